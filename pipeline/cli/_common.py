"""Helpers shared by the client subcommands (produce, consume, export, bench).

User mistakes (bad bootstrap, unknown topic, unreadable file, bad option) become one
``error: ...`` line on stderr and exit status 1 (2 for usage errors, as argparse does);
only a bug prints a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

BOOTSTRAP_ENV = "PIPELINE_BOOTSTRAP"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"

#: the exit status for a user error (argparse uses 2 for usage errors)
EXIT_ERROR = 1


class UserError(Exception):
    """A mistake the user can fix; printed as one line."""


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-b",
        "--bootstrap",
        default=os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP,
        help=f"host:port[,host:port] (default: ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log the client's retries and warnings"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the cluster to answer (default: 10)",
    )


def setup_logging(verbose: bool = False) -> None:
    """Library warnings (connection retries...) only with ``-v``; errors are reported once."""
    import logging

    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    else:
        logging.getLogger("pipeline").addHandler(logging.NullHandler())
        logging.getLogger("pipeline").propagate = False


def check_bootstrap(bootstrap: str) -> str:
    from pipeline.testing.broker import parse_bootstrap

    try:
        parse_bootstrap(bootstrap)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return bootstrap


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def run_guarded(fn: Callable[[], int]) -> int:
    """Run ``fn``; turn user-facing errors into ``error: ...`` + exit status 1."""
    from pipeline.cluster.errors import KafkaError
    from pipeline.util.groups import real_errors

    try:
        return fn()
    except BaseExceptionGroup as group:
        # Every error of the group is reported (pipeline.util.groups): one line each.
        errors = real_errors(group)
        if any(isinstance(e, KeyboardInterrupt) for e in errors):
            print("interrupted", file=sys.stderr)
            return 130
        if all(isinstance(e, UserError | KafkaError | OSError) for e in errors):
            for error in errors:
                report(error)
            return EXIT_ERROR
        raise
    except (UserError, KafkaError, OSError) as exc:
        return report(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def report(exc: BaseException) -> int:
    from pipeline.cluster.errors import KafkaError

    if isinstance(exc, UserError):
        text = one_line(exc)
    elif isinstance(exc, FileNotFoundError):
        text = f"no such file: {exc.filename}"
    elif isinstance(exc, PermissionError):
        text = f"permission denied: {exc.filename}"
    elif isinstance(exc, KafkaError):
        text = one_line(exc)
    else:
        text = f"{type(exc).__name__}: {one_line(exc)}"
    print(f"error: {text}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def producer_option(text: str) -> tuple[str, Any]:
    """argparse type for ``-X name=value`` (ProducerConfig fields, e.g. linger=0.01)."""
    from pipeline.cluster.config import parse_option_value

    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip().replace(".", "_").replace("-", "_"), parse_option_value(value.strip())


def add_producer_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-X",
        dest="producer_options",
        metavar="NAME=VALUE",
        type=producer_option,
        action="append",
        default=[],
        help="a producer option (ProducerConfig field, e.g. -X linger=0.02 -X compression=zstd)",
    )
    parser.add_argument(
        "-z", "--compression", default=None, help="none, gzip, snappy, lz4 or zstd"
    )


def producer_options(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.producer.config import make_config
    from pipeline.producer.errors import ConfigError

    opts: dict[str, Any] = dict(args.producer_options)
    if args.compression is not None:
        opts["compression"] = args.compression
    opts.setdefault("request_timeout", args.timeout)
    opts.setdefault("delivery_timeout", max(120.0, args.timeout + 1))
    try:
        make_config(None, opts)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    return opts


async def check_topic(bootstrap: str, topic: str, wait: float) -> int:
    """The topic's partition count; ``UserError`` if the cluster or the topic is not there."""
    import trio

    from pipeline.cluster.errors import KafkaError, UnknownTopicError
    from pipeline.cluster.pool import Cluster
    from pipeline.util.groups import real_errors

    try:
        async with Cluster.open(
            bootstrap, request_timeout=wait, metadata_timeout=wait
        ) as cluster:
            with trio.move_on_after(wait):
                return await cluster.partitions_for(topic)
    except BaseExceptionGroup as group:
        errors = real_errors(group)
        if any(isinstance(e, UnknownTopicError) for e in errors):
            raise UserError(f"unknown topic {topic!r}: create it first") from None
        if all(isinstance(e, KafkaError | OSError) for e in errors):
            detail = "; ".join(one_line(e) for e in errors)
            raise UserError(f"cannot reach {bootstrap}: {detail}") from None
        raise
    except UnknownTopicError:
        raise UserError(f"unknown topic {topic!r}: create it first") from None
    except (KafkaError, OSError) as exc:
        raise UserError(f"cannot reach {bootstrap}: {one_line(exc)}") from None
    raise UserError(
        f"no broker of {bootstrap} answered within {wait}s; "
        "check the address and that the broker is running"
    )
