"""Partition producer rules found unpinned by ``make mutants`` (docs/testing.md, "Mutation testing").

Deterministic (FakeCluster, autojump_clock, no jitter); each docstring walks
through the schedule it needs, and the virtual times the protocol fixes are
asserted exactly.
"""

from __future__ import annotations

from typing import Any

import trio

from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_guards import exact, offsets
from .test_sarama_suite import outcomes


async def test_a_leaderless_partition_waits_without_spending_retries(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Guard (``_attach``): a partition producer attaches only to a known
    leader. While its partition has none (leader -1), it asks for fresh metadata
    and waits, spending no retry: nothing was sent.

    Schedule (retries=0, backoff 0.125 s): broker 1, the only replica of t[0],
    stops without an election and the producer's metadata says so (a refresh
    completing at t0). t0: m is sent: no leader, it waits; metadata rounds run
    every 0.125 s while the partition is leaderless. t0 + 1.0625: broker 1 is
    back, leader again; the round at t0 + 1.125 finds it and m is written then.
    Attaching to "leader" -1 sent m to a bootstrap connection (broker 0), which
    answered NOT_LEADER_OR_FOLLOWER: with retries=0, m failed."""
    fake.create_topic("t", 1, leaders=[1])
    async with open_fake_producer(fake, **exact(retries=0, idempotent=False)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.stop_broker(1, elect=False)
        await producer._core.cluster.refresh(force=True)
        t0 = trio.current_time()
        m = await producer.send("t", b"m", partition=0)
        await trio.sleep(1.0625)
        fake.restart_broker(1)
        results = await outcomes([m])
        assert trio.current_time() == t0 + 1.125
    assert offsets(results) == [1]
    assert values_in_log(fake, "t", 0) == [b"warm", b"m"]


async def test_a_message_that_never_found_a_leader_says_so_when_it_times_out(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A message held by its partition producer because the partition has no
    leader, and no broker error was ever seen for it, times out with the reason
    that applies: no usable leader (not "never acknowledged", which would send
    the user looking for a broker error that did not happen).

    Schedule (delivery_timeout 2 s, request_timeout 1 s): t[0] on broker 0,
    t[1] on broker 1 (its only replica). Broker 1 stops without an election
    before anything was sent to t[1], and the producer knows it. t0: m is sent
    to t[1] and waits for a leader; at t0 + 2 exactly it fails with a
    DeliveryTimeoutError naming the partition and the missing leader."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 2, leaders=[0, 1])
    options = exact(idempotent=False, delivery_timeout=2.0, request_timeout=1.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.stop_broker(1, elect=False)
        await producer._core.cluster.refresh(force=True)
        t0 = trio.current_time()
        (result,) = await outcomes([await producer.send("t", b"m", partition=1)])
        assert trio.current_time() == t0 + 2.0
    assert isinstance(result.cause, DeliveryTimeoutError)
    assert "t[1] had no usable leader" in str(result.cause)
    assert "delivery_timeout=2.0s" in str(result.cause)


async def test_no_leader_in_the_cache_backs_off_even_when_the_refresh_is_quick(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Backoff (``_attach``): finding no leader in its metadata, a partition
    producer asks for a refresh and also backs off for ``retry_backoff``
    before it tries again, even when the refresh is back at once (Java's
    ``retry.backoff.ms`` before re-querying a leaderless partition). The wait
    is the one a retry level 1 gets: ``backoff(max(hwm, 1))``.

    Schedule (backoff 0.125 s growing to 1 s): t[0] on broker 0, t[1] on
    broker 1. Broker 1 stops without an election; a refresh records t[1] as
    leaderless. Broker 1 restarts at once, but nothing asks for metadata, so
    the producer's view keeps leader -1. t0 (5 s later, no refresh round
    pending): m is sent to t[1]: no leader in the view, so a refresh runs at
    once and finds broker 1, and m is written at t0 + 0.125 (the backoff),
    not at t0 (no backoff) or t0 + 0.25 (the backoff of level 2)."""
    fake.create_topic("t", 2, leaders=[0, 1])
    options = exact(idempotent=False, retry_backoff=0.125, retry_backoff_max=1.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.stop_broker(1, elect=False)
        await producer._core.cluster.refresh(force=True)
        assert producer._core.cluster.metadata.leader_for("t", 1) in (None, -1)
        fake.restart_broker(1)
        await trio.sleep(5.0)
        t0 = trio.current_time()
        (result,) = await outcomes([await producer.send("t", b"m", partition=1)])
        assert trio.current_time() == t0 + 0.125
    assert offsets([result]) == [0]
    assert values_in_log(fake, "t", 1) == [b"m"]
