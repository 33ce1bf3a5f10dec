"""The producer on Apache Kafka's own semantics, each write judged by librdkafka's reader.

What tansu cannot show (docs/testing.md, "tansu, and where it differs"), on the session clusters:

* a lost ack: the identical retry is answered the way Kafka answers a duplicate (NONE,
  the original offset, and the cached max timestamp as ``log_append_time``); the records
  keep their offsets and their own timestamps, and are in the log once;
* recovery: a sequence gap the producer cannot explain, or a request stalled past
  ``delivery_timeout``, makes it bump its own epoch (no InitProducerId, which would give
  a new id); Kafka accepts the bumped epoch; order kept, nothing duplicated;
* MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE: a batch of several records is split and
  delivered, a single too-large record fails with that cause and nothing else is lost;
* UNKNOWN_TOPIC_OR_PARTITION (never created, deleted, a partition beyond the count),
  NOT_ENOUGH_REPLICAS (retried until ``delivery_timeout``, then an error naming it, and
  delivered once the ISR is whole again), NOT_LEADER_OR_FOLLOWER after a leader move.

The same situations are deterministic regressions on the fake cluster in
tests/scenarios/test_kafka_semantics.py; the raw answers behind them are compared with
the fake's in tests/testing/test_fake_vs_kafka.py.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio

from pipeline import (
    BrokerResponseError,
    DeliveryTimeoutError,
    ProducerError,
    ProducerMessage,
    open_producer,
)
from pipeline.cluster import Cluster
from pipeline.cluster.errors import UnknownTopicError
from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.producer._stages.topic_producer import PartitionOutOfRangeError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import produce as pm
from pipeline.protocol.records import BatchBuilder
from pipeline.testing.kafka import KafkaCluster
from pipeline.testing.proxy import FaultProxy

from .conftest import read_partitions

Topic = Callable[..., str]
T0 = 1_600_000_000_000  # explicit CreateTimes (in the past: Kafka 4 refuses far-future ones)

OPTIONS: dict[str, Any] = dict(request_timeout=10.0, delivery_timeout=60.0, close_timeout=30.0,
                               retry_backoff=0.05, retry_backoff_max=0.5)


def options(**overrides: Any) -> dict[str, Any]:
    return {**OPTIONS, **overrides}


async def outcomes(deliveries: list[Any]) -> list[Any]:
    out: list[Any] = []
    for d in deliveries:
        try:
            out.append(await d)
        except ProducerError as exc:
            out.append(exc)
    return out


def idem(producer: Any) -> Any:
    state = producer._core.idempotence
    assert state is not None
    return state


async def read_values(bootstrap: str, topic: str, partition: int, expected: int
                      ) -> list[tuple[int, bytes, int]]:
    """(offset, value, timestamp) of the first ``expected`` records, by librdkafka."""
    got = await trio.to_thread.run_sync(read_partitions, bootstrap, topic, [partition], expected)
    return [(m.offset(), m.value(), m.timestamp()[1]) for m in got]


@contextlib.asynccontextmanager
async def fault_proxies(cluster: KafkaCluster) -> AsyncIterator[dict[int, FaultProxy]]:
    """A FaultProxy on every node's advertised port, for the block."""
    assert cluster.advertised_ports is not None
    proxies = {n: FaultProxy(*cluster.proxy_upstream(n), listen_port=cluster.advertised_ports[n],
                             seed=n) for n in cluster.nodes}
    async with trio.open_nursery() as nursery:
        for proxy in proxies.values():
            await nursery.start(proxy.run)
        yield proxies
        nursery.cancel_scope.cancel()


# -- duplicates ----------------------------------------------------------------


async def test_lost_ack_retry_is_a_duplicate_with_the_original_offset(
    kafka_cluster: KafkaCluster, kafka_topic: Topic
) -> None:
    """The proxy in front of the leader loses the response to a written batch; the
    identical retry is a duplicate, which Kafka answers NONE with the original offset
    and the batch's max timestamp in log_append_time. The producer reports the right
    offsets and each record's own timestamp; librdkafka reads each record once."""
    topic = kafka_topic("dup")
    await kafka_cluster.call(kafka_cluster.create_topic, topic, 1, 3)
    leader = await kafka_cluster.call(kafka_cluster.leader, topic, 0)
    async with fault_proxies(kafka_cluster) as proxies:
        async with open_producer(kafka_cluster.proxied_bootstrap,
                                 **options(linger=0.2)) as producer:
            await producer.send_and_wait(topic, b"warm", partition=0, timestamp=T0 - 1)
            proxies[leader].lose_responses(1, api_key=ApiKey.PRODUCE)
            deliveries = [await producer.send(topic, b"v%d" % i, partition=0, timestamp=T0 + i)
                          for i in range(5)]
            results = await outcomes(deliveries)
            recoveries = (idem(producer).bumps, idem(producer).new_ids)
        assert proxies[leader].stats.responses_lost == 1
    assert [(r.offset, r.timestamp, r.offset_known) for r in results] == [
        (1 + i, T0 + i, True) for i in range(5)]
    assert recoveries == (0, 0)
    assert await read_values(kafka_cluster.internal_bootstrap, topic, 0, 6) == [
        (0, b"warm", T0 - 1), *[(1 + i, b"v%d" % i, T0 + i) for i in range(5)]]


# -- recovery ------------------------------------------------------------------


async def test_unexplained_sequence_gap_bumps_the_epoch_on_kafka(
    kafka_single: KafkaCluster, kafka_topic: Topic
) -> None:
    """Another writer with this producer's id and epoch (as a zombie copy of it would)
    takes the next sequence: the producer's next batch is OUT_OF_ORDER with nothing on
    its side to explain it. That batch fails; the producer bumps its own epoch (same id,
    epoch 1, sequences from 0), which Kafka accepts; later messages arrive in order."""
    topic = kafka_topic("gap")
    await kafka_single.call(kafka_single.create_topic, topic, 1)
    async with open_producer(kafka_single.bootstrap, **options(linger=0.5)) as producer:
        first = [await producer.send(topic, b"a%d" % i, partition=0) for i in range(3)]
        await producer.flush()
        state = idem(producer)
        pid, epoch = state.producer_id, state.producer_epoch
        seq = state._next_sequence[TopicPartition(topic, 0)]
        builder = BatchBuilder()
        builder.append(T0, None, b"intruder")
        intruder = builder.build(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        async with Cluster.open(kafka_single.bootstrap) as cluster:
            conn = await cluster.connection(kafka_single.nodes[0])
            response = await conn.request(pm.ProduceRequest(acks=-1, timeout_ms=5000, topic_data=(
                pm.TopicProduceData(name=topic, partition_data=(
                    pm.PartitionProduceData(index=0, records=intruder),)),
            )), version=conn.version_for(ApiKey.PRODUCE))
        answer = response.responses[0].partition_responses[0]
        assert (answer.error_code, answer.base_offset) == (0, 3)
        gap = [await producer.send(topic, b"gap%d" % i, partition=0) for i in range(3)]
        await producer.flush()
        later = [await producer.send(topic, b"b%d" % i, partition=0) for i in range(3)]
        results = await outcomes(first + gap + later)
        assert (state.bumps, state.new_ids) == (1, 0)
        assert (state.producer_id, state.producer_epoch) == (pid, epoch + 1)
    assert all(isinstance(r, ProducerError) for r in results[3:6])
    assert {r.cause.code for r in results[3:6]} == {ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER}
    assert [r.offset for r in results[:3] + results[6:]] == [0, 1, 2, 4, 5, 6]
    assert [v for _, v, _ in await read_values(kafka_single.bootstrap, topic, 0, 7)] == [
        b"a0", b"a1", b"a2", b"intruder", b"b0", b"b1", b"b2"]


async def test_request_stalled_past_delivery_timeout_then_a_new_epoch(
    kafka_cluster: KafkaCluster, kafka_topic: Topic
) -> None:
    """The leader's proxy forwards nothing for 10 s (the request is held there and
    reaches Kafka only afterwards, long after the producer gave up on it). The message
    fails with DeliveryTimeoutError ("may or may not have been written"); the producer
    bumps its own epoch; afterwards messages are delivered. In the log the stalled
    message is absent or present once, before the later ones: never duplicated or
    reordered."""
    topic = kafka_topic("stall")
    await kafka_cluster.call(kafka_cluster.create_topic, topic, 1, 3)
    leader = await kafka_cluster.call(kafka_cluster.leader, topic, 0)
    async with fault_proxies(kafka_cluster) as proxies:
        async with open_producer(kafka_cluster.proxied_bootstrap,
                                 **options(request_timeout=3.0, delivery_timeout=6.0)) as producer:
            warm = [await producer.send(topic, b"w%d" % i, partition=0) for i in range(3)]
            await producer.flush()
            pid = idem(producer).producer_id
            proxies[leader].blackhole(10.0)
            stall_ends = trio.current_time() + 10.0
            late = await outcomes([await producer.send(topic, b"late", partition=0)])
            await trio.sleep_until(stall_ends + 0.5)
            after = await outcomes([await producer.send(topic, b"z%d" % i, partition=0)
                                    for i in range(3)])
            state = idem(producer)
            recoveries = (state.bumps, state.new_ids, state.producer_id == pid)
    assert all(not isinstance(r, ProducerError) for r in warm)
    assert isinstance(late[0], ProducerError) and isinstance(late[0].cause, DeliveryTimeoutError)
    assert all(not isinstance(r, ProducerError) for r in after), after
    assert recoveries[0] >= 1 and recoveries[1:] == (0, True)
    values = [v for _, v, _ in await read_values(
        kafka_cluster.internal_bootstrap, topic, 0, 6 + (after[0].offset - 3))]
    assert values in ([b"w0", b"w1", b"w2", b"z0", b"z1", b"z2"],
                      [b"w0", b"w1", b"w2", b"late", b"z0", b"z1", b"z2"])


# -- size limits ---------------------------------------------------------------

# topic config, producer options, a record that alone is too large, the error
LIMITS = {
    "max.message.bytes": ({"max.message.bytes": "2000"}, {}, 1, 3000,
                          ErrorCode.MESSAGE_TOO_LARGE),
    # Kafka 4 refuses segment.bytes below 1 MiB: a batch between that and max.message.bytes
    "segment.bytes": ({"segment.bytes": "1048576", "max.message.bytes": "3000000"},
                      {"batch_bytes": 4_000_000, "max_request_bytes": 4_000_000,
                       "max_message_bytes": 2_000_000}, 1000, 1_100_000,
                      ErrorCode.RECORD_LIST_TOO_LARGE),
}


@pytest.mark.parametrize("retries", [None, 0], ids=["idempotent", "plain-retries0"])
@pytest.mark.parametrize("limit", list(LIMITS))
async def test_too_large_batch_is_split_on_kafka(
    kafka_single: KafkaCluster, kafka_topic: Topic, limit: str, retries: int | None
) -> None:
    """40 records that fit the topic's limit one by one but not as one batch: the broker
    refuses the batch, the producer splits it (KIP-126) until the parts fit; every record
    arrives once, in order, with no recovery needed. A split spends no retry: also with
    retries=0 (not idempotent: idempotence needs retries)."""
    config, extra, scale, _, code = LIMITS[limit]
    topic = kafka_topic(f"{limit}-{retries}")
    await kafka_single.call(kafka_single.create_topic, topic, 1, 1, config)
    values = [b"%03d:" % i + b"x" * (100 * scale) for i in range(40)]
    if retries is not None:
        extra = {**extra, "idempotent": False, "retries": retries}
    async with open_producer(kafka_single.bootstrap, **options(linger=1.0, **extra)) as producer:
        deliveries = [await producer.send(topic, v, partition=0) for v in values]
        await producer.flush()
        results = await outcomes(deliveries)
        if retries is None:
            assert (idem(producer).bumps, idem(producer).new_ids) == (0, 0)
    assert [r.offset for r in results] == list(range(40)), code
    assert [v for _, v, _ in await read_values(kafka_single.bootstrap, topic, 0, 40)] == values


@pytest.mark.parametrize("limit", list(LIMITS))
async def test_single_too_large_record_fails_alone_on_kafka(
    kafka_single: KafkaCluster, kafka_topic: Topic, limit: str
) -> None:
    """One record over the topic's limit, pipelined between others: it fails with the
    broker's error; the batches behind it (answered OUT_OF_ORDER meanwhile: Kafka waits
    for its sequence) arrive in a new epoch; the other partition and the acknowledged
    data are untouched."""
    config, extra, _, big_size, code = LIMITS[limit]
    topic = kafka_topic(limit)
    await kafka_single.call(kafka_single.create_topic, topic, 2, 1, config)
    async with open_producer(kafka_single.bootstrap,
                             **options(max_batch_messages=1, **extra)) as producer:
        await producer.send_and_wait(topic, b"warm", partition=0)
        big = await producer.send(topic, b"B" * big_size, partition=0)
        rest = [await producer.send(topic, b"s%d" % i, partition=0) for i in range(4)]
        other = [await producer.send(topic, b"o%d" % i, partition=1) for i in range(4)]
        results = await outcomes([big, *rest, *other])
        assert idem(producer).new_ids == 0
    assert isinstance(results[0], ProducerError)
    assert isinstance(results[0].cause, BrokerResponseError) and results[0].cause.code == code
    assert all(not isinstance(r, ProducerError) for r in results[1:]), results
    assert [v for _, v, _ in await read_values(kafka_single.bootstrap, topic, 0, 5)] == [
        b"warm", b"s0", b"s1", b"s2", b"s3"]
    assert [v for _, v, _ in await read_values(kafka_single.bootstrap, topic, 1, 4)] == [
        b"o0", b"o1", b"o2", b"o3"]


# -- unknown topics and partitions ---------------------------------------------


async def test_unknown_topic_and_partition_on_kafka(
    kafka_single: KafkaCluster, kafka_topic: Topic
) -> None:
    """auto.create.topics.enable is off: a topic never created fails at once with
    UnknownTopicError; a partition beyond the count with PartitionOutOfRangeError (the
    producer knows the count; Kafka itself answers UNKNOWN_TOPIC_OR_PARTITION, see
    test_fake_vs_kafka.py). Messages to a topic deleted meanwhile are retried until
    delivery_timeout, whose error names UNKNOWN_TOPIC_OR_PARTITION; what was
    acknowledged before stays acknowledged."""
    topic = kafka_topic("deleted")
    await kafka_single.call(kafka_single.create_topic, topic, 2)
    async with open_producer(kafka_single.bootstrap,
                             **options(request_timeout=3.0, delivery_timeout=8.0)) as producer:
        before = await producer.send_and_wait(topic, b"before", partition=0)
        never = await outcomes([await producer.send(kafka_topic("never"), b"x")])
        beyond = await outcomes([await producer.send(topic, b"x", partition=2)])
        await kafka_single.call(kafka_single.delete_topic, topic)
        t0 = trio.current_time()
        gone = await outcomes([await producer.send(topic, b"after", partition=0)])
        waited = trio.current_time() - t0
    assert before.offset == 0
    assert isinstance(never[0], ProducerError) and isinstance(never[0].cause, UnknownTopicError)
    assert isinstance(beyond[0], ProducerError)
    assert isinstance(beyond[0].cause, PartitionOutOfRangeError)
    assert "has 2 partitions" in str(beyond[0].cause)
    assert isinstance(gone[0], ProducerError)
    assert isinstance(gone[0].cause, DeliveryTimeoutError), gone
    assert "last error: UNKNOWN_TOPIC_OR_PARTITION" in str(gone[0].cause)
    assert 8.0 <= waited < 8.0 + 5.0


# -- replication ---------------------------------------------------------------


async def test_not_enough_replicas_then_recovery_on_kafka(
    kafka_cluster: KafkaCluster, kafka_topic: Topic
) -> None:
    """RF=3 with min.insync.replicas=3, one follower stopped (controlled shutdown):
    Kafka answers NOT_ENOUGH_REPLICAS. The producer retries until delivery_timeout, then
    fails the message with an error naming it; a message sent meanwhile by a producer with
    a longer delivery_timeout is delivered once the follower is back. (Stopping two of
    three followers instead would take the KRaft quorum down with them: every node is
    also a controller.)"""
    topic = kafka_topic("ner")
    await kafka_cluster.call(kafka_cluster.create_topic, topic, 1, 3,
                             {"min.insync.replicas": "3"})
    leader = await kafka_cluster.call(kafka_cluster.leader, topic, 0)
    follower = next(n for n in kafka_cluster.nodes if n != leader)
    async with open_producer(kafka_cluster.bootstrap, **options()) as patient, open_producer(
        kafka_cluster.bootstrap, **options(request_timeout=3.0, delivery_timeout=6.0)
    ) as hasty:
        await patient.send_and_wait(topic, b"before", partition=0)
        await kafka_cluster.call(kafka_cluster.stop, follower)
        t0 = trio.current_time()
        failed = await outcomes([await hasty.send(topic, b"never", partition=0)])
        assert trio.current_time() - t0 < 6.0 + 3.0
        waiting = await patient.send(topic, b"waits", partition=0)
        await kafka_cluster.call(kafka_cluster.start, follower)
        meta = await waiting
    assert isinstance(failed[0], ProducerError)
    assert isinstance(failed[0].cause, DeliveryTimeoutError)
    assert "NOT_ENOUGH_REPLICAS" in str(failed[0].cause)
    assert meta.offset == 1
    assert [v for _, v, _ in await read_values(
        kafka_cluster.internal_bootstrap, topic, 0, 2)] == [b"before", b"waits"]


async def test_leader_move_is_transparent_on_kafka(
    kafka_cluster: KafkaCluster, kafka_topic: Topic, caplog: pytest.LogCaptureFixture
) -> None:
    """The partition's leader moves (reassignment + preferred election) while messages
    are in flight: the old leader answers NOT_LEADER_OR_FOLLOWER, the producer retries on
    the new one; every message is acknowledged once, in order."""
    topic = kafka_topic("move")
    await kafka_cluster.call(kafka_cluster.create_topic, topic, 1, 3)
    leader = await kafka_cluster.call(kafka_cluster.leader, topic, 0)
    target = next(n for n in kafka_cluster.nodes if n != leader)
    sent: list[ProducerMessage] = []
    caplog.set_level(logging.DEBUG, logger="pipeline.producer")
    async with open_producer(kafka_cluster.bootstrap, **options(linger=0.002)) as producer:
        async with trio.open_nursery() as nursery:
            moved = trio.Event()

            async def move() -> None:
                await kafka_cluster.call(kafka_cluster.move_leader, topic, 0, to_node=target)
                moved.set()

            for i in range(300):
                sent.append(await producer.send(topic, b"m%04d" % i, partition=0))
                if i == 100:
                    nursery.start_soon(move)
                await trio.sleep(0.005)
            await moved.wait()
            for i in range(300, 400):
                sent.append(await producer.send(topic, b"m%04d" % i, partition=0))
        await producer.flush()
        stats = producer.statistics()
        new_leader = producer._core.cluster.metadata.leader_for(topic, 0)
        requests = {n: bp.requests_sent for n, bp in producer._core._bps.items()}
    assert (stats.succeeded, stats.failed, stats.double_settles) == (400, 0, 0)
    assert new_leader == target
    assert requests[leader] > 0 and requests[target] > 0  # both leaders wrote some
    # the old leader refused a batch (NOT_LEADER_OR_FOLLOWER): it went back and was retried
    assert any("retry level 1" in r.getMessage() for r in caplog.records)
    assert [m.offset for m in sent] == list(range(400))
    assert [v for _, v, _ in await read_values(kafka_cluster.internal_bootstrap, topic, 0,
                                               400)] == [b"m%04d" % i for i in range(400)]
