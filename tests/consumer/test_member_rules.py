"""The classic group member's rules (``_member.py``), pinned on the fake cluster in
virtual time: what it sends in JoinGroup / SyncGroup, how it answers each refusal,
auto-commit's pace, and the identity it reports between generations."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from pipeline.consumer import ConsumedRecord, Consumer, GroupError, TopicPartition
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_consumer, produce, until

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
    member ends up in the next generation with every partition, no error raised."""
    fake = topic
    async with reading(fake, retry_backoff=0.25, retry_backoff_max=4.0) as r:
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
            assert gap >= 0.25
        else:
            assert (0.25 <= gap < 0.5) if backoff else gap < 0.25
        assert len(fake.requests_of(ApiKey.FIND_COORDINATOR)) == lookups + new_lookup
