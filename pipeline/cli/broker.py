"""``python -m pipeline broker``: run the embedded tansu broker until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from pipeline.testing.broker import BrokerStartError, EmbeddedBroker, create_topics

HELP = "run the embedded tansu broker (in-memory) on 127.0.0.1 until Ctrl-C"


def _topic_spec(text: str) -> tuple[str, int]:
    name, sep, count = text.rpartition(":")
    if not sep:
        name, count = text, "1"
    if not name or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME[:PARTITIONS], got {text!r}")
    return name, int(count)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=int, default=0, help="port to listen on (default: a free one)"
    )
    parser.add_argument(
        "--advertised-port",
        type=int,
        default=None,
        help="port advertised in Metadata (e.g. a fault proxy in front); default: --port",
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
        "--log-file", default=None, help="write the broker log here (default: a temp file)"
    )


def run(args: argparse.Namespace) -> int:
    broker = EmbeddedBroker(
        port=args.port, advertised_port=args.advertised_port, log_path=args.log_file
    )
    try:
        broker.start()
    except BrokerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
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
        print("Ctrl-C to stop", flush=True)
        while not stop.is_set():
            if not broker.running:
                print(
                    f"error: broker exited with code {broker.returncode}\n{broker.log_tail()}",
                    file=sys.stderr,
                )
                return 1
            stop.wait(0.5)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        broker.stop()
        print("broker stopped", flush=True)
