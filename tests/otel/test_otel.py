"""``pipeline.otel`` with the OpenTelemetry SDK's in-memory exporters, on the fake
cluster: trace context goes into the produced records' headers and arrives in the
consumed ones; statistics become metrics with the snapshots' exact values."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pipeline import open_producer
from pipeline.consumer import ConsumedRecord, open_consumer
from pipeline.otel import StatisticsMetrics, TracingInterceptor, context_of
from pipeline.testing.fake_cluster import FakeCluster

W3C = TraceContextTextMapPropagator()


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=3, seed=7, auto_create_topics=False)
    await nursery.start(cluster.run)
    return cluster


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def traceparent(span: Any) -> bytes:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}".encode()


async def consume(fake: FakeCluster, n: int, hold: float = 0.0,
                  **options: Any) -> list[ConsumedRecord]:
    out: list[ConsumedRecord] = []
    async with open_consumer(fake.bootstrap, connector=fake.connector, partitions=[("t", 0)],
                             auto_offset_reset="earliest", **options) as consumer:
        async for record in consumer:
            out.append(record)
            if len(out) == n:
                break
        await trio.sleep(hold)
    return out


async def test_trace_context_travels_in_the_headers(
        fake: FakeCluster, autojump_clock: trio.abc.Clock,
        spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("app")
    fake.create_topic("t", 1)
    tracing = TracingInterceptor(provider, W3C)
    async with open_producer(fake.bootstrap, connector=fake.connector, linger=0.0,
                             interceptors=[tracing]) as producer:
        with tracer.start_as_current_span("handle request") as parent:
            # a stale context from elsewhere is replaced, other headers are kept
            await producer.send_and_wait("t", b"in a span", partition=0,
                                         headers=[("h", b"1"), ("traceparent", b"00-old")])
        await producer.send_and_wait("t", b"no span", partition=0)
    [send] = [s for s in exporter.get_finished_spans() if s.name == "send t"]
    assert send.kind == trace.SpanKind.PRODUCER
    assert dict(send.attributes or {}) == {
        "messaging.system": "kafka", "messaging.destination.name": "t",
        "messaging.operation.name": "send", "messaging.operation.type": "send",
        "messaging.destination.partition.id": "0"}
    assert send.parent is None

    first, second = await consume(fake, 2, interceptors=[TracingInterceptor(provider, W3C)])
    assert first.headers == (("h", b"1"), ("traceparent", traceparent(parent)))
    assert second.headers == (("traceparent", traceparent(send)),)
    assert context_of(first, W3C) is not None
    assert trace.get_current_span(context_of(first, W3C)).get_span_context().trace_id == \
        parent.get_span_context().trace_id

    received: list[ReadableSpan] = [s for s in exporter.get_finished_spans()
                                    if s.name == "receive t"]
    assert [s.kind for s in received] == [trace.SpanKind.CONSUMER] * 2
    # Each receive span continues its record's trace, under the producer's span.
    for span, origin, offset in ((received[0], parent, 0), (received[1], send, 1)):
        assert span.parent is not None and span.parent.is_remote
        assert span.parent.span_id == origin.get_span_context().span_id
        assert span.context.trace_id == origin.get_span_context().trace_id
        assert (span.attributes or {})["messaging.kafka.offset"] == offset


async def test_without_send_spans_nor_consumer_spans(
        fake: FakeCluster, autojump_clock: trio.abc.Clock,
        spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = spans
    fake.create_topic("t", 1)
    tracing = TracingInterceptor(provider, W3C, send_spans=False)
    async with open_producer(fake.bootstrap, connector=fake.connector, linger=0.0,
                             interceptors=[tracing]) as producer:
        await producer.send_and_wait("t", b"no span", partition=0)
    [record] = await consume(
        fake, 1, interceptors=[TracingInterceptor(provider, W3C, consumer_spans=False)])
    assert record.headers == ()
    assert not trace.get_current_span(context_of(record, W3C)).get_span_context().is_valid
    assert exporter.get_finished_spans() == ()


def points(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    out = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out[metric.name] = metric
    return out


def value(metric: Any, **attributes: str) -> Any:
    found = [p.value for p in metric.data.data_points if dict(p.attributes) == attributes]
    assert len(found) == 1, (metric.name, attributes, metric.data.data_points)
    return found[0]


async def test_statistics_as_metrics(fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    reader = InMemoryMetricReader()
    bridge = StatisticsMetrics(MeterProvider(metric_readers=[reader]))
    fake.create_topic("t", 1)
    last: dict[str, Any] = {}

    def keep(stats: Any) -> None:
        bridge(stats)
        last[type(stats).__name__] = stats

    async with open_producer(fake.bootstrap, connector=fake.connector, linger=0.0,
                             client_id="p", statistics_interval=1.0,
                             on_statistics=keep) as producer:
        for _ in range(5):
            await producer.send_and_wait("t", b"x" * 10, partition=0)
        await trio.sleep(1.5)
    assert points(reader)  # (nothing from the consumer yet)
    await consume(fake, 5, 1.5, client_id="c", statistics_interval=1.0, on_statistics=keep)
    p, c = last["ProducerStatistics"], last["ConsumerStatistics"]
    got = points(reader)
    succeeded = got["pipeline.producer_succeeded"]
    assert isinstance(succeeded.data, Sum) and succeeded.data.is_monotonic
    assert value(succeeded, client_id="p") == p.succeeded == 5
    assert succeeded.unit == "{messages}"
    part = got["pipeline.producer_topic_partition_delivered_bytes"]
    assert part.unit == "By"
    assert value(part, client_id="p", topic="t", partition="0") == \
        p.topics["t"].partitions[0].delivered_bytes > 0
    queued = got["pipeline.producer_queued_messages"]
    assert isinstance(queued.data, Gauge) and value(queued, client_id="p") == 0
    leader = str(fake.leader("t", 0))
    rtt = p.brokers[int(leader)].rtt
    assert value(got["pipeline.producer_broker_rtt.count"], client_id="p", broker=leader) == \
        rtt.count > 0
    assert value(got["pipeline.producer_broker_rtt.sum"], client_id="p", broker=leader) == \
        rtt.sum
    assert value(got["pipeline.producer_broker_rtt"], client_id="p", broker=leader,
                 quantile="0.99") == rtt.p99
    assert got["pipeline.producer_broker_rtt"].unit == "s"
    assert value(got["pipeline.producer_broker_requests_by_api"], client_id="p",
                 broker=leader, api="Produce") == p.brokers[int(leader)].requests_by_api["Produce"]
    consumed = got["pipeline.consumer_topic_partition_consumed_records"]
    assert value(consumed, client_id="c", topic="t", partition="0") == \
        c.topics["t"].partitions[0].consumed_records
    assert set(bridge.instruments) >= {"pipeline.producer_succeeded",
                                       "pipeline.consumer_consumed_records"}


def test_records_sent_in_one_span_share_its_context_and_a_new_span_changes_it(
        spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    from pipeline import ProducerMessage

    provider, exporter = spans
    tracer = provider.get_tracer("app")
    tracing = TracingInterceptor(provider, W3C)

    def sent() -> tuple[tuple[str, bytes | None], ...]:
        return tuple(tracing.on_send(ProducerMessage("t", b"v")).headers)

    with tracer.start_as_current_span("outer") as outer:
        first, second = sent(), sent()
        with tracer.start_as_current_span("inner") as inner:
            third = sent()
        fourth = sent()
    assert first == second == fourth == (("traceparent", traceparent(outer)),)
    assert third == (("traceparent", traceparent(inner)),)
    alone = [sent(), sent()]  # outside any span: a send span each
    assert alone[0] != alone[1]
    assert [s.name for s in exporter.get_finished_spans()] == ["inner", "outer", "send t",
                                                               "send t"]
