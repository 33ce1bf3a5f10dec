"""The fetcher's finer rules, each pinned by a scenario (FakeCluster, virtual time):
one fetch task per leader broker, the Fetch version, backoffs drawn from the given rng,
the statistics' request count, the rotation of which partition leads a request."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline.consumer import ConsumerError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.fetch import FetchResponse
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import HalfRandom, open_fake_consumer, produce, take


def running_tasks(name: str) -> int:
    """How many tasks named ``name`` (a function's qualified name) run now."""
    count = 0
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        count += task.name.endswith(name)
        stack.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return count


async def test_one_fetch_task_per_leader_broker_however_often_the_assignment_changes(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """Every fetch, seek, pause and hand-out changes the assignment; the fetcher still
    runs exactly one task per broker leading a partition (a second one would put a
    second Fetch in flight to that broker), and none for a partition without a leader."""
    fake.create_topic("t", 3, leaders=[0, 0, 1])
    for p in range(3):
        await produce(fake, "t", [f"{p}-{i}".encode() for i in range(20)], partition=p)
    async with open_fake_consumer(fake, topics=["t"], max_partition_fetch_bytes=64) as consumer:
        got = await take(consumer, 60)
        assert sorted((r.partition, r.offset) for r in got) == [
            (p, i) for p in range(3) for i in range(20)]
        consumer.pause([("t", 0)])
        await consumer.seek(("t", 1), 5)
        consumer.resume([("t", 0)])
        await take(consumer, 15)
        assert running_tasks("Fetcher._fetch_from") == 2
        fake.stop_broker(1, elect=False)  # partition 2 has no leader now
        await trio.sleep(5)
        assert running_tasks("Fetcher._fetch_from") == 2


async def test_fetches_are_sent_at_the_last_name_based_version(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """Fetch v12 (the newest that names topics, not topic ids): a flexible version,
    and the one whose answers carry every field the fetcher reads."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        await take(consumer, 1)
    assert {r.api_version for r in fake.requests_of(ApiKey.FETCH)} == {12}


async def test_the_fetch_backoff_draws_its_jitter_from_the_given_rng(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """With jitter, a failed fetch's retry comes exactly when the consumer's own rng
    says (HalfRandom: the un-jittered base), not from a rng of its own."""
    fake.create_topic("t", 1, leaders=[0])
    await produce(fake, "t", [b"a"], partition=0)
    async with open_fake_consumer(fake, topics=["t"], retry_backoff_jitter=0.5,
                                  retry_backoff=1.0, retry_backoff_max=1.0,
                                  rng=HalfRandom(3)) as consumer:
        await take(consumer, 1)
        await trio.sleep(2)
        start = trio.current_time()
        fake.drop_connections(0)
        await produce(fake, "t", [b"b"], partition=0)
        await take(consumer, 1)
        fetches = [r.time - start for r in fake.requests_of(ApiKey.FETCH, node_id=0)
                   if r.time > start]
    # the fetcher's backoff (1 s), then the metadata wait's (1 s)
    assert fetches[0] == pytest.approx(2.0, abs=1e-9), fetches


async def test_the_statistics_count_every_fetch_request_sent(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 2, leaders=[0, 1])
    await produce(fake, "t", [b"x"] * 5, partition=0)
    await produce(fake, "t", [b"y"] * 5, partition=1)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        await take(consumer, 10)
        await trio.sleep(1.0)  # what was sent has arrived
        assert consumer.statistics().fetches == len(fake.requests_of(ApiKey.FETCH))


async def test_a_failed_fetch_backs_off_from_the_first_delay_in_each_episode(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """A lost connection: the broker's task backs off ``delay(failures)``, failures
    counted from 0 for the first fetch and again after each success."""
    fake.create_topic("t", 1, leaders=[0])
    await produce(fake, "t", [b"a"], partition=0)
    fake.drop_next_request(ApiKey.FETCH, count=1)
    async with open_fake_consumer(fake, topics=["t"], retry_backoff=1.0,
                                  retry_backoff_max=8.0) as consumer:
        await take(consumer, 1)
        await trio.sleep(3)
        fake.drop_next_request(ApiKey.FETCH, count=1)
        await produce(fake, "t", [b"b"], partition=0)
        await take(consumer, 1)
    times = [r.time for r in fake.requests_of(ApiKey.FETCH)]
    # each dropped fetch: the task's delay(1) = 1 s, then the metadata wait's 1 s
    assert times[1] - times[0] == pytest.approx(2.0, abs=1e-9), times
    assert times[-1] - times[-2] == pytest.approx(2.0, abs=1e-9), times


async def test_each_leader_move_waits_one_base_backoff_for_fresh_metadata(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """A partition answered NOT_LEADER waits ``retry_backoff`` (the first attempt's
    delay, again for every new episode), then a forced refresh: a broker's stale answer
    to the refresh the error asked for does not send it back to the old leader. While
    nothing waits for metadata, the consumer sends no Metadata request."""
    fake.create_topic("t", 1, leaders=[0])
    await produce(fake, "t", [b"a"], partition=0)
    async with open_fake_consumer(fake, topics=["t"], retry_backoff=1.0,
                                  retry_backoff_max=8.0) as consumer:
        await take(consumer, 1)
        await trio.sleep(2)
        for to, stale in ((1, False), (2, True), (0, False)):
            start = trio.current_time()
            if stale:
                fake.stale_metadata(count=1)
            fake.move_leader("t", 0, to=to)
            await trio.sleep(5)
            at_new = [r.time - start for r in fake.requests_of(ApiKey.FETCH, node_id=to)
                      if r.time >= start]
            assert at_new and at_new[0] == pytest.approx(1.0, abs=1e-9), (to, at_new)
            quiet = len(fake.requests_of(ApiKey.METADATA))
            await trio.sleep(20)
            assert len(fake.requests_of(ApiKey.METADATA)) == quiet
        await produce(fake, "t", [b"b"], partition=0)
        assert [r.value for r in await take(consumer, 1)] == [b"b"]


def leads(fake: FakeCluster, node: int, n: int) -> list[int]:
    """The first partition of each Fetch to ``node`` naming ``n`` partitions."""
    out = []
    for r in fake.requests_of(ApiKey.FETCH, node_id=node):
        parts = [p.partition for t in r.request.topics for p in t.partitions]
        if len(parts) == n:
            out.append(parts[0])
    return out


@pytest.mark.parametrize("partitions", [2, 3])
async def test_each_partition_leads_the_fetches_of_its_broker_in_turn(
        fake: FakeCluster, autojump_clock: Any, partitions: int) -> None:
    """Kafka answers at least one batch, however large, only for a response's first
    partition (KIP-74): consecutive fetches rotate which partition comes first."""
    fake.create_topic("t", partitions, leaders=[0] * partitions)
    async with open_fake_consumer(fake, topics=["t"], fetch_max_wait=0.5):
        await trio.sleep(10)  # caught up: one long poll after another
    seen = leads(fake, 0, partitions)
    assert len(seen) >= 4 * partitions
    for i in range(len(seen) - partitions + 1):
        assert sorted(seen[i:i + partitions]) == list(range(partitions)), seen


async def test_fetch_requests_name_a_consumer_without_a_session(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """replica_id -1 (a consumer, not a follower), no fetch session (id 0, epoch -1:
    a full fetch every time, KIP-227), the configured wait, sizes and rack."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)
    async with open_fake_consumer(fake, topics=["t"], fetch_max_wait=2.0, fetch_min_bytes=3,
                                  fetch_max_bytes=70_000, max_partition_fetch_bytes=9_000,
                                  client_rack="r1") as consumer:
        await take(consumer, 1)
    for r in fake.requests_of(ApiKey.FETCH):
        req = r.request
        assert (req.replica_id, req.session_id, req.session_epoch) == (-1, 0, -1)
        assert (req.max_wait_ms, req.min_bytes, req.max_bytes) == (2000, 3, 70_000)
        assert req.rack_id == "r1" and req.isolation_level == 0
        assert [p.partition_max_bytes for t in req.topics for p in t.partitions] == [9_000]


async def test_a_top_level_fetch_error_fails_the_consumer(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)

    def refuse(ctx: Any) -> Any:
        return FetchResponse(error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND)

    fake.control(ApiKey.FETCH, refuse)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        with pytest.raises(ConsumerError, match=r"Fetch from broker \d failed: "
                                                r"FETCH_SESSION_ID_NOT_FOUND"):
            await take(consumer, 1)


async def test_a_partition_error_that_is_not_retriable_fails_the_consumer_and_is_counted(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """TOPIC_AUTHORIZATION_FAILED: neither a metadata wait nor an offset reset; the
    application sees it, and the broker's statistics count it."""
    fake.create_topic("t", 1, leaders=[0])
    await produce(fake, "t", [b"a"], partition=0)
    fake.fail_next(ApiKey.FETCH, ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic="t", partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        with pytest.raises(ConsumerError, match=r"Fetch t\[0\] at offset 0 failed: "
                                                r"TOPIC_AUTHORIZATION_FAILED"):
            await take(consumer, 1)
        assert consumer.statistics().brokers[0].errors == {"TOPIC_AUTHORIZATION_FAILED": 1}
        assert consumer.position(("t", 0)) == 0


async def test_a_corrupt_batch_fails_the_consumer_naming_where(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a", b"b"], partition=0)
    batch = fake.partition("t", 0).batches[-1]
    data = bytearray(batch.data)
    data[8:12] = (4).to_bytes(4, "big")  # a batch length shorter than a batch header
    batch.data = bytes(data)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        with pytest.raises(ConsumerError, match=r"t\[0\] at offset 0: corrupt record batch"):
            await take(consumer, 2)


async def test_a_partition_is_fetching_while_its_fetch_is_in_flight(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        await take(consumer, 1)
        fake.delay_responses(5.0, api_key=ApiKey.FETCH)
        await trio.sleep(2)
        assert consumer.statistics().topics["t"].partitions[0].fetch_state == "fetching"


async def test_a_full_buffer_on_one_broker_does_not_hold_up_another_brokers_long_poll(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """Partition 0 (broker 0) fills its buffer and the application reads nothing; a
    record for partition 1 (broker 1, caught up) is still fetched by its long poll."""
    fake.create_topic("t", 2, leaders=[0, 1])
    await produce(fake, "t", [b"x" * 100 for _ in range(300)], partition=0)
    async with open_fake_consumer(fake, topics=["t"], max_partition_fetch_bytes=2048,
                                  fetch_max_wait=0.5) as consumer:
        await take(consumer, 1)
        await trio.sleep(5)  # partition 0's buffer is full, partition 1 caught up
        await produce(fake, "t", [b"y"], partition=1)
        await trio.sleep(1)
        assert consumer.statistics().topics["t"].partitions[1].buffered_offsets == 1


async def test_an_empty_partition_does_not_long_poll_alone_while_another_has_records(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """As test_fetch_rules' long-poll rule, with the caught-up partition empty (high
    watermark 0): it is caught up too."""
    fake.create_topic("t", 2, leaders=[0, 0])
    await produce(fake, "t", [b"x" * 100 for _ in range(300)], partition=0)
    async with open_fake_consumer(fake, topics=["t"], max_partition_fetch_bytes=2048,
                                  fetch_max_wait=0.5) as consumer:
        got = 0
        started = None
        with trio.fail_after(600):
            async for batch in consumer.batches():
                started = trio.current_time() if started is None else started
                got += len(batch)
                if got == 300:
                    break
                await trio.sleep(0.005)
        assert started is not None
        assert trio.current_time() - started < 0.5
