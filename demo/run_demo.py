"""``make demo``: order events -> Parquet -> Spark -> pipeline producer -> Kafka -> verified.

1. start the embedded tansu broker and create ``demo-orders`` (6 partitions);
2. generate ``DEMO_ROWS`` (default 1,000,000) order events with Spark and write them
   as Parquet (customer keys, a per-customer sequence number, JSON values, headers);
3. read the Parquet back, hash-partition by customer and sort by sequence (so every key
   is produced by one task, in order), and export with ``pipeline.spark.export_dataframe``;
4. read the whole topic back with the project's own consumer (Fetch codec) and verify
   the count, that no row is missing or duplicated, and the per-key order;
5. print the export report (rows/s, MB/s, partitions, retries) and stop everything.

Environment: ``DEMO_ROWS`` (rows), ``DEMO_TASKS`` (Spark tasks; default: cores),
``DEMO_KEEP=1`` keeps the broker running at the end until Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout even without the editable install

TOPIC = "demo-orders"
TOPIC_PARTITIONS = 6
WORK = ROOT / ".demo"


def log(text: str) -> None:
    print(text, flush=True)


def spark_session(tasks: int):  # type: ignore[no-untyped-def]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{tasks}]")
        .appName("pipeline-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(tasks))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.local.dir", str(WORK / "spark-local"))
        .config("spark.sql.warehouse.dir", str(WORK / "warehouse"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def generate(spark, rows: int, customers: int, path: Path) -> None:  # type: ignore[no-untyped-def]
    """Order events: customer c-NNNNN places orders with seq 0, 1, 2, ... over time."""
    from pyspark.sql import functions as F

    id_ = F.col("id")
    df = spark.range(rows).select(
        F.concat(F.lit("o-"), F.lpad(id_.cast("string"), 9, "0")).alias("order_id"),
        F.concat(F.lit("c-"), F.lpad((id_ % customers).cast("string"), 6, "0")).alias("customer_id"),
        (id_ / customers).cast("long").alias("seq"),
        (F.abs(F.hash(id_)) % 50_000 + 199).alias("amount_cents"),
        F.element_at(F.array(*[F.lit(c) for c in ("EUR", "USD", "GBP", "CHF")]),
                     (id_ % 4 + 1).cast("int")).alias("currency"),
        F.element_at(F.array(*[F.lit(s) for s in ("web", "ios", "android", "store")]),
                     (F.abs(F.hash(id_ * 7)) % 4 + 1).cast("int")).alias("channel"),
        (F.abs(F.hash(id_ * 13)) % 5 + 1).alias("items"),
        (F.lit(1_767_225_600_000) + id_ * 37).alias("created_ms"),
    )
    df.write.mode("overwrite").parquet(str(path))


def export(spark, path: Path, bootstrap: str, tasks: int):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    from pipeline.spark import ExportProgress, export_dataframe

    orders = spark.read.parquet(str(path))
    frame = (
        orders.select(
            F.col("customer_id").alias("key"),
            F.to_json(F.struct(*[F.col(c) for c in orders.columns])).alias("value"),
            F.array(
                F.struct(F.lit("event-type").alias("key"),
                         F.lit(b"order-created").alias("value")),
                F.struct(F.lit("schema").alias("key"), F.lit(b"orders/v1").alias("value")),
                F.struct(F.lit("seq").alias("key"),
                         F.col("seq").cast("string").cast("binary").alias("value")),
            ).alias("headers"),
            F.col("seq"),
        )
        # per-key order: every customer in one task, its orders in sequence
        .repartition(tasks, "key")
        .sortWithinPartitions("seq")
        .drop("seq")
        .persist()
    )
    t = time.perf_counter()
    frame.count()  # shuffle + sort now, so the export's rows/s measures the export itself
    log(f"      read Parquet, partitioned by key, sorted by seq: {time.perf_counter() - t:.1f} s")
    started = time.perf_counter()
    last = [0.0]

    def progress(p: ExportProgress) -> None:
        now = time.perf_counter()
        if now - last[0] >= 5:
            last[0] = now
            log(f"  ... {p.tasks_done}/{p.tasks_total} export tasks done, {p.rows:,} rows "
                f"({p.bytes / 1e6:.1f} MB) delivered, {now - started:.0f} s")

    report = export_dataframe(
        frame, bootstrap=bootstrap, topic=TOPIC, add_message_id_header=True,
        message_id_prefix="demo-", progress=progress, linger=0.01,
    )
    frame.unpersist()
    return report


def verify(bootstrap: str, rows: int, customers: int) -> tuple[bool, float]:
    """Read everything back with pipeline.consumer; check count, no gaps/dups, key order."""
    import trio

    from pipeline.consumer import read_topic

    expected = {f"c-{c:06d}": rows // customers + (1 if c < rows % customers else 0)
                for c in range(customers)}

    async def read() -> tuple[int, dict[str, int], list[str], float]:
        from contextlib import aclosing

        next_seq: dict[str, int] = {}
        key_partition: dict[str, int] = {}
        problems: list[str] = []
        count = 0
        started = time.perf_counter()
        async with aclosing(read_topic(bootstrap, TOPIC, stop_at_end=True)) as records:
            async for rec in records:
                count += 1
                key = rec.key.decode() if rec.key else "?"
                seq = int(dict(rec.headers)["seq"])  # type: ignore[arg-type]
                want = next_seq.get(key, 0)
                if seq != want and len(problems) < 10:
                    problems.append(f"{key}: got seq {seq} at {rec.partition}@{rec.offset}, "
                                    f"expected {want}")
                next_seq[key] = seq + 1
                if key_partition.setdefault(key, rec.partition) != rec.partition:
                    problems.append(f"{key} in two partitions")
        return count, next_seq, problems, time.perf_counter() - started

    count, next_seq, problems, seconds = trio.run(read)
    ok = True
    log(f"read back {count:,} records in {seconds:.1f} s ({count / seconds:,.0f} records/s) "
        "with pipeline.consumer (own Fetch codec)")
    if count != rows:
        ok = False
        log(f"  COUNT MISMATCH: expected {rows:,}, read {count:,}")
    else:
        log(f"  count: {count:,} == {rows:,} rows exported  OK")
    incomplete = [k for k, n in expected.items() if next_seq.get(k, 0) != n]
    if problems or incomplete:
        ok = False
        for text in problems:
            log(f"  ORDER PROBLEM: {text}")
        if incomplete:
            log(f"  {len(incomplete)} customers incomplete, e.g. {incomplete[:3]}")
    else:
        log(f"  per-key order: {len(next_seq):,} customer keys, every key's seq 0..n-1 "
            "in offset order, no gaps, no duplicates  OK")
    return ok, seconds


def main() -> int:
    rows = int(os.environ.get("DEMO_ROWS", "1000000"))
    tasks = int(os.environ.get("DEMO_TASKS", str(max(2, min(os.cpu_count() or 2, 8)))))
    customers = max(1, min(10_000, rows // 50))
    total_started = time.perf_counter()
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir()

    from pipeline.testing.broker import EmbeddedBroker, create_topics

    with EmbeddedBroker(log_path=WORK / "broker.log") as broker:
        bootstrap = broker.bootstrap
        create_topics(bootstrap, {TOPIC: TOPIC_PARTITIONS})
        log(f"[1/5] embedded tansu broker at {bootstrap}; topic {TOPIC} "
            f"({TOPIC_PARTITIONS} partitions)")

        t = time.perf_counter()
        spark = spark_session(tasks)
        log(f"[2/5] Spark {spark.version} local[{tasks}] up in {time.perf_counter() - t:.1f} s")
        try:
            path = WORK / "orders.parquet"
            t = time.perf_counter()
            generate(spark, rows, customers, path)
            size = sum(f.stat().st_size for f in path.glob("*.parquet"))
            log(f"      generated {rows:,} order events for {customers:,} customers -> "
                f"{path.relative_to(ROOT)} ({size / 1e6:.1f} MB Parquet) in "
                f"{time.perf_counter() - t:.1f} s")

            log(f"[3/5] exporting through pipeline.spark.export_dataframe ({tasks} tasks)")
            report = export(spark, path, bootstrap, tasks)
        finally:
            spark.stop()
        log(report.format())

        log("[4/5] verifying")
        ok, _ = verify(bootstrap, rows, customers)
        crc = broker.crc_errors_in_log()
        if crc:
            ok = False
            log("  broker logged CRC errors: " + "; ".join(crc[:3]))

        log("[5/5] summary")
        log(f"  export: {report.delivered:,} rows, {report.rows_per_second:,.0f} rows/s, "
            f"{report.mb_per_second:.1f} MB/s, {len(report.partitions)} Spark partitions -> "
            f"{TOPIC_PARTITIONS} topic partitions, retried partitions: "
            f"{list(report.retried_partitions) or 'none'}, failed rows: {report.failed}")
        if os.environ.get("DEMO_KEEP") == "1":
            log(f"broker still running at {bootstrap}; Ctrl-C to stop")
            try:
                while broker.running:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
    log(f"broker stopped; demo {'PASSED' if ok and report.ok else 'FAILED'} in "
        f"{time.perf_counter() - total_started:.0f} s")
    return 0 if ok and report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
