"""The producer clients that ``bench.producer_bench`` measures, one function per client.

Each ``produce_*`` function sends ``n`` values to ``topic`` (acks=all), waits until
every one is acknowledged, and returns the wall-clock seconds of that timed section
together with client-side counters. Before the clock starts every client connects and
delivers one warm-up message to ``warmup_topic`` (connections open, idempotent producer
id obtained); the metadata of ``topic`` is fetched inside the timed section by every
client (each does it on its first send).

These functions are meant to run in a fresh interpreter per run
(``python -m bench.producer_bench --client NAME ...``) so that the CPU seconds and the
peak RSS measured by the caller belong to one client only.
"""

from __future__ import annotations

import random
import resource
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

VALUE_SIZE = 100
LINGER_S = 0.005
SEND_MANY_CHUNK = 10_000
SEND_BATCH_ROWS = 100_000  # rows per send_batch call (a list or an Arrow array of them)
AWAIT_WINDOW = 10_000  # deliveries an await-each client holds before awaiting the oldest
AWAIT_WINDOWS = (("100k", 100_000), ("300k", 300_000))  # the "await-window" group's windows
_POOL = 1024  # distinct values, cycled: no 100 MB value list inflating every client's RSS


def make_values(count: int = _POOL, size: int = VALUE_SIZE, seed: int = 0) -> list[bytes]:
    """``count`` distinct random ``size``-byte values (``count`` a power of two)."""
    assert count & (count - 1) == 0, "count must be a power of two"
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def make_keys(count: int = _POOL) -> list[bytes]:
    """``count`` distinct keys ``b"key-000000"``, ... (``count`` a power of two): the keyed
    clients cycle them, ``keys[i & mask]`` with ``values[i & mask]`` for message ``i``."""
    assert count & (count - 1) == 0, "count must be a power of two"
    return [b"key-%06d" % i for i in range(count)]


# The "workloads" group: what users send, the same for both libraries.
#   nokey         a distinct value per message (no key)
#   keyed         + a key of make_keys() (1024 distinct, cycled)
#   headers       + 2 headers: ("trace-id", a distinct 16-byte hex id), ("source", b"checkout")
#   headers-zstd  + compression zstd (default level), over text-like values that compress
WORKLOADS = ("nokey", "keyed", "headers", "headers-zstd")


def make_event_values(count: int = _POOL, size: int = VALUE_SIZE, seed: int = 0) -> list[bytes]:
    """``count`` distinct ``size``-byte JSON-like event texts (they compress as event
    data does, random bytes would not); the workloads make each message's value
    distinct with ``distinct_value``."""
    assert count & (count - 1) == 0, "count must be a power of two"
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        text = (b'{"id":0000000000,"user":"u%05d","sku":"sku-%04d","qty":%d,"price":%d.%02d,'
                b'"status":"%s"}' % (rng.randrange(100_000), rng.randrange(10_000),
                                      rng.randrange(1, 9), rng.randrange(1, 500),
                                      rng.randrange(100),
                                      rng.choice([b"paid", b"shipped", b"open"])))
        out.append((text + b" " * size)[:size])
    return out


def distinct_value(i: int, base: bytes) -> bytes:
    """Message ``i``'s value: ``base`` with its 10-digit id field set to ``i`` (no two
    messages share a value or a buffer; both libraries' loops pay this call)."""
    return base[:6] + b"%010d" % i + base[16:]


def workload_record(workload: str, i: int, events: list[bytes], keys: list[bytes]
                    ) -> tuple[bytes | None, bytes, list[tuple[str, bytes]] | None]:
    """``(key, value, headers)`` of message ``i`` of ``workload`` (``events`` of
    ``make_event_values()``, ``keys`` of ``make_keys()``): what every client's timed loop
    sends, written out once for the read-back check (the loops inline it: a call per
    message would bill the clients for the benchmark's own structure)."""
    j = i & (len(events) - 1)
    value = distinct_value(i, events[j])
    if workload == "nokey":
        return None, value, None
    if workload == "keyed":
        return keys[j], value, None
    if workload in ("headers", "headers-zstd"):
        return keys[j], value, [("trace-id", b"%016x" % i), ("source", b"checkout")]
    raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")


def cpu_seconds() -> float:
    """User + system CPU of this process, every thread included (librdkafka's too)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass
class ClientResult:
    elapsed_s: float  # first send .. last acknowledgement (flush returned)
    cpu_s: float  # process CPU over the same timed section
    acked: int | None = None  # messages the client reports delivered (None: not tracked)
    failed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- pipeline


def produce_pipeline(bootstrap: str, topic: str, n: int, *, api: str = "send",
                     options: dict[str, Any] | None = None,
                     warmup_topic: str | None = None) -> ClientResult:
    """pipeline: ``await producer.send()`` per message (api="send"; api="send-keyed":
    ``send(key=)`` with the keys of ``make_keys()``) or ``send_many`` in lists of
    ``SEND_MANY_CHUNK`` ``ProducerMessage`` (api="send_many"), then ``flush()``."""
    import trio

    from pipeline import ProducerConfig, ProducerError
    from pipeline.producer._api import open_producer
    from pipeline.producer._message import ProducerMessage

    opts: dict[str, Any] = {"acks": "all", "linger": LINGER_S}
    opts.update(options or {})
    buffer_memory = ProducerConfig(**opts).buffer_memory  # the effective option, for RSS
    values = make_values()
    mask = len(values) - 1
    keys = make_keys(len(values)) if api == "send-keyed" else []  # before the clock
    arrow_pool: Any = None
    if api == "send_batch-arrow":  # built before the clock: the data is Arrow already
        import pyarrow as pa

        arrow_pool = pa.array([values[j & mask] for j in range(SEND_BATCH_ROWS + mask + 1)],
                              pa.binary())

    async def main() -> ClientResult:
        async with open_producer(bootstrap, **opts) as producer:
            if warmup_topic:  # (what the client's serializer takes)
                await producer.send_and_wait(warmup_topic, {"warm": 1} if api.endswith("-json")
                                             else values[0], key="w" if api.endswith("-json")
                                             else None)
            groups = []
            outcomes: dict[str, Any] = {}  # what the await / callback clients counted
            t0, c0 = time.perf_counter(), cpu_seconds()
            if api == "send":
                send = producer.send
                for i in range(n):
                    await send(topic, values[i & mask])
            elif api == "send-keyed":  # as "send", each message with a key of the pool
                send = producer.send
                for i in range(n):
                    j = i & mask
                    await send(topic, values[j], key=keys[j])
            elif api == "await":  # keep every delivery, await each
                send = producer.send
                deliveries = [await send(topic, values[i & mask]) for i in range(n)]
                for d in deliveries:
                    await d
                del deliveries
            elif api == "callback":  # on_delivery per message
                send = producer.send
                counts = [0, 0]

                def count(meta: Any, error: Any) -> None:
                    counts[meta is None] += 1

                for i in range(n):
                    await send(topic, values[i & mask], on_delivery=count)
            elif api == "send_many":
                send_many = producer.send_many
                for start in range(0, n, SEND_MANY_CHUNK):
                    batch = [ProducerMessage(topic, values[i & mask])
                             for i in range(start, min(n, start + SEND_MANY_CHUNK))]
                    groups.append(await send_many(batch))
            elif api == "send_batch":  # a list per call
                send_batch = producer.send_batch
                for start in range(0, n, SEND_BATCH_ROWS):
                    column = [values[i & mask]
                              for i in range(start, min(n, start + SEND_BATCH_ROWS))]
                    groups.append(await send_batch(topic, column))
                    del column
            elif api == "send_batch-arrow":  # Arrow data, as Spark has it
                send_batch = producer.send_batch
                for start in range(0, n, SEND_BATCH_ROWS):
                    rows = min(n, start + SEND_BATCH_ROWS) - start
                    # the same rows as above: values[i & mask], a zero-copy slice
                    groups.append(await send_batch(topic, arrow_pool.slice(start & mask, rows)))
            elif api.startswith(("many-", "many0-")):  # the "workloads" group, as send_many
                workload = api.split("-", 1)[1]
                if api.startswith("many0-"):  # the per-message path, for a before/after
                    from pipeline.producer._intake import bulk

                    bulk.COLUMNS_MIN = 1 << 62  # (no call is long enough for rows)
                send_many = producer.send_many
                events = make_event_values()
                wkeys = make_keys(len(events))
                for start in range(0, n, SEND_MANY_CHUNK):
                    stop = min(n, start + SEND_MANY_CHUNK)
                    if workload == "nokey":
                        batch = [ProducerMessage(topic, distinct_value(i, events[i & mask]))
                                 for i in range(start, stop)]
                    elif workload == "keyed":
                        batch = [ProducerMessage(topic, distinct_value(i, events[i & mask]),
                                                 wkeys[i & mask]) for i in range(start, stop)]
                    else:  # headers, headers-zstd
                        batch = [ProducerMessage(topic, distinct_value(i, events[i & mask]),
                                                 wkeys[i & mask],
                                                 [("trace-id", b"%016x" % i),
                                                  ("source", b"checkout")])
                                 for i in range(start, stop)]
                    groups.append(await send_many(batch))
                    del batch
            elif api.startswith("await-"):  # the "workloads" group, awaiting every delivery
                # What a caller who wants each message's outcome writes without holding a
                # million futures: keep the last AWAIT_WINDOW (or N) deliveries, and once the
                # window is full await the oldest before the next send (a sliding window:
                # sends never stop to drain it). The rest are awaited after the loop.
                # ("await-W@N": a window of N deliveries instead of AWAIT_WINDOW)
                workload, _, held = api[len("await-"):].partition("@")
                held_max = int(held) if held else AWAIT_WINDOW
                send = producer.send
                events = make_event_values()
                wkeys = make_keys(len(events))
                window: deque[Any] = deque()
                hold, oldest = window.append, window.popleft
                failed = 0
                if workload == "nokey":
                    for i in range(n):
                        hold(await send(topic, distinct_value(i, events[i & mask])))
                        if len(window) >= held_max:
                            try:
                                await oldest()
                            except ProducerError:
                                failed += 1
                elif workload == "keyed":
                    for i in range(n):
                        j = i & mask
                        hold(await send(topic, distinct_value(i, events[j]), key=wkeys[j]))
                        if len(window) >= held_max:
                            try:
                                await oldest()
                            except ProducerError:
                                failed += 1
                else:  # headers, headers-zstd
                    for i in range(n):
                        j = i & mask
                        hold(await send(topic, distinct_value(i, events[j]), key=wkeys[j],
                                        headers=[("trace-id", b"%016x" % i),
                                                 ("source", b"checkout")]))
                        if len(window) >= held_max:
                            try:
                                await oldest()
                            except ProducerError:
                                failed += 1
                while window:
                    try:
                        await oldest()
                    except ProducerError:
                        failed += 1
                outcomes = {"awaited_failed": failed}
            elif api.startswith("callback-"):  # the "workloads" group, send(on_delivery=)
                workload = api[len("callback-"):]
                send = producer.send
                events = make_event_values()
                wkeys = make_keys(len(events))
                settled = [0, 0]  # [succeeded, failed], counted by the callback

                def on_delivery(meta: Any, error: Any) -> None:
                    settled[error is not None] += 1

                if workload == "nokey":
                    for i in range(n):
                        await send(topic, distinct_value(i, events[i & mask]),
                                   on_delivery=on_delivery)
                elif workload == "keyed":
                    for i in range(n):
                        j = i & mask
                        await send(topic, distinct_value(i, events[j]), key=wkeys[j],
                                   on_delivery=on_delivery)
                else:  # headers, headers-zstd
                    for i in range(n):
                        j = i & mask
                        await send(topic, distinct_value(i, events[j]), key=wkeys[j],
                                   headers=[("trace-id", b"%016x" % i),
                                            ("source", b"checkout")],
                                   on_delivery=on_delivery)
                outcomes = {"on_delivery": settled}  # read after flush() (below)
            elif api.startswith("workload-"):  # the "workloads" group (WORKLOADS)
                workload = api[len("workload-"):]
                send = producer.send
                events = make_event_values()
                wkeys = make_keys(len(events))
                if workload == "nokey":
                    for i in range(n):
                        await send(topic, distinct_value(i, events[i & mask]))
                elif workload == "keyed":
                    for i in range(n):
                        j = i & mask
                        await send(topic, distinct_value(i, events[j]), key=wkeys[j])
                elif workload in ("keyed-json", "keyed-otel"):  # the "hooks" group
                    objects = [{"user": f"u{j:05d}", "sku": f"sku-{j % 10_000:04d}",
                                "qty": 1 + j % 8, "price": j % 500 + 0.25, "status": "paid"}
                               for j in range(len(events))] if workload == "keyed-json" else []
                    skeys = [k.decode() for k in wkeys]
                    if workload == "keyed-json":  # the producer serializes: dict -> JSON
                        for i in range(n):
                            j = i & mask
                            await send(topic, {"id": i, **objects[j]}, key=skeys[j])
                    else:  # the TracingInterceptor adds traceparent, inside one span
                        with otel_span():
                            for i in range(n):
                                j = i & mask
                                await send(topic, distinct_value(i, events[j]), key=wkeys[j])
                else:  # headers, headers-zstd (the producer's compression option)
                    for i in range(n):
                        j = i & mask
                        await send(topic, distinct_value(i, events[j]), key=wkeys[j],
                                   headers=[("trace-id", b"%016x" % i),
                                            ("source", b"checkout")])
            else:
                raise ValueError(f"unknown pipeline api {api!r}")
            await producer.flush()
            elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            stats = producer.statistics()
            extra: dict[str, Any] = {
                "requests_sent": stats.requests_sent,
                "double_settles": stats.double_settles,
                "options": {k: v for k, v in opts.items()},
                "buffer_memory": buffer_memory,
            }
            if "on_delivery" in outcomes:  # [succeeded, failed] as the callbacks counted
                ok, bad = outcomes["on_delivery"]
                extra["on_delivery"] = {"succeeded": ok, "failed": bad}
            elif outcomes:
                extra.update(outcomes)
            if groups:
                extra["group_delivered"] = sum(g.delivered for g in groups)
                errors = [str(e) for g in groups for e in g.errors][:3]
                if errors:
                    extra["first_errors"] = errors
            return ClientResult(elapsed, cpu, stats.succeeded, stats.failed, extra)

    return trio.run(main)


def produce_pipeline_sync(bootstrap: str, topic: str, n: int,
                          warmup_topic: str | None = None) -> ClientResult:
    """pipeline's SyncProducer from plain blocking code: ``producer.send()`` per message
    (a SyncDelivery back at once), then ``flush()``; the same options as "pipeline-send"."""
    from pipeline import ProducerConfig
    from pipeline.producer._sync import SyncProducer

    values = make_values()
    mask = len(values) - 1
    buffer_memory = ProducerConfig(acks="all", linger=LINGER_S).buffer_memory
    with SyncProducer(bootstrap, acks="all", linger=LINGER_S) as producer:
        if warmup_topic:
            producer.send_and_wait(warmup_topic, values[0])
        t0, c0 = time.perf_counter(), cpu_seconds()
        send = producer.send
        for i in range(n):
            send(topic, values[i & mask])
        producer.flush()
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        stats = producer.statistics()
    return ClientResult(elapsed, cpu, stats.succeeded, stats.failed,
                        {"requests_sent": stats.requests_sent, "buffer_memory": buffer_memory})


# --------------------------------------------------------------------------- aiokafka


def produce_aiokafka(bootstrap: str, topic: str, n: int,
                     warmup_topic: str | None = None, *,
                     workload: str | None = None) -> ClientResult:
    """aiokafka 0.14, acks=all, NOT idempotent (its InitProducerId v0 fails on tansu),
    linger 5 ms: ``await producer.send()`` (returns a future) per message, then flush().
    ``workload`` (the "workloads" group): the records of ``produce_pipeline``'s workload
    loops (key, headers as (str, bytes) pairs; ``compression_type="zstd"`` for
    headers-zstd)."""
    import asyncio

    from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

    values = make_values()
    mask = len(values) - 1

    async def main() -> ClientResult:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
            linger_ms=int(LINGER_S * 1000),
            compression_type="zstd" if workload == "headers-zstd" else None,
        )
        await producer.start()
        try:
            if warmup_topic:
                await producer.send_and_wait(warmup_topic, values[0])
            t0, c0 = time.perf_counter(), cpu_seconds()
            send = producer.send
            # -> a future per send; not awaited (see below)
            if workload is None:
                for i in range(n):
                    await send(topic, values[i & mask])
            else:  # the "workloads" group: as produce_pipeline's loops
                events = make_event_values()
                wkeys = make_keys(len(events))
                if workload == "nokey":
                    for i in range(n):
                        await send(topic, distinct_value(i, events[i & mask]))
                elif workload == "keyed":
                    for i in range(n):
                        j = i & mask
                        await send(topic, distinct_value(i, events[j]), key=wkeys[j])
                else:  # headers, headers-zstd
                    for i in range(n):
                        j = i & mask
                        await send(topic, distinct_value(i, events[j]), key=wkeys[j],
                                   headers=[("trace-id", b"%016x" % i),
                                            ("source", b"checkout")])
            await producer.flush()
            elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            # No per-future callbacks: they would bill aiokafka for bookkeeping the
            # benchmark does not need. The count is verified on the broker instead.
            return ClientResult(elapsed, cpu)
        finally:
            await producer.stop()

    return asyncio.run(main())


# --------------------------------------------------------------------------- confluent-kafka


def produce_confluent(bootstrap: str, topic: str, n: int,
                      warmup_topic: str | None = None, *, keyed: bool = False,
                      workload: str | None = None) -> ClientResult:
    """confluent-kafka (librdkafka), idempotent, acks=all, linger.ms=5:
    ``produce()`` + ``poll(0)`` per message, then ``flush()``. ``keyed``:
    ``produce(key=)`` with the keys of ``make_keys()`` (librdkafka's default partitioner)."""
    from confluent_kafka import KafkaException, Producer

    values = make_values()
    mask = len(values) - 1
    keys = make_keys(len(values)) if keyed else []  # before the clock
    config = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": int(LINGER_S * 1000),
    }
    if workload == "headers-zstd":
        config["compression.type"] = "zstd"
    producer = Producer(config)
    producer.list_topics(timeout=10)  # connect before the clock starts
    if warmup_topic:  # ... and get the producer id
        producer.produce(warmup_topic, values[0])
        if producer.flush(30):
            raise KafkaException("warm-up message not delivered within 30 s")
    full_waits = 0
    t0, c0 = time.perf_counter(), cpu_seconds()
    produce, poll = producer.produce, producer.poll
    if workload is not None:  # the "workloads" group: as produce_pipeline's loops
        events = make_event_values()
        wkeys = make_keys(len(events))
        with_key, with_headers = workload != "nokey", workload.startswith("headers")
        for i in range(n):
            j = i & mask
            value = distinct_value(i, events[j])
            while True:
                try:
                    if with_headers:
                        produce(topic, value, key=wkeys[j],
                                headers=[("trace-id", b"%016x" % i), ("source", b"checkout")])
                    elif with_key:
                        produce(topic, value, key=wkeys[j])
                    else:
                        produce(topic, value)
                    break
                except BufferError:
                    full_waits += 1
                    poll(0.005)
            poll(0)
    elif keyed:  # the same loop with a key: a separate loop, so the keyless one stays as it was
        for i in range(n):
            j = i & mask
            while True:
                try:
                    produce(topic, values[j], key=keys[j])
                    break
                except BufferError:  # local queue full: serve delivery reports, retry
                    full_waits += 1
                    poll(0.005)
            poll(0)
    else:
        for i in range(n):
            while True:
                try:
                    produce(topic, values[i & mask])
                    break
                except BufferError:  # local queue full: serve delivery reports, then retry
                    full_waits += 1
                    poll(0.005)
            poll(0)
    remaining = producer.flush(120)
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    if remaining:
        raise KafkaException(f"flush left {remaining} messages undelivered")
    # No delivery callback (it would cost a Python call per message); the count is
    # verified on the broker instead.
    return ClientResult(elapsed, cpu, extra={"buffer_full_waits": full_waits})


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class ClientSpec:
    name: str
    label: str
    run: Callable[..., ClientResult]  # (bootstrap, topic, n, warmup_topic=None)
    library: str  # "pipeline" | "aiokafka" | "confluent"
    wants_idempotent: bool | None = None  # None: library default; checked on the broker
    group: str = "peers"  # "peers" (issue 4), "idempotence" (issue 5) or "keyed"
    # The records sent are WORKLOADS[workload]'s (workload_record): every run is read back
    # and checked record by record (bench/readback.py). None: counted on the broker only.
    workload: str | None = None


def _pipeline(api: str, **options: Any) -> Callable[..., ClientResult]:
    def run(bootstrap: str, topic: str, n: int, warmup_topic: str | None = None
            ) -> ClientResult:
        return produce_pipeline(bootstrap, topic, n, api=api, options=options,
                                warmup_topic=warmup_topic)
    return run


def _confluent_keyed(bootstrap: str, topic: str, n: int, warmup_topic: str | None = None
                     ) -> ClientResult:
    return produce_confluent(bootstrap, topic, n, warmup_topic=warmup_topic, keyed=True)


def _aiokafka_workload(workload: str) -> Callable[..., ClientResult]:
    def run(bootstrap: str, topic: str, n: int, warmup_topic: str | None = None
            ) -> ClientResult:
        return produce_aiokafka(bootstrap, topic, n, warmup_topic=warmup_topic,
                                workload=workload)
    return run


def _zstd(workload: str) -> dict[str, Any]:
    """The producer options of ``workload``: headers-zstd compresses."""
    return {"compression": "zstd"} if workload.endswith("zstd") else {}


def _confluent_workload(workload: str) -> Callable[..., ClientResult]:
    def run(bootstrap: str, topic: str, n: int, warmup_topic: str | None = None
            ) -> ClientResult:
        return produce_confluent(bootstrap, topic, n, warmup_topic=warmup_topic,
                                 workload=workload)
    return run


_TRACER_PROVIDER: Any = None


def otel_options() -> dict[str, Any]:
    """The producer options of the OpenTelemetry client: a TracingInterceptor over an SDK
    tracer provider that records spans and exports none (the interceptor's own cost)."""
    global _TRACER_PROVIDER
    from opentelemetry.sdk.trace import TracerProvider

    from pipeline.otel import TracingInterceptor

    _TRACER_PROVIDER = TracerProvider()
    return {"interceptors": [TracingInterceptor(_TRACER_PROVIDER)]}


def otel_span() -> Any:
    """The span the OpenTelemetry client sends in (one for the whole run)."""
    return _TRACER_PROVIDER.get_tracer("bench").start_as_current_span("bench")


def _pipeline_lazy(api: str, options: Callable[[], dict[str, Any]]
                   ) -> Callable[..., ClientResult]:
    def run(bootstrap: str, topic: str, n: int, warmup_topic: str | None = None
            ) -> ClientResult:
        return produce_pipeline(bootstrap, topic, n, api=api, options=options(),
                                warmup_topic=warmup_topic)
    return run


CLIENTS: dict[str, ClientSpec] = {spec.name: spec for spec in (
    ClientSpec("pipeline-send", "pipeline send()", _pipeline("send"), "pipeline"),
    ClientSpec("pipeline-send_many", "pipeline send_many(10k)", _pipeline("send_many"),
               "pipeline"),
    ClientSpec("pipeline-send_batch", "pipeline send_batch(list)", _pipeline("send_batch"),
               "pipeline"),
    ClientSpec("pipeline-send_batch-arrow", "pipeline send_batch(arrow)",
               _pipeline("send_batch-arrow"), "pipeline"),
    ClientSpec("pipeline-await", "pipeline send() + await each", _pipeline("await"),
               "pipeline"),
    ClientSpec("pipeline-callback", "pipeline send(on_delivery=)", _pipeline("callback"),
               "pipeline"),
    ClientSpec("pipeline-sync", "pipeline SyncProducer.send()", produce_pipeline_sync,
               "pipeline"),
    ClientSpec("aiokafka", "aiokafka send() [not idem.]", produce_aiokafka, "aiokafka",
               wants_idempotent=False),
    ClientSpec("confluent", "confluent-kafka [idem.]", produce_confluent, "confluent",
               wants_idempotent=True),
    # Issue 5: the cost of idempotence, on the bulk path (where the pipeline, not the
    # per-message API, is the bottleneck, so in-flight limits show).
    ClientSpec("pipeline-idem-mif5", "pipeline idem. mif=5",
               _pipeline("send_many", idempotent=True, max_in_flight=5), "pipeline",
               wants_idempotent=True, group="idempotence"),
    ClientSpec("pipeline-idem-mif1", "pipeline idem. mif=1",
               _pipeline("send_many", idempotent=True, max_in_flight=1), "pipeline",
               wants_idempotent=True, group="idempotence"),
    ClientSpec("pipeline-nonidem", "pipeline non-idem. mif=5",
               _pipeline("send_many", idempotent=False, max_in_flight=5), "pipeline",
               wants_idempotent=False, group="idempotence"),
    # Keyed sends, side by side: send(key=) per message against produce(key=), both
    # cycling the same pool of make_keys() (1024 distinct keys); otherwise as
    # "pipeline-send" and "confluent".
    ClientSpec("pipeline-send-keyed", "pipeline send(key=)", _pipeline("send-keyed"),
               "pipeline", group="keyed"),
    ClientSpec("confluent-keyed", "confluent-kafka keyed [idem.]", _confluent_keyed,
               "confluent", wants_idempotent=True, group="keyed"),
    # What users send (WORKLOADS), distinct values, each workload the same records
    # (workload_record) from every client, every run read back and checked:
    #   pipeline-w-W  send() + flush()
    #   pipeline-a-W  send(), awaiting every delivery (a sliding window of AWAIT_WINDOW)
    #   pipeline-c-W  send(on_delivery=) counting the outcomes, then flush()
    #   pipeline-m-W  send_many() of SEND_MANY_CHUNK ProducerMessages built in the timed
    #                 loop (as a caller builds them)
    #   confluent-w-W produce() + poll(0) + flush(); idempotent (pipeline's default)
    #   aiokafka-w-W  await send() + flush(); NOT idempotent (as "aiokafka")
    *(spec for w in WORKLOADS for spec in (
        ClientSpec(f"pipeline-w-{w}", f"pipeline send() {w}",
                   _pipeline(f"workload-{w}", **_zstd(w)),
                   "pipeline", wants_idempotent=True, group="workloads", workload=w),
        ClientSpec(f"pipeline-a-{w}", f"pipeline send() + await each {w}",
                   _pipeline(f"await-{w}", **_zstd(w)),
                   "pipeline", wants_idempotent=True, group="workloads", workload=w),
        ClientSpec(f"pipeline-c-{w}", f"pipeline send(on_delivery=) {w}",
                   _pipeline(f"callback-{w}", **_zstd(w)),
                   "pipeline", wants_idempotent=True, group="workloads", workload=w),
        ClientSpec(f"confluent-w-{w}", f"confluent-kafka {w} [idem.]", _confluent_workload(w),
                   "confluent", wants_idempotent=True, group="workloads", workload=w),
        ClientSpec(f"aiokafka-w-{w}", f"aiokafka send() {w} [not idem.]",
                   _aiokafka_workload(w), "aiokafka", wants_idempotent=False,
                   group="workloads", workload=w),
        ClientSpec(f"pipeline-m-{w}", f"pipeline send_many() {w}",
                   _pipeline(f"many-{w}", **_zstd(w)),
                   "pipeline", wants_idempotent=True, group="workloads", workload=w))),
    # Awaiting every keyed delivery with larger windows than AWAIT_WINDOW, against
    # "pipeline-w-keyed" and "pipeline-a-keyed": what the window costs (docs/benchmarks.md).
    *(ClientSpec(f"pipeline-a{label}-keyed", f"pipeline send() + await each keyed, {label} window",
                 _pipeline(f"await-keyed@{held}"),
                 "pipeline", wants_idempotent=True, group="await-window", workload="keyed")
      for label, held in AWAIT_WINDOWS),
    # send_many forced onto the per-message path (what every call took before its
    # messages rode the columnar path): the before of a before/after in one run.
    *(ClientSpec(f"pipeline-m0-{w}", f"pipeline send_many() {w}, per-message path",
                 _pipeline(f"many0-{w}", **_zstd(w)),
                 "pipeline", wants_idempotent=True, group="send_many-before", workload=w)
      for w in WORKLOADS),
    # What hooks cost, against "pipeline-w-keyed" (the same keyed records): the JSON
    # serializer (dicts and str keys in, the producer encodes), and the OpenTelemetry
    # TracingInterceptor (a traceparent header on every record, sent inside one span).
    ClientSpec("pipeline-hooks-json", "pipeline send() keyed, value_serializer=json",
               _pipeline("workload-keyed-json", key_serializer="str", value_serializer="json"),
               "pipeline", wants_idempotent=True, group="hooks"),
    ClientSpec("pipeline-hooks-otel", "pipeline send() keyed, TracingInterceptor",
               _pipeline_lazy("workload-keyed-otel", otel_options),
               "pipeline", wants_idempotent=True, group="hooks"),
)}
