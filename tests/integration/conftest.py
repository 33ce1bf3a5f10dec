"""Integration fixtures (real broker). Everything here is marked ``integration``.

Every test that uses the session broker runs twice, ``[tansu]`` and ``[kafka]`` (Apache
Kafka, marked ``kafka``): ``kafka_bootstrap``, ``new_topic``, ``broker_kind`` and
``embedded_broker`` are overridden here with ``any_broker``'s (tests/conftest.py).

* ``broker_factory(**kwargs)``: a private EmbeddedBroker for tests that must not share the
  session broker (own port layout, fault proxy in front, log assertions); stopped at teardown.
* ``consume``: read records back with confluent-kafka via ``assign()`` (never group
  subscribe: a tansu group join takes ~23 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pipeline.testing.broker import EmbeddedBroker
from pipeline.testing.choose_broker import BrokerKind

BrokerFactory = Callable[..., EmbeddedBroker]
Consume = Callable[..., list[Any]]
NewTopic = Callable[..., str]
AnyBroker = Any  # tests/conftest.py's AnyBroker (the root conftest is no importable package)


@pytest.fixture
def kafka_bootstrap(any_broker: AnyBroker) -> str:
    return any_broker.bootstrap


@pytest.fixture
def broker_kind(any_broker: AnyBroker) -> BrokerKind:
    return any_broker.kind


@pytest.fixture
def embedded_broker(any_broker: AnyBroker) -> EmbeddedBroker | None:
    return any_broker.embedded


@pytest.fixture
def new_topic(any_new_topic: NewTopic) -> NewTopic:
    return any_new_topic


@pytest.fixture
def broker_factory() -> Iterator[BrokerFactory]:
    started: list[EmbeddedBroker] = []

    def _start(**kwargs: Any) -> EmbeddedBroker:
        broker = EmbeddedBroker(**kwargs)
        started.append(broker)
        return broker.start()

    yield _start
    for broker in reversed(started):
        broker.stop()


@pytest.fixture
def consume() -> Consume:
    """``consume(bootstrap, topic, partitions, expected, timeout=20.0)``: the first
    ``expected`` messages of ``topic`` (partitions ``range(partitions)`` from offset 0), as
    confluent_kafka ``Message`` objects in per-partition offset order. Blocking; from an
    async test call it through ``trio.to_thread.run_sync``."""
    confluent_kafka = pytest.importorskip("confluent_kafka")

    def _consume(
        bootstrap: str,
        topic: str,
        partitions: int | list[int],
        expected: int,
        timeout: float = 20.0,
    ) -> list[Any]:
        parts = list(range(partitions)) if isinstance(partitions, int) else partitions
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"pipeline-tests-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "check.crcs": True,
                "socket.timeout.ms": 5000,
            }
        )
        try:
            consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in parts])
            out: list[Any] = []
            deadline = time.monotonic() + timeout
            while len(out) < expected and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=expected - len(out), timeout=0.5):
                    if msg.error() is not None:
                        raise AssertionError(f"consumer error: {msg.error()}")
                    out.append(msg)
            out.sort(key=lambda m: (m.partition(), m.offset()))
            return out
        finally:
            consumer.close()

    return _consume
