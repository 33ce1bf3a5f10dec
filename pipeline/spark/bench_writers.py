"""The pieces of the export bench: its DataFrames, the five writers, the read-back check.

Writers, each given the same cached DataFrame and its own fresh topic:

* ``pipeline``: :func:`~pipeline.spark.export_dataframe` (mapInArrow + the trio producer),
  at least once;
* ``pipeline_eos``: the same with ``exactly_once=True`` and a fresh ``export_id`` per run
  (one transactional id per Spark partition, markers in the default ledger topic, the
  default commit interval: a third of the 60 s transaction timeout); it needs a broker
  whose ``read_committed`` readers see only committed transactions
  (:func:`transactions_reason` finds out; the embedded tansu broker has none);
* ``foreach``: what people write without this package: ``df.foreachPartition`` with one
  confluent-kafka ``Producer`` per partition, ``produce()`` per ``Row``, ``flush()``;
* ``spark_kafka``: Spark's own sink, ``df.write.format("kafka")`` (the session must have
  been started with ``spark.jars`` = :func:`~pipeline.spark.kafka_sink_jars`);
* ``noop_arrow``: a ``mapInArrow`` that only counts the rows it receives: the ceiling of
  any exporter fed by Arrow batches (Spark's side of the cost alone).

Every producing writer runs acks=all, idempotent, linger 5 ms, Java's murmur2 partitioner
for keyed rows. What each wrote is judged by an independent reader (confluent-kafka,
``isolation.level=read_committed``), not by our own decoder: every row exactly once (the
row id is in the value; records are counted, not offsets, which transaction markers also
take), and a sample of rows exactly as the DataFrame holds them (key, value, headers, and
for keyed rows the murmur2 partition).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.spark.progress import ExportProgress

__all__ = [
    "SHAPES",
    "TRANSACTIONAL",
    "WRITERS",
    "bench_frame",
    "confluent_partition_exporter",
    "count_arrow_rows",
    "read_back",
    "sample_rows",
    "sink_jars_reason",
    "transactions_reason",
    "write",
]

WRITERS = ("pipeline", "pipeline_eos", "foreach", "spark_kafka", "noop_arrow")
#: writers that write in transactions (their topics are judged at read_committed, and
#: they need a broker that isolates transactions)
TRANSACTIONAL = frozenset({"pipeline_eos"})
#: plain: a 100-byte value, no key, no headers. keyed_headers: the demo's rows: a
#: customer key (10k keys), a JSON order value (~190 B), 3 headers.
SHAPES = ("plain", "keyed_headers")
LINGER_MS = 5
_ID_DIGITS = 12


def bench_frame(spark: Any, shape: str, rows: int, *, partitions: int = 2,
                keys: int = 10_000) -> Any:
    """A cached, materialized DataFrame of ``rows`` rows of ``shape`` in ``partitions``
    Spark partitions. Every value starts with its row id (12 digits), so a reader can
    tell every row apart."""
    from pyspark.sql import functions as F

    id_ = F.col("id")
    row_id = F.lpad(id_.cast("string"), _ID_DIGITS, "0")
    base = spark.range(rows, numPartitions=partitions)
    if shape == "plain":
        df = base.select(
            F.concat(row_id, F.expr(f"repeat('x', {100 - _ID_DIGITS})")).cast("binary")
            .alias("value"))
    elif shape == "keyed_headers":
        customer = F.concat(F.lit("c-"), F.lpad((id_ % keys).cast("string"), 6, "0"))
        seq = (id_ / keys).cast("long")
        order = F.struct(
            customer.alias("customer_id"), seq.alias("seq"),
            (F.abs(F.hash(id_)) % 50_000 + 199).alias("amount_cents"),
            F.element_at(F.array(*[F.lit(c) for c in ("EUR", "USD", "GBP", "CHF")]),
                         (F.abs(F.hash(id_ * 3)) % 4 + 1).cast("int")).alias("currency"),
            F.element_at(F.array(*[F.lit(s) for s in ("web", "ios", "android", "store")]),
                         (F.abs(F.hash(id_ * 7)) % 4 + 1).cast("int")).alias("channel"),
            (F.lit(1_767_225_600_000) + id_ * 37).alias("created_ms"),
        )
        df = base.select(
            customer.alias("key"),
            F.concat(row_id, F.to_json(order)).alias("value"),
            F.array(
                F.struct(F.lit("event-type").alias("key"),
                         F.lit(b"order-created").alias("value")),
                F.struct(F.lit("schema").alias("key"), F.lit(b"orders/v1").alias("value")),
                F.struct(F.lit("seq").alias("key"), seq.cast("string").cast("binary")
                         .alias("value")),
            ).alias("headers"),
        )
    else:
        raise ValueError(f"unknown shape {shape!r}: choose from {', '.join(SHAPES)}")
    df = df.cache()
    df.count()  # materialize: no writer pays for generating the rows
    return df


def sample_rows(df: Any, rows: int, target: int = 200) -> dict[bytes, tuple[Any, ...]]:
    """About ``target`` rows of ``df`` (a deterministic hash sample):
    ``{value: (key bytes | None, headers list)}``."""
    from pyspark.sql import functions as F

    modulus = max(1, rows // target)
    picked = df.where(F.expr(f"pmod(hash(value), {modulus}) = 0")).collect()
    out: dict[bytes, tuple[Any, ...]] = {}
    for row in picked:
        data = row.asDict()
        key = data.get("key")
        headers = [(h["key"], bytes(h["value"])) for h in (data.get("headers") or [])]
        value = data["value"]
        value = value.encode() if isinstance(value, str) else bytes(value)
        out[value] = (key.encode() if isinstance(key, str) else key, headers)
    return out


def sink_jars_reason(spark: Any) -> str | None:
    """Why Spark's own Kafka sink cannot run in this session (None: it can)."""
    jars = spark.sparkContext.getConf().get("spark.jars", "") or ""
    if "spark-sql-kafka" not in jars:
        return ("Spark's Kafka sink is not on this session's class path: start the session "
                "with spark.jars = ','.join(pipeline.spark.kafka_sink_jars())")
    return None


def transactions_reason(bootstrap: str, topic: str, *, timeout: float = 30.0) -> str | None:
    """Why an exactly-once export cannot be measured on this broker (None: it can).

    Asks the broker, on ``topic`` (an existing, empty, 1-partition topic): confluent-kafka's
    transactional producer commits one record and aborts another, then a confluent-kafka
    consumer at ``read_committed`` reads the partition to its end. A broker that isolates
    transactions shows the committed record alone; one that refuses the transaction
    requests, or shows the aborted record too (tansu 0.6.0 accepts every request but
    isolates nothing), cannot hold an exactly-once export's promise, so measuring it
    there would measure a writer whose guarantee does not hold."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"export-bench-probe-{time.time_ns()}",
                         "transaction.timeout.ms": int(timeout * 1000)})
    try:
        producer.init_transactions(timeout)
        producer.begin_transaction()
        producer.produce(topic, b"committed", partition=0)
        producer.commit_transaction(timeout)
        producer.begin_transaction()
        producer.produce(topic, b"aborted", partition=0)
        producer.flush(timeout)
        producer.abort_transaction(timeout)
    except KafkaException as exc:
        return (f"the broker refused a transaction ({exc.args[0]}): an exactly-once export "
                "needs transactions; measure it on Apache Kafka (--broker kafka)")
    finally:
        del producer
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{time.time_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})
    seen: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        ended = False
        while not ended and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10, timeout=0.5):
                err = msg.error()
                if err is None:
                    seen.append(msg.value() or b"")
                elif err.code() == KafkaError._PARTITION_EOF:
                    ended = True
    finally:
        consumer.close()
    if seen == [b"committed"]:
        return None
    what = ("a record of an aborted transaction" if b"aborted" in seen else
            f"{seen!r} where the one committed record was expected" if ended else
            f"no end of the partition within {timeout:g} s")
    return (f"the broker does not isolate transactions: a read_committed reader saw {what}, "
            "so nothing there holds an exactly-once export to its promise; measure it on "
            "Apache Kafka (--broker kafka)")


def confluent_partition_exporter(rows: Iterator[Any], bootstrap: str, topic: str) -> None:
    """The hand-written baseline: one confluent-kafka Producer per partition, produce() per
    Row (headers converted to the (str, bytes) pairs confluent-kafka takes)."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": LINGER_MS,
        "partitioner": "murmur2_random",  # Java's, as the other writers
    })
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None and len(errors) < 5:
            errors.append(str(err))

    produce, poll = producer.produce, producer.poll
    for row in rows:
        data = row.asDict()
        headers = data.get("headers")
        kwargs: dict[str, Any] = {"key": data.get("key"), "on_delivery": on_delivery}
        if headers:
            kwargs["headers"] = [(h["key"], bytes(h["value"])) for h in headers]
        while True:
            try:
                produce(topic, value=data["value"], **kwargs)
                break
            except BufferError:
                poll(0.05)
        poll(0)
    remaining = producer.flush(120)
    if remaining or errors:
        raise KafkaException(f"{remaining} undelivered; errors: {errors}")


def count_arrow_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """The no-op sink: receive every Arrow batch, keep nothing, yield the row count."""
    import pyarrow as pa  # type: ignore[import-untyped]

    n = 0
    for batch in batches:
        n += batch.num_rows
    yield pa.RecordBatch.from_pydict({"rows": pa.array([n], pa.int64())})


def write(writer: str, df: Any, bootstrap: str, topic: str, *,
          producer_options: dict[str, Any] | None = None,
          progress: Callable[[ExportProgress], None] | None = None) -> dict[str, Any]:
    """Run ``writer`` once on ``df`` into ``topic``; ``{"seconds", "rows_seen"?, ...}``.
    The clock is the driver's wall clock around the whole action, alike for all five
    (for ``pipeline_eos`` it includes the driver's ledger read before the job and its
    "finished" marker after). ``producer_options``: ``ProducerConfig`` fields for the
    ``pipeline`` and ``pipeline_eos`` writers; ``progress``: their ``export_dataframe``
    progress callback."""
    started = time.perf_counter()
    extra: dict[str, Any] = {}
    if writer == "pipeline":
        from pipeline.spark.export import export_dataframe

        options = {"linger": LINGER_MS / 1000, **(producer_options or {})}
        report = export_dataframe(df, bootstrap=bootstrap, topic=topic, progress=progress,
                                  **options)
        extra = {"job_seconds": report.seconds, "delivered": report.delivered,
                 "failed": report.failed}
    elif writer == "pipeline_eos":
        from pipeline.spark.export import export_dataframe

        options = {"linger": LINGER_MS / 1000, **(producer_options or {})}
        report = export_dataframe(df, bootstrap=bootstrap, topic=topic, progress=progress,
                                  exactly_once=True,
                                  export_id=f"{topic}-{uuid.uuid4().hex[:8]}", **options)
        extra = {"job_seconds": report.seconds, "delivered": report.delivered,
                 "failed": report.failed, "committed_rows": report.committed_rows,
                 "transactions": sum(p.transactions for p in report.partitions),
                 "retried_partitions": list(report.retried_partitions)}
    elif writer == "foreach":
        df.foreachPartition(functools.partial(confluent_partition_exporter,
                                              bootstrap=bootstrap, topic=topic))
    elif writer == "spark_kafka":
        (df.write.format("kafka")
         .option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic)
         .option("kafka.acks", "all")
         .option("kafka.enable.idempotence", "true")
         .option("kafka.linger.ms", str(LINGER_MS))
         .save())
    elif writer == "noop_arrow":
        counted = df.mapInArrow(count_arrow_rows, "rows long").collect()
        extra = {"rows_seen": sum(r["rows"] for r in counted)}
    else:
        raise ValueError(f"unknown writer {writer!r}: choose from {', '.join(WRITERS)}")
    return {"seconds": time.perf_counter() - started, **extra}


def read_back(bootstrap: str, topic: str, *, rows: int, partitions: int,
              sample: dict[bytes, tuple[Any, ...]], keyed: bool,
              isolation: str = "read_committed", timeout: float = 300.0) -> dict[str, Any]:
    """Read ``topic`` whole with confluent-kafka (assign mode, to each partition's end, at
    ``isolation``: librdkafka's ``isolation.level``, whose default is ``read_committed``
    too) and judge it: ``ok`` when it holds every row id 0..rows-1 exactly once and every
    sampled row is there unchanged (key, value, headers; keyed rows on the murmur2
    partition Java's client picks). Records are counted, never offsets: transaction
    markers take offsets too."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from pipeline.producer._stages.partitioner import java_positive, murmur2

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"export-bench-{time.monotonic_ns()}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "auto.offset.reset": "earliest", "fetch.max.bytes": 16 << 20,
        "isolation.level": isolation,
    })
    ids: list[int] = []
    found: dict[bytes, tuple[Any, ...]] = {}
    eof: set[int] = set()
    errors: list[str] = []
    started = time.perf_counter()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(eof) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=20_000, timeout=0.5):
                err = msg.error()
                partition = msg.partition() or 0  # None only for non-partition events
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(partition)
                    elif len(errors) < 5:
                        errors.append(str(err))
                    continue
                value: bytes = msg.value() or b""
                eof.discard(partition)
                ids.append(int(value[:_ID_DIGITS] or b"-1"))
                if value in sample:
                    found[value] = (msg.key(), msg.headers() or [], msg.partition())
    finally:
        consumer.close()
    distinct = set(ids)
    bad_sample = []
    for value, (key, headers) in sample.items():
        got = found.get(value)
        want_partition = java_positive(murmur2(key)) % partitions if keyed and key else None
        if got is None or got[0] != key or list(got[1]) != headers or (
                want_partition is not None and got[2] != want_partition):
            bad_sample.append(value[:_ID_DIGITS].decode())
    result = {
        "records": len(ids), "distinct_ids": len(distinct),
        "duplicates": len(ids) - len(distinct),
        "missing": rows - sum(1 for i in distinct if 0 <= i < rows),
        "sample_checked": len(sample), "sample_bad": bad_sample[:5],
        "complete": len(eof) == partitions, "errors": errors, "isolation": isolation,
        "read_seconds": round(time.perf_counter() - started, 2),
    }
    result["ok"] = (result["records"] == rows and result["distinct_ids"] == rows
                    and result["missing"] == 0 and not bad_sample and not errors)
    return result
