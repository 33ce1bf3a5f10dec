"""``python -m pipeline produce``: messages from stdin or files to a topic, like ``kcat -P``.

Input is split into messages at the ``-D`` delimiter: a newline by default (a ``\r``
before it is dropped, for CRLF files), or any string or byte with kcat's escapes
(``-D '\x00'``, ``-D '\t'``), which makes any input that lacks that byte binary-safe.
``--length-prefixed`` reads any bytes at all: each message is a 4-byte big-endian signed
length (-1: a null value) and that many bytes, what ``consume -f '%R%s'`` writes.
``-K DELIM`` splits each message at its first DELIM into key and value; ``-Z`` sends an
empty key or value as null (an empty value with ``-Z`` is a tombstone).

Progress (rows delivered, the rate, with files the share done and the time left) is
drawn on stderr when it is a terminal; ``--progress`` draws it elsewhere too, a plain
line per report (``_progress.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import IO, Any

from pipeline.cli._common import (
    UserError,
    add_bootstrap,
    add_producer_options,
    check_topic,
    one_line,
    producer_options,
    resolve_bootstrap,
    run_guarded,
    setup_logging,
    unescape,
)
from pipeline.cli._progress import (
    Progress,
    Snapshot,
    add_progress_arguments,
    input_size,
    position,
    progress_settings,
    share_of_input,
)

HELP = ("produce messages from stdin or files to a topic, like kcat -P (lines, a -D "
        "delimiter, or length-prefixed binary)")

CHUNK_LINES = 5000


def _header(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value.encode()


def _delimiter(text: str) -> bytes:
    delim = unescape(text)
    if not delim:
        raise argparse.ArgumentTypeError("the delimiter must not be empty")
    return delim


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.add_argument("-t", "--topic", required=True)
    parser.add_argument(
        "-D", "--delimiter", type=_delimiter, default=None, metavar="DELIM",
        help="split the input into messages at DELIM (default: newline, a CR before it "
        "dropped); kcat escapes: \\n \\r \\t \\xNN, e.g. -D '\\x00'",
    )
    parser.add_argument(
        "--length-prefixed", action="store_true",
        help="binary input: each message is a 4-byte big-endian length (-1: null) and "
        "its bytes (what consume -f '%%R%%s' writes)",
    )
    parser.add_argument(
        "-K", "--key-delimiter", metavar="DELIM", type=_delimiter, default=None,
        help="split each message at the first DELIM into key and value (a message "
        "without DELIM gets a null key); escapes as -D",
    )
    parser.add_argument(
        "-k", "--key", default=None, help="the key of every message that has none from -K",
    )
    parser.add_argument(
        "-Z", "--null", action="store_true",
        help="send an empty key or value as null (an empty value: a tombstone)",
    )
    parser.add_argument(
        "-H", "--header", dest="headers", metavar="NAME=VALUE", type=_header,
        action="append", default=[], help="add this header to every message (repeatable)",
    )
    parser.add_argument(
        "-p", "--partition", type=int, default=None,
        help="produce to this partition (default: the partitioner picks)",
    )
    parser.add_argument(
        "--skip-empty", action="store_true", help="do not produce empty messages"
    )
    add_producer_options(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    add_progress_arguments(
        parser, "rows and bytes delivered, their rate, share done and ETA when the input "
        "size is known")
    parser.add_argument(
        "files", nargs="*", metavar="FILE", help="files to read (default: stdin; '-' is stdin)"
    )


def _open_inputs(paths: list[str]) -> list[IO[bytes]]:
    if not paths:
        return [sys.stdin.buffer]
    out: list[IO[bytes]] = []
    for path in paths:
        if path == "-":
            out.append(sys.stdin.buffer)
            continue
        try:
            out.append(open(path, "rb"))
        except IsADirectoryError:
            raise UserError(f"cannot read {path}: it is a directory") from None
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror or one_line(exc)}") from None
    return out


class _Idle:
    """Yielded by ``_messages`` after the messages of a short read: the input has
    nothing more ready now (a pipe or a terminal that someone writes slowly)."""


IDLE = _Idle()


def split_messages(stream: IO[bytes], delim: bytes, *, chunk: int = 1 << 16,
                   idle: bool = False) -> Iterator[bytes | _Idle]:
    """The messages of ``stream`` between ``delim`` (a last one without a delimiter
    after it included; nothing after a final delimiter); with ``idle``, ``IDLE`` after
    the messages of each read that returned less than asked."""
    pending = b""
    read = getattr(stream, "read1", stream.read)  # what is there: a slow pipe is not held
    while True:
        data = read(chunk)
        if not data:
            break
        pending += data
        parts = pending.split(delim)
        pending = parts.pop()
        yield from parts
        if idle and len(data) < chunk:
            yield IDLE
    if pending:
        yield pending


def length_prefixed(stream: IO[bytes]) -> Iterator[bytes | None]:
    """The messages of ``stream`` framed as 4-byte big-endian signed length (-1: null)
    plus bytes. A frame cut short is a :class:`UserError` naming the message."""
    number = 0
    while True:
        head = stream.read(4)
        if not head:
            return
        number += 1
        if len(head) < 4:
            raise UserError(f"--length-prefixed input ends inside the length of message {number}")
        size = int.from_bytes(head, "big", signed=True)
        if size < -1:
            raise UserError(f"--length-prefixed message {number} has length {size} "
                            "(-1 for null, else >= 0)")
        if size == -1:
            yield None
            continue
        body = stream.read(size)
        if len(body) < size:
            raise UserError(f"--length-prefixed input ends inside message {number} "
                            f"({len(body)} of {size} bytes)")
        yield body


def _messages(inputs: list[IO[bytes]],
              args: argparse.Namespace) -> Iterator[bytes | _Idle | None]:
    for stream in inputs:
        if args.length_prefixed:
            yield from length_prefixed(stream)
        elif args.delimiter is None:
            for line in split_messages(stream, b"\n", idle=True):
                if isinstance(line, bytes) and line.endswith(b"\r"):
                    line = line[:-1]
                yield line
        else:
            yield from split_messages(stream, args.delimiter, idle=True)


def run(args: argparse.Namespace) -> int:
    return run_guarded(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    import trio

    setup_logging(args.verbose)
    resolve_bootstrap(args)
    options = producer_options(args)
    if args.partition is not None and args.partition < 0:
        raise UserError(f"--partition must be >= 0, not {args.partition}")
    try:
        progress_settings(args.progress, args.progress_interval, tty=False)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    inputs = _open_inputs(args.files)
    try:
        delivered, failed, first = trio.run(_produce, args, options, inputs)
    finally:
        for stream in inputs:
            if stream is not sys.stdin.buffer:
                stream.close()
    if failed:
        print(
            f"error: {failed} of {delivered + failed} message(s) not delivered to "
            f"{args.topic}; first error: {first}",
            file=sys.stderr,
        )
        return 1
    if not args.quiet:
        print(f"produced {delivered} message(s) to {args.topic}", file=sys.stderr)
    return 0


async def _produce(
    args: argparse.Namespace, options: dict[str, Any], inputs: list[IO[bytes]]
) -> tuple[int, int, str | None]:
    import trio

    from pipeline.producer._api import open_producer
    from pipeline.producer._message import ProducerMessage
    from pipeline.producer._outcomes.delivery import DeliveryGroup

    count = await check_topic(args.bootstrap, args.topic, args.timeout, options)
    if args.partition is not None and args.partition >= count:
        raise UserError(
            f"topic {args.topic!r} has {count} partition(s); no partition {args.partition}"
        )
    messages = _messages(inputs, args)
    sep = args.key_delimiter
    fixed_key = args.key.encode() if args.key is not None else None
    headers = tuple(args.headers)
    topic, partition = args.topic, args.partition

    def next_chunk() -> list[ProducerMessage]:
        out: list[ProducerMessage] = []
        for value in messages:
            if value is IDLE:
                if out:
                    break  # send what came; waiting for more would hold it back
                continue
            assert not isinstance(value, _Idle)
            if args.skip_empty and not value:
                continue
            key: bytes | None = None
            if sep is not None and value is not None:
                k, found, v = value.partition(sep)
                if found:
                    key, value = k, v
            if key is None:
                key = fixed_key
            if args.null:
                key = key or None
                value = value or None
            out.append(ProducerMessage(topic, value, key=key, headers=headers,
                                       partition=partition))
            if len(out) >= CHUNK_LINES:
                break
        return out

    groups: list[DeliveryGroup] = []
    tty = sys.stderr.isatty()
    show, every = progress_settings(args.progress, args.progress_interval, tty=tty,
                                    quiet=args.quiet)
    total = input_size(inputs) if show else None
    start = sum(s.tell() for s in inputs) if total is not None else 0
    read = [0, 0]  # rows read, bytes read (the bytes of regular files only)
    async with open_producer(args.bootstrap, **options) as producer, \
            trio.open_nursery() as nursery:
        progress = None
        if show:
            progress = Progress(sys.stderr, tty=tty, clock=trio.current_time)

            def snapshot() -> Snapshot:
                stats = producer.statistics()
                done = stats.succeeded + stats.failed
                return Snapshot(stats.succeeded, stats.delivered_bytes, stats.failed,
                                share=share_of_input(done, read[0], read[1], total))

            nursery.start_soon(progress.run, every, snapshot, trio.sleep)
        while True:
            # reading stdin may block for a long time: never on the event loop
            chunk = await trio.to_thread.run_sync(next_chunk, abandon_on_cancel=True)
            if not chunk:
                break
            read[0] += len(chunk)
            if total is not None:
                read[1] = position(inputs, start)
            groups.append(await producer.send_many(chunk))
        delivered = failed = 0
        first: str | None = None
        for group in groups:
            result = await group
            delivered += result.delivered
            failed += result.failed
            if first is None and result.first_error is not None:
                cause = result.first_error.cause
                first = f"{type(cause).__name__}: {one_line(cause)}"
        nursery.cancel_scope.cancel()
        if progress is not None:
            progress.draw(Snapshot(delivered, producer.statistics().delivered_bytes, failed,
                                   share=None if total is None else 1.0), final=True)
    return delivered, failed, first
