"""The KIP-848 member against the fake's own KIP-848 group coordinator (no script).

``test_member848_rules`` steers a scripted coordinator (error injection, chosen targets);
here the fake cluster's ``fake/groups848.py`` answers, the coordinator that
tests/testing/test_fake_vs_kafka_groups848.py holds to Kafka 4.1's answers: the server
assigns (four partitions split 2/2 between two members: the first keeps 0 and 1), a
member gives up partitions before another gets them, leaves and session timeouts move
partitions, commits are checked against the member epoch. Everything runs on virtual time.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import trio

from pipeline.consumer import CommitFailedError, MaxPollIntervalExceededError
from pipeline.protocol.api import ApiKey
from pipeline.testing.fake.faults import DROP, ControlContext
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import HalfRandom, produce, until
from .test_member848_rules import ALL4, Member, running, tps


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=3, seed=7, auto_create_topics=False,
                          group_consumer_heartbeat_interval=3.0,
                          group_consumer_session_timeout=20.0)
    await nursery.start(cluster.run)
    cluster.create_topic("t", 4)
    for p in range(4):
        await produce(cluster, "t", [f"{p}-{i}".encode() for i in range(5)], partition=p)
    return cluster


def second() -> dict[str, Any]:
    """Options of a second member: another random source, so another member id."""
    return {"rng": HalfRandom(2)}


def beats(fake: FakeCluster, member_id: str | None = None) -> list[Any]:
    return [r.request for r in fake.requests_of(ApiKey.CONSUMER_GROUP_HEARTBEAT)
            if member_id is None or r.request.member_id == member_id]


def owned(request: Any) -> set[int]:
    return {p for t in request.topic_partitions or () for p in t.partitions}


def offsets(member: Member) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in member.records]


async def split(fake: FakeCluster, a: Member, b: Member) -> None:
    """Until ``a`` (joined first) owns 0 and 1 and ``b`` 2 and 3."""
    await until(lambda: a.c.assignment() == tps(0, 1) and b.consumer is not None
                and b.c.assignment() == tps(2, 3), 30)


async def test_a_member_joins_and_heartbeats_at_the_interval_the_coordinator_gives(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """The first member gets every partition at epoch 1, is stable, and heartbeats every
    group.consumer.heartbeat.interval.ms (3 s here), reporting what it owns."""
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        assert m.events == [("assigned", ALL4)]
        assert m.c.state == "stable" and m.c.group_metadata().generation_id == 1
        group = fake.consumer_group("g")
        assert group.state == "Stable" and group.members[m.member_id].epoch == 1
        n = len(beats(fake))
        await trio.sleep(30)
        assert 9 <= len(beats(fake)) - n <= 11
        assert owned(beats(fake)[-1]) == {0, 1, 2, 3}


async def test_two_members_split_the_partitions_through_revocation_and_read_each_record_once(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """A second member's partitions are first revoked from the first one (which commits
    them and reports owning only the rest while still in its old epoch) and only then
    given to the second: every record is read once, across both."""
    a, b = Member(), Member()
    common: dict[str, Any] = dict(enable_auto_commit=True, auto_commit_interval=1000.0)
    async with running(fake, a, **common):
        await until(lambda: len(a.records) == 20)
        async with running(fake, b, **common, **second()):
            await split(fake, a, b)
            assert a.events == [("assigned", ALL4), ("revoked", tps(2, 3))]
            # b's first answer: epoch 2 and nothing yet (2 and 3 unreleased)
            assert b.events == [("assigned", frozenset()), ("assigned", tps(2, 3))]
            revoked_at = next(i for i, r in enumerate(beats(fake, a.member_id))
                              if owned(r) == {0, 1})
            assert beats(fake, a.member_id)[revoked_at].member_epoch == 1
            assert a.c.group_metadata().generation_id == 2
            assert b.c.group_metadata().generation_id == 2
            for p in range(4):
                await produce(fake, "t", [f"{p}-late".encode()], partition=p)
            await until(lambda: len(a.records) + len(b.records) == 24)
            await trio.sleep(10)
            assert fake.consumer_group("g").state == "Stable"
    both = offsets(a) + offsets(b)
    assert sorted(both) == [(p, o) for p in range(4) for o in range(6)]  # each once
    assert {p for p, _ in offsets(b)} == {2, 3}


async def test_a_member_that_leaves_hands_its_partitions_to_the_other(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """Closing a member commits, revokes and leaves (epoch -1); the coordinator gives its
    partitions to the member left, which reads on from the committed offsets."""
    a, b = Member(), Member()
    common: dict[str, Any] = dict(enable_auto_commit=True, auto_commit_interval=1000.0)
    async with running(fake, a, **common):
        await until(lambda: len(a.records) == 20)
        async with running(fake, b, **common, **second()):
            await split(fake, a, b)
            for p in (2, 3):
                await produce(fake, "t", [b"for-b"], partition=p)
            await until(lambda: len(b.records) == 2)
        assert beats(fake, b.member_id)[-1].member_epoch == -1
        await until(lambda: a.c.assignment() == ALL4, 10)
        assert a.events[-1] == ("assigned", tps(2, 3))
        for p in (2, 3):
            await produce(fake, "t", [b"for-a"], partition=p)
        await until(lambda: sum(r.value == b"for-a" for r in a.records) == 2)
        assert not any(r.value == b"for-b" for r in a.records)  # b committed them
        assert list(fake.consumer_group("g").members) == [a.member_id]


async def test_a_commit_sent_with_an_epoch_the_coordinator_just_moved_is_retried(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """A commit that reaches the coordinator after a heartbeat moved the member to a new
    epoch, whose answer is still on its way, is refused STALE_MEMBER_EPOCH; the member
    retries it after its next heartbeat, with the new epoch."""
    a, b = Member(), Member()
    async with running(fake, a):
        await until(lambda: len(a.records) == 20)
        async with running(fake, b, **second()):
            await split(fake, a, b)
        assert a.c.group_metadata().generation_id == 2
        n = len(beats(fake, a.member_id))
        fake.delay_responses(2.0, api_key=ApiKey.CONSUMER_GROUP_HEARTBEAT, count=1)
        await until(lambda: len(beats(fake, a.member_id)) > n, 10)
        assert fake.consumer_group("g").members[a.member_id].epoch == 3  # moved on
        await a.c.commit({("t", 0): 3})
        commits = [r.request for r in fake.requests_of(ApiKey.OFFSET_COMMIT)]
        assert [c.generation_id_or_member_epoch for c in commits] == [2, 3]
        assert fake.committed("g", "t", 0) == 3


async def test_a_member_the_coordinator_timed_out_cannot_commit_and_joins_again(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """A member whose heartbeats do not arrive is removed after the session timeout: its
    commit fails with CommitFailedError (UNKNOWN_MEMBER_ID) and, once its heartbeats get
    through, it loses its partitions and joins again as a new member."""
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        mid = m.member_id

        def drop(ctx: ControlContext) -> Any:
            return DROP if ctx.request.member_id == mid else None

        hook = fake.control(ApiKey.CONSUMER_GROUP_HEARTBEAT, drop, sticky=True)
        await until(lambda: mid not in fake.consumer_group("g").members, 30)
        with pytest.raises(CommitFailedError, match="UNKNOWN_MEMBER_ID"):
            await m.c.commit({("t", 0): 3})
        hook.remove()
        await until(lambda: ("lost", ALL4) in m.events, 30)
        await until(lambda: m.c.state == "stable" and m.c.assignment() == ALL4, 30)
        assert m.c.group_metadata().generation_id == 3  # joined, removed, joined
        assert fake.committed("g", "t", 0) is None


@pytest.mark.parametrize("static", [False, True])
async def test_a_member_that_stops_iterating_leaves_and_rejoins(
    fake: FakeCluster, autojump_clock: Any, static: bool,
) -> None:
    """Past max_poll_interval the member leaves: a dynamic one (-1) is removed, so its
    rejoin is a new epoch; a static one (-2) keeps its place and partitions, so its rejoin
    gets them back at the same epoch (no rebalance)."""
    m = Member()
    extra = {"group_instance_id": "i1"} if static else {}
    async with running(fake, m, max_poll_interval=10.0, **extra):
        await until(lambda: len(m.records) == 20)
        m.iterating = False
        await produce(fake, "t", [b"x"], partition=0)
        await until(lambda: any(r.member_epoch < 0 for r in beats(fake)), 20)
        group = fake.consumer_group("g")
        if static:
            assert group.members[m.member_id].epoch == -2
        else:
            assert group.state == "Empty"
        m.iterating = True
        await until(lambda: len(m.errors) == 1 and m.c.state == "stable", 20)
        assert isinstance(m.errors[0], MaxPollIntervalExceededError)
        assert m.c.group_metadata().generation_id == (1 if static else 3)
        await produce(fake, "t", [b"y"], partition=1)
        await until(lambda: any(r.value == b"y" for r in m.records), 10)


async def test_a_fenced_member_whose_rejoin_is_refused_backs_off_until_it_is_let_in(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """Kafka 4.1 refuses the epoch-0 rejoin of a member it still holds at a later epoch
    (FENCED_MEMBER_EPOCH again, until the session timeout removes it; KAFKA-19233 lets it
    in at once from later releases). The member rejoins at once after the first fence, as
    the Java client does, then paces its refused rejoins by retry_backoff, doubling up to
    retry_backoff_max: a bounded number of heartbeats, not a storm, until it is let in."""
    from pipeline.protocol.errors import ErrorCode
    from pipeline.protocol.messages import consumer_group_heartbeat as cgh

    a, b = Member(), Member()
    async with running(fake, a, retry_backoff=0.1, retry_backoff_max=1.0):
        await until(lambda: len(a.records) == 20)
        async with running(fake, b, **second()):
            await split(fake, a, b)
            first_epoch = fake.consumer_group("g").members[a.member_id].epoch
            storm = [0]

            async def slow_storm(ctx: ControlContext) -> None:
                if ctx.request.member_id == a.member_id and ctx.request.member_epoch == 0:
                    storm[0] += 1
                    if storm[0] > 200:  # (without pacing: let virtual time move, and fail)
                        await trio.sleep(1)

            def fence_a(ctx: ControlContext) -> Any:
                if ctx.request.member_id != a.member_id:
                    return None
                return cgh.ConsumerGroupHeartbeatResponse(
                    error_code=ErrorCode.FENCED_MEMBER_EPOCH)

            fake.control(ApiKey.CONSUMER_GROUP_HEARTBEAT, slow_storm, sticky=True)
            fake.control(ApiKey.CONSUMER_GROUP_HEARTBEAT, fence_a)  # (once, for a)
            fenced_at = trio.current_time()
            await until(lambda: a.events[-1:] == [("lost", tps(0, 1))], 10)
            await until(lambda: a.c.state == "stable" and a.c.assignment(), 60)
            let_in = trio.current_time() - fenced_at
            joins = [r.time for r in fake.requests_of(ApiKey.CONSUMER_GROUP_HEARTBEAT)
                     if r.request.member_id == a.member_id and r.request.member_epoch == 0
                     and r.time >= fenced_at]
            gaps = [later - earlier for earlier, later in pairwise(joins)]
            assert 18 <= let_in <= 25  # the session timeout (20 s) removed it, then in
            assert 10 <= len(joins) <= 40, len(joins)
            assert gaps[0] == pytest.approx(0.1, abs=0.05) and gaps[1] > gaps[0] * 1.5
            assert max(gaps) == pytest.approx(1.0, abs=0.3)
            assert fake.consumer_group("g").members[a.member_id].epoch > first_epoch
            # let in: the next fence's refused rejoins are paced from retry_backoff again
            await until(lambda: set(a.c.assignment()) | set(b.c.assignment()) == ALL4, 60)
            for _ in range(3):  # a's next three heartbeats: the fence, two refused joins
                fake.control(ApiKey.CONSUMER_GROUP_HEARTBEAT, fence_a)
            again_at = trio.current_time()
            await until(lambda: a.c.state == "stable" and trio.current_time() - again_at > 5
                        and a.c.assignment(), 60)
            joins = [r.time for r in fake.requests_of(ApiKey.CONSUMER_GROUP_HEARTBEAT)
                     if r.request.member_id == a.member_id and r.request.member_epoch == 0
                     and r.time >= again_at]
            assert [round(t - joins[0], 2) for t in joins[1:3]] == [0.1, 0.3]
