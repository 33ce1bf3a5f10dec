"""``python -m pipeline produce``: lines from stdin or files to a topic, like ``kcat -P``."""

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
)

HELP = "produce lines from stdin or files to a topic (like kcat -P)"

CHUNK_LINES = 5000


def _header(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value.encode()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.add_argument("-t", "--topic", required=True)
    parser.add_argument(
        "-K", "--key-delimiter", metavar="SEP", default=None,
        help="split each line at the first SEP into key and value (a line without SEP "
        "gets a null key)",
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
        "--skip-empty", action="store_true", help="do not produce empty lines"
    )
    add_producer_options(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
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


def _lines(inputs: list[IO[bytes]], skip_empty: bool) -> Iterator[bytes]:
    for stream in inputs:
        for raw in stream:
            line = raw[:-1] if raw.endswith(b"\n") else raw
            if line.endswith(b"\r"):
                line = line[:-1]
            if skip_empty and not line:
                continue
            yield line


def run(args: argparse.Namespace) -> int:
    return run_guarded(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    import trio

    setup_logging(args.verbose)
    resolve_bootstrap(args)
    options = producer_options(args)
    if args.partition is not None and args.partition < 0:
        raise UserError(f"--partition must be >= 0, not {args.partition}")
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
    lines = _lines(inputs, args.skip_empty)
    sep = args.key_delimiter.encode() if args.key_delimiter else None
    headers = tuple(args.headers)
    topic, partition = args.topic, args.partition

    def next_chunk() -> list[ProducerMessage]:
        out: list[ProducerMessage] = []
        for line in lines:
            key: bytes | None = None
            if sep is not None:
                k, found, v = line.partition(sep)
                if found:
                    key, line = k, v
            out.append(ProducerMessage(topic, line, key=key, headers=headers, partition=partition))
            if len(out) >= CHUNK_LINES:
                break
        return out

    groups: list[DeliveryGroup] = []
    async with open_producer(args.bootstrap, **options) as producer:
        while True:
            # reading stdin may block for a long time: never on the event loop
            chunk = await trio.to_thread.run_sync(next_chunk, abandon_on_cancel=True)
            if not chunk:
                break
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
    return delivered, failed, first
