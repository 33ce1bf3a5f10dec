"""The classic group member's close (``GroupMember.close``), on the fake cluster in
virtual time: what the application's callbacks and the group see when a consumer
closes, from a stable member, from one that was removed from the group, and from one
whose application is still inside a rebalance callback."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline.consumer import ConsumerError, TopicPartition, open_consumer
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake.coordinators import GROUP
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import consumer_options, open_fake_consumer, produce, take, until

GROUP_APIS = (ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
              ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT)
ALL4 = frozenset(TopicPartition("t", p) for p in range(4))
Events = list[tuple[str, frozenset[TopicPartition]]]


@pytest.fixture
async def topic(fake: FakeCluster) -> FakeCluster:
    fake.create_topic("t", 4)
    for p in range(4):
        await produce(fake, "t", [f"{p}-{i}".encode() for i in range(5)], partition=p)
    return fake


def logging_callbacks(events: Events, *, slow_revoke: float = 0.0) -> dict[str, Any]:
    """on_assigned / on_revoked / on_lost that record ``(kind, partitions)``; on_revoked
    takes ``slow_revoke`` seconds (an application committing its own work there)."""

    async def revoked(consumer: Any, parts: frozenset[TopicPartition]) -> None:
        events.append(("revoked", parts))
        await trio.sleep(slow_revoke)

    return dict(on_assigned=lambda c, parts: events.append(("assigned", parts)),
                on_revoked=revoked,
                on_lost=lambda c, parts: events.append(("lost", parts)))


def group_requests_since(fake: FakeCluster, n: int) -> list[Any]:
    return [q for q in fake.requests[n:] if q.api_key in GROUP_APIS]


def coordinator_connections(fake: FakeCluster) -> int:
    """Connections open to group ``g``'s coordinator, as the broker sees them."""
    node = fake.coordinators.node_for(GROUP, "g")
    return sum(1 for conn in fake._server.conns if conn.node_id == node)


async def test_closing_a_stable_member_revokes_commits_leaves_and_drops_its_connection(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """Closing a stable member (as the Java client's close: heartbeat thread stopped
    first, then onLeavePrepare, then LeaveGroup): on_revoked gets every partition after
    auto-commit committed the positions; nothing else reaches the coordinator meanwhile
    (no heartbeat during a slow on_revoked, no auto-commit of its own), then one
    LeaveGroup names the member. When close returns, the coordinator's connection is
    closed, the member is in no generation (group metadata and statistics say -1), and a
    commit after the close is refused without reaching Kafka."""
    fake = topic
    events: Events = []
    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=True,
                                  auto_commit_interval=1000.0, heartbeat_interval=1.0,
                                  **logging_callbacks(events, slow_revoke=3.5)) as consumer:
        await take(consumer, 20)
        member_id = consumer.group_metadata().member_id
        assert consumer.group_metadata().generation_id == 1
        await trio.sleep(0.5)  # the coordinator connection is idle between heartbeats
        before, connections = len(fake.requests), coordinator_connections(fake)
        assert connections >= 1
        await consumer.aclose()
        sent = group_requests_since(fake, before)
        assert [q.api_key for q in sent] == [ApiKey.OFFSET_COMMIT, ApiKey.LEAVE_GROUP]
        assert sent[1].request.members[0].member_id == member_id
        assert sent[1].time - sent[0].time >= 3.5  # the leave comes after on_revoked
        assert events == [("assigned", ALL4), ("revoked", ALL4)]
        assert [fake.committed("g", "t", p) for p in range(4)] == [5] * 4
        await trio.sleep(0.1)
        assert coordinator_connections(fake) == connections - 1
        assert consumer.group_metadata().generation_id == -1
        assert consumer.statistics().generation == -1
        after = len(fake.requests)
        with pytest.raises(ConsumerError):
            await consumer.commit({("t", 0): 1})
        assert group_requests_since(fake, after) == []
    assert fake.group("g").members == {}


@pytest.mark.parametrize("code", [ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION],
                         ids=lambda c: c.name)
async def test_closing_a_member_removed_from_its_generation_hands_its_partitions_over_as_lost(
    topic: FakeCluster, autojump_clock: Any, code: ErrorCode,
) -> None:
    """A member whose heartbeat said it is no longer in the generation (the application
    has not iterated since) closes with on_lost, not on_revoked, for the partitions it
    still holds, and commits nothing (auto-commit on): another member may own them. It
    sends LeaveGroup only if it still has a member id (kept after ILLEGAL_GENERATION,
    dropped after UNKNOWN_MEMBER_ID)."""
    fake = topic
    events: Events = []
    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=True,
                                  auto_commit_interval=1000.0,
                                  **logging_callbacks(events)) as consumer:
        await take(consumer, 20)
        member_id = consumer.group_metadata().member_id
        fake.fail_next(ApiKey.HEARTBEAT, code)
        await until(lambda: consumer.group_metadata().generation_id == -1
                    and consumer._handoff.pending)  # the loss waits for the application
        before = len(fake.requests)
        await consumer.aclose()
        sent = group_requests_since(fake, before)
        assert events == [("assigned", ALL4), ("lost", ALL4)]
        assert [q.api_key for q in sent] == (
            [ApiKey.LEAVE_GROUP] if code == ErrorCode.ILLEGAL_GENERATION else [])
        if sent:
            assert sent[0].request.members[0].member_id == member_id
        assert [fake.committed("g", "t", p) for p in range(4)] == [None] * 4


async def test_a_loss_queued_while_the_application_was_in_a_callback_is_not_run_after_close(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """The application spends longer than max_poll_interval in on_revoked: the member
    leaves the group and queues its partitions as lost for the next iteration. When the
    consumer is closed (by another task) before that callback returns, close hands the
    partitions over once (on_lost), and the iteration that was running the callback
    stops there: no second on_lost after the close."""
    fake = topic
    events: Events = []
    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=False,
                                  max_poll_interval=10.0,
                                  **logging_callbacks(events, slow_revoke=15.0)) as consumer:
        errors: list[BaseException] = []

        async def read() -> None:
            try:
                async for _ in consumer:
                    pass
            except ConsumerError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await until(lambda: consumer.assignment() == ALL4
                        and all(consumer.position(tp) == 5 for tp in ALL4))
            fake.fail_next(ApiKey.HEARTBEAT, ErrorCode.REBALANCE_IN_PROGRESS)
            await until(lambda: ("revoked", ALL4) in events)  # the application is in it
            leaves = len(fake.requests_of(ApiKey.LEAVE_GROUP))
            await until(lambda: len(fake.requests_of(ApiKey.LEAVE_GROUP)) > leaves, 12)
            await consumer.aclose()  # on_revoked still runs
            await until(lambda: bool(errors), 10)
        assert events == [("assigned", ALL4), ("revoked", ALL4), ("lost", ALL4)]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
async def test_a_member_task_that_crashes_fails_the_consumer_instead_of_hanging_its_close(
    topic: FakeCluster, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch, protocol: str,
) -> None:
    """A plain exception in a group member's task (a bug) ends ``open_consumer`` with
    that exception, alone. The close that follows cannot reach the coordinator (the
    nursery its connections run in is gone): its commit and LeaveGroup are given up at
    once and logged, rather than waiting out ``default_api_timeout`` or, shielded,
    forever for a connection reader that never starts, or raising an error of their own
    beside the crash."""
    from pipeline.consumer._member import GroupMember
    from pipeline.consumer._member848 import GroupMember848

    async def crash(self: Any) -> None:
        await trio.sleep(1)
        raise ValueError("a bug in a member task")

    member = GroupMember if protocol == "classic" else GroupMember848
    monkeypatch.setattr(member, "_auto_commits", crash)
    crashed_at: list[float] = []

    async def consume() -> None:
        options = consumer_options(group_id="g", topics=["t"], group_protocol=protocol,
                                   enable_auto_commit=True, default_api_timeout=30.0)
        if protocol == "consumer":  # the broker sets these (KIP-848)
            del options["session_timeout"], options["heartbeat_interval"]
        async with open_consumer(topic.bootstrap, connector=topic.connector,
                                 **options) as consumer:
            await take(consumer, 20)
            try:
                await trio.sleep_forever()
            finally:
                crashed_at.append(trio.current_time())

    with trio.fail_after(60), pytest.raises(ValueError, match="a bug in a member task"):
        await consume()
    assert trio.current_time() - crashed_at[0] < 1.0
