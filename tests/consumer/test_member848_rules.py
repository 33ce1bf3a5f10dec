"""The KIP-848 member (``group_protocol="consumer"``) against a scripted coordinator.

:class:`Coordinator848` plays Kafka's group coordinator for one group through
``control()`` hooks, in front of the fake's own (``fake/groups848.py``, which
tests/testing/test_fake_vs_kafka_groups848.py holds to Kafka 4.1 and
``test_member848_native`` runs the member against): it answers ConsumerGroupHeartbeat
(join with epoch 0, leave with -1/-2, fence any other epoch, send the target assignment
by topic id when it changes) and OffsetCommit v9 (the member epoch checked as Kafka 4.1
checks it: any other epoch, lower or higher, is STALE_MEMBER_EPOCH; an unknown member
UNKNOWN_MEMBER_ID). Tests steer it: the target of each member, the heartbeat interval,
and error codes to answer next. Everything runs on virtual time.

Where the script is simpler than Kafka (on purpose: the tests choose targets): a new
target is given at once, without waiting for another member to release its partitions;
the assignment is sent only when it changed (Kafka sends it in the answer to every full
heartbeat, which is what the member sends); the previous epoch re-sent after a lost
answer is fenced (Kafka accepts it when the owned partitions are inside the assignment).
The member's answer to each of those is tested against the native coordinator.
"""

from __future__ import annotations

from collections import deque
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
    MaxPollIntervalExceededError,
    TopicPartition,
    open_consumer,
)
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import consumer_group_heartbeat as cgh
from pipeline.protocol.messages import offset_commit as oc
from pipeline.testing.fake.cluster import SUPPORTED_VERSIONS
from pipeline.testing.fake.coordinators import GROUP
from pipeline.testing.fake.faults import DROP, ControlContext
from pipeline.testing.fake.offsets import CommittedOffset
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import HalfRandom, produce, until

Target = frozenset[TopicPartition]


@dataclass
class Member848:
    """The coordinator's view of one member."""

    epoch: int
    target: Target
    sent: Target | None = None  # the target last sent to it (None: not yet)


class Coordinator848:
    """Kafka's KIP-848 group coordinator for group ``g``, scripted (module doc).

    ``targets`` maps a member id to its target; a member without an entry gets every
    partition of the topics it subscribes to that no earlier member has (join order).
    """

    def __init__(self, fake: FakeCluster, interval_ms: int = 1000) -> None:
        self.fake = fake
        self.interval_ms = interval_ms
        self.members: dict[str, Member848] = {}
        self.targets: dict[str, Target] = {}
        self.group_epoch = 0
        self.errors: deque[int] = deque()  # the next heartbeats' answers
        self.commit_errors: deque[int] = deque()  # the next commits' answers
        self.heartbeats: list[cgh.ConsumerGroupHeartbeatRequest] = []
        self.times: list[float] = []  # when each heartbeat arrived
        self.send_member_id = True  # the answer names the member id
        self.server_member_id: str | None = None  # the id a joining member is given
        self.drops = 0  # the next heartbeats close the connection instead
        self.hold_assignment = 0  # the next answers to a member leave its new target out
        self.leave_delay = 0.0  # seconds a leave heartbeat's answer takes
        self.answer_delay = 0.0  # seconds any other heartbeat's answer takes
        self.error_message: str | None = None  # sent with the error codes of `errors`
        self.bumps = 0  # the next answers move their member to a new epoch, target kept
        fake.control(ApiKey.CONSUMER_GROUP_HEARTBEAT, self._heartbeat, sticky=True)
        fake.control(ApiKey.OFFSET_COMMIT, self._commit, sticky=True)

    def _default_target(self, member_id: str, topics: tuple[str, ...]) -> Target:
        taken = {tp for m, v in self.members.items() if m != member_id for tp in v.target}
        return frozenset(TopicPartition(t, p) for t in topics if t in self.fake.state.topics
                         for p in range(len(self.fake.state.topics[t].partitions))
                         if TopicPartition(t, p) not in taken)

    def set_target(self, member_id: str, target: set[TopicPartition] | Target) -> None:
        """The member's next target (sent, with a new epoch, in its next heartbeat)."""
        self.targets[member_id] = frozenset(target)
        if member_id in self.members:
            self.members[member_id].target = frozenset(target)

    def _assignment(self, target: Target) -> cgh.Assignment:
        topics = self.fake.state.topics
        by_topic: dict[str, list[int]] = {}
        for tp in target:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return cgh.Assignment(topic_partitions=tuple(
            cgh.ResponseTopicPartitions(topic_id=topics[t].topic_id, partitions=tuple(sorted(ps)))
            for t, ps in sorted(by_topic.items())))

    async def _heartbeat(self, ctx: ControlContext) -> Any:
        req: cgh.ConsumerGroupHeartbeatRequest = ctx.request
        self.heartbeats.append(req)
        self.times.append(ctx.time)
        if self.drops:
            self.drops -= 1
            return DROP
        if self.errors:
            return cgh.ConsumerGroupHeartbeatResponse(error_code=self.errors.popleft(),
                                                      error_message=self.error_message)
        mid = req.member_id
        member_id = mid if self.send_member_id else None
        if req.member_epoch < 0:
            self.members.pop(mid, None)
            await trio.sleep(self.leave_delay)
            return cgh.ConsumerGroupHeartbeatResponse(member_id=member_id,
                                                      member_epoch=req.member_epoch)
        await trio.sleep(self.answer_delay)
        member = self.members.get(mid)
        if req.member_epoch == 0:
            if self.server_member_id is not None:
                mid = member_id = self.server_member_id
            self.group_epoch += 1
            member = Member848(self.group_epoch, frozenset())
            self.members[mid] = member
            member.target = self.targets.get(
                mid, self._default_target(mid, tuple(req.subscribed_topic_names or ())))
        elif member is None:
            return cgh.ConsumerGroupHeartbeatResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID)
        elif req.member_epoch != member.epoch:
            return cgh.ConsumerGroupHeartbeatResponse(error_code=ErrorCode.FENCED_MEMBER_EPOCH)
        assignment = None
        if self.hold_assignment:
            self.hold_assignment -= 1
        elif member.target != member.sent:
            if member.sent is not None:
                self.group_epoch += 1
                member.epoch = self.group_epoch
            member.sent = member.target
            assignment = self._assignment(member.target)
        elif self.bumps:
            self.bumps -= 1
            self.group_epoch += 1
            member.epoch = self.group_epoch
        return cgh.ConsumerGroupHeartbeatResponse(
            member_id=member_id, member_epoch=member.epoch,
            heartbeat_interval_ms=self.interval_ms, assignment=assignment)

    def _commit(self, ctx: ControlContext) -> oc.OffsetCommitResponse:
        req: oc.OffsetCommitRequest = ctx.request
        member = self.members.get(req.member_id)
        code = 0
        if self.commit_errors:
            code = self.commit_errors.popleft()
        elif member is None:
            code = ErrorCode.UNKNOWN_MEMBER_ID
        elif req.generation_id_or_member_epoch != member.epoch:
            code = ErrorCode.STALE_MEMBER_EPOCH
        if code == 0:
            self.fake.offsets.commit("g", {
                (t.name, p.partition_index): CommittedOffset(p.committed_offset)
                for t in req.topics for p in t.partitions})
        return oc.OffsetCommitResponse(topics=tuple(
            oc.OffsetCommitResponseTopic(name=t.name, partitions=tuple(
                oc.OffsetCommitResponsePartition(partition_index=p.partition_index,
                                                 error_code=int(code))
                for p in t.partitions))
            for t in req.topics))


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=3, seed=7, auto_create_topics=False, api_versions={
        **SUPPORTED_VERSIONS, ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1)})
    await nursery.start(cluster.run)
    cluster.create_topic("t", 4)
    for p in range(4):
        await produce(cluster, "t", [f"{p}-{i}".encode() for i in range(5)], partition=p)
    return cluster


@pytest.fixture
def coord(fake: FakeCluster) -> Coordinator848:
    return Coordinator848(fake)


ALL4 = frozenset(TopicPartition("t", p) for p in range(4))


def tps(*partitions: int) -> Target:
    return frozenset(TopicPartition("t", p) for p in partitions)


@dataclass
class Member:
    """A consumer run as a task: what it saw, in order."""

    consumer: Consumer | None = None
    records: list[ConsumedRecord] = field(default_factory=list)
    events: list[tuple[str, Target]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    iterating: bool = True  # False: the application stops taking records

    def callbacks(self) -> dict[str, Any]:
        def log(kind: str) -> Any:
            def cb(consumer: Consumer, parts: Target) -> None:
                self.events.append((kind, parts))
            return cb
        return {"on_assigned": log("assigned"), "on_revoked": log("revoked"),
                "on_lost": log("lost")}

    @property
    def c(self) -> Consumer:
        assert self.consumer is not None
        return self.consumer

    @property
    def member_id(self) -> str:
        return self.c.group_metadata().member_id


def options(**overrides: Any) -> dict[str, Any]:
    opts: dict[str, Any] = dict(
        group_id="g", topics=["t"], group_protocol="consumer", auto_offset_reset="earliest",
        retry_backoff=0.125, retry_backoff_max=0.125, retry_backoff_jitter=0,
        request_timeout=5.0, max_poll_interval=30.0, enable_auto_commit=False,
        rng=HalfRandom(1))
    opts.update(overrides)
    return opts


@asynccontextmanager
async def running(fake: FakeCluster, member: Member, **overrides: Any) -> AsyncIterator[Member]:
    """Run ``member`` consuming ``t`` in group ``g`` (KIP-848) for the block."""
    async with open_consumer(fake.bootstrap, connector=fake.connector, **member.callbacks(),
                             **options(**overrides)) as consumer, \
            trio.open_nursery() as nursery:
        member.consumer = consumer

        async def consume() -> None:
            while True:
                try:
                    async for record in consumer:
                        member.records.append(record)
                        while not member.iterating:  # noqa: ASYNC110 - a flag the test flips
                            await trio.sleep(0.5)
                except (MaxPollIntervalExceededError, ConsumerError) as exc:
                    member.errors.append(exc)
                    if not isinstance(exc, MaxPollIntervalExceededError):
                        return

        nursery.start_soon(consume)
        yield member
        nursery.cancel_scope.cancel()


def quiet(coord: Coordinator848) -> None:
    """The member joining next owns nothing: no fetch long-polls hold up the connection
    its coordinator lookups use, so request times show the member's own backoffs."""
    coord.server_member_id = "quiet"
    coord.targets["quiet"] = frozenset()


def beats(coord: Coordinator848, member_id: str) -> list[cgh.ConsumerGroupHeartbeatRequest]:
    return [r for r in coord.heartbeats if r.member_id == member_id]


# ------------------------------------------------------------------ joining


async def test_a_member_joins_with_epoch_0_owns_its_target_and_reports_it(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Joining sends epoch 0, the subscription, the rebalance timeout and no owned
    partitions; the answer's epoch becomes the member's (group metadata, statistics),
    the target is assigned (on_assigned once, with all of it), the member turns stable,
    and the following heartbeats carry that epoch and the partitions owned, by topic id,
    every heartbeat_interval the coordinator set."""
    m = Member()
    coord.interval_ms = 3000
    async with running(fake, m, client_rack="r1"):
        await until(lambda: len(m.records) == 20)
        assert m.c.state == "stable"
        assert m.events == [("assigned", ALL4)]
        meta = m.c.group_metadata()
        assert meta.generation_id == 1 and meta.group_id == "g"
        first = beats(coord, meta.member_id)[0]
        assert first.member_epoch == 0 and first.topic_partitions == ()
        assert first.subscribed_topic_names == ("t",)
        assert first.rebalance_timeout_ms == 30000 and first.rack_id == "r1"
        n = len(beats(coord, meta.member_id))
        await trio.sleep(30)
        later = beats(coord, meta.member_id)[n:]
        assert 9 <= len(later) <= 11  # every 3 s
        topic_id = fake.state.topics["t"].topic_id
        assert all(r.member_epoch == 1 for r in later)
        assert later[-1].topic_partitions == (
            cgh.TopicPartitions(topic_id=topic_id, partitions=(0, 1, 2, 3)),)
        stats = m.c.statistics()
        assert stats.generation == 1 and stats.rebalances == 1
        assert stats.member_id == meta.member_id
        assert stats.coordinator == fake.coordinators.node_for(GROUP, "g")
        assert stats.coordinator_moves == 0
        assert stats.since_last_heartbeat is not None and stats.since_last_heartbeat <= 3


async def test_the_member_takes_the_id_and_interval_the_coordinator_answers(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A member id in the answer replaces the member's own (the next heartbeats and the
    group metadata carry it); a heartbeat_interval_ms of 0 keeps the interval in use."""
    coord.server_member_id = "given-by-kafka"
    coord.interval_ms = 4000
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        assert m.member_id == "given-by-kafka"
        assert coord.heartbeats[0].member_id != "given-by-kafka"
        assert coord.heartbeats[-1].member_id == "given-by-kafka"
        coord.send_member_id = False
        coord.interval_ms = 0
        n = len(coord.heartbeats)
        await trio.sleep(40)
        assert 9 <= len(coord.heartbeats) - n <= 11  # still every 4 s
        assert m.member_id == "given-by-kafka"


async def test_an_empty_target_is_assigned_once_and_the_member_is_stable(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A first target with nothing in it still completes the join: on_assigned runs
    once with no partitions (as after every Java rebalance) and the member is stable;
    later heartbeats with no new target run no callback."""
    m = Member()
    coord.targets["given"] = frozenset()
    coord.server_member_id = "given"
    async with running(fake, m):
        await until(lambda: m.c.state == "stable")
        await until(lambda: m.events == [("assigned", frozenset())])
        await trio.sleep(10)
        assert m.events == [("assigned", frozenset())]
        assert m.records == []


# ------------------------------------------------------------------ reconciling


async def test_a_smaller_target_revokes_at_once_and_a_bigger_one_assigns(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Reconciling: partitions that left the target are revoked (on_revoked with just
    them) and a heartbeat reports it right away, long before the interval, so the
    coordinator can hand them on; partitions added are assigned (on_assigned with just
    them). Each new epoch counts as a rebalance and is what the member reports."""
    coord.interval_ms = 20_000
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        mid = m.member_id
        coord.set_target(mid, tps(0, 1))
        await until(lambda: m.c.group_metadata().generation_id == 2, 25)
        t_answer = trio.current_time()
        await until(lambda: m.c.assignment() == tps(0, 1), 1)
        await until(lambda: len(coord.heartbeats) > 0 and coord.heartbeats[-1].topic_partitions
                    is not None and sum(len(t.partitions) for t in
                                        coord.heartbeats[-1].topic_partitions) == 2, 1)
        assert trio.current_time() - t_answer < 1
        assert m.events == [("assigned", ALL4), ("revoked", tps(2, 3))]
        assert coord.heartbeats[-1].member_epoch == 2
        coord.set_target(mid, tps(0, 1, 3))
        await until(lambda: m.c.assignment() == tps(0, 1, 3), 25)
        assert m.events[2:] == [("assigned", tps(3))]
        assert m.c.statistics().rebalances == 3
        await produce(fake, "t", [b"x"], partition=3)
        await until(lambda: any(r.partition == 3 and r.offset == 5 for r in m.records))


async def test_a_target_with_a_topic_the_metadata_does_not_know_yet_is_waited_for(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A target naming a topic id the client's metadata does not have refreshes the
    metadata and assigns once the id resolves, never a partition by a wrong name."""
    m = Member()
    async with running(fake, m, topics=["t", "u"]):
        await until(lambda: len(m.records) == 20)
        fake.create_topic("u", 2)
        await produce(fake, "u", [b"u0"], partition=1)
        coord.set_target(m.member_id, ALL4 | {TopicPartition("u", 0), TopicPartition("u", 1)})
        await until(lambda: any(r.topic == "u" for r in m.records), 30)
        assert m.events == [("assigned", ALL4),
                            ("assigned", frozenset({TopicPartition("u", 0),
                                                    TopicPartition("u", 1)}))]


# ------------------------------------------------------------------ losing membership


@pytest.mark.parametrize("code", [ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID])
async def test_a_fenced_member_loses_its_partitions_and_joins_again(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any, code: ErrorCode,
) -> None:
    """FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID: the partitions are lost (on_lost, no
    on_revoked, nothing committed), the member joins again with epoch 0 and the same
    member id at once (not one heartbeat interval later), is assigned again and goes on
    reading."""
    m = Member()
    coord.interval_ms = 20_000
    async with running(fake, m, enable_auto_commit=True, auto_commit_interval=1000.0):
        await until(lambda: len(m.records) == 20)
        mid = m.member_id
        coord.errors.append(int(code))
        coord.members.pop(mid)
        await until(lambda: ("lost", ALL4) in m.events, 25)
        await until(lambda: m.events[-1] == ("assigned", ALL4), 2)
        assert m.events == [("assigned", ALL4), ("lost", ALL4), ("assigned", ALL4)]
        rejoin = [r for r in coord.heartbeats if r.member_epoch == 0]
        assert len(rejoin) == 2 and rejoin[1].member_id == mid
        assert rejoin[1].topic_partitions == ()
        assert m.c.state == "stable" and m.c.group_metadata().generation_id == 2
        assert fake.offsets.fetch("g", ("t", 0)) is None
        await produce(fake, "t", [b"x"], partition=0)
        await until(lambda: any(r.offset == 5 and r.partition == 0 for r in m.records))


async def test_a_member_fenced_with_nothing_owned_just_joins_again(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Fenced while owning nothing: no on_lost at all; the member rejoins."""
    m = Member()
    coord.targets["given"] = frozenset()
    coord.server_member_id = "given"
    async with running(fake, m):
        await until(lambda: m.c.state == "stable")
        coord.errors.append(int(ErrorCode.FENCED_MEMBER_EPOCH))
        coord.members.clear()
        await until(lambda: sum(r.member_epoch == 0 for r in coord.heartbeats) == 2, 10)
        await until(lambda: m.c.state == "stable")
        assert [e for e in m.events if e[0] == "lost"] == []


# ------------------------------------------------------------------ coordinator errors


@pytest.mark.parametrize("code", [ErrorCode.NOT_COORDINATOR,
                                  ErrorCode.COORDINATOR_NOT_AVAILABLE])
async def test_a_moved_coordinator_is_found_again_and_the_membership_kept(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any, code: ErrorCode,
) -> None:
    """NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE: the coordinator is looked up again
    (FindCoordinator), the heartbeat retried after the backoff, with the same epoch:
    nothing is lost."""
    m = Member()
    coord.interval_ms = 10_000
    quiet(coord)
    async with running(fake, m, retry_backoff=0.1, retry_backoff_max=5.0):
        await until(lambda: m.c.state == "stable")
        finds = len(fake.requests_of(ApiKey.FIND_COORDINATOR))
        n = len(coord.heartbeats)
        coord.errors.append(int(code))
        await until(lambda: len(coord.heartbeats) >= n + 2, 30)
        first, retry = coord.heartbeats[n], coord.heartbeats[n + 1]
        times = coord.times
        # the first retry's backoff (retry_backoff), not the heartbeat interval
        assert times[n + 1] - times[n] == pytest.approx(0.1, abs=0.02)
        assert len(fake.requests_of(ApiKey.FIND_COORDINATOR)) > finds
        assert retry.member_epoch == first.member_epoch == 1
        assert m.events == [("assigned", frozenset())] and m.c.state == "stable"
        assert m.c.statistics().coordinator_moves >= 0


@pytest.mark.parametrize("code", [ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                  ErrorCode.REQUEST_TIMED_OUT])
async def test_a_busy_coordinator_is_asked_again_after_the_backoff(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any, code: ErrorCode,
) -> None:
    """COORDINATOR_LOAD_IN_PROGRESS / REQUEST_TIMED_OUT: the same coordinator is asked
    again after the backoff (no FindCoordinator), the membership kept."""
    m = Member()
    coord.interval_ms = 10_000
    quiet(coord)
    async with running(fake, m, retry_backoff=0.1, retry_backoff_max=5.0):
        await until(lambda: m.c.state == "stable")
        finds = len(fake.requests_of(ApiKey.FIND_COORDINATOR))
        n = len(coord.heartbeats)
        coord.errors.extend([int(code)] * 3)
        await until(lambda: len(coord.heartbeats) >= n + 4, 30)
        times = coord.times
        for i in range(n, n + 3):  # the coordinator answered: each retry waits retry_backoff
            assert times[i + 1] - times[i] == pytest.approx(0.1, abs=0.02)
        assert len(fake.requests_of(ApiKey.FIND_COORDINATOR)) == finds
        assert m.events == [("assigned", frozenset())] and m.c.state == "stable"


async def test_a_lost_connection_is_retried_with_backoff(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A heartbeat whose connection drops is sent again after an exponential backoff
    (retry_backoff, doubling per consecutive failure, starting over after an answer);
    the member keeps its epoch and partitions."""
    m = Member()
    coord.interval_ms = 10_000
    quiet(coord)
    async with running(fake, m, retry_backoff=0.1, retry_backoff_max=5.0):
        await until(lambda: m.c.state == "stable")
        n = len(coord.heartbeats)
        coord.drops = 3
        await until(lambda: len(coord.heartbeats) >= n + 4, 30)
        times = coord.times
        gaps = [times[i + 1] - times[i] for i in range(n, n + 3)]
        assert gaps == pytest.approx([0.1, 0.2, 0.4], abs=0.02)
        assert coord.heartbeats[n + 3].member_epoch == 1
        coord.drops = 1
        await until(lambda: len(coord.heartbeats) >= n + 6, 30)
        times = coord.times
        assert times[n + 5] - times[n + 4] == pytest.approx(0.1, abs=0.02)
        assert m.events == [("assigned", frozenset())] and m.c.state == "stable"


async def test_a_first_join_refused_as_unknown_is_sent_again_after_the_backoff(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A join (epoch 0) refused UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH is sent again
    after retry_backoff, doubling while it is refused."""
    coord.errors.extend([int(ErrorCode.UNKNOWN_MEMBER_ID), int(ErrorCode.FENCED_MEMBER_EPOCH)])
    m = Member()
    async with running(fake, m, retry_backoff=0.1, retry_backoff_max=5.0):
        await until(lambda: m.c.state == "stable", 5)
        assert [r.member_epoch for r in coord.heartbeats[:3]] == [0, 0, 0]
        times = coord.times
        assert [times[1] - times[0], times[2] - times[1]] == pytest.approx([0.1, 0.2], abs=0.02)


async def test_a_first_heartbeat_that_fails_is_retried(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A join whose connection drops is sent again after the backoff."""
    coord.drops = 1
    m = Member()
    async with running(fake, m):
        await until(lambda: m.c.state == "stable", 5)
        assert [r.member_epoch for r in coord.heartbeats[:2]] == [0, 0]


async def test_a_refused_heartbeat_fails_the_consumer_with_the_reason(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Any other error (GROUP_AUTHORIZATION_FAILED, UNSUPPORTED_ASSIGNOR...) fails the
    consumer: the next iteration raises a GroupError naming the code, and the member's
    background work stops: no heartbeat, no leave, no auto-commit."""
    m = Member()
    async with running(fake, m, max_poll_interval=10.0, enable_auto_commit=True,
                       auto_commit_interval=1.0):
        await until(lambda: len(m.records) == 20)
        coord.errors.append(int(ErrorCode.GROUP_AUTHORIZATION_FAILED))
        await until(lambda: bool(m.errors), 10)
        assert "GROUP_AUTHORIZATION_FAILED" in str(m.errors[0])
        assert m.c.state == "failed"
        n, commits = len(coord.heartbeats), len(fake.requests_of(ApiKey.OFFSET_COMMIT))
        await trio.sleep(40)
        assert len(coord.heartbeats) == n
        assert len(fake.requests_of(ApiKey.OFFSET_COMMIT)) == commits


# ------------------------------------------------------------------ commits


async def test_commits_carry_the_member_epoch_and_are_counted(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """commit() sends the member id and epoch; Kafka stores the offsets; the statistics
    count the commit and show each partition's committed offset; an empty commit sends
    nothing."""
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        await m.c.commit()
        (req,) = [r.request for r in fake.requests_of(ApiKey.OFFSET_COMMIT)]
        assert req.generation_id_or_member_epoch == 1 and req.member_id == m.member_id
        assert {p: fake.offsets.fetch("g", ("t", p)).offset for p in range(4)} == \
            dict.fromkeys(range(4), 5)
        stats = m.c.statistics()
        assert stats.commits == 1
        assert m.c._group is not None
        assert m.c._group.committed_offsets == {TopicPartition("t", p): 5 for p in range(4)}
        await m.c.commit({})
        await trio.sleep(20)  # no auto-commit (enable_auto_commit=False)
        assert len(fake.requests_of(ApiKey.OFFSET_COMMIT)) == 1
        assert (await m.c.committed([("t", 0)]))[TopicPartition("t", 0)] is not None


async def test_a_commit_with_a_stale_epoch_waits_for_the_next_heartbeat(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """STALE_MEMBER_EPOCH: a heartbeat is sent at once (not at the interval) and the
    commit is retried after its answer, with the epoch it brought."""
    coord.interval_ms = 30_000
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        n = len(coord.heartbeats)
        epoch = coord.group_epoch
        coord.commit_errors.append(int(ErrorCode.STALE_MEMBER_EPOCH))
        coord.answer_delay = 0.5  # the heartbeat's answer comes 0.5 s after it is sent
        coord.bumps = 1  # and moves the member to a new epoch
        t0 = trio.current_time()
        await m.c.commit({("t", 0): 3})
        assert trio.current_time() - t0 < 5
        assert len(coord.heartbeats) == n + 1
        commits = fake.requests_of(ApiKey.OFFSET_COMMIT)
        assert [c.request.generation_id_or_member_epoch for c in commits] == [epoch, epoch + 1]
        assert commits[1].time >= coord.times[n] + 0.5  # retried after the answer, not before
        assert fake.offsets.fetch("g", ("t", 0)).offset == 3


@pytest.mark.parametrize("code", [ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID])
async def test_a_commit_by_a_removed_member_fails_with_commit_failed(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any, code: ErrorCode,
) -> None:
    """A commit answered FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID raises
    CommitFailedError (another member may own the partitions now), once."""
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        coord.commit_errors.append(int(code))
        with pytest.raises(CommitFailedError, match=code.name):
            await m.c.commit({("t", 0): 3})
        assert len(fake.requests_of(ApiKey.OFFSET_COMMIT)) == 1
        assert fake.offsets.fetch("g", ("t", 0)) is None


async def test_a_commit_refused_otherwise_fails_with_the_code(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A commit refused with another error (GROUP_AUTHORIZATION_FAILED) raises a
    ConsumerError naming it, and counts no commit."""
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        coord.commit_errors.append(int(ErrorCode.GROUP_AUTHORIZATION_FAILED))
        with pytest.raises(ConsumerError, match="GROUP_AUTHORIZATION_FAILED") as info:
            await m.c.commit({("t", 0): 3})
        assert not isinstance(info.value, CommitFailedError)
        assert m.c.statistics().commits == 0


async def test_a_commit_before_joining_fails_without_a_request(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Until the member has an epoch, commit() raises CommitFailedError and sends no
    OffsetCommit."""
    coord.errors.extend([int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)] * 1000)
    m = Member()
    async with running(fake, m):
        await trio.sleep(1)
        assert m.c.state == "rebalancing"  # joining
        with pytest.raises(CommitFailedError, match="not a member"):
            await m.c.commit({("t", 0): 1})
        assert fake.requests_of(ApiKey.OFFSET_COMMIT) == []
        coord.errors.clear()


async def test_a_commit_that_gets_no_answer_fails_after_default_api_timeout(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A commit retried past default_api_timeout raises ConsumerError saying so."""
    m = Member()
    async with running(fake, m, default_api_timeout=7.0):
        await until(lambda: len(m.records) == 20)
        coord.commit_errors.extend([int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)] * 10_000)
        t0 = trio.current_time()
        with pytest.raises(ConsumerError, match=r"default_api_timeout=7\.0"):
            await m.c.commit({("t", 0): 3})
        assert 7 <= trio.current_time() - t0 < 8
        coord.commit_errors.clear()


async def test_auto_commit_commits_what_moved_each_interval_while_stable(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """With enable_auto_commit, every auto_commit_interval the positions that changed
    since the last auto-commit are committed (nothing is sent when none did)."""
    m = Member()
    async with running(fake, m, enable_auto_commit=True, auto_commit_interval=5.0):
        await until(lambda: len(m.records) == 20)
        await until(lambda: len(fake.requests_of(ApiKey.OFFSET_COMMIT)) == 1, 6)
        await trio.sleep(20)
        assert len(fake.requests_of(ApiKey.OFFSET_COMMIT)) == 1
        assert fake.offsets.fetch("g", ("t", 2)).offset == 5
        await produce(fake, "t", [b"x"], partition=2)
        await until(lambda: len(m.records) == 21)
        await until(lambda: len(fake.requests_of(ApiKey.OFFSET_COMMIT)) == 2, 6)
        (last,) = fake.requests_of(ApiKey.OFFSET_COMMIT)[1:]
        assert [(t.name, [p.partition_index for p in t.partitions])
                for t in last.request.topics] == [("t", [2])]
        assert fake.offsets.fetch("g", ("t", 2)).offset == 6


async def test_auto_commit_waits_while_the_member_is_not_stable(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """No auto-commit before the member is stable (it has no epoch to commit with)."""
    coord.errors.extend([int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)] * 200)
    m = Member()
    async with running(fake, m, enable_auto_commit=True, auto_commit_interval=1.0):
        await trio.sleep(10)
        assert fake.requests_of(ApiKey.OFFSET_COMMIT) == []
        coord.errors.clear()


# ------------------------------------------------------------------ max_poll_interval


@pytest.mark.parametrize("static", [False, True])
async def test_a_member_that_stops_iterating_leaves_and_rejoins_on_the_next_iteration(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any, static: bool,
) -> None:
    """Past max_poll_interval without an iteration the member leaves (epoch -1; a static
    member -2), stops heartbeating, its partitions are lost; the next iteration raises
    MaxPollIntervalExceededError, then the member joins again (epoch 0) and reads on."""
    m = Member()
    extra = {"group_instance_id": "i1"} if static else {}
    async with running(fake, m, max_poll_interval=10.0, **extra):
        await until(lambda: len(m.records) == 20)
        await trio.sleep(15)  # waiting for records is not a missed poll
        assert not any(r.member_epoch < 0 for r in coord.heartbeats)
        m.iterating = False
        await produce(fake, "t", [b"x"], partition=0)
        await until(lambda: any(r.member_epoch < 0 for r in coord.heartbeats), 15)
        t_left = trio.current_time()
        leave = [r for r in coord.heartbeats if r.member_epoch < 0]
        assert [r.member_epoch for r in leave] == [-2 if static else -1]
        assert m.c.state == "unjoined"
        n = len(coord.heartbeats)
        await trio.sleep(20)
        assert len(coord.heartbeats) == n  # no heartbeats while left
        assert m.errors == []
        m.iterating = True
        await until(lambda: len(m.errors) == 1, 5)
        assert isinstance(m.errors[0], MaxPollIntervalExceededError)
        assert ("lost", ALL4) in m.events and ("revoked", ALL4) not in m.events
        await until(lambda: m.c.state == "stable", 10)
        assert coord.heartbeats[n].member_epoch == 0
        assert t_left - 10 >= 0
        await produce(fake, "t", [b"y"], partition=1)
        await until(lambda: any(r.value == b"y" for r in m.records), 10)
        # and a second time alike: left, silent until the application iterates
        m.iterating = False
        await produce(fake, "t", [b"z"], partition=1)
        await until(lambda: sum(r.member_epoch < 0 for r in coord.heartbeats) == 2, 15)
        n = len(coord.heartbeats)
        await trio.sleep(20)
        assert len(coord.heartbeats) == n
        m.iterating = True
        await until(lambda: len(m.errors) == 2 and m.c.state == "stable", 10)


async def test_the_poll_deadline_is_max_poll_interval_after_the_last_iteration(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """The member leaves between max_poll_interval and max_poll_interval + 1 s after
    the last iteration began, not before."""
    m = Member()
    async with running(fake, m, max_poll_interval=16.0):
        await until(lambda: len(m.records) == 20)
        m.iterating = False
        await produce(fake, "t", [b"x"], partition=0)
        await until(lambda: len(m.records) == 21)
        t0 = trio.current_time()
        await until(lambda: any(r.member_epoch < 0 for r in coord.heartbeats), 30)
        waited = trio.current_time() - t0
        assert 17 < waited <= 18  # checked each second from the first check it was seen


# ------------------------------------------------------------------ close


@pytest.mark.parametrize("static", [False, True])
async def test_close_revokes_commits_and_leaves(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any, static: bool,
) -> None:
    """Closing revokes the partitions (on_revoked, auto-commit first), then leaves
    (epoch -1; a static member -2) and stops heartbeating."""
    m = Member()
    extra = {"group_instance_id": "i1"} if static else {}
    async with running(fake, m, enable_auto_commit=True, auto_commit_interval=1000.0,
                       **extra):
        await until(lambda: len(m.records) == 20)
    assert m.events == [("assigned", ALL4), ("revoked", ALL4)]
    assert coord.heartbeats[-1].member_epoch == (-2 if static else -1)
    assert fake.offsets.fetch("g", ("t", 1)).offset == 5
    assert m.c.state == "closed"
    n = len(coord.heartbeats)
    await trio.sleep(20)
    assert len(coord.heartbeats) == n


async def test_close_before_joining_sends_no_leave(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A member closed before it had an epoch sends no leave heartbeat."""
    coord.errors.extend([int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)] * 1000)
    m = Member()
    async with running(fake, m):
        await trio.sleep(1)
    assert all(r.member_epoch == 0 for r in coord.heartbeats)
    assert m.events == []


async def test_a_member_without_a_seeded_rng_gets_a_fresh_uuid_member_id(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Without ``rng`` the member id is a fresh random UUID (KIP-1082: the client picks
    it), different per consumer, and the member joins with it; jittered backoffs work
    from a fresh random source too."""
    import uuid

    a, b = Member(), Member()
    coord.errors.append(int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    async with running(fake, a, rng=None, retry_backoff_jitter=0.2), \
            running(fake, b, rng=None, retry_backoff_jitter=0.2):
        await until(lambda: a.c.state == "stable" and b.c.state == "stable")
        ids = {a.member_id, b.member_id}
        assert len(ids) == 2
        for i in ids:
            assert str(uuid.UUID(i)) == i
        assert {r.member_id for r in coord.heartbeats if r.member_epoch == 0} == ids


async def test_a_member_is_not_stable_until_its_first_target_arrives(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Answers without an assignment (null: unchanged or not computed yet) leave a
    joining member rebalancing with nothing assigned; the first target makes it stable.
    Before the first answer the statistics show no heartbeat and no epoch."""
    coord.hold_assignment = 3
    coord.errors.append(int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    m = Member()
    async with running(fake, m):
        stats = m.c.statistics()
        assert stats.since_last_heartbeat is None and stats.generation == 0
        assert stats.coordinator_moves == 0
        await until(lambda: len(coord.heartbeats) == 3)
        assert m.c.state == "rebalancing" and m.events == []
        await until(lambda: m.c.state == "stable", 10)
        await until(lambda: len(m.records) == 20)
        assert m.events == [("assigned", ALL4)]


async def test_without_an_interval_from_the_coordinator_the_default_one_is_used(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A coordinator that never sets heartbeat_interval_ms (0) gets a heartbeat every
    heartbeat_interval (3 s, the default)."""
    coord.interval_ms = 0
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        n = len(coord.heartbeats)
        await trio.sleep(30)
        assert 9 <= len(coord.heartbeats) - n <= 11


async def test_a_member_iterating_while_its_leave_is_unanswered_rejoins_with_epoch_0(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """After a poll timeout the member's next heartbeat is a join (epoch 0), even when
    the application iterates again before the coordinator answered the leave: the old
    epoch is never sent again."""
    coord.leave_delay = 3.0
    m = Member()
    async with running(fake, m, max_poll_interval=10.0):
        await until(lambda: len(m.records) == 20)
        m.iterating = False
        await produce(fake, "t", [b"x"], partition=0)
        await until(lambda: any(r.member_epoch < 0 for r in coord.heartbeats), 15)
        i = next(i for i, r in enumerate(coord.heartbeats) if r.member_epoch < 0)
        m.iterating = True
        await until(lambda: len(m.errors) == 1, 5)
        await until(lambda: len(coord.heartbeats) > i + 1 and m.c.state == "stable", 20)
        assert coord.heartbeats[i + 1].member_epoch == 0
        assert [type(e) for e in m.errors] == [MaxPollIntervalExceededError]


async def test_a_failed_member_whose_coordinator_connection_dropped_still_closes(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """After a fatal heartbeat error, closing still leaves the group (epoch -1) even if
    the coordinator's connection dropped meanwhile: it is opened again for the leave,
    and close() raises nothing."""
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        coord.errors.append(int(ErrorCode.GROUP_AUTHORIZATION_FAILED))
        await until(lambda: bool(m.errors), 10)
        fake.drop_connections(fake.coordinators.node_for(GROUP, "g"))
        await trio.sleep(1)
    assert coord.heartbeats[-1].member_epoch == -1
