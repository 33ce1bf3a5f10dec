"""Statistics and trace context on Apache Kafka (1 node), for both group protocols.

A producer of ours sends in a span with ``TracingInterceptor``; confluent-kafka reads the
``traceparent`` header back (an independent reader). A group consumer of ours reads
everything and commits: its statistics agree with the log ends and the committed offsets
librdkafka reads, and the Prometheus text says the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.parser import text_string_to_metric_families

from pipeline import open_producer
from pipeline.consumer import open_consumer
from pipeline.metrics import prometheus_text
from pipeline.otel import TracingInterceptor
from pipeline.testing.kafka import KafkaCluster

from .conftest import confluent_kafka

pytestmark = pytest.mark.kafka

PARTITIONS = 3
RECORDS = 300


def first_record_headers(bootstrap: str, topic: str) -> dict[str, bytes]:
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                  "group.id": f"probe-{uuid.uuid4().hex[:6]}",
                                  "auto.offset.reset": "earliest"})
    try:
        c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        for _ in range(100):
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                return dict(m.headers() or [])
        raise AssertionError("nothing read")
    finally:
        c.close()


def ends_and_committed(bootstrap: str, topic: str, group: str
                       ) -> tuple[dict[int, int], dict[int, int]]:
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [confluent_kafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        committed = {tp.partition: tp.offset for tp in c.committed(tps, timeout=10)}
        return ends, committed
    finally:
        c.close()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
async def test_statistics_and_trace_context(
        kafka_single: KafkaCluster, kafka_topic: Callable[[str], str], protocol: str) -> None:
    bootstrap = kafka_single.bootstrap
    topic = kafka_topic(f"observe-{protocol}")
    group = f"observe-{uuid.uuid4().hex[:8]}"
    await kafka_single.call(kafka_single.create_topic, topic, PARTITIONS, 1)
    tracer_provider = TracerProvider()
    tracing = TracingInterceptor(tracer_provider, TraceContextTextMapPropagator())
    async with open_producer(bootstrap, client_id="p", interceptors=[tracing]) as producer:
        with tracer_provider.get_tracer("t").start_as_current_span("batch") as span:
            for i in range(RECORDS):
                await producer.send(topic, b"v%d" % i, partition=i % PARTITIONS)
        await producer.flush()
        produced = producer.statistics()
    assert (produced.succeeded, produced.failed) == (RECORDS, 0)
    parts = produced.topics[topic].partitions
    assert {p: s.delivered_messages for p, s in parts.items()} == \
        {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
    ctx = span.get_span_context()
    headers = await trio.to_thread.run_sync(first_record_headers, bootstrap, topic)
    assert headers["traceparent"] == \
        f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}".encode()

    async with open_consumer(bootstrap, group_id=group, topics=[topic], client_id="c",
                             group_protocol=protocol, auto_offset_reset="earliest",
                             enable_auto_commit=False) as consumer:
        n = 0
        with trio.fail_after(90):
            async for _ in consumer:
                n += 1
                if n == RECORDS:
                    break
        await consumer.commit()
        stats = consumer.statistics()
    ends, committed = await trio.to_thread.run_sync(ends_and_committed, bootstrap, topic, group)
    assert ends == committed == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
    assert stats.state == "stable" and stats.group_id == group and stats.generation >= 1
    assert stats.coordinator == 1 and stats.commits == 1
    assert (stats.consumed_records, stats.lag, stats.assigned_partitions) == \
        (RECORDS, 0, PARTITIONS)
    cparts = stats.topics[topic].partitions
    assert {p: s.committed for p, s in cparts.items()} == ends
    assert {p: s.position for p, s in cparts.items()} == ends
    assert {p: s.high_watermark for p, s in cparts.items()} == ends
    assert stats.fetched_bytes > 0 and stats.brokers[1].requests_by_api["Fetch"] >= 1
    samples = {(s.name, s.labels.get("partition")): s.value
               for f in text_string_to_metric_families(prometheus_text(stats))
               for s in f.samples}
    for p in range(PARTITIONS):
        assert samples[("pipeline_consumer_topic_partition_lag", str(p))] == 0
        assert samples[("pipeline_consumer_topic_partition_committed", str(p))] == ends[p]
