"""``python -m pipeline broker``: run a broker on 127.0.0.1 until Ctrl-C.

By default the embedded tansu broker (in-memory, starts in milliseconds); with ``--kafka``
an Apache Kafka cluster (``--nodes N``, KRaft, from Maven Central jars; needs Java 17+ and,
the first time, Maven).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from pipeline.testing.broker import BrokerStartError, EmbeddedBroker, create_topics

HELP = "run a broker on 127.0.0.1 until Ctrl-C (embedded tansu; --kafka: Apache Kafka)"


def _topic_spec(text: str) -> tuple[str, int]:
    name, sep, count = text.rpartition(":")
    if not sep:
        name, count = text, "1"
    if not name or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME[:PARTITIONS], got {text!r}")
    return name, int(count)


def _config_spec(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kafka", action="store_true",
        help="run Apache Kafka (KRaft) instead of the embedded tansu broker",
    )
    parser.add_argument(
        "--nodes", type=int, default=None, metavar="N",
        help="--kafka: how many nodes (combined broker + controller; default 1)",
    )
    parser.add_argument(
        "--config", dest="configs", metavar="KEY=VALUE", type=_config_spec, action="append",
        default=[], help="--kafka: a broker setting, e.g. min.insync.replicas=2 (repeatable)",
    )
    parser.add_argument(
        "--workdir", default=None,
        help="--kafka: keep data and logs here (default: a temporary directory, removed)",
    )
    parser.add_argument(
        "--port", type=int, default=0, help="tansu: port to listen on (default: a free one)"
    )
    parser.add_argument(
        "--advertised-port",
        type=int,
        default=None,
        help="tansu: port advertised in Metadata (e.g. a fault proxy in front); default: --port",
    )
    parser.add_argument(
        "--topic",
        dest="topics",
        metavar="NAME:PARTITIONS",
        type=_topic_spec,
        action="append",
        default=[],
        help="create this topic at startup (repeatable; PARTITIONS defaults to 1)",
    )
    parser.add_argument(
        "--log-file", default=None, help="tansu: write the broker log here (default: a temp file)"
    )


def run(args: argparse.Namespace) -> int:
    if args.kafka:
        tansu_only = [flag for flag, used in (("--port", args.port),
                                              ("--advertised-port", args.advertised_port),
                                              ("--log-file", args.log_file)) if used]
        if tansu_only:
            print(f"error: {', '.join(tansu_only)} only apply to the tansu broker "
                  "(drop --kafka, or drop them)", file=sys.stderr)
            return 2
        return _run_kafka(args)
    kafka_only = [flag for flag, used in (("--nodes", args.nodes is not None),
                                          ("--config", args.configs),
                                          ("--workdir", args.workdir)) if used]
    if kafka_only:
        print(f"error: {', '.join(kafka_only)} need --kafka", file=sys.stderr)
        return 2
    return _run_tansu(args)


@contextmanager
def _until_signal() -> Iterator[threading.Event]:
    """An event set by SIGINT/SIGTERM while the block runs (previous handlers restored)."""
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(stop: threading.Event, dead: Callable[[], str | None]) -> int:
    print("Ctrl-C to stop", flush=True)
    while not stop.is_set():
        problem = dead()
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        stop.wait(0.5)
    return 0


def _run_tansu(args: argparse.Namespace) -> int:
    broker = EmbeddedBroker(
        port=args.port, advertised_port=args.advertised_port, log_path=args.log_file
    )
    try:
        broker.start()
    except BrokerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with _until_signal() as stop:
        try:
            print(f"tansu broker listening on {broker.bootstrap}", flush=True)
            if args.advertised_port is not None:
                print(f"advertised address: {broker.advertised_bootstrap}", flush=True)
            print(f"broker log: {broker.log_path}", flush=True)
            for name, partitions in args.topics:
                code = create_topics(broker.bootstrap, {name: partitions})[name]
                state = "created" if code == 0 else "exists already"
                print(f"topic {name} ({partitions} partitions): {state}", flush=True)
            print(f"bootstrap.servers={broker.bootstrap}", flush=True)

            def dead() -> str | None:
                if broker.running:
                    return None
                return f"broker exited with code {broker.returncode}\n{broker.log_tail()}"

            return _serve(stop, dead)
        finally:
            broker.stop()
            print("broker stopped", flush=True)


def _run_kafka(args: argparse.Namespace) -> int:
    from pipeline.cluster.admin_types import AdminError
    from pipeline.testing.kafka import KAFKA_VERSION, KafkaCluster, KafkaClusterError

    nodes = 1 if args.nodes is None else args.nodes
    try:
        cluster = KafkaCluster(nodes, dict(args.configs), workdir=args.workdir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"starting Apache Kafka {KAFKA_VERSION}, {nodes} node(s)...", flush=True)
    try:
        cluster.start()  # Ctrl-C here interrupts the start; it leaves nothing running
    except KafkaClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; nothing left running", file=sys.stderr)
        return 130
    with _until_signal() as stop:
        try:
            print(f"Kafka ready in {cluster.start_seconds:.1f}s; nodes {cluster.nodes}",
                  flush=True)
            for n in cluster.nodes:
                print(f"node {n} pid {cluster.pid(n)} log: {cluster.log_path(n)}", flush=True)
            for name, partitions in args.topics:
                try:
                    cluster.create_topic(name, partitions)
                    state = "created"
                except AdminError as exc:
                    state = f"not created: {exc}"
                print(f"topic {name} ({partitions} partitions): {state}", flush=True)
            print(f"bootstrap.servers={cluster.bootstrap}", flush=True)

            def dead() -> str | None:
                down = [n for n in cluster.nodes if not cluster.running(n)]
                if not down:
                    return None
                return f"node {down[0]} exited\n{cluster.log_tail(down[0])}"

            return _serve(stop, dead)
        finally:
            cluster.close()
            print("broker stopped", flush=True)
