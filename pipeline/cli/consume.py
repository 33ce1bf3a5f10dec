"""``python -m pipeline consume``: read a topic back (assign mode), or consume as a
member of a consumer group (``-G GROUP topic...``, kcat's ``-G``).

Built on :mod:`pipeline.consumer` (the project's own Fetch / ListOffsets codec). Output
is one line per record, formatted with kcat-style tokens (``-f``) or as JSON lines. In a
group, positions are committed (auto-commit, and on exit) and ``-o`` only chooses where
a partition without a committed offset starts (beginning or end).
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
)

HELP = ("read records from a topic (assign mode; from beginning/offset/end; count or until "
        "idle), or as a consumer group member (-G GROUP topic...)")

DEFAULT_FORMAT = "%p\\t%o\\t%k\\t%h\\t%s\\n"
_TOKENS = "tpoTksShKS%"


def _start(text: str) -> str | int:
    low = text.lower()
    if low in ("beginning", "earliest", "start"):
        return "beginning"
    if low in ("end", "latest"):
        return "end"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected beginning, end, an offset, or -N (N before the end), got {text!r}"
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
        "-o", "--offset", type=_start, default="beginning",
        help="beginning (default), end, an absolute offset, or -N for the last N per partition",
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
    out = parser.add_mutually_exclusive_group()
    out.add_argument(
        "-f", "--format", default=None,
        help="kcat-style: %%t topic %%p partition %%o offset %%T timestamp %%k key %%s value "
        "%%h headers %%K key length %%S value length, \\n \\t (default: "
        + DEFAULT_FORMAT.replace("%", "%%") + ")",
    )
    out.add_argument("-J", "--json", action="store_true", help="one JSON object per record")
    add_client_options(parser, what="consumer")
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "backslashreplace")


def _headers_text(headers: tuple[tuple[str, bytes | None], ...]) -> str:
    return ",".join(f"{k}={_text(v)}" for k, v in headers)


def format_record(rec: Any, fmt: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch == "\\" and i + 1 < len(fmt):
            out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(fmt[i + 1], fmt[i : i + 2]))
            i += 2
            continue
        if ch == "%" and i + 1 < len(fmt):
            tok = fmt[i + 1]
            i += 2
            if tok == "t":
                out.append(rec.topic)
            elif tok == "p":
                out.append(str(rec.partition))
            elif tok == "o":
                out.append(str(rec.offset))
            elif tok == "T":
                out.append(str(rec.timestamp))
            elif tok == "k":
                out.append(_text(rec.key))
            elif tok == "s":
                out.append(_text(rec.value))
            elif tok == "h":
                out.append(_headers_text(rec.headers))
            elif tok == "K":
                out.append(str(-1 if rec.key is None else len(rec.key)))
            elif tok == "S":
                out.append(str(-1 if rec.value is None else len(rec.value)))
            elif tok == "%":
                out.append("%")
            else:
                out.append("%" + tok)
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _json_bytes(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def record_json(rec: Any) -> str:
    return json.dumps(
        {
            "topic": rec.topic,
            "partition": rec.partition,
            "offset": rec.offset,
            "timestamp": rec.timestamp,
            "key": _json_bytes(rec.key),
            "value": _json_bytes(rec.value),
            "headers": [[k, _json_bytes(v)] for k, v in rec.headers],
        },
        ensure_ascii=False,
    )


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
        if args.partitions or isinstance(args.offset, int):
            raise UserError("with -G the group assigns partitions and commits positions: "
                            "-p and -o OFFSET do not apply (-o beginning|end do)")
        count = trio.run(_consume_group, args, topics, options)
    if not args.quiet:
        print(f"read {count} record(s) from {', '.join(topics)}", file=sys.stderr)
    return 0


async def _consume_group(args: argparse.Namespace, topics: list[str],
                         options: dict[str, Any]) -> int:
    """As a member of ``args.group`` until ``--count``, ``--idle`` or, with ``-e``, until
    every assigned partition is at its end; closing commits the positions."""
    import trio

    from pipeline.consumer import ConsumerError, open_consumer

    fmt = args.format if args.format is not None else DEFAULT_FORMAT
    n = 0
    config = dict(options)
    config.setdefault("request_timeout", args.timeout)
    try:
        async with open_consumer(
            args.bootstrap, group_id=args.group, topics=topics,
            auto_offset_reset="earliest" if args.offset == "beginning" else "latest",
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
                    sys.stdout.write(record_json(rec) + "\n" if args.json
                                     else format_record(rec, fmt))
                n += len(batch)
    except ConsumerError as exc:
        raise UserError(str(exc)) from None
    except BrokenPipeError:
        pass
    sys.stdout.flush()
    return n


async def _consume(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from contextlib import aclosing

    from pipeline.cluster.config import cluster_config
    from pipeline.consumer import ConsumerError, read_topic

    partitions = await check_topic(args.bootstrap, args.topic, args.timeout, options)
    bad = [p for p in args.partitions or () if not 0 <= p < partitions]
    if bad:
        raise UserError(f"topic {args.topic!r} has {partitions} partition(s); no partition {bad[0]}")
    fmt = args.format if args.format is not None else DEFAULT_FORMAT
    out = sys.stdout
    n = 0
    try:
        async with aclosing(
            read_topic(
                args.bootstrap, args.topic, partitions=args.partitions, start=args.offset,
                max_messages=args.count, stop_at_end=args.exit_at_end,
                idle_timeout=args.idle, isolation_level=args.isolation,
                request_timeout=args.timeout,
                config=cluster_config(None, options),
            )
        ) as records:
            async for rec in records:
                out.write(record_json(rec) + "\n" if args.json else format_record(rec, fmt))
                n += 1
    except ConsumerError as exc:
        raise UserError(str(exc)) from None
    except BrokenPipeError:  # e.g. `| head`
        pass
    out.flush()
    return n
