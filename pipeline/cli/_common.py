"""Helpers shared by the client subcommands (produce, consume, export, bench).

User mistakes (bad bootstrap, unknown topic, unreadable file, bad option) become one
``error: ...`` line on stderr and exit status 1 (usage errors too, after the usage);
only a bug prints a traceback. Option errors speak the user's spelling and units:
``-X linger.ms=-5`` is reported as ``linger.ms=-5``, not as the option it maps to.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Callable
from typing import Any

BOOTSTRAP_ENV = "PIPELINE_BOOTSTRAP"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"

#: the exit status for a user error (usage errors included)
EXIT_ERROR = 1
#: ClusterConfig's connect_timeout: a --timeout below it lowers it (-X sets it)
CONNECT_TIMEOUT = 5.0


class UserError(Exception):
    """A mistake the user can fix; printed as one line."""


def unescape(text: str) -> bytes:
    """kcat's escapes in a delimiter or format: ``\\n \\r \\t \\\\`` and ``\\xNN`` (any
    byte, e.g. ``-D '\\x00'``); other text is UTF-8."""
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in "nrt\\":
                out += {"n": b"\n", "r": b"\r", "t": b"\t", "\\": b"\\"}[nxt]
                i += 2
                continue
            digits = text[i + 2:i + 4]
            if nxt == "x" and len(digits) == 2 and all(c in "0123456789abcdefABCDEF"
                                                        for c in digits):
                out.append(int(digits, 16))
                i += 4
                continue
        out += ch.encode()
        i += 1
    return bytes(out)


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-b",
        "--bootstrap",
        default=None,
        help=f"host:port[,host:port] (default: bootstrap.servers of --config, "
        f"${BOOTSTRAP_ENV}, or {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log the client's retries and warnings"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the cluster to answer (default: 10); a bootstrap that "
        "nobody answers fails after min(5, SECONDS) (-X socket.connection.setup.timeout.ms="
        "MS to choose)",
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


_SECRET_HINTS = ("password", "secret", "token", "jaas", "key")


def _shown(text: str) -> str:
    """``text`` for an error message, unless it may hold a secret."""
    return "(hidden: it may hold a secret)" if any(h in text.lower() for h in _SECRET_HINTS) \
        else repr(text)


def client_option(text: str) -> tuple[str, str]:
    """argparse type for ``-X name=value``: a Kafka property (``security.protocol``,
    ``sasl.mechanism``...) or an option field name (``linger``, ``request_timeout``)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {_shown(text)}")
    return name.strip(), value.strip()


def add_client_options(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``-X NAME=VALUE`` (repeatable) and ``--config FILE`` (Java-style properties)."""
    parser.add_argument(
        "-X",
        dest="client_options",
        metavar="NAME=VALUE",
        type=client_option,
        action="append",
        default=[],
        help=f"a {what} option (field name, e.g. -X request_timeout=5) or client property as "
        "kcat/librdkafka/Java take it (-X security.protocol=SASL_SSL -X sasl.mechanism="
        "SCRAM-SHA-512 -X sasl.username=... -X sasl.password=... -X ssl.ca.location=ca.pem)",
    )
    parser.add_argument(
        "--config",
        dest="config_file",
        metavar="FILE",
        default=None,
        help="a properties file of such settings (name=value lines, # comments; "
        "bootstrap.servers is used when -b is not given)",
    )


def add_producer_options(parser: argparse.ArgumentParser) -> None:
    add_client_options(parser, what="producer")
    parser.add_argument(
        "-z", "--compression", default=None, help="none, gzip, snappy, lz4 or zstd"
    )


def read_properties(path: str) -> dict[str, str]:
    """``name=value`` (or ``name: value``) lines; ``#`` / ``!`` comments. A bad line is
    reported by number, never by content (it may hold a password)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read --config {path}: {exc.strerror or one_line(exc)}") from None
    except UnicodeDecodeError:
        raise UserError(f"cannot read --config {path}: not UTF-8 text") from None
    out: dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise UserError(f"--config {path} line {number}: expected name=value")
        out[line[:cut].strip()] = line[cut + 1:].strip()
    return out


def _collect(args: argparse.Namespace) -> dict[str, str]:
    """--config properties, then -X ones over them; ``bootstrap.servers`` goes to
    ``args.bootstrap`` unless -b was given."""
    props: dict[str, str] = {}
    if getattr(args, "config_file", None):
        props.update(read_properties(args.config_file))
    props.update(dict(getattr(args, "client_options", []) or []))
    servers = props.pop("bootstrap.servers", None)
    if getattr(args, "bootstrap", None) is None and servers:
        args.bootstrap = servers
    return props


def resolve_bootstrap(args: argparse.Namespace) -> str:
    """-b, else bootstrap.servers of --config, else $PIPELINE_BOOTSTRAP, else the default."""
    _collect(args)
    if args.bootstrap is None:
        args.bootstrap = os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP
    return check_bootstrap(args.bootstrap)


def _options(args: argparse.Namespace, cls: type[Any]) -> dict[str, Any]:
    """The client's options from --config and -X: Kafka security/client properties,
    the Java producer's tuning properties (``acks``, ``linger.ms``...: a producer
    takes them, a reader ignores them with a warning, as the Java client does with a
    config it does not use), else our own field names (``request_timeout``).

    ``args.option_origins`` records, per option converted from a property, what the
    user wrote (for :func:`user_units`)."""
    import logging

    from pipeline.cluster.properties import kafka_properties, option_from_text
    from pipeline.producer._errors import ConfigError
    from pipeline.spark.options import KAFKA_OPTIONS

    props = _collect(args)
    origins: dict[str, tuple[str, str]] = {}
    try:
        opts, rest = kafka_properties(props)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    for name, value in rest.items():
        java = KAFKA_OPTIONS.get(f"kafka.{name.lower()}")
        if java is not None:
            field, convert = java
            if not any(f.name == field for f in cls.option_fields()):
                logging.getLogger("pipeline.cli").warning(
                    "%s is a producer property: ignored here", name)
                continue
            try:
                opts[field] = convert(value)
            except ValueError:
                raise UserError(f"invalid {name}={value!r}: not a valid value") from None
            origins[field] = (name, value)
            continue
        field = name.replace(".", "_").replace("-", "_")
        opts[field] = option_from_text(field, value, cls)
    args.option_origins = origins
    return opts


def user_units(text: str, args: argparse.Namespace) -> str:
    """A config error's text as the user wrote the option: ``invalid linger=-0.005:
    must be a number of seconds >= 0`` for ``-X linger.ms=-5`` becomes ``invalid
    linger.ms='-5': must be a number of milliseconds >= 0``."""
    for field, (name, raw) in getattr(args, "option_origins", {}).items():
        head = re.match(rf"invalid {re.escape(field)}=\S+?: ", text)
        if head is None:
            continue
        rest = text[head.end():]
        if name.lower().endswith(".ms"):
            rest = rest.replace("number of seconds", "number of milliseconds")
            # Other durations it is compared with, as properties in milliseconds too:
            # "linger + request_timeout (0.005 + 30.0)" -> "linger.ms + ... (5 + 30000)".
            rest = re.sub(r"\(([\d.]+(?: \+ [\d.]+)*)\)", lambda m: "(" + " + ".join(
                f"{float(x) * 1000:g}" for x in m.group(1).split(" + ")) + ")", rest, count=1)
            rest = re.sub(r"\b(" + "|".join(_MS_PROPERTIES) + r")\b",
                          lambda m: _MS_PROPERTIES[m.group(1)], rest)
        return f"invalid {name}={raw!r}: {rest}"
    return text


#: option fields the Java client sets in milliseconds -> the property names
_MS_PROPERTIES = {"linger": "linger.ms", "request_timeout": "request.timeout.ms",
                  "delivery_timeout": "delivery.timeout.ms"}


def echo_options(options: dict[str, Any]) -> None:
    """With -v: the options in effect, secrets shown as ***."""
    import logging

    from pipeline.cluster.security import redact_options

    shown = " ".join(f"{k}={v!r}" for k, v in sorted(redact_options(options).items()))
    logging.getLogger("pipeline.cli").info("options: %s", shown or "(defaults)")


def producer_options(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.producer._config import ProducerConfig, make_config
    from pipeline.producer._errors import ConfigError

    opts = _options(args, ProducerConfig)
    if args.compression is not None:
        opts["compression"] = args.compression
    opts.setdefault("request_timeout", args.timeout)
    opts.setdefault("delivery_timeout", max(120.0, args.timeout + 1))
    if args.timeout < CONNECT_TIMEOUT:
        opts.setdefault("connect_timeout", args.timeout)
    try:
        make_config(None, opts)
    except ConfigError as exc:
        raise UserError(user_units(str(exc), args)) from None
    echo_options(opts)
    return opts


def cluster_options(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster options of a reader (consume): ClusterConfig fields only."""
    from pipeline.cluster.config import ClusterConfig, cluster_config
    from pipeline.cluster.errors import ConfigError

    opts = _options(args, ClusterConfig)
    timeout = getattr(args, "timeout", None)
    if timeout is not None and timeout < CONNECT_TIMEOUT:
        opts.setdefault("connect_timeout", timeout)
    try:
        cluster_config(None, opts)
    except ConfigError as exc:
        raise UserError(user_units(str(exc), args)) from None
    echo_options(opts)
    return opts


#: option names in the client's error texts -> the property names the CLI takes
_CLI_NAMES = {
    "ssl_cafile": "ssl.ca.location", "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location", "ssl_password": "ssl.key.password",
    "ssl_check_hostname=False": "ssl.endpoint.identification.algorithm=none",
    "ssl_check_hostname": "ssl.endpoint.identification.algorithm",
    "security_protocol": "security.protocol", "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username", "sasl_password": "sasl.password",
}
_CLI_NAME = re.compile("|".join(re.escape(k) for k in _CLI_NAMES))


def cli_names(text: str) -> str:
    """An error text of the client with its option names as the CLI's ``-X`` names."""
    return _CLI_NAME.sub(lambda m: _CLI_NAMES[m.group(0)], text)


async def check_topic(bootstrap: str, topic: str, wait: float,
                      options: dict[str, Any] | None = None) -> int:
    """The topic's partition count; ``UserError`` if the cluster or the topic is not there.
    ``options``: the client's (its cluster part is used: security, client id...)."""
    import trio

    from pipeline.cluster.config import ClusterConfig
    from pipeline.cluster.errors import (
        AuthenticationError,
        BootstrapError,
        KafkaError,
        UnknownTopicError,
    )
    from pipeline.cluster.pool import Cluster
    from pipeline.util.groups import real_errors

    names = {f.name for f in dataclasses.fields(ClusterConfig) if f.init}
    cluster_opts = {k: v for k, v in (options or {}).items() if k in names}
    cluster_opts.update(request_timeout=wait, metadata_timeout=wait)
    cluster_opts.setdefault("connect_timeout", min(CONNECT_TIMEOUT, wait))
    try:
        async with Cluster.open(bootstrap, **cluster_opts) as cluster:
            with trio.move_on_after(wait):
                return await cluster.partitions_for(topic)
            unreachable = cluster.bootstrap_error()
            if unreachable is not None:
                raise unreachable
    except BaseExceptionGroup as group:
        errors = real_errors(group)
        if any(isinstance(e, UnknownTopicError) for e in errors):
            raise UserError(f"unknown topic {topic!r}: create it first") from None
        refused = [e for e in errors if isinstance(e, AuthenticationError | BootstrapError)]
        if refused:
            raise UserError(cli_names(one_line(refused[0]))) from None
        if all(isinstance(e, KafkaError | OSError) for e in errors):
            detail = "; ".join(one_line(e) for e in errors)
            raise UserError(f"cannot reach {bootstrap}: {detail}") from None
        raise
    except UnknownTopicError:
        raise UserError(f"unknown topic {topic!r}: create it first") from None
    except (AuthenticationError, BootstrapError) as exc:
        raise UserError(cli_names(one_line(exc))) from None  # says itself what is wrong
    except (KafkaError, OSError) as exc:
        raise UserError(f"cannot reach {bootstrap}: {one_line(exc)}") from None
    raise UserError(
        f"no broker of {bootstrap} answered within {wait}s; "
        "check the address and that the broker is running"
    )
