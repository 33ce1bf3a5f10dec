"""The rebalance state machine, pinned by deterministic scenarios (FakeCluster, virtual time).

Each test runs members as tasks that consume and record what happened to them (records,
callbacks, errors) and checks the group's outcome: who owns what, which generation,
what was committed, and that every record was handed out exactly once across members
(re-deliveries only where the scenario says so).
"""

from __future__ import annotations

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
    MaxPollIntervalExceededError,
    TopicPartition,
)
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake.coordinators import GROUP
from pipeline.testing.fake.faults import NO_RESPONSE
from pipeline.testing.fake.state import PartitionState
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_consumer, produce, until

ALL4 = {TopicPartition("t", p) for p in range(4)}


@dataclass
class Member:
    """A consumer run as a task: what it saw, in order."""

    name: str
    consumer: Consumer | None = None
    records: list[ConsumedRecord] = field(default_factory=list)
    events: list[tuple[str, frozenset[TopicPartition]]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    pause: float = 0.0  # seconds each record takes to process
    stopped: trio.Event = field(default_factory=trio.Event)

    def callbacks(self) -> dict[str, Any]:
        def log(kind: str) -> Any:
            def cb(consumer: Consumer, parts: frozenset[TopicPartition]) -> None:
                self.events.append((kind, parts))
            return cb
        return {"on_assigned": log("assigned"), "on_revoked": log("revoked"),
                "on_lost": log("lost")}

    @property
    def assignment(self) -> frozenset[TopicPartition]:
        assert self.consumer is not None
        return self.consumer.assignment()


@asynccontextmanager
async def running(fake: FakeCluster, member: Member, **options: Any) -> AsyncIterator[Member]:
    """Run ``member`` consuming ``t`` in group ``g`` for the block."""
    options.setdefault("group_id", "g")
    options.setdefault("topics", ["t"])
    options.setdefault("client_id", member.name)
    async with open_fake_consumer(fake, **member.callbacks(), **options) as consumer, \
            trio.open_nursery() as nursery:
        member.consumer = consumer

        async def consume() -> None:
            while True:
                try:
                    async for record in consumer:
                        member.records.append(record)
                        if member.pause:
                            await trio.sleep(member.pause)
                except MaxPollIntervalExceededError as exc:
                    member.errors.append(exc)

        nursery.start_soon(consume)
        yield member
        nursery.cancel_scope.cancel()


def offsets(*members: Member) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for m in members for r in m.records)


async def fill(fake: FakeCluster, start: int, stop: int, partitions: int = 4) -> None:
    for p in range(partitions):
        await produce(fake, "t", [f"{p}-{i}".encode() for i in range(start, stop)], partition=p)


@pytest.fixture
async def topic(fake: FakeCluster) -> FakeCluster:
    fake.create_topic("t", 4)
    await fill(fake, 0, 5)
    return fake


# ------------------------------------------------------------------ cooperative

async def test_cooperative_rebalance_revokes_only_what_moves_then_assigns_it(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """KIP-429 in two rebalances: A keeps two partitions throughout (never revoked), hands
    two over (revoked alone, committed first), and B receives them only in the second
    rebalance, after A revoked them."""
    fake = topic
    a, b = Member("a"), Member("b")
    opts = dict(partition_assignment_strategy="cooperative-sticky")
    async with running(fake, a, **opts):
        await until(lambda: len(a.records) == 20)
        assert a.events == [("assigned", frozenset(ALL4))]
        async with running(fake, b, **opts):
            await until(lambda: len(a.assignment) == 2 and len(b.assignment) == 2)
            await fill(fake, 5, 10)
            await until(lambda: len(a.records) + len(b.records) == 40)
            kept = a.assignment
            moved = frozenset(ALL4) - kept
            # on_assigned after every rebalance, with what is new (Java's rule)
            assert a.events == [("assigned", frozenset(ALL4)), ("revoked", moved),
                                ("assigned", frozenset()), ("assigned", frozenset())]
            assert b.events == [("assigned", frozenset()), ("assigned", moved)]
            assert fake.group("g").generation == 3  # B's join, then A's rejoin
            for tp in moved:  # auto-commit on revoke: B went on from A's position
                assert fake.committed("g", "t", tp.partition) is not None
    assert offsets(a, b) == [(p, o) for p in range(4) for o in range(10)]


async def test_eager_rebalance_revokes_everything_before_joining(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    fake = topic
    a, b = Member("a"), Member("b")
    async with running(fake, a, partition_assignment_strategy="range"):
        await until(lambda: len(a.records) == 20)
        async with running(fake, b, partition_assignment_strategy="range"):
            await until(lambda: len(b.assignment) == 2)
            await fill(fake, 5, 10)
            await until(lambda: len(a.records) + len(b.records) == 40)
            assert a.events == [("assigned", frozenset(ALL4)), ("revoked", frozenset(ALL4)),
                                ("assigned", a.assignment)]
            assert fake.group("g").generation == 2
    assert offsets(a, b) == [(p, o) for p in range(4) for o in range(10)]


# ------------------------------------------------------------------ the state machine

async def test_heartbeat_answered_rebalance_in_progress_makes_the_member_rejoin(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """The coordinator's REBALANCE_IN_PROGRESS is the only way a member learns that
    another joined: it rejoins with its current member id, and the group completes the
    new generation without waiting for the rebalance timeout."""
    fake = topic
    a = Member("a")
    async with running(fake, a, partition_assignment_strategy="range"):
        await until(lambda: len(a.records) == 20)
        member_id = a.consumer.group_metadata().member_id  # type: ignore[union-attr]
        fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
        start = trio.current_time()
        await until(lambda: fake.group("g").generation == 2 and fake.group("g").state == "Stable")
        assert trio.current_time() - start < 2.0  # one heartbeat interval, not a timeout
        assert a.consumer.group_metadata().member_id == member_id  # type: ignore[union-attr]
        assert a.events == [("assigned", frozenset(ALL4)), ("revoked", frozenset(ALL4)),
                            ("assigned", frozenset(ALL4))]


async def test_a_member_joining_during_a_rebalance_is_in_the_same_generation(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """B's join starts a rebalance that waits for A, which is slow to revoke; C joins
    meanwhile. One generation completes with all three, none is left for a later one."""
    fake = topic
    a, b, c = Member("a"), Member("b"), Member("c")

    async def slow_revoke(consumer: Consumer, parts: frozenset[TopicPartition]) -> None:
        a.events.append(("revoked", parts))
        await trio.sleep(5)

    async with running(fake, a, partition_assignment_strategy="range"):
        await until(lambda: len(a.records) == 20)
        a.callbacks = lambda: {"on_revoked": slow_revoke}  # type: ignore[method-assign]
        assert a.consumer is not None
        a.consumer._handoff._callbacks["revoke"] = slow_revoke
        async with running(fake, b, partition_assignment_strategy="range"):
            await until(lambda: fake.group("g").state == "PreparingRebalance")
            async with running(fake, c, partition_assignment_strategy="range"):
                await until(lambda: len(c.assignment) > 0 and fake.group("g").state == "Stable")
                assert fake.group("g").generation == 2
                assert len(fake.group("g").members) == 3
                assert sorted(len(m.assignment) for m in (a, b, c)) == [1, 1, 2]


async def test_a_commit_racing_a_revoke_commits_what_was_handed_out_before_it(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A's application commits while A's revocation waits for its next iteration (the
    group is preparing a rebalance, so the coordinator still takes the commit, KIP-429);
    B then starts exactly after what A committed: nothing is read twice."""
    fake = topic
    b = Member("b")
    async with open_fake_consumer(fake, group_id="g", topics=["t"], client_id="a",
                                  enable_auto_commit=False,
                                  partition_assignment_strategy="range") as a:
        got: list[ConsumedRecord] = []
        with trio.fail_after(60):
            async for record in a:
                got.append(record)
                if len(got) == 20:
                    break
        async with running(fake, b, partition_assignment_strategy="range",
                           enable_auto_commit=False):
            # A's heartbeat learns of the rebalance; its revocation waits for the application
            await until(lambda: a._handoff.pending)
            assert fake.group("g").state == "PreparingRebalance"
            await a.commit()  # races it: still generation 1
            assert [fake.committed("g", "t", p) for p in range(4)] == [5, 5, 5, 5]
            with trio.fail_after(60):
                while len(b.assignment) < 2:  # iterate: the revocation runs, A rejoins
                    with trio.move_on_after(0.5):
                        got.append(await a.__anext__())
            await fill(fake, 5, 6)
            await until(lambda: len(b.records) == 2)
        assert all(r.offset == 5 for r in b.records)


async def test_a_commit_after_the_group_moved_on_fails_with_commit_failed(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A stops iterating; B's join waits for A up to the rebalance timeout (A's
    max_poll_interval), then completes without it. A's commit of generation 1 is refused
    (CommitFailedError), and A's next iteration reports the poll timeout."""
    fake = topic
    b = Member("b")
    async with open_fake_consumer(fake, group_id="g", topics=["t"], client_id="a",
                                  enable_auto_commit=False, max_poll_interval=20.0,
                                  partition_assignment_strategy="range") as a:
        with trio.fail_after(60):
            async for _ in a:
                break
        async with running(fake, b, partition_assignment_strategy="range"):
            await until(lambda: fake.group("g").generation == 2 and len(b.assignment) == 4)
            with pytest.raises(CommitFailedError):
                await a.commit({("t", 0): 1})
            with pytest.raises(MaxPollIntervalExceededError, match=r"max_poll_interval=20\.0"):
                await a.__anext__()
            assert a.state == "unjoined"


async def test_coordinator_moves_without_a_rebalance(topic: FakeCluster, autojump_clock: Any) -> None:
    """The group's coordinator moves: the old broker answers NOT_COORDINATOR, the member
    finds the new one and goes on in the same generation; commits land there."""
    fake = topic
    a = Member("a")
    async with running(fake, a, enable_auto_commit=False):
        await until(lambda: len(a.records) == 20)
        old = fake.coordinator("g", GROUP)
        new = fake.move_coordinator("g", key_type=GROUP)
        await until(lambda: any(r.api_key == ApiKey.HEARTBEAT and r.node_id == new
                                for r in fake.requests))
        assert a.consumer is not None
        await a.consumer.commit()
        assert fake.committed("g", "t", 0) == 5
        assert fake.group("g").generation == 1 and old != new
        assert a.consumer.statistics().coordinator == new


async def test_a_member_that_stops_heartbeating_is_removed_and_loses_its_partitions(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    fake = topic
    a, b = Member("a"), Member("b")
    async with running(fake, a), running(fake, b):
        await until(lambda: len(a.assignment) == 2 and len(b.assignment) == 2)
        silenced = fake.control(
            ApiKey.HEARTBEAT,
            lambda ctx: NO_RESPONSE if ctx.client_id == "a" else None, sticky=True)
        await until(lambda: len(b.assignment) == 4)  # A expired after session_timeout
        assert len(fake.group("g").members) == 1
        held = a.assignment
        silenced.remove()  # A hears UNKNOWN_MEMBER_ID: its partitions are lost, not revoked
        await until(lambda: len(a.assignment) == 2 and len(b.assignment) == 2)
        assert [e for e in a.events if e[0] != "assigned"][-1] == ("lost", held)


async def test_poll_timeout_leaves_the_group_and_says_so(topic: FakeCluster, autojump_clock: Any) -> None:
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"], max_poll_interval=10.0,
                                  enable_auto_commit=False) as a:
        with trio.fail_after(60):
            async for _ in a:
                break
        assert a.state == "stable"
        await trio.sleep(15)  # processing, not iterating
        assert a.state == "unjoined" and len(fake.group("g").members) == 0
        with pytest.raises(MaxPollIntervalExceededError, match="left group 'g'"):
            await a.__anext__()
        record = await a.__anext__()  # iterating again rejoins
        assert a.state == "stable" and record.topic == "t"
        assert fake.group("g").generation == 3


async def test_static_member_restart_rejoins_without_a_rebalance(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """KIP-345: a static member leaves no LeaveGroup on close; restarted with the same
    group_instance_id within the session timeout it gets its partitions back in the same
    generation, and the other member is not disturbed."""
    fake = topic
    a, b = Member("a"), Member("b")
    async with running(fake, b, group_instance_id="b-1"):
        async with running(fake, a, group_instance_id="a-1"):
            await until(lambda: len(a.assignment) == 2 and len(b.assignment) == 2
                        and fake.group("g").state == "Stable")
            before = (fake.group("g").generation, a.assignment, list(b.events))
        assert len(fake.group("g").members) == 2  # still there
        a2 = Member("a")
        async with running(fake, a2, group_instance_id="a-1"):
            await until(lambda: len(a2.assignment) == 2)
            await trio.sleep(5)
            assert (fake.group("g").generation, a2.assignment, b.events) == before


async def test_restart_resumes_from_the_committed_offsets(topic: FakeCluster, autojump_clock: Any) -> None:
    fake = topic
    a = Member("a")
    async with running(fake, a):
        await until(lambda: len(a.records) == 20)
    assert [fake.committed("g", "t", p) for p in range(4)] == [5] * 4  # committed on close
    await fill(fake, 5, 7)
    a2 = Member("a")
    async with running(fake, a2):
        await until(lambda: len(a2.records) == 8)
    assert offsets(a2) == [(p, o) for p in range(4) for o in (5, 6)]



async def test_the_leader_rebalances_when_subscribed_topics_change(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """A subscribed topic created after the join, then grown by a partition, is
    assigned: the leader notices in its metadata (asked every metadata_max_age) and
    rejoins, as the Java leader does."""
    fake.create_topic("t", 1)
    a = Member("a")
    async with running(fake, a, topics=["t", "later"], metadata_max_age=10.0):
        await until(lambda: a.assignment == {TopicPartition("t", 0)})
        fake.create_topic("later", 1)
        await until(lambda: TopicPartition("later", 0) in a.assignment, within=60)
        fake.state.topics["t"].partitions.append(  # a partition added (CreatePartitions)
            PartitionState("t", 1, leader=0, leader_epoch=0, replicas=(0,)))
        await until(lambda: TopicPartition("t", 1) in a.assignment, within=60)
        assert fake.group("g").generation == 3
