"""The group coordinator's rules (``pipeline/consumer/_coordinator.py``): how it is found,
retried, timed out, forgotten and closed, on the FakeCluster and virtual time.

Most tests drive a ``Coordinator`` directly (a ``Cluster`` on the fake, the consumer's
config): the rules are about one connection and its timers, which a whole consumer
would only show through a rebalance's timing. The ones a user sees through the consumer
(old brokers' FindCoordinator versions, ``statistics().coordinator_moves``) run one.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from pipeline.cluster.errors import RequestTimedOutError
from pipeline.cluster.pool import Cluster
from pipeline.consumer import TopicPartition
from pipeline.consumer._config import make_config
from pipeline.consumer._coordinator import Coordinator
from pipeline.consumer._errors import ConsumerClosedError, GroupError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import find_coordinator as fc
from pipeline.protocol.messages.heartbeat import HeartbeatRequest, HeartbeatResponse
from pipeline.testing.fake.cluster import SUPPORTED_VERSIONS
from pipeline.testing.fake.coordinators import GROUP
from pipeline.testing.fake.faults import ControlContext
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import consumer_options, open_fake_consumer, produce, take, until


@asynccontextmanager
async def coordinator_of(fake: FakeCluster, **overrides: Any) -> AsyncIterator[Coordinator]:
    """A ``Coordinator`` of group ``g`` on ``fake``, configured as the consumer tests are."""
    options = consumer_options(group_id="g", connector=fake.connector, **overrides)
    config = make_config(None, options)
    async with Cluster.open(fake.bootstrap, config.cluster) as cluster, \
            trio.open_nursery() as nursery:
        coordinator = Coordinator(cluster, config, nursery)
        try:
            yield coordinator
        finally:
            await coordinator.aclose()
            nursery.cancel_scope.cancel()


def heartbeat(version: int) -> HeartbeatRequest:
    return HeartbeatRequest(group_id="g", generation_id=-1, member_id="")


def lookup_times(fake: FakeCluster) -> list[float]:
    return [r.time for r in fake.requests_of(ApiKey.FIND_COORDINATOR)]


# ------------------------------------------------------------------ lookup


@pytest.mark.parametrize("find_coordinator_max", [3, 4, 6])
async def test_the_group_is_found_on_brokers_of_every_find_coordinator_version(
    find_coordinator_max: int, autojump_clock: Any,
) -> None:
    """FindCoordinator v0-3 carries one ``key`` and answers one coordinator; v4+ carries
    ``coordinator_keys`` and answers a list (KIP-699). A consumer joins its group and
    reads whichever a broker serves (v3: Kafka 2.x brokers; v4: the first batched one)."""
    versions = {**SUPPORTED_VERSIONS, ApiKey.FIND_COORDINATOR: (0, find_coordinator_max)}
    async with FakeCluster.serve(brokers=3, seed=7, auto_create_topics=False,
                                 api_versions=versions) as fake:
        fake.create_topic("t", 1)
        await produce(fake, "t", [b"a", b"b"])
        async with open_fake_consumer(fake, topics=["t"], group_id="g") as consumer:
            assert [r.value for r in await take(consumer, 2)] == [b"a", b"b"]
            assert consumer.assignment() == {TopicPartition("t", 0)}
            assert consumer.statistics().coordinator == fake.coordinator("g", GROUP)
        (lookup, *_) = fake.requests_of(ApiKey.FIND_COORDINATOR)
        assert lookup.api_version == find_coordinator_max
        if find_coordinator_max >= 4:
            assert lookup.request.coordinator_keys == ("g",)
        else:
            assert lookup.request.key == "g"


async def test_no_coordinator_yet_is_retried_on_the_backoff_schedule(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """COORDINATOR_NOT_AVAILABLE (the offsets topic is still loading) is retriable: the
    lookup is retried after ``retry_backoff`` doubling up to ``retry_backoff_max``, its
    jitter drawn from the configured ``rng`` (so a seeded rng gives the same schedule),
    until the coordinator answers."""
    fake.fail_next(ApiKey.FIND_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE, count=3)
    async with coordinator_of(fake, retry_backoff=0.1, retry_backoff_max=10.0,
                              retry_backoff_jitter=0.2) as coordinator:
        conn = await coordinator.connection()
        assert conn.node_id == coordinator.node_id == fake.coordinator("g", GROUP)
    times = lookup_times(fake)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # HalfRandom draws 0.5: each jittered delay is exactly its base
    assert gaps == pytest.approx([0.1, 0.2, 0.4])


@pytest.mark.parametrize("broker_message", ["User:alice may not describe group g", None])
async def test_a_refused_lookup_raises_group_error_with_the_brokers_reason(
    fake: FakeCluster, autojump_clock: Any, broker_message: str | None,
) -> None:
    """A non-retriable FindCoordinator error (GROUP_AUTHORIZATION_FAILED) is not retried:
    ``connection()`` raises ``GroupError`` with the code and the broker's error message,
    or the error's description when the broker sent none."""
    def refuse(ctx: ControlContext) -> fc.FindCoordinatorResponse:
        code = int(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        if ctx.api_version >= 4:
            return fc.FindCoordinatorResponse(coordinators=(fc.Coordinator(
                key="g", node_id=-1, host="", port=-1, error_code=code,
                error_message=broker_message),))
        return fc.FindCoordinatorResponse(error_code=code, error_message=broker_message,
                                          node_id=-1, host="", port=-1)

    fake.control(ApiKey.FIND_COORDINATOR, refuse, sticky=True)
    async with coordinator_of(fake) as coordinator:
        with trio.fail_after(60), pytest.raises(GroupError) as raised:
            await coordinator.connection()
    reason = broker_message or ErrorCode.GROUP_AUTHORIZATION_FAILED.description
    assert str(raised.value) == (
        f"group 'g': FindCoordinator refused: GROUP_AUTHORIZATION_FAILED ({reason})")
    assert raised.value.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert len(fake.requests_of(ApiKey.FIND_COORDINATOR)) == 1


async def test_coordinator_moves_counts_only_lookups_that_found_another_broker(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """``statistics().coordinator_moves`` counts the times the group's coordinator was
    found on a different broker: reconnecting to the same coordinator (a dropped
    connection) is not a move; the coordinator moving to another broker is one."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"])
    async with open_fake_consumer(fake, topics=["t"], group_id="g") as consumer:
        await take(consumer, 1)
        first = fake.coordinator("g", GROUP)
        assert consumer.statistics().coordinator == first
        assert consumer.statistics().coordinator_moves == 0

        def heartbeats_to(node: int) -> int:
            return len(fake.requests_of(ApiKey.HEARTBEAT, node_id=node))

        lookups = len(fake.requests_of(ApiKey.FIND_COORDINATOR))
        fake.drop_connections(first)
        before = heartbeats_to(first)
        await until(lambda: heartbeats_to(first) > before + 1)
        assert len(fake.requests_of(ApiKey.FIND_COORDINATOR)) > lookups  # found it again
        assert consumer.statistics().coordinator == first
        assert consumer.statistics().coordinator_moves == 0

        second = fake.move_coordinator("g", key_type=GROUP)
        await until(lambda: heartbeats_to(second) > 1)
        assert consumer.statistics().coordinator == second
        assert consumer.statistics().coordinator_moves == 1


# ------------------------------------------------------------------ forget / close


async def test_forget_closes_the_coordinator_connection_and_the_next_request_finds_it_again(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """``forget()`` (a NOT_COORDINATOR answer) closes the coordinator's connection (no
    socket to an ex-coordinator is left open) and the next request looks the coordinator
    up again on a new connection. Forgetting twice, or before any connection, is a
    no-op: two requests may both see NOT_COORDINATOR."""
    async with coordinator_of(fake) as coordinator:
        coordinator.forget()  # nothing to forget yet
        old = await coordinator.connection()
        assert not old.closed
        coordinator.forget()
        coordinator.forget()
        await until(lambda: old.closed, within=1.0)
        new = await coordinator.connection()
        assert new is not old and not new.closed
        assert len(lookup_times(fake)) == 2


async def test_aclose_closes_the_coordinator_connection(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """Closing the coordinator closes its connection before returning (the broker sees
    the member's connection end when the consumer closes); closing again is a no-op."""
    async with coordinator_of(fake) as coordinator:
        conn = await coordinator.connection()
        await coordinator.aclose()
        assert conn.closed
        await coordinator.aclose()


async def test_an_ended_coordinator_fails_commits_and_offset_fetches_at_once(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """Once the nursery of its connections has ended (``end``), no connection can start:
    a commit and an offset fetch raise ``ConsumerClosedError`` at once, not retried on
    the backoff schedule as a lost connection is, and nothing reaches the broker."""
    from pipeline.consumer._commits import fetch_committed, send_commit
    from pipeline.consumer._types import OffsetAndMetadata
    from pipeline.util.backoff import Backoff

    async with coordinator_of(fake) as coordinator:
        await coordinator.connection()
        coordinator.end()
        sent = len(fake.requests)
        start = trio.current_time()
        backoff = Backoff(0.1, 1.0, jitter=0.0, rng=random.Random(1))
        tp = TopicPartition("t", 0)
        with trio.fail_after(10), pytest.raises(
                ConsumerClosedError, match="group 'g': the consumer's group tasks"):
            await send_commit(coordinator, backoff, "g", 1, "m", None,
                              {tp: OffsetAndMetadata(5)})
        with trio.fail_after(10), pytest.raises(ConsumerClosedError, match="cannot be reached"):
            await fetch_committed(coordinator, backoff, "g", frozenset({tp}))
        assert trio.current_time() == start
        assert len(fake.requests) == sent


# ------------------------------------------------------------------ timeouts


async def test_a_request_unanswered_within_request_timeout_fails_and_the_coordinator_is_forgotten(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """A Heartbeat, commit or offset fetch waits at most ``request_timeout`` (5 s here,
    not the connection's rebalance-long timeout): then it fails with
    RequestTimedOutError, the connection (whose answers are now stuck behind the lost
    one) is closed and the next request finds the coordinator again, as Java marks the
    coordinator unknown on a timeout."""
    async with coordinator_of(fake) as coordinator:
        conn = await coordinator.connection()
        fake.delay_responses(60.0, api_key=ApiKey.HEARTBEAT, count=1)
        start = trio.current_time()
        with pytest.raises(RequestTimedOutError, match=r"request_timeout=5\.0s"):
            await coordinator.request(ApiKey.HEARTBEAT, heartbeat)
        assert trio.current_time() - start == pytest.approx(5.0)
        await until(lambda: conn.closed, within=1.0)
        response = await coordinator.request(ApiKey.HEARTBEAT, heartbeat)
        assert isinstance(response, HeartbeatResponse)
        assert len(lookup_times(fake)) == 2


async def test_a_long_request_waits_up_to_the_rebalance_timeout_plus_five_seconds(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """JoinGroup / SyncGroup (``long=True``) may be held by the coordinator for the
    rebalance timeout (``max_poll_interval``, 30 s here): they wait up to it plus 5 s
    (Java's ``rebalance.timeout.ms + 5000``), not ``request_timeout``; only past that
    does the connection time out."""
    async with coordinator_of(fake) as coordinator:
        fake.delay_responses(34.0, api_key=ApiKey.HEARTBEAT, count=1)
        start = trio.current_time()
        response = await coordinator.request(ApiKey.HEARTBEAT, heartbeat, long=True)
        assert isinstance(response, HeartbeatResponse)
        assert trio.current_time() - start == pytest.approx(34.0)

        fake.delay_responses(60.0, api_key=ApiKey.HEARTBEAT, count=1)
        start = trio.current_time()
        with pytest.raises(RequestTimedOutError):
            await coordinator.request(ApiKey.HEARTBEAT, heartbeat, long=True)
        assert trio.current_time() - start == pytest.approx(35.0)
