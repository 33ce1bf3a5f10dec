"""Producer scenarios against the in-memory FakeCluster, on autojump_clock."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio

from pipeline.producer._api import Producer, open_producer
from pipeline.producer._message import ProducerMessage
from pipeline.testing.fake_cluster import FakeCluster

# The idempotence default for open_fake_producer: the sarama suite and the
# regressions run in both modes (see the autouse fixture in those modules).
MODE: dict[str, Any] = {"idempotent": False}


@pytest.fixture(params=[False, True], ids=["plain", "idempotent"])
def both_modes(request: pytest.FixtureRequest) -> Any:
    MODE["idempotent"] = request.param
    yield request.param
    MODE["idempotent"] = False


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=3, seed=7, auto_create_topics=False)
    await nursery.start(cluster.run)
    return cluster


class HalfRandom(random.Random):
    """A seeded ``random.Random`` whose ``random()`` is always 0.5: every jittered
    backoff (the cluster's metadata and reconnect backoffs) is then exactly its
    base value, so scenario tests can assert exact virtual times. Choices
    (``randrange``, ``choice``) still come from the seeded generator."""

    def random(self) -> float:
        return 0.5


def producer_options(**overrides: Any) -> dict[str, Any]:
    options: dict[str, Any] = dict(
        acks="all",
        idempotent=MODE["idempotent"],
        linger=0.0,
        # Durations are dyadic (exact in binary floating point) and nothing is
        # jittered, so the virtual times a schedule implies are exact sums.
        retry_backoff=0.125,
        retry_backoff_max=0.125,
        retry_backoff_jitter=0,
        request_timeout=5.0,
        delivery_timeout=60.0,
        close_timeout=10.0,
        rng=HalfRandom(1),
        timestamp_ms=lambda: 1_700_000_000_000,
    )
    options.update(overrides)
    return options


# [producer, block left normally] for every producer a test opened with
# open_fake_producer: the autouse fixture below checks them when the test ends.
_OPENED: list[list[Any]] = []


@asynccontextmanager
async def _tracked(manager: Any) -> AsyncIterator[Producer]:
    async with manager as producer:
        entry: list[Any] = [producer, False]
        _OPENED.append(entry)
        yield producer
    entry[1] = True  # the block was left normally and the shutdown completed


def open_fake_producer(fake: FakeCluster, **overrides: Any) -> Any:
    connector = overrides.pop("connector", fake.connector)
    return _tracked(
        open_producer(fake.bootstrap, connector=connector, **producer_options(**overrides))
    )


def check_producer_statistics(producer: Producer, closed: bool) -> None:
    """What every scenario must end with (docs/architecture.md, Invariants): no
    message settled twice and, once the producer is closed, every accepted
    message settled exactly once and every buffer byte released."""
    stats = producer.statistics()
    assert stats.double_settles == 0, stats
    if closed:
        assert stats.outstanding == 0, stats
        assert stats.succeeded + stats.failed == stats.accepted, stats
        assert stats.buffered_bytes == 0, stats


@pytest.fixture(autouse=True)
def every_producer_settles_each_message_once() -> Iterator[None]:
    """Autouse: checks every producer the test opened with open_fake_producer
    (so no scenario can forget to). A failure here shows as a teardown error."""
    _OPENED.clear()
    yield
    opened = list(_OPENED)
    _OPENED.clear()
    for producer, closed in opened:
        check_producer_statistics(producer, closed=closed)


async def leaderless_after_warm(fake: FakeCluster, producer: Producer, *,
                                 warm_partition: int) -> float:
    """The common start of the leaderless-partition schedules: one message
    acknowledged on ``warm_partition`` (connections and metadata warm), then
    broker 2 stops without an election and the producer's metadata is
    refreshed, so the partitions broker 2 led have no leader. Returns that
    instant (the schedules' t0)."""
    await producer.send_and_wait("t", b"warm", partition=warm_partition)
    fake.stop_broker(2, elect=False)
    await producer._core.cluster.refresh(force=True)
    return trio.current_time()


def values_in_log(fake: FakeCluster, topic: str, partition: int) -> list[bytes | None]:
    return [entry.record.value for entry in fake.log(topic, partition)]


def assert_one_outcome(producer: Producer, msgs: list[ProducerMessage]) -> None:
    stats = producer.statistics()
    assert stats.double_settles == 0
    assert all(m.done() for m in msgs)


class _SameInstantSteps(trio.abc.Instrument):
    """Counts task steps at one virtual instant; too many means a task spins
    (on autojump_clock a spinning task also stops virtual time, so the test
    would hang instead of failing): cancel the guarded scope."""

    def __init__(self, scope: trio.CancelScope, limit: int) -> None:
        self.scope, self.limit = scope, limit
        self.instant, self.steps, self.tripped = -1.0, 0, False

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        now = trio.current_time()
        if now != self.instant:
            self.instant, self.steps = now, 0
        self.steps += 1
        if self.steps > self.limit and not self.tripped:
            self.tripped = True
            self.scope.cancel()


@contextmanager
def livelock_guard(limit: int = 20_000) -> Iterator[None]:
    """Fail (instead of hanging) if some task keeps running without virtual time
    advancing: more than ``limit`` task steps at one instant."""
    with trio.CancelScope() as scope:
        instrument = _SameInstantSteps(scope, limit)
        trio.lowlevel.add_instrument(instrument)
        try:
            yield
        finally:
            trio.lowlevel.remove_instrument(instrument)
    assert not instrument.tripped, (
        f"livelock: over {limit} task steps at virtual time {instrument.instant}"
    )
