"""Heartbeats and the poll watchdog (``pipeline/consumer/_liveness.py``), pinned on the
FakeCluster in virtual time: when heartbeats go out, what each answer does to the
membership, when a member that stopped iterating leaves, and what it says on leaving."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import trio

from pipeline.consumer import (
    Consumer,
    ConsumerConfig,
    GroupError,
    MaxPollIntervalExceededError,
    TopicPartition,
)
from pipeline.consumer._liveness import Liveness
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake.cluster import SUPPORTED_VERSIONS
from pipeline.testing.fake.faults import DROP
from pipeline.testing.fake.state import PartitionState
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_consumer, produce, take, until

ALL = frozenset({TopicPartition("t", 0), TopicPartition("t", 1)})


@pytest.fixture
async def topic(fake: FakeCluster) -> FakeCluster:
    fake.create_topic("t", 2)
    for p in range(2):
        await produce(fake, "t", [b"%d" % i for i in range(20)], partition=p)
    return fake


def heartbeat_times(fake: FakeCluster) -> list[float]:
    return [r.time for r in fake.requests_of(ApiKey.HEARTBEAT)]


def join_member_ids(fake: FakeCluster) -> list[str]:
    return [r.request.member_id for r in fake.requests_of(ApiKey.JOIN_GROUP)]


async def test_heartbeats_go_out_every_heartbeat_interval_after_the_join(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """The first heartbeat follows the SyncGroup answer by heartbeat_interval, and the
    next ones by heartbeat_interval each: not at once, not faster."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  heartbeat_interval=0.5) as consumer:
        await take(consumer, 1)
        await trio.sleep(3)
        synced = fake.requests_of(ApiKey.SYNC_GROUP)[-1].time
        times = heartbeat_times(fake)
        gaps = [b - a for a, b in zip([synced, *times], times, strict=False)]
        assert gaps == pytest.approx([0.5] * len(times))


async def test_a_failed_heartbeat_is_retried_after_retry_backoff(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A heartbeat whose connection broke is tried again after retry_backoff (the first
    retry's delay), not a whole heartbeat_interval later, and the regular pace resumes
    from that retry: the session keeps its margin."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"], heartbeat_interval=2.0,
                                  retry_backoff=0.25, retry_backoff_max=4.0) as consumer:
        await take(consumer, 1)
        dropped = len(heartbeat_times(fake))
        fake.control(ApiKey.HEARTBEAT, lambda ctx: DROP)
        await until(lambda: len(heartbeat_times(fake)) >= dropped + 3)
        times = heartbeat_times(fake)
        # the retry starts 0.25 s after the failure (reaching the broker once it
        # reconnected), and the next heartbeat is due heartbeat_interval after that start
        assert 0.25 <= times[dropped + 1] - times[dropped] < 2.0
        assert times[dropped + 2] - times[dropped] == pytest.approx(2.25)


@pytest.mark.parametrize(("code", "message"), [
    (ErrorCode.FENCED_INSTANCE_ID, "another consumer uses group_instance_id='a-1'"),
    (ErrorCode.GROUP_AUTHORIZATION_FAILED, "not authorized to use group 'g'"),
])
async def test_a_fatal_heartbeat_answer_fails_the_consumer_with_its_reason(
    topic: FakeCluster, autojump_clock: Any, code: ErrorCode, message: str,
) -> None:
    """FENCED_INSTANCE_ID and GROUP_AUTHORIZATION_FAILED on a heartbeat are final: the
    application's next iteration raises a GroupError carrying the code and saying why."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  group_instance_id="a-1") as consumer:
        await take(consumer, 1)
        fake.fail_next(ApiKey.HEARTBEAT, code)
        with pytest.raises(GroupError) as caught, trio.fail_after(10):
            await iterate_slowly(consumer)
        assert f"group 'g': heartbeat refused: {message}" in str(caught.value)
        assert caught.value.error_code == int(code)


async def test_an_unexpected_heartbeat_answer_changes_nothing(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A heartbeat error the protocol gives no meaning to here (UNKNOWN_SERVER_ERROR) is
    logged and the next heartbeat tried: the member stays in its generation, keeps its
    partitions and keeps consuming."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"]) as consumer:
        await take(consumer, 1)
        joins = len(fake.requests_of(ApiKey.JOIN_GROUP))
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.UNKNOWN_SERVER_ERROR)
        n = len(heartbeat_times(fake))
        await take(consumer, 39)
        await until(lambda: len(heartbeat_times(fake)) >= n + 3)
        assert consumer.state == "stable" and consumer.assignment() == ALL
        assert fake.group("g").generation == 1
        assert len(fake.requests_of(ApiKey.JOIN_GROUP)) == joins


@pytest.mark.parametrize(("code", "keeps_id"), [
    (ErrorCode.ILLEGAL_GENERATION, True), (ErrorCode.UNKNOWN_MEMBER_ID, False)])
async def test_a_member_reset_by_a_heartbeat_rejoins_with_the_member_id_kafka_expects(
    topic: FakeCluster, autojump_clock: Any, code: ErrorCode, keeps_id: bool,
) -> None:
    """ILLEGAL_GENERATION: the member id is still known, the member rejoins with it;
    UNKNOWN_MEMBER_ID: the id is gone, it rejoins with an empty one (KIP-394 gives it a
    new id). Either way its partitions are lost, then assigned again."""
    fake = topic
    events: list[tuple[str, frozenset[TopicPartition]]] = []

    def log(kind: str) -> Any:
        def cb(consumer: Consumer, parts: frozenset[TopicPartition]) -> None:
            events.append((kind, parts))
        return cb

    async with open_fake_consumer(fake, group_id="g", topics=["t"], on_assigned=log("assigned"),
                                  on_revoked=log("revoked"), on_lost=log("lost")) as consumer:
        await take(consumer, 1)
        member_id = consumer.group_metadata().member_id
        joins = len(fake.requests_of(ApiKey.JOIN_GROUP))
        fake.fail_next(ApiKey.HEARTBEAT, code)
        with trio.fail_after(30):
            async for _ in consumer:
                if len(fake.requests_of(ApiKey.SYNC_GROUP)) >= 2 and consumer.state == "stable":
                    break
                await trio.sleep(0.1)
        rejoined_with = join_member_ids(fake)[joins]
        assert rejoined_with == (member_id if keeps_id else "")
        assert events == [("assigned", ALL), ("lost", ALL), ("assigned", ALL)]


async def test_a_rebalance_answer_counts_as_an_answered_heartbeat(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """REBALANCE_IN_PROGRESS is an answer: while the member waits for the application to
    revoke its partitions, its heartbeats keep being answered that way, and
    statistics().since_last_heartbeat stays within a heartbeat interval."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"]) as consumer:
        await take(consumer, 1)
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS, count=None)
        await trio.sleep(5.5)  # not iterating: the eager revocation waits for us
        since = consumer.statistics().since_last_heartbeat
        assert since is not None and since <= 1.0


# ------------------------------------------------------------------ the poll watchdog

async def test_the_poll_watchdog_leaves_once_max_poll_interval_passed_since_the_last_take(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """The member leaves on the watchdog's first check (every max_poll_interval/8)
    after max_poll_interval passed without an iteration: a take at 20.25 s is seen at the
    20.5 s check, so with max_poll_interval=4 the LeaveGroup goes out at 25.0 s (24.5 s
    is not yet past the limit)."""
    fake = topic
    start = trio.current_time()
    async with open_fake_consumer(fake, group_id="g", topics=["t"], max_poll_interval=4.0,
                                  session_timeout=10.0, enable_auto_commit=False) as consumer:
        for at in range(1, 21):  # a record a second, the last at 20.25 s
            await trio.sleep_until(start + at + 0.25)
            await take(consumer, 1)
        assert trio.current_time() == start + 20.25
        await trio.sleep(10)
        leaves = fake.requests_of(ApiKey.LEAVE_GROUP)
        assert [r.time - start for r in leaves] == [25.0]


async def test_a_consumer_never_iterated_leaves_after_max_poll_interval(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """Opened and never iterated: the member joins, and leaves the group once
    max_poll_interval passed; iterating then raises MaxPollIntervalExceededError and
    the next iteration rejoins, starting from the first record."""
    fake = topic
    events: list[tuple[str, frozenset[TopicPartition]]] = []

    def log(kind: str) -> Any:
        def cb(consumer: Consumer, parts: frozenset[TopicPartition]) -> None:
            events.append((kind, parts))
        return cb

    async with open_fake_consumer(fake, group_id="g", topics=["t"], max_poll_interval=4.0,
                                  on_assigned=log("assigned"), on_lost=log("lost"),
                                  on_revoked=log("revoked")) as consumer:
        await trio.sleep(10)
        assert len(fake.requests_of(ApiKey.LEAVE_GROUP)) == 1
        assert consumer.state == "unjoined" and len(fake.group("g").members) == 0
        with pytest.raises(MaxPollIntervalExceededError):
            await consumer.__anext__()
        record = await consumer.__anext__()
        assert record.offset == 0 and consumer.state == "stable"
        assert events == [("assigned", ALL)]


@pytest.mark.parametrize("instance", [None, "a-1"])
async def test_after_a_poll_timeout_a_static_member_keeps_its_id_a_dynamic_one_does_not(
    topic: FakeCluster, autojump_clock: Any, instance: str | None,
) -> None:
    """A dynamic member that left on a poll timeout rejoins as a new member (empty
    member id: its old id was removed by its LeaveGroup); a static member sent no
    LeaveGroup and rejoins with its member id."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"], max_poll_interval=4.0,
                                  group_instance_id=instance) as consumer:
        await take(consumer, 1)
        member_id = consumer.group_metadata().member_id
        joins = len(fake.requests_of(ApiKey.JOIN_GROUP))
        await trio.sleep(10)
        with pytest.raises(MaxPollIntervalExceededError):
            await consumer.__anext__()
        await take(consumer, 1)
        assert len(fake.requests_of(ApiKey.LEAVE_GROUP)) == (0 if instance else 1)
        assert join_member_ids(fake)[joins] == (member_id if instance else "")


@pytest.mark.parametrize("version", [2, 3, 4, 5])
async def test_leave_group_at_every_version_names_the_member(
    autojump_clock: Any, nursery: trio.Nursery, version: int,
) -> None:
    """Closing a dynamic member sends LeaveGroup in the form its version has: v0-2
    the member id at top level, v3+ a members list, v5+ with the reason."""
    versions = {**SUPPORTED_VERSIONS, ApiKey.LEAVE_GROUP: (0, version)}
    fake = FakeCluster(brokers=1, seed=7, auto_create_topics=False, api_versions=versions)
    await nursery.start(fake.run)
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"x"])
    async with open_fake_consumer(fake, group_id="g", topics=["t"]) as consumer:
        await take(consumer, 1)
        member_id = consumer.group_metadata().member_id
    (leave,) = fake.requests_of(ApiKey.LEAVE_GROUP)
    assert leave.api_version == version
    if version <= 2:
        assert leave.request.member_id == member_id
    else:
        assert [(m.member_id, m.reason) for m in leave.request.members] == [
            (member_id, "the consumer is closing" if version >= 5 else None)]
    assert len(fake.group("g").members) == 0


async def iterate_slowly(consumer: Any) -> None:
    """Iterate, 0.1 s per record, until the iteration raises."""
    async for _ in consumer:
        await trio.sleep(0.1)


async def test_a_heartbeat_answer_in_flight_when_the_member_left_does_not_rejoin_it(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A heartbeat answered REBALANCE_IN_PROGRESS after the member already left on a
    poll timeout belongs to the membership that is over: the member stays out of the
    group (no JoinGroup) until the application iterates again, which raises
    MaxPollIntervalExceededError once and rejoins."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"], max_poll_interval=4.0,
                                  group_instance_id="a-1",
                                  partition_assignment_strategy=["cooperative-sticky"]
                                  ) as consumer:
        await take(consumer, 1)
        joins = len(fake.requests_of(ApiKey.JOIN_GROUP))
        await trio.sleep(2.25)
        # the next heartbeat is answered 3 s late, across the poll timeout
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        fake.delay_responses(3.0, api_key=ApiKey.HEARTBEAT, count=1)
        sent = len(heartbeat_times(fake))
        await until(lambda: consumer.state == "unjoined", within=5)
        left_at = trio.current_time()
        assert len(heartbeat_times(fake)) == sent + 1  # asked before leaving ...
        await trio.sleep(20)  # ... answered after
        assert heartbeat_times(fake)[sent] < left_at
        assert len(fake.requests_of(ApiKey.JOIN_GROUP)) == joins
        with pytest.raises(MaxPollIntervalExceededError):
            await consumer.__anext__()
        await take(consumer, 1)
        assert len(fake.requests_of(ApiKey.JOIN_GROUP)) > joins


async def test_the_rejoin_after_a_poll_timeout_starts_when_the_error_is_raised(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """The iteration that raises MaxPollIntervalExceededError starts the rejoin: the
    JoinGroup goes out while the application still handles the error, and the
    partitions are there when it iterates again (on_lost once, for the partitions the
    member had when it left)."""
    fake = topic
    events: list[tuple[str, frozenset[TopicPartition]]] = []

    def log(kind: str) -> Any:
        def cb(consumer: Consumer, parts: frozenset[TopicPartition]) -> None:
            events.append((kind, parts))
        return cb

    async with open_fake_consumer(fake, group_id="g", topics=["t"], max_poll_interval=4.0,
                                  on_assigned=log("assigned"), on_lost=log("lost"),
                                  on_revoked=log("revoked")) as consumer:
        await take(consumer, 1)
        await trio.sleep(10)
        joins = len(fake.requests_of(ApiKey.JOIN_GROUP))
        with pytest.raises(MaxPollIntervalExceededError):
            await consumer.__anext__()
        raised_at = trio.current_time()
        await trio.sleep(3)  # handling the error, not iterating
        rejoins = fake.requests_of(ApiKey.JOIN_GROUP)[joins:]
        assert rejoins and rejoins[0].time == raised_at
        assert len(fake.group("g").members) == 1
        await take(consumer, 1)
        assert events == [("assigned", ALL), ("lost", ALL), ("assigned", ALL)]


async def test_only_the_current_leader_rebalances_on_a_partition_count_change(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """A member that led the group once and follows now leaves partition counts to the
    leader: the counts it assigned from back then are not compared with metadata (that
    would rebalance the group at every heartbeat, the follower never assigning anew).
    Once the leader rebalanced for a grown topic the group stays in its generation."""
    fake.create_topic("t", 2)
    for p in range(2):
        await produce(fake, "t", [b"x"], partition=p)
    options: dict[str, Any] = dict(group_id="g", topics=["t"], metadata_max_age=2.0)
    async with open_fake_consumer(fake, max_poll_interval=4.0, **options) as a, \
            open_fake_consumer(fake, **options) as b, trio.open_nursery() as nursery:
        await take(a, 1)  # a leads, assigning t's two partitions
        nursery.start_soon(iterate_slowly, b)
        # a stops iterating: it leaves on a poll timeout and b leads from now on
        await until(lambda: a.state == "unjoined" and b.state == "stable")
        fake.state.topics["t"].partitions.append(  # a partition added (CreatePartitions)
            PartitionState("t", 2, leader=0, leader_epoch=0, replicas=(0,)))
        await until(lambda: len(b.assignment()) == 3)
        with pytest.raises(MaxPollIntervalExceededError):
            await a.__anext__()
        nursery.start_soon(iterate_slowly, a)
        await until(lambda: a.state == b.state == "stable" and len(fake.group("g").members) == 2)
        generation = fake.group("g").generation
        await trio.sleep(30)
        assert fake.group("g").generation == generation
        assert a.group_metadata().member_id != fake.group("g").leader_id
        nursery.cancel_scope.cancel()


class _MetadataCache:
    """The cluster client as ``Liveness._check_metadata`` uses it: cached partition
    counts, and the topics it was asked to refresh, with when."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.refreshes: list[tuple[float, list[str]]] = []

    def partition_count_nowait(self, topic: str) -> int | None:
        return self.counts.get(topic)

    def request_refresh(self, topics: list[str]) -> None:
        self.refreshes.append((trio.current_time(), list(topics)))


class _Member(Liveness):
    """A group member reduced to what the metadata check reads."""

    def __init__(self, assigned: dict[str, int | None], seen: dict[str, int], *,
                 leads: bool) -> None:
        self.cache = _MetadataCache(seen)
        self._cluster = cast(Any, self.cache)
        self._config = ConsumerConfig(group_id="g", metadata_max_age=4.0)
        self.member_id = "m-1"
        self.leader_id = "m-1" if leads else "m-2"
        self._assigned_counts = assigned
        self._missing_checked = -math.inf
        self.rejoins: list[str] = []

    def request_rejoin(self, reason: str) -> None:
        self.rejoins.append(reason)


@pytest.mark.parametrize(("assigned", "seen", "leads", "rejoins"), [
    ({"t": 2}, {"t": 2}, True, []),
    ({"t": 2}, {"t": 3}, True, ["topic 't' has 3 partitions, not 2"]),
    ({"t": None}, {"t": 1}, True, ["topic 't' has 1 partitions, not None"]),
    ({"t": 2}, {}, True, []),  # not in the cache (yet): nothing to compare
    ({"t": 2}, {"t": 3}, False, []),  # counts kept from when it led: not its business
    ({}, {"t": 3}, True, []),
])
async def test_which_partition_counts_make_a_member_rebalance(
    autojump_clock: Any, assigned: dict[str, int | None], seen: dict[str, int], leads: bool,
    rejoins: list[str],
) -> None:
    """Only the leader compares the counts it assigned from with the cached metadata,
    and rejoins when a topic's count differs (or a missing topic appeared)."""
    member = _Member(assigned, seen, leads=leads)
    member._check_metadata()
    assert member.rejoins == rejoins


async def test_a_leader_asks_about_a_missing_topic_once_per_metadata_max_age(
    autojump_clock: Any,
) -> None:
    """A subscribed topic that did not exist at the assignment is asked about (a
    metadata refresh naming it) at the first check and then once metadata_max_age
    (4 s) has passed since the last time, not at every heartbeat; a follower never
    asks."""
    member = _Member({"t": 2, "later": None}, {"t": 2}, leads=True)
    for _ in range(13):  # a check per heartbeat, every second from 0 s to 12 s
        member._check_metadata()
        await trio.sleep(1.0)
    assert member.cache.refreshes == [(0.0, ["later"]), (4.0, ["later"]),
                                      (8.0, ["later"]), (12.0, ["later"])]
    follower = _Member({"later": None}, {}, leads=False)
    follower._check_metadata()
    assert follower.cache.refreshes == []
