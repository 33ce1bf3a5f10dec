"""The classic group member's rules (``_member.py``), pinned on the fake cluster in
virtual time: what it sends in JoinGroup / SyncGroup, how it answers each refusal,
auto-commit's pace, and the identity it reports between generations."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from pipeline.consumer import (
    CommitFailedError,
    ConsumedRecord,
    Consumer,
    ConsumerError,
    GroupError,
    RebalanceInProgressError,
    TopicPartition,
)
from pipeline.protocol.api import ApiKey
from pipeline.protocol.consumer_protocol import ConsumerProtocolSubscription
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.heartbeat import HeartbeatResponse
from pipeline.testing.fake.faults import ControlContext
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import HalfRandom, open_fake_consumer, produce, until

GROUP_APIS = (ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
              ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT)
ALL4 = frozenset(TopicPartition("t", p) for p in range(4))


@dataclass
class Reader:
    """A consumer iterated by a task: the records it got and the error that stopped it."""

    consumer: Consumer
    records: list[ConsumedRecord] = field(default_factory=list)
    error: BaseException | None = None


@asynccontextmanager
async def reading(fake: FakeCluster, **options: Any) -> AsyncIterator[Reader]:
    """A member of group ``g`` reading ``t`` (auto-commit off unless given) for the block."""
    options.setdefault("group_id", "g")
    options.setdefault("topics", ["t"])
    options.setdefault("enable_auto_commit", False)
    async with open_fake_consumer(fake, **options) as consumer, trio.open_nursery() as nursery:
        reader = Reader(consumer)

        async def run() -> None:
            try:
                async for record in consumer:
                    reader.records.append(record)
            except Exception as exc:  # the test looks at it
                reader.error = exc

        nursery.start_soon(run)
        yield reader
        nursery.cancel_scope.cancel()


@pytest.fixture
async def topic(fake: FakeCluster) -> FakeCluster:
    fake.create_topic("t", 4)
    for p in range(4):
        await produce(fake, "t", [f"{p}-{i}".encode() for i in range(5)], partition=p)
    return fake


def joins(fake: FakeCluster) -> list[Any]:
    return fake.requests_of(ApiKey.JOIN_GROUP)


def group_requests(fake: FakeCluster) -> list[Any]:
    return [q for q in fake.requests if q.api_key in GROUP_APIS]


def stable(fake: FakeCluster, reader: Reader, generation: int) -> bool:
    return ("g" in fake.group_coordinator.groups and fake.group("g").generation == generation and fake.group("g").state == "Stable"
            and reader.consumer.state == "stable")


# ------------------------------------------------------------------ requests


async def test_join_and_sync_requests_carry_the_configured_timeouts_and_protocol(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """JoinGroup states session_timeout and max_poll_interval (the rebalance timeout) in
    milliseconds; SyncGroup v5+ names the protocol type and the chosen assignor, which
    the coordinator checks against the group's (KIP-559)."""
    fake = topic
    async with reading(fake, session_timeout=12.5, max_poll_interval=45.25,
                       partition_assignment_strategy="roundrobin") as r:
        await until(lambda: len(r.records) == 20)
    join = joins(fake)[-1].request
    assert (join.session_timeout_ms, join.rebalance_timeout_ms) == (12500, 45250)
    sync = fake.requests_of(ApiKey.SYNC_GROUP)[-1]
    assert sync.api_version >= 5
    assert (sync.request.protocol_type, sync.request.protocol_name) == ("consumer", "roundrobin")


# ------------------------------------------------------------------ refusals


async def rejoin_once(fake: FakeCluster, reader: Reader) -> None:
    """Make the (stable, generation 1) member rejoin: its heartbeat hears of a rebalance."""
    await until(lambda: stable(fake, reader, 1) and len(reader.records) == 20)
    fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)


@pytest.mark.parametrize(("api", "code", "message"), [
    (ApiKey.JOIN_GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED,
     "JoinGroup failed: not authorized to use group 'g'"),
    (ApiKey.JOIN_GROUP, ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
     "partition_assignment_strategy=range,cooperative-sticky"),
    (ApiKey.JOIN_GROUP, ErrorCode.UNKNOWN_SERVER_ERROR, "JoinGroup failed: UNKNOWN_SERVER_ERROR: "),
    (ApiKey.SYNC_GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED,
     "SyncGroup failed: not authorized to use group 'g'"),
])
async def test_a_join_refused_for_good_fails_the_consumer_and_it_stops_asking(
    topic: FakeCluster, autojump_clock: Any, api: ApiKey, code: ErrorCode, message: str,
) -> None:
    """A JoinGroup / SyncGroup refusal that retrying cannot fix reaches the application
    as GroupError (Kafka's code, a reason naming the setting or group); the member
    then sends the coordinator nothing more until it is closed (no heartbeat, no
    LeaveGroup on a poll timeout, no further join)."""
    fake = topic
    async with reading(fake, max_poll_interval=10.0,
                       partition_assignment_strategy="range,cooperative-sticky") as r:
        await rejoin_once(fake, r)
        fake.fail_next(api, code)
        await until(lambda: r.error is not None)
        assert isinstance(r.error, GroupError) and r.error.error_code == code
        assert message in str(r.error) and "group 'g'" in str(r.error)
        assert r.consumer.state == "failed"
        seen = len(fake.requests)
        await trio.sleep(30)  # three poll intervals without iterating
        assert len(fake.requests) == seen


@pytest.mark.parametrize(("api", "code", "member_id_kept", "new_lookup", "backoff"), [
    (ApiKey.JOIN_GROUP, ErrorCode.UNKNOWN_MEMBER_ID, False, False, False),
    (ApiKey.JOIN_GROUP, ErrorCode.NOT_COORDINATOR, True, True, True),
    (ApiKey.JOIN_GROUP, ErrorCode.COORDINATOR_NOT_AVAILABLE, True, True, True),
    (ApiKey.JOIN_GROUP, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, True, False, True),
    (ApiKey.JOIN_GROUP, ErrorCode.REBALANCE_IN_PROGRESS, True, False, True),
    (ApiKey.SYNC_GROUP, ErrorCode.UNKNOWN_MEMBER_ID, False, False, False),
    (ApiKey.SYNC_GROUP, ErrorCode.ILLEGAL_GENERATION, True, False, False),
    (ApiKey.SYNC_GROUP, ErrorCode.NOT_COORDINATOR, True, True, True),
    (ApiKey.SYNC_GROUP, ErrorCode.REBALANCE_IN_PROGRESS, True, False, True),
])
async def test_a_retriable_join_refusal_joins_again(
    topic: FakeCluster, autojump_clock: Any, api: ApiKey, code: ErrorCode,
    member_id_kept: bool, new_lookup: bool, backoff: bool,
) -> None:
    """As the Java AbstractCoordinator: after UNKNOWN_MEMBER_ID the member joins again
    with an empty member id, after ILLEGAL_GENERATION at once with its id; a moved or
    unavailable coordinator is looked up again (FindCoordinator), and these and a
    loading or rebalancing coordinator are asked again after one retry_backoff. The
    member ends up in the next generation with every partition, no error raised.
    (Fetches answer at once here, so no lookup waits behind a long-polling Fetch on a
    shared connection: the pacing measured is the member's own.)"""
    fake = topic
    async with reading(fake, retry_backoff=0.25, retry_backoff_max=4.0,
                       fetch_max_wait=0.01) as r:
        await rejoin_once(fake, r)
        member_id = r.consumer.group_metadata().member_id
        lookups = len(fake.requests_of(ApiKey.FIND_COORDINATOR))
        before = len(joins(fake))
        syncs = len(fake.requests_of(ApiKey.SYNC_GROUP))
        failed = fake.fail_next(api, code)
        await until(lambda: fake.group("g").generation > 1 and stable(
            fake, r, fake.group("g").generation) and r.consumer.assignment() == ALL4)
        assert failed.fired == 1 and r.error is None
        assert r.consumer.assignment() == ALL4
        refused = (joins(fake)[before] if api == ApiKey.JOIN_GROUP
                   else fake.requests_of(ApiKey.SYNC_GROUP)[syncs])
        retry = joins(fake)[before + 1]
        assert retry.request.member_id == (member_id if member_id_kept else "")
        gap = retry.time - refused.time
        if new_lookup:  # the lookup follows the backoff (and needs a new connection)
            gap = fake.requests_of(ApiKey.FIND_COORDINATOR)[lookups].time - refused.time
        assert (0.25 <= gap < 0.5) if backoff else gap < 0.25
        assert len(fake.requests_of(ApiKey.FIND_COORDINATOR)) == lookups + new_lookup


async def test_join_and_sync_may_wait_longer_than_request_timeout(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A JoinGroup or SyncGroup is answered when the rebalance completes, which may take
    up to the rebalance timeout (max_poll_interval), far beyond request_timeout: the
    member waits for the answer instead of timing out and joining again."""
    fake = topic
    async with reading(fake, request_timeout=2.0) as r:
        await until(lambda: stable(fake, r, 1))
        lookups = len(fake.requests_of(ApiKey.FIND_COORDINATOR))
        before, syncs = len(joins(fake)), len(fake.requests_of(ApiKey.SYNC_GROUP))
        fake.delay_responses(6.0, api_key=ApiKey.JOIN_GROUP, count=1)
        fake.delay_responses(6.0, api_key=ApiKey.SYNC_GROUP, count=1)
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        await until(lambda: stable(fake, r, 2))
        assert len(joins(fake)) == before + 1
        assert len(fake.requests_of(ApiKey.SYNC_GROUP)) == syncs + 1
        assert len(fake.requests_of(ApiKey.FIND_COORDINATOR)) == lookups


async def test_a_lookup_refused_while_rejoining_fails_the_consumer(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """The coordinator moved during a join and the new lookup is refused for good
    (group authorization): the application gets that GroupError, the member does not
    keep joining; closing it still leaves the group."""
    fake = topic
    async with reading(fake) as r:
        await rejoin_once(fake, r)
        fake.fail_next(ApiKey.JOIN_GROUP, ErrorCode.NOT_COORDINATOR)
        fake.fail_next(ApiKey.FIND_COORDINATOR, ErrorCode.GROUP_AUTHORIZATION_FAILED)
        await until(lambda: r.error is not None)
        assert isinstance(r.error, GroupError)
        assert "FindCoordinator refused: GROUP_AUTHORIZATION_FAILED" in str(r.error)
        joined = len(joins(fake))
        await trio.sleep(10)
        assert len(joins(fake)) == joined
    # closing still leaves the group (the lookup is asked again for it)
    assert len(fake.requests_of(ApiKey.LEAVE_GROUP)) == 1 and fake.group("g").members == {}


@pytest.mark.parametrize("api", [ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP])
async def test_a_lost_connection_during_a_join_joins_again_after_one_backoff(
    topic: FakeCluster, autojump_clock: Any, api: ApiKey,
) -> None:
    """A connection lost with a JoinGroup or SyncGroup in flight is retried (the member
    finds the coordinator again) after one retry_backoff, not at once; no error reaches
    the application. (Fetches answer at once: no lookup waits behind a long-polling
    Fetch on a shared connection, so the pacing measured is the member's own.)"""
    fake = topic
    async with reading(fake, retry_backoff=0.25, retry_backoff_max=4.0,
                       fetch_max_wait=0.01) as r:
        await rejoin_once(fake, r)
        lookups = len(fake.requests_of(ApiKey.FIND_COORDINATOR))
        before = len(fake.requests_of(api))
        fake.drop_next_request(api)
        await until(lambda: fake.group("g").generation > 1 and stable(
            fake, r, fake.group("g").generation))
        assert r.error is None and r.consumer.assignment() == ALL4
        dropped = fake.requests_of(api)[before]
        lookup = fake.requests_of(ApiKey.FIND_COORDINATOR)[lookups]
        assert 0.25 <= lookup.time - dropped.time < 0.5


async def test_the_join_backoff_draws_its_jitter_from_the_given_rng(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """With retry_backoff_jitter, the delay before joining again comes from the rng the
    application gave (here one whose draws are always 0.5: exactly the base delay)."""
    fake = topic
    async with reading(fake, retry_backoff=0.25, retry_backoff_max=4.0,
                       retry_backoff_jitter=0.8, rng=HalfRandom(3)) as r:
        await rejoin_once(fake, r)
        before = len(joins(fake))
        fake.fail_next(ApiKey.JOIN_GROUP, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, count=3)
        await until(lambda: fake.group("g").generation > 1 and stable(
            fake, r, fake.group("g").generation))
        times = [q.time for q in joins(fake)[before:before + 4]]
        assert [b - a for a, b in itertools.pairwise(times)] == [0.25, 0.25, 0.25]


async def test_a_leader_that_cannot_read_the_metadata_joins_again_after_one_backoff(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """The leader cannot assign while the subscribed topic's metadata is refused: it
    joins again one retry_backoff after each refusal (the group waits for it; not at
    once, not after a growing delay), and assigns once the metadata is there; the
    application sees no error."""
    fake.create_topic("t", 4)
    fake.fail_next(ApiKey.METADATA, ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic="t", count=2)
    async with reading(fake, retry_backoff=0.25, retry_backoff_max=4.0) as r:
        await until(lambda: r.consumer.assignment() == ALL4)
        assert r.error is None
        times = [q.time for q in joins(fake)][1:]  # after the member id was given
        assert len(times) >= 2  # the leader joined again
        assert all(b - a >= 0.25 for a, b in itertools.pairwise(times))
        asked = [i for i, q in enumerate(fake.requests) if q.api_key == ApiKey.METADATA
                 and [t.name for t in q.request.topics or ()] == ["t"]]
        for i in asked[:2]:  # the refused ones; the JoinGroup that follows each
            rejoin = next(q for q in fake.requests[i:] if q.api_key == ApiKey.JOIN_GROUP)
            assert 0.25 <= rejoin.time - fake.requests[i].time < 0.5


# ------------------------------------------------------------------ identity


async def test_a_member_reports_no_generation_between_a_refused_sync_and_its_next_join(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """After SyncGroup answered ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID the member is in
    no generation: group_metadata() says generation -1 (and, for UNKNOWN_MEMBER_ID, no
    member id) until the next join completes, so offsets sent to a transaction with it
    are not taken as the old generation's."""
    fake = topic
    async with reading(fake) as r:
        await rejoin_once(fake, r)
        member_id = r.consumer.group_metadata().member_id
        fake.fail_next(ApiKey.SYNC_GROUP, ErrorCode.ILLEGAL_GENERATION)
        fake.delay_responses(5.0, api_key=ApiKey.JOIN_GROUP, count=2)
        await until(lambda: len(fake.requests_of(ApiKey.SYNC_GROUP)) >= 2)
        await trio.sleep(1.0)  # the next JoinGroup is in flight
        meta = r.consumer.group_metadata()
        assert (meta.generation_id, meta.member_id) == (-1, member_id)
        assert r.consumer.state == "rebalancing"
        await until(lambda: fake.group("g").generation > 2 and stable(
            fake, r, fake.group("g").generation))
        generation = fake.group("g").generation
        syncs = len(fake.requests_of(ApiKey.SYNC_GROUP))
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        fake.fail_next(ApiKey.SYNC_GROUP, ErrorCode.UNKNOWN_MEMBER_ID)
        fake.delay_responses(5.0, api_key=ApiKey.JOIN_GROUP, count=2)
        await until(lambda: len(fake.requests_of(ApiKey.SYNC_GROUP)) > syncs)
        await trio.sleep(1.0)
        meta = r.consumer.group_metadata()
        assert (meta.generation_id, meta.member_id) == (-1, "")
        await until(lambda: fake.group("g").generation > generation and stable(
            fake, r, fake.group("g").generation))


async def test_a_fresh_member_reports_that_it_has_not_joined_and_commits_after_its_join(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """Before its first join completes a member is in no generation, leads nothing,
    has had no heartbeat or rebalance; a commit issued meanwhile, even right after
    opening (before the join round has started), waits for the join and carries the
    generation it joined."""
    fake = topic
    fake.delay_responses(5.0, api_key=ApiKey.JOIN_GROUP, count=1)
    async with open_fake_consumer(fake, group_id="g", topics=["t"]) as consumer:
        stats = consumer.statistics()
        assert (stats.generation, stats.member_id, stats.leader, stats.rebalances) == (-1, "", False, 0)
        assert stats.since_last_heartbeat is None
        meta = consumer.group_metadata()
        assert (meta.generation_id, meta.member_id) == (-1, "")
        await consumer.commit({("t", 0): 1})
        (sent,) = fake.requests_of(ApiKey.OFFSET_COMMIT)
        assert sent.request.generation_id_or_member_epoch == 1
        assert fake.committed("g", "t", 0) == 1
        assert consumer.statistics().rebalances == 1


async def test_statistics_name_the_leader_and_the_time_since_the_join(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """``leader`` is true for the one member the coordinator chose, false for the
    others; a join counts as a heartbeat (since_last_heartbeat starts at 0, not None)."""
    fake = topic
    async with reading(fake, client_id="a", heartbeat_interval=3.0) as a:
        await until(lambda: stable(fake, a, 1))
        since = a.consumer.statistics().since_last_heartbeat
        assert since is not None and 0 <= since < 1  # no heartbeat before 3 s
        async with reading(fake, client_id="b") as b:
            await until(lambda: stable(fake, a, 2) and stable(fake, b, 2))
            leader = fake.group("g").leader_id
            assert leader == a.consumer.group_metadata().member_id
            assert (a.consumer.statistics().leader, b.consumer.statistics().leader) == (True, False)


async def test_a_cooperative_member_tells_the_generation_its_partitions_are_from(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """KIP-429/KIP-792: a cooperative member's subscription lists what it owns and the
    generation it got it in; a member that owns nothing says generation -1."""
    fake = topic
    async with reading(fake, partition_assignment_strategy="cooperative-sticky") as r:
        await rejoin_once(fake, r)
        await until(lambda: stable(fake, r, 2))
    subs = [ConsumerProtocolSubscription.decode(q.request.protocols[0].metadata)
            for q in joins(fake)]
    assert (subs[0].generation_id, subs[0].owned) == (-1, frozenset())
    assert (subs[-1].generation_id, subs[-1].owned) == (1, frozenset(("t", p) for p in range(4)))


# ------------------------------------------------------------------ commits


@pytest.mark.parametrize(("code", "error", "rejoins", "member_id_kept"), [
    (ErrorCode.REBALANCE_IN_PROGRESS, RebalanceInProgressError, True, True),
    (ErrorCode.ILLEGAL_GENERATION, CommitFailedError, True, True),
    (ErrorCode.UNKNOWN_MEMBER_ID, CommitFailedError, True, False),
    (ErrorCode.GROUP_AUTHORIZATION_FAILED, ConsumerError, False, True),
])
async def test_a_refused_commit_says_why_and_the_member_rejoins_when_it_must(
    topic: FakeCluster, autojump_clock: Any, code: ErrorCode, error: type[Exception],
    rejoins: bool, member_id_kept: bool,
) -> None:
    """A commit refused because the group is rebalancing raises RebalanceInProgressError
    and the member rejoins at once; one refused because the member's generation is over
    raises CommitFailedError, and the member rejoins (with its member id after
    ILLEGAL_GENERATION, with none after UNKNOWN_MEMBER_ID) reporting no generation
    until then, and its partitions as lost; any other refusal is a ConsumerError naming
    the partitions and the code, and the member stays in its generation."""
    fake = topic
    lost: list[frozenset[TopicPartition]] = []
    async with reading(fake, on_lost=lambda c, parts: lost.append(parts)) as r:
        await until(lambda: stable(fake, r, 1) and len(r.records) == 20)
        member_id = r.consumer.group_metadata().member_id
        before = len(joins(fake))
        fake.fail_next(ApiKey.OFFSET_COMMIT, code)
        fake.delay_responses(3.0, api_key=ApiKey.JOIN_GROUP, count=1)
        with pytest.raises(error) as raised:
            await r.consumer.commit({("t", 0): 5})
        assert type(raised.value) is error
        if error is ConsumerError:
            assert f"[('t', 0)]: {code.name}" in str(raised.value)
        await trio.sleep(1.0)
        meta = r.consumer.group_metadata()
        if code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID):
            assert (meta.generation_id, meta.member_id) == (-1, member_id if member_id_kept else "")
        else:
            assert (meta.generation_id, meta.member_id) == (1, member_id)
        await trio.sleep(5.0)
        assert (len(joins(fake)) > before) == rejoins
        if rejoins:
            assert joins(fake)[before].request.member_id == (member_id if member_id_kept else "")
            await until(lambda: fake.group("g").generation > 1 and stable(
                fake, r, fake.group("g").generation))
        assert lost == ([ALL4] if code in (ErrorCode.ILLEGAL_GENERATION,
                                           ErrorCode.UNKNOWN_MEMBER_ID) else [])
        assert r.consumer.assignment() == ALL4 and r.error is None


async def test_a_commit_refused_after_the_member_moved_on_does_not_reset_it(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A commit of generation 1, retried after the coordinator was loading, is answered
    ILLEGAL_GENERATION because the member joined generation 2 meanwhile: it raises
    CommitFailedError but leaves the member in generation 2 (no reset, nothing lost,
    no further rebalance)."""
    fake = topic
    lost: list[frozenset[TopicPartition]] = []
    async with reading(fake, on_lost=lambda c, parts: lost.append(parts),
                       retry_backoff=3.0, retry_backoff_max=3.0) as r:
        await until(lambda: stable(fake, r, 1) and len(r.records) == 20)
        fake.fail_next(ApiKey.OFFSET_COMMIT, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        with pytest.raises(CommitFailedError, match="generation 1"):
            await r.consumer.commit({("t", 0): 5})
        assert stable(fake, r, 2)
        await trio.sleep(10.0)
        assert stable(fake, r, 2) and lost == []
        assert r.consumer.group_metadata().generation_id == 2


async def test_committing_nothing_asks_nothing(topic: FakeCluster, autojump_clock: Any) -> None:
    """A commit with no offsets (nothing consumed yet, or an empty mapping) completes
    without a request and is not counted, but is still a trio checkpoint."""
    fake = topic
    async with reading(fake) as r:
        await until(lambda: stable(fake, r, 1))
        await r.consumer.commit({})
        assert fake.requests_of(ApiKey.OFFSET_COMMIT) == []
        assert r.consumer.statistics().commits == 0
        with trio.CancelScope() as scope:
            scope.cancel()
            await r.consumer.commit({})
        assert scope.cancelled_caught


# ------------------------------------------------------------------ auto-commit


async def test_auto_commit_commits_what_changed_every_interval(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """With enable_auto_commit, every auto_commit_interval the member commits the
    positions that moved since its last commit, and sends nothing when none did."""
    fake = topic
    start = trio.current_time()
    async with reading(fake, enable_auto_commit=True, auto_commit_interval=2.0) as r:
        await until(lambda: len(r.records) == 20)
        await until(lambda: [fake.committed("g", "t", p) for p in range(4)] == [5] * 4)
        first = fake.requests_of(ApiKey.OFFSET_COMMIT)
        assert len(first) == 1 and (first[0].time - start) % 2.0 == pytest.approx(0.0)
        await trio.sleep(10.0)
        assert len(fake.requests_of(ApiKey.OFFSET_COMMIT)) == 1  # nothing moved
        await produce(fake, "t", [b"more"], partition=2)
        await until(lambda: fake.committed("g", "t", 2) == 6)
        last = fake.requests_of(ApiKey.OFFSET_COMMIT)[-1].request
        assert [(t.name, [p.partition_index for p in t.partitions]) for t in last.topics] == [("t", [2])]
        assert len(fake.requests_of(ApiKey.OFFSET_COMMIT)) == 2


async def test_without_auto_commit_nothing_is_committed_while_consuming(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    fake = topic
    async with reading(fake, enable_auto_commit=False, auto_commit_interval=1.0) as r:
        await until(lambda: len(r.records) == 20)
        await trio.sleep(10.0)
        assert fake.requests_of(ApiKey.OFFSET_COMMIT) == []


# ------------------------------------------------------------------ resets and failures


async def test_a_heartbeat_refused_for_good_fails_the_consumer_and_it_stops_asking(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A heartbeat answered GROUP_AUTHORIZATION_FAILED reaches the application as
    GroupError; the member stops heartbeating and joins no more."""
    fake = topic
    async with reading(fake, max_poll_interval=10.0) as r:
        await until(lambda: stable(fake, r, 1) and len(r.records) == 20)
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.GROUP_AUTHORIZATION_FAILED)
        await until(lambda: r.error is not None)
        assert isinstance(r.error, GroupError)
        assert "heartbeat refused: not authorized to use group 'g'" in str(r.error)
        assert r.consumer.state == "failed"
        seen = len(group_requests(fake))
        await trio.sleep(30)
        assert len(group_requests(fake)) == seen


async def test_a_member_reset_while_its_revocation_waits_rejoins_once(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """Eager: the member's revocation waits for the application's next iteration; a
    heartbeat meanwhile answers UNKNOWN_MEMBER_ID. The join round that was waiting stops
    (it joined for a membership that is over); the member joins once more, without a
    member id, and its partitions are revoked once and then assigned: none is reported
    lost after it was revoked, and no further rebalance follows."""
    fake = topic
    events: list[tuple[str, frozenset[TopicPartition]]] = []

    def log(kind: str) -> Any:
        return lambda consumer, parts: events.append((kind, parts))

    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=False,
                                  on_assigned=log("assigned"), on_revoked=log("revoked"),
                                  on_lost=log("lost")) as consumer:
        got = 0
        with trio.fail_after(60):
            async for _ in consumer:
                got += 1
                if got == 20:
                    break
        before = len(joins(fake))
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        await until(lambda: consumer._handoff.pending)  # the revocation waits for us
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.UNKNOWN_MEMBER_ID)
        await until(lambda: consumer.group_metadata().member_id == "")
        with trio.move_on_after(20):
            async for _ in consumer:  # iterate: the revocation runs, the member rejoins
                pass
        assert consumer.state == "stable" and consumer.assignment() == ALL4
        assert joins(fake)[before].request.member_id == ""
        assert [e for e in events[1:] if e[1]] == [("revoked", ALL4), ("assigned", ALL4)]
        generation = fake.group("g").generation
        await trio.sleep(10)
        assert fake.group("g").generation == generation


async def test_a_restarted_static_leader_told_to_skip_the_assignment_keeps_heartbeating(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """KIP-814: a static leader that restarts within the session timeout is told to skip
    the assignment (JoinGroup v9); it gets its partitions back in the same generation and
    stays in the group, heartbeating, with nothing of its own to check as the leader."""
    fake = topic
    async with reading(fake, group_instance_id="a-1") as first:
        await until(lambda: stable(fake, first, 1) and len(first.records) == 20)
    async with reading(fake, group_instance_id="a-1") as again:
        await until(lambda: again.consumer.assignment() == ALL4)
        assert joins(fake)[-1].api_version >= 9
        beats = len(fake.requests_of(ApiKey.HEARTBEAT))
        await trio.sleep(5)
        assert len(fake.requests_of(ApiKey.HEARTBEAT)) >= beats + 4
        assert stable(fake, again, 1) and again.error is None
        assert again.consumer.statistics().leader


async def test_a_cooperative_member_reset_while_revoking_assigns_nothing_for_the_old_generation(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """KIP-429: A revokes the two partitions B gets; while that revocation waits for A's
    next iteration, A's heartbeat answers UNKNOWN_MEMBER_ID. A's on_assigned for the
    generation it was removed from is not called: after the revocation come the kept
    partitions, lost, then A's assignment in a later generation."""
    fake = topic
    events: list[tuple[str, frozenset[TopicPartition]]] = []

    def log(kind: str) -> Any:
        return lambda consumer, parts: events.append((kind, parts))

    opts: dict[str, Any] = dict(group_id="g", topics=["t"], enable_auto_commit=False,
                                partition_assignment_strategy="cooperative-sticky")
    async with open_fake_consumer(fake, client_id="a", on_assigned=log("assigned"),
                                  on_revoked=log("revoked"), on_lost=log("lost"),
                                  **opts) as a:
        got = 0
        with trio.fail_after(60):
            async for _ in a:
                got += 1
                if got == 20:
                    break
        async with reading(fake, client_id="b", **opts):
            await until(lambda: a._handoff.pending)  # A's revocation waits for A
            fake.control(ApiKey.HEARTBEAT, lambda ctx: HeartbeatResponse(
                error_code=ErrorCode.UNKNOWN_MEMBER_ID) if ctx.client_id == "a" else None)
            await until(lambda: a.group_metadata().member_id == "")
            with trio.move_on_after(30):
                async for _ in a:
                    pass
            assert events[0] == ("assigned", ALL4)
            (kind, moved), (kind2, kept) = events[1:3]
            assert (kind, kind2) == ("revoked", "lost")
            assert len(moved) == 2 and moved | kept == ALL4
            assert a.state == "stable" and a.group_metadata().member_id != ""


async def test_a_commit_during_a_rejoin_waits_for_it_and_carries_the_new_generation(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A commit issued while the member's JoinGroup / SyncGroup is in flight (a later
    rebalance, not the first) waits for the join and commits in the new generation,
    instead of being refused as the old one's. Twice, so each rebalance waits anew."""
    fake = topic
    async with reading(fake) as r:
        await until(lambda: stable(fake, r, 1) and len(r.records) == 20)
        for generation in (2, 3):
            before = len(joins(fake))
            fake.delay_responses(3.0, api_key=ApiKey.JOIN_GROUP, count=1)
            fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
            await until(lambda: len(joins(fake)) > before)  # noqa: B023 - awaited here
            await r.consumer.commit({("t", 0): generation})
            sent = fake.requests_of(ApiKey.OFFSET_COMMIT)[-1]
            assert sent.request.generation_id_or_member_epoch == generation
            assert fake.committed("g", "t", 0) == generation
            assert stable(fake, r, generation)


def late_refusal(fake: FakeCluster, code: ErrorCode, after: float) -> tuple[list[float], Any]:
    """A one-shot HEARTBEAT hook, inactive until ``arm()``: the first heartbeat after it
    is answered ``code`` ``after`` seconds late (its connection busy meanwhile). Returns
    the times the hook took that heartbeat, and ``arm``."""
    taken: list[float] = []
    armed = False

    async def refuse(ctx: ControlContext) -> HeartbeatResponse | None:
        if not armed:
            return None
        taken.append(trio.current_time())
        await trio.sleep(after)
        return HeartbeatResponse(error_code=code)

    def arm() -> None:
        nonlocal armed
        armed = True

    fake.control(ApiKey.HEARTBEAT, refuse)
    return taken, arm


async def test_a_fatal_heartbeat_answer_arriving_during_a_join_stops_that_join(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A heartbeat sent while the member was stable (its eager revocation waiting in a
    slow on_revoked) is answered GROUP_AUTHORIZATION_FAILED only once the member's
    JoinGroup went out: that join stops there. The application gets the GroupError and
    the member sends nothing more: no SyncGroup, no heartbeat, no other join."""
    fake = topic
    taken, arm = late_refusal(fake, ErrorCode.GROUP_AUTHORIZATION_FAILED, after=2.0)

    async def revoked(consumer: Any, parts: frozenset[TopicPartition]) -> None:
        arm()  # the next heartbeat goes out while this runs
        await trio.sleep(1.5)

    async with reading(fake, on_revoked=revoked, heartbeat_interval=1.0) as r:
        await until(lambda: stable(fake, r, 1) and len(r.records) == 20)
        syncs = len(fake.requests_of(ApiKey.SYNC_GROUP))
        joined = len(joins(fake))
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        await until(lambda: r.error is not None, 30)
        assert isinstance(r.error, GroupError)
        assert len(taken) == 1 and len(joins(fake)) == joined + 1  # the join was under way
        seen = len(group_requests(fake))
        await trio.sleep(30)
        assert len(group_requests(fake)) == seen
        assert len(fake.requests_of(ApiKey.SYNC_GROUP)) == syncs
        assert r.consumer.state == "failed"


async def test_a_stale_commit_answer_after_a_fatal_heartbeat_does_not_revive_the_member(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A commit sent while a heartbeat was in flight is answered ILLEGAL_GENERATION
    after that heartbeat's GROUP_AUTHORIZATION_FAILED failed the consumer: the commit
    raises CommitFailedError, but the failed member is not reset by it. Iterating again
    raises the GroupError again; no partition is reported lost and the member joins no
    more."""
    fake = topic
    lost: list[frozenset[TopicPartition]] = []
    taken, arm = late_refusal(fake, ErrorCode.GROUP_AUTHORIZATION_FAILED, after=2.0)
    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=False,
                                  on_lost=lambda c, parts: lost.append(parts)) as consumer:
        got = 0
        with trio.fail_after(60):
            async for _ in consumer:
                got += 1
                if got == 20:
                    break
        arm()
        await until(lambda: bool(taken), 5)
        # answered after the heartbeat (behind it on the connection), and later still
        fake.fail_next(ApiKey.OFFSET_COMMIT, ErrorCode.ILLEGAL_GENERATION)
        fake.delay_responses(0.5, api_key=ApiKey.OFFSET_COMMIT, count=1)
        with pytest.raises(CommitFailedError):
            await consumer.commit({("t", 0): 5})
        seen = len(group_requests(fake))
        for _ in range(2):
            with pytest.raises(GroupError), trio.fail_after(5):
                async for _ in consumer:
                    pass
        await trio.sleep(30)
        assert lost == [] and len(group_requests(fake)) == seen


async def test_a_join_completed_for_a_membership_reset_meanwhile_hands_nothing_over(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A heartbeat sent while the member was stable (its eager revocation waiting in a
    slow on_revoked) is answered ILLEGAL_GENERATION after the member's JoinGroup went
    out. As the Java client ignores the answer of a join made before such a reset, the
    join that then completes is not handed to the application: the member joins again,
    and on_assigned runs once, for the generation it ends in (no assign-revoke-assign
    for a generation it already knew was stale)."""
    fake = topic
    events: list[tuple[str, frozenset[TopicPartition]]] = []
    taken, arm = late_refusal(fake, ErrorCode.ILLEGAL_GENERATION, after=2.0)

    async def revoked(consumer: Any, parts: frozenset[TopicPartition]) -> None:
        events.append(("revoked", parts))
        arm()  # the next heartbeat goes out while this runs
        await trio.sleep(1.5)

    async with reading(fake, on_revoked=revoked, heartbeat_interval=1.0,
                       on_assigned=lambda c, parts: events.append(("assigned", parts)),
                       on_lost=lambda c, parts: events.append(("lost", parts))) as r:
        await until(lambda: stable(fake, r, 1) and len(r.records) == 20)
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        await until(lambda: bool(taken), 10)
        await until(lambda: fake.group("g").generation == 3 and stable(fake, r, 3), 30)
        await trio.sleep(5)
        assert r.error is None and r.consumer.assignment() == ALL4
        assert events == [("assigned", ALL4), ("revoked", ALL4), ("assigned", ALL4)]
        assert fake.group("g").generation == 3


async def test_a_commit_issued_as_the_consumer_opens_waits_for_the_first_join_every_time(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A commit the application issues the moment the consumer is open waits for the
    first join and carries its generation, whichever of the application and the
    member's join round trio runs first (it picks at random each time: twelve opens,
    so both orders occur)."""
    fake = topic
    for i in range(12):
        async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                      enable_auto_commit=False) as consumer:
            await consumer.commit({("t", 0): i + 1})
            sent = fake.requests_of(ApiKey.OFFSET_COMMIT)[-1]
            assert sent.request.generation_id_or_member_epoch == fake.group("g").generation
            assert fake.committed("g", "t", 0) == i + 1


async def test_auto_commit_skips_a_tick_that_falls_inside_a_rebalance(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """Auto-commit commits on its ticks only (every auto_commit_interval since the
    start); a tick while the member is rebalancing commits nothing, as the Java client's
    auto-commit fails fast outside a stable generation instead of waiting for the join:
    the positions moved meanwhile are committed at the first tick after it."""
    fake = topic
    start = trio.current_time()
    async with reading(fake, enable_auto_commit=True, auto_commit_interval=2.0,
                       partition_assignment_strategy="cooperative-sticky") as r:
        await until(lambda: [fake.committed("g", "t", p) for p in range(4)] == [5] * 4)
        await until(lambda: 0.2 <= (trio.current_time() - start) % 2.0 < 0.3)  # after a tick
        fake.delay_responses(3.3, api_key=ApiKey.JOIN_GROUP, count=1)
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        await produce(fake, "t", [b"more"], partition=1)
        await until(lambda: len(r.records) == 21)
        joined = len(joins(fake))
        await until(lambda: len(joins(fake)) > joined)
        assert fake.committed("g", "t", 1) == 5  # the move is still to commit
        await until(lambda: stable(fake, r, 2))
        await until(lambda: fake.committed("g", "t", 1) == 6)
        for q in fake.requests_of(ApiKey.OFFSET_COMMIT):
            assert round((q.time - start) / 2.0, 6).is_integer(), q.time - start


async def test_a_commit_that_ends_the_generation_ends_the_fast_path_of_the_old_chunk(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """The application is in the middle of a fetched run of records (served without a
    trio checkpoint while nothing changes) when its commit is refused UNKNOWN_MEMBER_ID:
    the member's generation is over and its partitions are lost. The next iteration
    does not go on serving that run: it first looks for rebalance changes (a trio
    checkpoint, so an iteration cancelled beforehand hands out nothing), and the
    partitions are reported lost before the member rejoins and reads them again."""
    fake = topic
    lost: list[frozenset[TopicPartition]] = []
    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=False,
                                  on_lost=lambda c, parts: lost.append(parts)) as consumer:
        with trio.fail_after(30):
            first = await consumer.__anext__()
            second = await consumer.__anext__()  # served from the same run
        assert (first.topic, first.partition) == (second.topic, second.partition)
        fake.fail_next(ApiKey.OFFSET_COMMIT, ErrorCode.UNKNOWN_MEMBER_ID)
        with pytest.raises(CommitFailedError):
            await consumer.commit()
        with trio.CancelScope() as scope:
            scope.cancel()
            await consumer.__anext__()
        assert scope.cancelled_caught
        with trio.fail_after(30):
            while not lost:
                await consumer.__anext__()
        assert lost == [ALL4]


async def test_an_eager_member_reset_while_its_revocation_runs_joins_once_afterwards(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """An eager member revokes everything before it joins; a heartbeat answered
    UNKNOWN_MEMBER_ID while its on_revoked runs ends that round before its JoinGroup:
    the next round (the loss, then one join for an id, one with it) is the only one, so
    the group moves on by one generation, not two."""
    fake = topic
    revoking = trio.Event()

    async def slow_revoke(consumer: Any, parts: Any) -> None:
        if parts:
            revoking.set()
            await trio.sleep(2)

    async with reading(fake, client_id="a", on_revoked=slow_revoke,
                       partition_assignment_strategy="range") as a:
        await until(lambda: stable(fake, a, 1) and len(a.records) == 20)
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        await revoking.wait()
        before = len(joins(fake))
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.UNKNOWN_MEMBER_ID)
        await until(lambda: a.consumer.group_metadata().member_id == "", 10)
        await until(lambda: a.consumer.state == "stable", 30)
        await trio.sleep(10)
        assert [j.request.member_id != "" for j in joins(fake)[before:]] == [False, True]
        assert fake.group("g").generation == 2 and a.consumer.assignment() == ALL4
