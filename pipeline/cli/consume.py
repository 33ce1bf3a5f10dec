"""``python -m pipeline consume``: read a topic back (assign mode), like ``kcat -C``, or
consume as a member of a consumer group (``-G GROUP topic...``, kcat's ``-G``).

Built on :mod:`pipeline.consumer` (the project's own Fetch / ListOffsets codec). Output
is kcat's: by default each record's value followed by the ``-D`` delimiter (``\\n``),
its key and the ``-K`` delimiter before it when ``-K`` is given; ``-f`` takes kcat's
format tokens; ``-J`` writes kcat's JSON envelope. Keys and values are written as the
bytes they are (binary-safe); ``%R`` frames a value with its length for a binary pipe
into ``produce --length-prefixed``.

``-o`` takes kcat's forms: ``beginning``, ``end``, an offset, ``-N`` (the last N of each
partition), ``s@TS`` (start at the first record with a timestamp >= TS, milliseconds:
ListOffsets by time) and ``e@TS`` (stop each partition before its first record with a
timestamp >= TS); ``s@`` and ``e@`` may be given together.

With ``-G GROUP`` the group assigns the partitions of ``-t TOPIC`` and of the topics
given after the options; positions are committed (auto-commit, and on exit), and ``-o``
only chooses where a partition without a committed offset starts (beginning or end).

What differs from kcat: ``-J`` has no ``tstype`` and ``broker`` keys (the reader does
not report them), and a key, value or header that is not UTF-8 appears in JSON as
``{"base64": "..."}`` (kcat writes the raw bytes, which is not JSON). ``-Z`` prints
``NULL`` for a null key or value only (kcat also for an empty one).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

from pipeline.cli._common import (
    UserError,
    add_bootstrap,
    add_client_options,
    check_topic,
    cluster_options,
    resolve_bootstrap,
    run_guarded,
    setup_logging,
    unescape,
)

HELP = ("read records from a topic, like kcat -C (assign mode; from beginning, an "
        "offset, the end or a time; count, until the end or a time, or until idle), or as "
        "a consumer group member (-G GROUP topic...)")

NULL = b"NULL"  # what -Z prints for a null key or value, as kcat does


def _offset(text: str) -> tuple[str, int | str]:
    """One ``-o``: ("start", beginning | end | N | -N), ("start_ts", TS), ("stop_ts", TS)."""
    low = text.lower()
    if low in ("beginning", "earliest", "start"):
        return "start", "beginning"
    if low in ("end", "latest"):
        return "start", "end"
    for prefix, kind in (("s@", "start_ts"), ("e@", "stop_ts")):
        if low.startswith(prefix):
            try:
                stamp = int(text[2:])
            except ValueError:
                stamp = -1
            if stamp < 0:
                raise argparse.ArgumentTypeError(
                    f"{text!r}: {prefix}TS takes a timestamp in milliseconds since the epoch")
            return kind, stamp
    try:
        return "start", int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected beginning, end, an offset, -N (N before the end), s@TS or e@TS "
            f"(TS in ms), got {text!r}"
        ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.add_argument("-t", "--topic", default=None)
    parser.add_argument(
        "-G", "--group", default=None, metavar="GROUP",
        help="consume as a member of consumer group GROUP: the group assigns the partitions "
        "of -t TOPIC and the TOPICS given after the options; positions are committed",
    )
    parser.add_argument("topics", nargs="*", metavar="TOPICS",
                        help="with -G: more topics to subscribe to")
    parser.add_argument(
        "-p", "--partition", dest="partitions", type=int, action="append", default=None,
        help="read this partition (repeatable; default: all)",
    )
    parser.add_argument(
        "-o", "--offset", dest="offsets", type=_offset, action="append", default=[],
        metavar="OFFSET",
        help="where to start: beginning (default), end, an offset, -N (the last N per "
        "partition), s@TS (the first record at or after TS, ms since the epoch); e@TS: "
        "stop each partition before its first record at or after TS (may be combined)",
    )
    parser.add_argument("-c", "--count", type=int, default=None, help="stop after COUNT records")
    parser.add_argument(
        "-e", "--exit-at-end", action="store_true",
        help="stop when every partition reached its end (like kcat -e)",
    )
    parser.add_argument(
        "--idle", type=float, default=None, metavar="SECONDS",
        help="stop when no record arrived for SECONDS",
    )
    parser.add_argument(
        "--isolation", choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="read_committed: only committed transactions, up to the last stable offset "
        "(also the end for -e and -o end); default read_uncommitted, as Kafka's",
    )
    parser.add_argument(
        "-D", "--delimiter", type=unescape, default=b"\n", metavar="DELIM",
        help="written after each record (default \\n); kcat escapes: \\n \\r \\t \\xNN",
    )
    parser.add_argument(
        "-K", "--key-delimiter", type=unescape, default=None, metavar="DELIM",
        help="print each record's key, then DELIM, before its value",
    )
    parser.add_argument(
        "-Z", "--null", action="store_true", help="print a null key or value as NULL",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument(
        "-f", "--format", default=None,
        help="kcat's format (overrides -D and -K): %%t topic %%p partition %%o offset "
        "%%T timestamp %%k key %%s value %%h headers (n=v,...) %%K key length %%S value "
        "length (-1: null) %%R value length as a 4-byte big-endian int, \\n \\r \\t \\xNN",
    )
    out.add_argument(
        "-J", "--json", action="store_true",
        help="kcat's JSON envelope per record: topic, partition, offset, ts, headers "
        "([name, value, ...]), key, payload",
    )
    parser.add_argument(
        "-u", "--unbuffered", action="store_true", help="write each record at once"
    )
    add_client_options(parser, what="consumer")
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")


def _text(data: bytes | None, null: bool) -> bytes:
    if data is None:
        return NULL if null else b""
    return data


def _headers(headers: tuple[tuple[str, bytes | None], ...]) -> bytes:
    return b",".join(k.encode() + b"=" + (v or b"") for k, v in headers)


def format_record(rec: Any, fmt: str, *, null: bool = False) -> bytes:
    """``rec`` in kcat's format ``fmt`` (bytes: keys and values as they are)."""
    out = bytearray()
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch == "%" and i + 1 < len(fmt):
            tok = fmt[i + 1]
            i += 2
            if tok == "t":
                out += rec.topic.encode()
            elif tok == "p":
                out += b"%d" % rec.partition
            elif tok == "o":
                out += b"%d" % rec.offset
            elif tok == "T":
                out += b"%d" % rec.timestamp
            elif tok == "k":
                out += _text(rec.key, null)
            elif tok == "s":
                out += _text(rec.value, null)
            elif tok == "h":
                out += _headers(rec.headers)
            elif tok == "K":
                out += b"%d" % (-1 if rec.key is None else len(rec.key))
            elif tok == "S":
                out += b"%d" % (-1 if rec.value is None else len(rec.value))
            elif tok == "R":
                size = -1 if rec.value is None else len(rec.value)
                out += size.to_bytes(4, "big", signed=True)
            elif tok == "%":
                out += b"%"
            else:
                out += b"%" + tok.encode()
            continue
        j = fmt.find("%", i + 1)
        j = len(fmt) if j < 0 else j
        out += unescape(fmt[i:j])
        i = j
    return bytes(out)


def _json_bytes(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def record_json(rec: Any) -> str:
    """kcat's ``-J`` envelope (its key names and order; no tstype, broker)."""
    envelope: dict[str, Any] = {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "ts": rec.timestamp,
    }
    if rec.headers:
        envelope["headers"] = [x for k, v in rec.headers for x in (k, _json_bytes(v))]
    envelope["key"] = _json_bytes(rec.key)
    envelope["payload"] = _json_bytes(rec.value)
    return json.dumps(envelope, ensure_ascii=False)


def run(args: argparse.Namespace) -> int:
    return run_guarded(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    import trio

    setup_logging(args.verbose)
    resolve_bootstrap(args)
    options = cluster_options(args)
    if args.count is not None and args.count < 0:
        raise UserError(f"--count must be >= 0, not {args.count}")
    topics = ([args.topic] if args.topic else []) + list(args.topics)
    if not topics:
        raise UserError("name a topic: -t TOPIC (or, with -G GROUP, topics after the options)")
    if args.group is None:
        if len(topics) > 1 or args.topic is None:
            raise UserError("without -G read one topic, given with -t TOPIC")
        count = trio.run(_consume, args, options)
    else:
        starts = dict(args.offsets)
        if args.partitions or set(starts) - {"start"} or starts.get("start", "beginning") not in (
                "beginning", "end"):
            raise UserError("with -G the group assigns partitions and commits positions: "
                            "-p, -o OFFSET and -o s@/e@ do not apply (-o beginning|end do)")
        count = trio.run(_consume_group, args, topics, options, starts.get("start", "beginning"))
    if not args.quiet:
        print(f"read {count} record(s) from {', '.join(topics)}", file=sys.stderr)
    return 0


async def _consume_group(args: argparse.Namespace, topics: list[str], options: dict[str, Any],
                         start: str) -> int:
    """As a member of ``args.group`` until ``--count``, ``--idle`` or, with ``-e``, until
    every assigned partition is at its end; closing commits the positions."""
    import trio

    from pipeline.consumer import ConsumerError, open_consumer

    out = sys.stdout.buffer
    sys.stdout.flush()
    flush = args.unbuffered or out.isatty()
    n = 0
    config = dict(options)
    config.setdefault("request_timeout", args.timeout)
    try:
        async with open_consumer(
            args.bootstrap, group_id=args.group, topics=topics,
            auto_offset_reset="earliest" if start == "beginning" else "latest",
            isolation_level=args.isolation, **config,
        ) as consumer:
            while args.count is None or n < args.count:
                with trio.move_on_after(args.idle if args.idle is not None else 1.0) as idle:
                    batch = await consumer.getmany(
                        None if args.count is None else args.count - n)
                if idle.cancelled_caught:
                    if args.idle is not None:
                        break
                    if args.exit_at_end and consumer.assignment() and \
                            all(lag == 0 for lag in consumer.lag().values()):
                        break
                    continue
                for rec in batch:
                    _write(out, rec, args)
                n += len(batch)
                if flush:
                    out.flush()
        out.flush()
    except ConsumerError as exc:
        raise UserError(str(exc)) from None
    except BrokenPipeError:
        pass
    return n


def _write(out: Any, rec: Any, args: argparse.Namespace) -> None:
    if args.json:
        out.write(record_json(rec).encode() + args.delimiter)
    elif args.format is not None:
        out.write(format_record(rec, args.format, null=args.null))
    else:  # kcat's default: [key DELIM] value DELIM
        if args.key_delimiter is not None:
            out.write(_text(rec.key, args.null) + args.key_delimiter)
        out.write(_text(rec.value, args.null) + args.delimiter)


async def _consume(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from contextlib import aclosing

    from pipeline.cluster.config import cluster_config
    from pipeline.consumer import ConsumerError, offsets_for_times, read_topic

    partitions = await check_topic(args.bootstrap, args.topic, args.timeout, options)
    bad = [p for p in args.partitions or () if not 0 <= p < partitions]
    if bad:
        raise UserError(f"topic {args.topic!r} has {partitions} partition(s); no partition {bad[0]}")
    wanted = sorted(set(args.partitions)) if args.partitions else list(range(partitions))
    settings = dict(args.offsets)
    config = cluster_config(None, options)
    start: Any = settings.get("start", "beginning")
    stop_ts = settings.get("stop_ts")
    try:
        if "start_ts" in settings:
            start = await offsets_for_times(args.bootstrap, args.topic, settings["start_ts"],
                                            partitions=wanted, config=config,
                                            request_timeout=args.timeout)
        out = sys.stdout.buffer
        sys.stdout.flush()
        flush = args.unbuffered or out.isatty()
        n = 0
        stopped: set[int] = set()
        async with aclosing(
            read_topic(
                args.bootstrap, args.topic, partitions=wanted, start=start,
                max_messages=args.count, stop_at_end=args.exit_at_end,
                idle_timeout=args.idle, isolation_level=args.isolation,
                request_timeout=args.timeout, config=config,
            )
        ) as records:
            async for rec in records:
                if stop_ts is not None and (rec.partition in stopped or rec.timestamp >= stop_ts):
                    stopped.add(rec.partition)
                    if len(stopped) == len(wanted):
                        break
                    continue
                _write(out, rec, args)
                n += 1
                if flush:
                    out.flush()
        out.flush()
    except ConsumerError as exc:
        raise UserError(str(exc)) from None
    except BrokenPipeError:  # e.g. `| head`
        pass
    return n
