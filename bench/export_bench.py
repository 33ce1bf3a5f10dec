"""Spark export bench: our ``export_dataframe`` (at least once, and exactly once) beside the
hand-written ``foreachPartition`` + confluent-kafka exporter, Spark's own
``format("kafka")`` sink and a ``mapInArrow`` no-op (the ceiling), on the same cached
DataFrame, same broker, same run.

    python -m bench.export_bench [--rows N] [--rounds R] [--shapes plain,keyed_headers]
                                 [--writers ...] [--broker tansu|kafka] [--quick] [--json PATH]
    python -m bench export        # (make bench) the defaults

Two row shapes: ``plain`` (100-byte values, no key) and ``keyed_headers`` (the demo's rows:
customer keys, JSON order values, 3 headers). 500k rows per run (``--quick``: 50k, 1
round), 2 Spark partitions (local[2]) -> 6 topic partitions, acks=all, idempotent, linger
5 ms for every producing writer, 3 rounds with the writers' order rotated each round.
Spark's sink runs from the jars :func:`pipeline.spark.kafka_sink_jars` fetches (set as
``spark.jars`` before the JVM starts). The exactly-once export (``exactly_once=True``, a
fresh export id per run) needs a broker that isolates transactions: on tansu, which does
not, it is reported n/a with the reason; ``--broker kafka`` measures it. Every run is read
back with confluent-kafka at ``read_committed`` (each row exactly once; a sample compared
field by field). Targets: ours >= 3x the hand-written exporter and >= 1.0x Spark's sink;
exactly once >= 0.8x ours at least once and >= 1.0x Spark's sink. The logic is
:func:`pipeline.spark.bench.compare_export`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.brokers import add_broker_argument, open_broker
from bench.producer_bench import _machine

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_JSON = BENCH_DIR / "results" / "export.json"
DEFAULT_ROWS = 500_000
QUICK_ROWS = 50_000
DEFAULT_ROUNDS = 3


def spark_session(master: str = "local[2]", *, with_sink: bool = True) -> tuple[Any, str | None]:
    """A SparkSession for the bench (Spark's Kafka sink jars in ``spark.jars`` unless they
    cannot be had: then the reason is returned and that writer is reported n/a)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from pipeline.spark import KafkaSinkJarsError, kafka_sink_jars

    builder = (
        SparkSession.builder.master(master).appName("export-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    reason = None
    if with_sink:
        try:
            builder = builder.config("spark.jars", ",".join(kafka_sink_jars()))
        except KafkaSinkJarsError as exc:
            reason = str(exc)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, reason


def _print(msg: str) -> None:
    print(msg, flush=True)


def run(rows: int | None = None, rounds: int | None = None, *, quick: bool = False,
        shapes: list[str] | None = None, writers: list[str] | None = None,
        broker: str = "tansu", log: Callable[[str], None] = _print) -> dict[str, Any]:
    from pipeline.spark.bench import compare_export
    from pipeline.spark.bench_writers import SHAPES, WRITERS

    rows = rows or int(os.environ.get("BENCH_EXPORT_ROWS", QUICK_ROWS if quick else DEFAULT_ROWS))
    rounds = rounds or (1 if quick else DEFAULT_ROUNDS)
    spark, reason = spark_session()
    if reason:
        log(f"[export] Spark's Kafka sink left out: {reason}")
    try:
        with open_broker(broker) as b:
            report = compare_export(
                spark, b.bootstrap, create_topics=b.create_topics, rows=rows, rounds=rounds,
                shapes=shapes or list(SHAPES), writers=writers or list(WRITERS),
                log=log)
            report["meta"]["broker"] = b.description
    finally:
        spark.stop()
    report["meta"]["machine"] = _machine()
    from importlib import metadata

    report["meta"]["versions"] = {
        d: metadata.version(d) for d in ("pyspark", "pyarrow", "confluent-kafka", "trio")}
    return report


def format_table(report: dict[str, Any]) -> str:
    from pipeline.spark.bench import format_comparison

    meta = report["meta"]
    return (format_comparison(report)
            + f"\n(broker: {meta.get('broker')}; machine: {meta.get('machine')}; "
              f"{meta.get('duration_s')} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.export_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None,
                        help=f"rows per run (default {DEFAULT_ROWS:,}; --quick {QUICK_ROWS:,})")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"rounds, median reported (default {DEFAULT_ROUNDS})")
    parser.add_argument("--shapes", default=None, help="comma-separated: plain,keyed_headers")
    parser.add_argument("--writers", default=None,
                        help="comma-separated: pipeline,pipeline_eos,foreach,spark_kafka,noop_arrow")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows, 1 round")
    add_broker_argument(parser)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    report = run(args.rows, args.rounds, quick=args.quick, broker=args.broker,
                 shapes=args.shapes.split(",") if args.shapes else None,
                 writers=args.writers.split(",") if args.writers else None)
    print(format_table(report))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.json} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
