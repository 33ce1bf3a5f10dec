"""Where a partition starts, and how its offset lookups behave (the offset resolver,
``pipeline/consumer/_positions.py``), pinned on the FakeCluster in virtual time."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import pairwise
from typing import Any

import pytest
import trio

from pipeline.consumer import ConsumerError, TopicPartition
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import list_offsets as lo
from pipeline.testing.fake.cluster import SUPPORTED_VERSIONS
from pipeline.testing.fake.faults import DROP, NO_RESPONSE, ControlContext
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_consumer, produce, take, until

T0 = TopicPartition("t", 0)


@pytest.fixture
async def topic(fake: FakeCluster) -> FakeCluster:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"%d" % i for i in range(6)], partition=0)
    return fake


def lookup_times(fake: FakeCluster) -> list[float]:
    return [r.time for r in fake.requests_of(ApiKey.LIST_OFFSETS)]


async def test_list_offsets_names_the_consumer_and_the_leader_epoch_it_knows(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A ListOffsets asks as a consumer (replica_id -1, so Kafka answers with the high
    watermark, not a follower's view) and carries the partition's leader epoch from
    metadata (KIP-320: a leader with a newer epoch refuses instead of answering)."""
    fake = topic
    fake.move_leader("t", 0)
    epoch = fake.partition("t", 0).leader_epoch
    assert epoch > 0
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        assert [r.offset for r in await take(consumer, 1)] == [0]
    request = fake.requests_of(ApiKey.LIST_OFFSETS)[0].request
    assert request.replica_id == -1
    assert [p.current_leader_epoch for t in request.topics for p in t.partitions] == [epoch]


async def test_a_retriable_lookup_error_is_retried_after_the_backoff_and_refreshes_metadata(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """NOT_LEADER_OR_FOLLOWER on a ListOffsets is retried (the consumer starts at the
    earliest offset as asked), after retry_backoff growing per consecutive failure
    (0.25, 0.5, 1.0 with jitter at its midpoint), with a Metadata refresh before each
    retry (the leader moved: asking the same broker again would fail again)."""
    fake = topic
    fake.fail_next(ApiKey.LIST_OFFSETS, ErrorCode.NOT_LEADER_OR_FOLLOWER, count=3)
    async with open_fake_consumer(fake, partitions=[("t", 0)], retry_backoff=0.25,
                                  retry_backoff_max=8.0, retry_backoff_jitter=0.2) as consumer:
        assert [r.offset for r in await take(consumer, 6)] == list(range(6))
        times = lookup_times(fake)
        gaps = [b - a for a, b in pairwise(times)]
        assert gaps == pytest.approx([0.25, 0.5, 1.0])
        metadata = [r.time for r in fake.requests_of(ApiKey.METADATA)]
        for failed, retried in pairwise(times):
            assert any(failed <= m <= retried for m in metadata)

        # A later lookup (after a success) backs off from the start again.
        fake.fail_next(ApiKey.LIST_OFFSETS, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        await consumer.seek_to_beginning([("t", 0)])
        assert [r.offset for r in await take(consumer, 1)] == [0]
        times = lookup_times(fake)
        assert len(times) == 6 and times[-1] - times[-2] == pytest.approx(0.25)


async def test_the_backoff_starts_over_when_nothing_waits_for_an_offset(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A lookup that failed, for a partition the application then positioned itself,
    does not make the next, unrelated lookup wait longer: retries count consecutive
    failures of the lookups still needed."""
    fake = topic
    fake.fail_next(ApiKey.LIST_OFFSETS, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    async with open_fake_consumer(fake, partitions=[("t", 0)], retry_backoff=0.25,
                                  retry_backoff_max=8.0) as consumer:
        await fake.wait_for_requests(ApiKey.LIST_OFFSETS, 1)
        await consumer.seek(("t", 0), 4)  # during the backoff: nothing needs a lookup
        assert [r.offset for r in await take(consumer, 1)] == [4]
        await trio.sleep(1)  # the backoff is over, nothing needs a lookup
        fake.fail_next(ApiKey.LIST_OFFSETS, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        await consumer.seek_to_beginning([("t", 0)])
        assert [r.offset for r in await take(consumer, 1)] == [0]
        times = lookup_times(fake)
        assert len(times) == 3 and times[-1] - times[-2] == pytest.approx(0.25)


async def test_a_non_retriable_lookup_error_fails_the_consumer(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """TOPIC_AUTHORIZATION_FAILED on a ListOffsets is not retried: the application's
    next iteration raises a ConsumerError naming the partition and the error."""
    fake = topic
    fake.fail_next(ApiKey.LIST_OFFSETS, ErrorCode.TOPIC_AUTHORIZATION_FAILED, count=None)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        with pytest.raises(ConsumerError, match=r"t\[0\] failed: TOPIC_AUTHORIZATION_FAILED"):
            await take(consumer, 1, within=10)
    assert len(fake.requests_of(ApiKey.LIST_OFFSETS)) == 1


async def test_a_partial_answer_retries_only_the_missing_partitions(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """One partition answered, the other NOT_LEADER_OR_FOLLOWER: the answered one is
    positioned at once, the other is looked up again after retry_backoff (not at once,
    and not forgotten)."""
    fake.create_topic("two", 2)
    for p in range(2):
        await produce(fake, "two", [b"a", b"b"], partition=p)
    fake.fail_next(ApiKey.LIST_OFFSETS, ErrorCode.NOT_LEADER_OR_FOLLOWER, topic="two",
                   partition=1)
    async with open_fake_consumer(fake, partitions=[("two", 0), ("two", 1)],
                                  retry_backoff=0.25, retry_backoff_max=8.0) as consumer:
        records = await take(consumer, 4)
        assert sorted((r.partition, r.offset) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        asked = [(r.time, p.partition_index) for r in fake.requests_of(ApiKey.LIST_OFFSETS)
                 for t in r.request.topics for p in t.partitions]
        assert [p for _, p in asked] == [0, 1, 1]
        assert asked[2][0] - asked[1][0] == pytest.approx(0.25)


async def test_a_seek_during_a_lookup_wins_over_the_lookups_answer(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """The application's seek() made while a ListOffsets is in flight stands: the late
    answer for the earlier reset is dropped."""
    fake = topic
    fake.delay_responses(2.0, api_key=ApiKey.LIST_OFFSETS, count=1)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        await fake.wait_for_requests(ApiKey.LIST_OFFSETS, 1)
        await consumer.seek(("t", 0), 3)
        assert [r.offset for r in await take(consumer, 3)] == [3, 4, 5]


async def test_a_seek_in_on_assigned_wins_over_the_committed_offset(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A group member's seek() in on_assigned, made while the committed offsets are
    being fetched, stands: the committed offset that arrives later is not applied."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"]) as consumer:
        await take(consumer, 3)
        await consumer.commit({("t", 0): 2})
    fake.delay_responses(2.0, api_key=ApiKey.OFFSET_FETCH, count=1)

    async def seek(consumer: Any, parts: frozenset[TopicPartition]) -> None:
        await consumer.seek(("t", 0), 4)

    async with open_fake_consumer(fake, group_id="g", topics=["t"], on_assigned=seek,
                                  auto_offset_reset="latest") as consumer:
        assert [r.offset for r in await take(consumer, 2)] == [4, 5]


async def test_a_committed_offset_of_zero_is_a_position(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """Committed offset 0 means "start at 0": no auto_offset_reset ("latest" here)
    and no ListOffsets."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  enable_auto_commit=False) as consumer:
        await take(consumer, 1)
        await consumer.commit({("t", 0): 0})
    before = len(fake.requests_of(ApiKey.LIST_OFFSETS))
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  auto_offset_reset="latest") as consumer:
        assert [r.offset for r in await take(consumer, 2)] == [0, 1]
    assert len(fake.requests_of(ApiKey.LIST_OFFSETS)) == before


async def test_a_lookup_waits_with_the_configured_rng(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """The retry delay draws its jitter from the configured ``rng`` (reproducible runs):
    with an rng returning 0.75 and jitter 0.5, the first retry waits 0.25 * 1.25."""

    class ThreeQuarters(random.Random):
        def random(self) -> float:
            return 0.75

    fake = topic
    fake.fail_next(ApiKey.LIST_OFFSETS, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    async with open_fake_consumer(fake, partitions=[("t", 0)], retry_backoff=0.25,
                                  retry_backoff_max=8.0, retry_backoff_jitter=0.5,
                                  rng=ThreeQuarters()) as consumer:
        await take(consumer, 1)
    times = lookup_times(fake)
    assert times[1] - times[0] == pytest.approx(0.3125)


async def test_an_answered_lookup_starts_the_backoff_over_for_the_next_one(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """Retries count consecutive failures: a lookup that was answered ends the series,
    even when the partition needs another lookup at once (the application sent it to the
    beginning while the answer was on its way), so that lookup failing is retried
    after the first retry's delay (0.25 s), not a longer one."""
    fake = topic
    fake.fail_next(ApiKey.LIST_OFFSETS, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    async with open_fake_consumer(fake, partitions=[("t", 0)], retry_backoff=0.25,
                                  retry_backoff_max=8.0, auto_offset_reset="latest") as consumer:
        await fake.wait_for_requests(ApiKey.LIST_OFFSETS, 1)
        fake.delay_responses(2.0, api_key=ApiKey.LIST_OFFSETS, count=1)  # the retry's answer
        await fake.wait_for_requests(ApiKey.LIST_OFFSETS, 2)
        await consumer.seek_to_beginning([("t", 0)])
        fake.fail_next(ApiKey.LIST_OFFSETS, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        assert [r.offset for r in await take(consumer, 1)] == [0]
        times = lookup_times(fake)
        assert len(times) == 4
        assert times[1] - times[0] == pytest.approx(0.25)
        assert times[3] - times[2] == pytest.approx(0.25)


@pytest.mark.parametrize(("reset", "first"), [("earliest", 2), ("latest", 6)])
async def test_a_broker_answering_list_offsets_v0_positions_at_its_old_style_offset(
    autojump_clock: Any, nursery: trio.Nursery, reset: str, first: int,
) -> None:
    """ListOffsets v0 (a broker offering no later version) answers the offset in the
    old-style list (the offset field is v1+): the consumer starts at its first entry,
    the log start offset for "earliest", the high watermark for "latest"."""
    versions = {**SUPPORTED_VERSIONS, ApiKey.LIST_OFFSETS: (0, 0)}
    fake = FakeCluster(brokers=1, seed=7, auto_create_topics=False, api_versions=versions)
    await nursery.start(fake.run)
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"%d" % i for i in range(6)], partition=0)
    fake.partition("t", 0).log_start_offset = 2

    def answer(ctx: ControlContext) -> Any:
        if len(fake.requests_of(ApiKey.LIST_OFFSETS)) > 1:
            return NO_RESPONSE  # one lookup is enough: a second one waits, time passes
        (topic,) = ctx.request.topics
        (asked,) = topic.partitions
        part = fake.partition(topic.name, asked.partition_index)
        offset = part.log_start_offset if asked.timestamp == -2 else part.high_watermark
        return lo.ListOffsetsResponse(topics=(lo.ListOffsetsTopicResponse(
            name=topic.name, partitions=(lo.ListOffsetsPartitionResponse(
                partition_index=asked.partition_index, old_style_offsets=(offset,)),)),))

    fake.control(ApiKey.LIST_OFFSETS, answer, sticky=True)
    async with open_fake_consumer(fake, partitions=[("t", 0)],
                                  auto_offset_reset=reset) as consumer:
        await until(lambda: consumer.position(("t", 0)) is not None)
        await produce(fake, "t", [b"6", b"7"], partition=0)
        records = await take(consumer, 8 - first)
    assert [r.offset for r in records] == list(range(first, 8))
    assert {r.api_version for r in fake.requests_of(ApiKey.LIST_OFFSETS)} == {0}


async def test_a_lookup_for_a_partition_metadata_lost_meanwhile_names_no_leader_epoch(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """The ListOffsets of each leader carries the leader epoch the cached metadata has
    for the partition when that request is built. When a metadata answer dropped the
    topic meanwhile (a broker that does not know it yet answered
    UNKNOWN_TOPIC_OR_PARTITION while the connection to an earlier leader was being
    set up), the request says "no epoch" (-1, which Kafka does not check) rather than
    a made-up one a leader with a later epoch would refuse, and the partition gets its
    offset."""
    fake.create_topic("two", 2)
    for p in range(2):
        await produce(fake, "two", [b"a", b"b"], partition=p)
    fake.move_leader("two", 0, to=1)
    fake.move_leader("two", 1, to=2)
    fake.delay_responses(2.0, api_key=ApiKey.API_VERSIONS, node_id=1, count=1)
    async with open_fake_consumer(fake, partitions=[("two", 0), ("two", 1)],
                                  metadata_max_age=0.5) as consumer:
        await fake.wait_for_requests(ApiKey.API_VERSIONS, 1, node_id=1)
        unknown = fake.fail_next(ApiKey.METADATA, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                 topic="two", count=None)
        await fake.wait_for_requests(ApiKey.LIST_OFFSETS, 2)
        unknown.remove()
        records = await take(consumer, 4)
        assert sorted((r.partition, r.offset) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    asked = [(r.node_id, p.partition_index, p.current_leader_epoch)
             for r in fake.requests_of(ApiKey.LIST_OFFSETS)
             for t in r.request.topics for p in t.partitions]
    assert asked == [(1, 0, 1), (2, 1, -1)]


@asynccontextmanager
async def member_that_committed(fake: FakeCluster, offset: int) -> AsyncIterator[Any]:
    """A member of group ``g`` that read a record of ``t`` and committed ``offset`` for
    partition 0; retries back off 0.1 s, doubling, without jitter."""
    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=False,
                                  retry_backoff=0.1, retry_backoff_max=5.0,
                                  retry_backoff_jitter=0) as consumer:
        await take(consumer, 1)
        await consumer.commit({("t", 0): offset})
        yield consumer


async def test_a_committed_offsets_fetch_refused_retriably_is_asked_again_after_the_backoff(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """OffsetFetch answered COORDINATOR_LOAD_IN_PROGRESS is sent again after
    retry_backoff, doubling while it is refused, then gives the committed offset."""
    fake = topic
    async with member_that_committed(fake, 3) as consumer:
        before = len(fake.requests_of(ApiKey.OFFSET_FETCH))
        fake.fail_next(ApiKey.OFFSET_FETCH, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, count=2)
        got = await consumer.committed([("t", 0)])
        assert got[TopicPartition("t", 0)].offset == 3
        times = [r.time for r in fake.requests_of(ApiKey.OFFSET_FETCH)[before:]]
        assert [round(b - a, 3) for a, b in pairwise(times)] == [0.1, 0.2]


@pytest.mark.parametrize("api", [ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH])
async def test_a_commit_or_committed_fetch_whose_connection_drops_is_sent_again_after_the_backoff(
    topic: FakeCluster, autojump_clock: Any, api: int,
) -> None:
    """The coordinator's connection drops under an OffsetCommit or OffsetFetch: the
    request is sent again after retry_backoff, doubling while it fails, and completes."""
    fake = topic
    async with member_that_committed(fake, 2) as consumer:
        before = len(fake.requests_of(api))
        drops = [2]

        def drop(ctx: ControlContext) -> Any:
            if drops[0]:
                drops[0] -= 1
                return DROP
            return None

        fake.control(api, drop, sticky=True)
        if api == ApiKey.OFFSET_COMMIT:
            await consumer.commit({("t", 0): 3})
        got = await consumer.committed([("t", 0)])
        assert got[TopicPartition("t", 0)].offset == 3 if api == ApiKey.OFFSET_COMMIT else 2
        times = [r.time for r in fake.requests_of(api)[before:]][:3]
        gaps = [round(b - a, 2) for a, b in pairwise(times)]
        assert gaps == [0.1, 0.2], gaps


@pytest.mark.parametrize("api", [ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH])
@pytest.mark.parametrize(("code", "finds"), [(ErrorCode.NOT_COORDINATOR, 1),
                                             (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, 0)])
async def test_a_moved_coordinator_is_found_again_and_a_busy_one_is_just_asked_again(
    topic: FakeCluster, autojump_clock: Any, api: int, code: ErrorCode, finds: int,
) -> None:
    """NOT_COORDINATOR on a commit or a committed fetch: the coordinator is looked up
    again (FindCoordinator) before the retry; COORDINATOR_LOAD_IN_PROGRESS: the same
    one is asked again. Either way after retry_backoff, and the call completes."""
    fake = topic
    async with member_that_committed(fake, 2) as consumer:
        before, found = len(fake.requests_of(api)), len(fake.requests_of(ApiKey.FIND_COORDINATOR))
        fake.fail_next(api, code)
        if api == ApiKey.OFFSET_COMMIT:
            await consumer.commit({("t", 0): 3})
        else:
            assert (await consumer.committed([("t", 0)]))[TopicPartition("t", 0)].offset == 2
        first, again = [r.time for r in fake.requests_of(api)[before:before + 2]]
        assert round(again - first, 3) == 0.1
        assert len(fake.requests_of(ApiKey.FIND_COORDINATOR)) - found == finds


async def test_a_committed_fetch_refused_for_good_fails_with_the_code(
    topic: FakeCluster, autojump_clock: Any,
) -> None:
    """A code that is neither retriable nor a moved coordinator ends committed() with a
    ConsumerError naming it, after one request."""
    fake = topic
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  enable_auto_commit=False) as consumer:
        await take(consumer, 1)
        before = len(fake.requests_of(ApiKey.OFFSET_FETCH))
        fake.fail_next(ApiKey.OFFSET_FETCH, ErrorCode.GROUP_AUTHORIZATION_FAILED)
        with pytest.raises(ConsumerError, match=r"OffsetFetch .* GROUP_AUTHORIZATION_FAILED"):
            await consumer.committed([("t", 0)])
        assert len(fake.requests_of(ApiKey.OFFSET_FETCH)) == before + 1
