"""``producer.statistics()`` on the fake cluster, on virtual time: every value a schedule
determines is asserted exactly (counts, bytes, round trips, what waits where).

A record's bytes are the size bound ``buffer_memory`` counts (``batch_size_for_record``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import trio

from pipeline import ConfigError, ProducerConfig
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.records import batch_size_for_record
from pipeline.testing.fake_cluster import FakeCluster
from pipeline.util.stats import Summary

from .conftest import open_fake_producer

VALUE = b"v" * 100
SIZE = batch_size_for_record(None, VALUE)


async def test_delivered_records_batches_and_bytes_per_partition(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 2)
    async with open_fake_producer(fake) as producer:
        for _ in range(3):  # one batch each: linger 0, each awaited
            await producer.send_and_wait("t", VALUE, partition=0)
        deliveries = [await producer.send("t", VALUE, partition=1) for _ in range(5)]
        for d in deliveries:
            await d
        stats = producer.statistics()
    assert (stats.accepted, stats.succeeded, stats.failed) == (8, 8, 0)
    assert (stats.queued_messages, stats.in_flight_messages, stats.in_flight_requests) == (0, 0, 0)
    assert stats.delivered_bytes == 8 * SIZE
    topic = stats.topics["t"]
    p0, p1 = topic.partitions[0], topic.partitions[1]
    assert (p0.delivered_messages, p0.delivered_bytes, p0.batches) == (3, 3 * SIZE, 3)
    assert p0.batch_messages == Summary(3, 3, 3, 1, 1, 1, 1, 1)
    assert p0.batch_bytes == Summary(3, 3 * SIZE, 3, SIZE, SIZE, SIZE, SIZE, SIZE)
    # The five sends of partition 1 share a burst: one batch of five.
    assert (p1.delivered_messages, p1.delivered_bytes, p1.batches) == (5, 5 * SIZE, 1)
    assert p1.batch_messages == Summary(1, 5, 1, 5, 5, 5, 5, 5)
    assert (topic.delivered_messages, topic.delivered_bytes, topic.batches) == (8, 8 * SIZE, 4)
    # The topic's window holds both partitions' batches: [1, 1, 1, 5].
    assert topic.batch_messages == Summary(4, 8, 4, 1, 5, 1, 5, 5)
    assert (p0.failed_messages, p0.retries, topic.failed_messages, topic.retries) == (0, 0, 0, 0)
    assert {p0.leader, p1.leader} <= {0, 1, 2}
    assert stats.requests_sent == 4


async def test_records_written_with_acks_0_count_as_delivered(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    """acks=0: being written is all a record will ever hear, and it counts as delivered
    at its partition (records and bytes), as an acknowledged one does."""
    fake.create_topic("t", 2)
    async with open_fake_producer(fake, acks=0, idempotent=False) as producer:
        deliveries = [await producer.send("t", VALUE, partition=1) for _ in range(4)]
        for d in deliveries:
            await d
        stats = producer.statistics()
    assert (stats.succeeded, stats.delivered_bytes) == (4, 4 * SIZE)
    p1 = stats.topics["t"].partitions[1]
    assert (p1.delivered_messages, p1.delivered_bytes) == (4, 4 * SIZE)


async def test_round_trips_requests_and_bytes_per_broker(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 1)
    leader = fake.leader("t", 0)
    fake.delay_responses(0.25, api_key=ApiKey.PRODUCE)
    async with open_fake_producer(fake) as producer:
        for _ in range(4):
            await producer.send_and_wait("t", VALUE, partition=0)
        broker = producer.statistics().brokers[leader]
    assert broker.state == "up" and broker.node_id == leader
    assert broker.address == f"fake-{leader}:9092"
    # (the producer's metadata came from the bootstrap address's connection)
    assert broker.requests_by_api == {"Produce": 4, "ApiVersions": 1}
    assert broker.requests == 5
    assert broker.responses == broker.requests  # every request answered
    assert (broker.connects, broker.connect_failures, broker.disconnects) == (1, 0, 0)
    assert (broker.in_flight_requests, broker.timeouts, broker.errors) == (0, 0, {})
    # Four Produce round trips of 0.25 s, and the ApiVersions one of none.
    assert broker.rtt == Summary(5, 1.0, 5, 0.0, 0.25, 0.25, 0.25, 0.25)
    assert broker.sent_bytes > 4 * SIZE and broker.received_bytes > 0


async def test_in_flight_and_queued_records_while_the_broker_is_slow(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    """One batch on the wire (without idempotence: one per partition), the next one
    waiting behind it in the broker producer: in flight and queued, exactly."""
    fake.create_topic("t", 1)
    fake.delay_responses(1.0, api_key=ApiKey.PRODUCE)
    async with open_fake_producer(fake) as producer:
        first = [await producer.send("t", VALUE, partition=0) for _ in range(3)]
        await trio.sleep(0.5)  # the first batch is on the wire now
        later = [await producer.send("t", VALUE, partition=0) for _ in range(2)]
        await trio.sleep(0.25)
        stats = producer.statistics()
        part = stats.topics["t"].partitions[0]
        assert (part.in_flight_batches, part.in_flight_messages, part.in_flight_bytes) == (
            1, 3, 3 * SIZE)
        assert (part.queued_messages, part.queued_bytes) == (2, 2 * SIZE)
        assert (stats.in_flight_requests, stats.in_flight_messages, stats.in_flight_bytes) == (
            1, 3, 3 * SIZE)
        assert stats.queued_messages == 2
        assert stats.brokers[fake.leader("t", 0)].in_flight_requests == 1
        for d in first + later:
            await d
        done = producer.statistics().topics["t"].partitions[0]
    assert (done.in_flight_messages, done.queued_messages, done.delivered_messages) == (0, 0, 5)


async def test_send_batch_rows_count_as_records_while_they_linger(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    """A send_batch run waits in its broker producer as one unit: counted as its rows."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, linger=2.0) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        group = await producer.send_batch("t", [VALUE] * 10, partitions=[0] * 10)
        await producer.send("t", VALUE, partition=0)  # a message behind the run
        await trio.sleep(1.0)
        part = producer.statistics().topics["t"].partitions[0]
        assert part.queued_messages == 11 and part.in_flight_messages == 0
        queued_bytes = part.queued_bytes
        await group
        await producer.flush()
        done = producer.statistics().topics["t"].partitions[0]
    warm = batch_size_for_record(None, b"warm")
    assert (done.queued_messages, done.delivered_messages) == (0, 12)
    assert done.delivered_bytes == warm + queued_bytes
    assert done.batch_messages.max == 10  # the run was sealed alone


async def test_records_waiting_for_a_leader_are_queued_at_their_partition(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 3)
    async with open_fake_producer(fake, delivery_timeout=60.0) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        leaderless = [p for p in range(3) if fake.leader("t", p) == 2]
        fake.stop_broker(2, elect=False)
        await producer._core.cluster.refresh(force=True)
        waiting = [await producer.send("t", VALUE, partition=leaderless[0]) for _ in range(4)]
        await trio.sleep(1.0)
        stats = producer.statistics()
        part = stats.topics["t"].partitions[leaderless[0]]
        assert (part.queued_messages, part.queued_bytes, part.in_flight_messages) == (
            4, 4 * SIZE, 0)
        assert part.leader == -1
        assert stats.queued_messages == 4
        down = stats.brokers[2]
        assert (down.state, down.disconnects, down.in_flight_requests) == ("down", 1, 0)
        fake.restart_broker(2)
        for d in waiting:
            await d


async def test_retries_and_errors_by_code(fake: FakeCluster,
                                         autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 1)
    leader = fake.leader("t", 0)
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, count=2)
    async with open_fake_producer(fake) as producer:
        deliveries = [await producer.send("t", VALUE, partition=0) for _ in range(3)]
        for d in deliveries:
            await d
        stats = producer.statistics()
    part = stats.topics["t"].partitions[0]
    assert (part.retries, part.retried_messages, part.batches) == (2, 6, 1)
    assert (part.delivered_messages, part.failed_messages) == (3, 0)
    assert stats.retries == stats.topics["t"].retries == 2
    assert stats.brokers[leader].errors == {"NOT_ENOUGH_REPLICAS": 2}
    assert stats.requests_sent == 3


async def test_failed_records_per_partition_and_before_one_was_chosen(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 2)
    leader = fake.leader("t", 1)
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.CORRUPT_MESSAGE, topic="t", partition=1,
                   count=None)
    async with open_fake_producer(fake, retries=0) as producer:
        bad = [await producer.send("t", VALUE, partition=1) for _ in range(3)]
        good = await producer.send("t", VALUE, partition=0)
        await good
        for d in bad:
            with pytest.raises(Exception, match="CORRUPT_MESSAGE"):
                await d
        with pytest.raises(Exception, match="nowhere"):
            await producer.send_and_wait("nowhere", VALUE)
        stats = producer.statistics()
    assert stats.failed == 4 and stats.succeeded == 1
    t = stats.topics["t"]
    assert (t.partitions[1].failed_messages, t.partitions[1].delivered_messages) == (3, 0)
    assert (t.partitions[0].failed_messages, t.partitions[0].delivered_messages) == (0, 1)
    assert t.failed_messages == 3
    # An unknown topic fails before any partition is chosen: partition -1.
    assert stats.topics["nowhere"].partitions[-1].failed_messages == 1
    assert stats.topics["nowhere"].partitions[-1].leader == -1
    assert stats.brokers[leader].errors == {"CORRUPT_MESSAGE": 1}


async def test_statistics_after_close_and_the_plain_forms(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 2)
    async with open_fake_producer(fake, client_id="billing") as producer:
        await producer.send_and_wait("t", VALUE, partition=1)
    stats = producer.statistics()  # (after the close: still readable)
    assert stats.client_id == "billing" and stats.accepted == 1
    plain = stats.to_dict()
    assert plain["topics"]["t"]["partitions"][1]["delivered_messages"] == 1
    assert plain["brokers"][fake.leader("t", 1)]["requests_by_api"]["Produce"] == 1
    assert plain["topics"]["t"]["batch_bytes"] == {
        "count": 1, "sum": SIZE, "window": 1, "min": SIZE, "max": SIZE,
        "p50": SIZE, "p90": SIZE, "p99": SIZE}
    from_json = json.loads(stats.to_json())
    assert from_json["topics"]["t"]["partitions"]["1"]["delivered_messages"] == 1
    assert set(from_json) == set(plain)
    # The fields every earlier reader uses stay where they were.
    assert (stats.accepted, stats.succeeded, stats.failed, stats.outstanding,
            stats.buffered_bytes, stats.requests_sent, stats.double_settles,
            stats.callback_errors) == (1, 1, 0, 0, 0, 1, 0, 0)


# --------------------------------------------------------------------------- the callback


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_on_statistics_every_interval(fake: FakeCluster, autojump_clock: trio.abc.Clock,
                                           kind: str) -> None:
    fake.create_topic("t", 1)
    seen: list[tuple[float, int]] = []

    def record(stats: Any) -> None:
        seen.append((trio.current_time() - opened, stats.succeeded))

    async def record_async(stats: Any) -> None:
        await trio.sleep(0.125)  # awaited: the next call waits for it
        record(stats)

    callback = record if kind == "sync" else record_async
    async with open_fake_producer(fake, statistics_interval=0.5,
                                  on_statistics=callback) as producer:
        opened = producer._started_at
        await producer.send_and_wait("t", VALUE)
        await trio.sleep_until(opened + 1.75)
        await producer.send_and_wait("t", VALUE)
        await trio.sleep_until(opened + 2.25)
    late = 0.125 if kind == "async" else 0.0
    assert seen == [(0.5 + late, 1), (1.0 + late, 1), (1.5 + late, 1), (2.0 + late, 2)]


async def test_a_failing_on_statistics_is_logged_and_called_again(
        fake: FakeCluster, autojump_clock: trio.abc.Clock,
        caplog: pytest.LogCaptureFixture) -> None:
    fake.create_topic("t", 1)
    calls = 0

    def broken(stats: Any) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("dashboard down")

    async with open_fake_producer(fake, statistics_interval=1.0, on_statistics=broken) as p:
        await p.send_and_wait("t", VALUE)
        await trio.sleep(3.5)
    assert calls == 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR
              and "on_statistics" in r.getMessage()]
    assert len(errors) == 1 and "dashboard down" in (errors[0].exc_text or "")


@pytest.mark.parametrize(("options", "message"), [
    ({"statistics_interval": -1}, "invalid statistics_interval=-1"),
    ({"statistics_interval": "5"}, "invalid statistics_interval='5'"),
    ({"statistics_interval": True}, "invalid statistics_interval=True"),
    ({"statistics_interval": float("inf"), "on_statistics": print},
     "invalid statistics_interval=inf"),
    ({"statistics_interval": 5, "on_statistics": "print"}, "invalid on_statistics='print'"),
    ({"statistics_interval": 5}, "statistics_interval=5 needs on_statistics"),
    ({"on_statistics": print}, "on_statistics needs statistics_interval"),
])
def test_statistics_options_are_checked(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        ProducerConfig(**options)
    assert ProducerConfig(statistics_interval=5, on_statistics=print).statistics_interval == 5


async def test_requests_sent_counts_requests_written_not_a_send_that_failed(
        fake: FakeCluster, autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``requests_sent`` counts Produce requests written: a send that fails before
    it writes anything (its connection lost) is retried, and counted once, when the
    retry is written. The explorer holds every run to it (O4, against the requests
    the connections wrote)."""
    from pipeline.cluster.connection import BrokerConnection
    from pipeline.cluster.errors import BrokerConnectionError

    fake.create_topic("t", 1)
    original = BrokerConnection.send_before
    refused: list[object] = []

    async def send_before(self: BrokerConnection, request: Any, wait: trio.CancelScope,
                          **kwargs: Any) -> Any:
        if type(request).__name__ == "ProduceRequest" and not refused:
            refused.append(request)
            raise BrokerConnectionError("the connection was lost before the write (test)")
        return await original(self, request, wait, **kwargs)

    monkeypatch.setattr(BrokerConnection, "send_before", send_before)
    async with open_fake_producer(fake) as producer:
        await producer.send_and_wait("t", b"x")
        stats = producer.statistics()
    assert refused and (stats.requests_sent, stats.succeeded) == (1, 1)
    assert len(fake.requests_of(ApiKey.PRODUCE)) == 1


async def test_a_request_being_written_counts_as_in_flight(
        fake: FakeCluster, autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drained request whose write has not finished (a slow socket) is in flight for
    the statistics: its records are neither queued any more nor forgotten, so queued
    and in-flight records add up to those without an outcome (the explorer's O9, at
    rest)."""
    from pipeline.cluster.connection import BrokerConnection

    fake.create_topic("t", 1)
    original = BrokerConnection.send_before
    writing = trio.Event()
    release = trio.Event()

    async def send_before(self: BrokerConnection, request: Any, wait: trio.CancelScope,
                          **kwargs: Any) -> Any:
        if type(request).__name__ == "ProduceRequest" and not release.is_set():
            writing.set()
            await release.wait()  # (the write takes its time)
        return await original(self, request, wait, **kwargs)

    monkeypatch.setattr(BrokerConnection, "send_before", send_before)
    async with open_fake_producer(fake) as producer:
        delivery = await producer.send("t", b"x")
        await writing.wait()
        stats = producer.statistics()
        part = stats.topics["t"].partitions[0]
        release.set()
        await delivery
    assert (stats.in_flight_requests, part.in_flight_batches, part.in_flight_messages,
            part.queued_messages, stats.queued_messages) == (1, 1, 1, 0, 0)


async def test_a_batch_failed_at_its_deadline_in_flight_is_no_longer_counted_in_flight(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    """A batch whose delivery deadline passed while its request was out has an outcome
    (it failed): its request is still in flight, its records are not."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, delivery_timeout=4.0, request_timeout=4.0,
                                  idempotent=False, max_in_flight=1) as producer:
        await producer.send_and_wait("t", b"warm")
        fake.delay_responses(3.0, api_key=ApiKey.PRODUCE, count=2)
        first = await producer.send("t", b"first")
        await trio.sleep(0.0625)  # (its request is out: answered at 3 s)
        late = await producer.send("t", b"late")  # (sent at 3 s, when the slot frees)
        await first
        await trio.sleep(1.5)  # (past its deadline at 4 s, before its answer at 6 s)
        assert late.done()
        stats = producer.statistics()
        part = stats.topics["t"].partitions[0]
    assert (stats.in_flight_requests, part.in_flight_batches, part.in_flight_messages,
            part.in_flight_bytes) == (1, 0, 0, 0)


async def test_every_batch_of_a_partition_in_flight_is_counted(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    """With idempotence a confirmed partition pipelines batches: each one in flight
    counts, with its records, in the partition's gauges."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, idempotent=True, max_in_flight=3,
                                  max_batch_messages=1) as producer:
        await producer.send_and_wait("t", b"warm")  # (confirms the partition)
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE)
        deliveries = [await producer.send("t", b"m%d" % i) for i in range(3)]
        await trio.sleep(0.5)
        stats = producer.statistics()
        part = stats.topics["t"].partitions[0]
        fake.clear_faults()
        for d in deliveries:
            await d
    assert (stats.in_flight_requests, part.in_flight_batches, part.in_flight_messages) == (3, 3, 3)


async def test_a_batch_back_from_a_lost_leader_is_queued_at_its_partition(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    """A sealed batch its broker failed (the connection closed with it in flight), back
    at its partition producer waiting for a leader, is queued there: its records and
    its bytes, once; what waits with it to keep the order (the retry's fin) counts
    nothing."""
    fake.create_topic("t", 3)
    async with open_fake_producer(fake, delivery_timeout=60.0) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        p = next(p for p in range(3) if fake.leader("t", p) == 2)
        slow = fake.delay_responses(5.0, api_key=ApiKey.PRODUCE, node_id=2, before_apply=True)
        sent = [await producer.send("t", VALUE, partition=p) for _ in range(4)]
        await trio.sleep(1.0)
        assert producer.statistics().topics["t"].partitions[p].in_flight_messages == 4
        fake.stop_broker(2, elect=False)
        await trio.sleep(1.0)
        part = producer.statistics().topics["t"].partitions[p]
        assert (part.leader, part.retried_messages, part.batch_messages.max) == (-1, 4, 4)
        assert (part.queued_messages, part.in_flight_messages) == (4, 0)
        assert part.queued_bytes == part.batch_bytes.max  # (the sealed batch's bytes)
        # A chaser back from the old path, not handled yet (broker producers hand it to
        # ``retry`` between two steps of the partition producer), counts nothing.
        from pipeline.producer._stages.envelopes import Fin

        [pp] = [pp for pp in producer._core.partition_producers() if pp.tp == ("t", p)]
        waiting = pp.waiting()
        assert waiting == (4, part.queued_bytes)
        pp._retries.append(Fin(pp.tp, pp.hwm))
        assert pp.waiting() == waiting
        pp._retries.pop()
        slow.remove()
        fake.restart_broker(2)
        for d in sent:
            await d


async def test_a_failed_batch_waiting_for_its_partitions_flights_is_queued(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    """With idempotence, a batch answered with a retriable error while later batches of
    its partition are still in flight waits at its broker producer until they come
    back (answered OUT_OF_ORDER, explained by it): its records and bytes are queued
    there, once; the later ones are in flight."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, idempotent=True, max_in_flight=3,
                                  max_batch_messages=2) as producer:
        await producer.send_and_wait("t", b"warm")  # (confirms the partition)
        # (one request at a time per connection: answered at +0.5, +1.0, +1.5)
        fake.delay_responses(0.5, api_key=ApiKey.PRODUCE)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS)
        deliveries = [await producer.send("t", VALUE) for _ in range(6)]
        await trio.sleep(0.75)
        stats = producer.statistics()
        part = stats.topics["t"].partitions[0]
        assert (part.queued_messages, part.queued_bytes) == (2, 2 * SIZE)
        assert (part.in_flight_batches, part.in_flight_messages) == (2, 4)
        assert stats.queued_messages == 2
        fake.clear_faults()
        for d in deliveries:
            await d


async def test_a_retried_batch_waiting_for_a_request_slot_is_queued(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    """A batch back for its retry, sealed, waits at its broker producer while the only
    request slot is taken by another partition's request: its records and bytes are
    queued there, once."""
    fake.create_topic("t", 2, leaders=[0, 0])
    async with open_fake_producer(fake, max_in_flight=1) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS)
        retried = [await producer.send("t", VALUE, partition=0) for _ in range(3)]
        await trio.sleep(0.0625)  # (answered; back after the retry backoff, 0.125)
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE)
        holding = await producer.send("t", VALUE, partition=1)  # (takes the slot)
        await trio.sleep(0.5)
        stats = producer.statistics()
        part = stats.topics["t"].partitions[0]
        assert (part.queued_messages, part.queued_bytes) == (3, 3 * SIZE)
        assert (part.in_flight_messages, part.retried_messages) == (0, 3)
        assert stats.topics["t"].partitions[1].in_flight_messages == 1
        fake.clear_faults()
        for d in [*retried, holding]:
            await d
