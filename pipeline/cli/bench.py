"""``python -m pipeline bench``: a quick producer throughput run (or the Spark export bench).

Without ``-b`` it starts the embedded broker for the run. ``--spark`` runs
:func:`pipeline.spark.bench.compare_export` (one round: export, exactly-once export when
the broker isolates transactions, a foreachPartition + confluent-kafka baseline, Spark's
own Kafka sink when its jars can be had, and a mapInArrow no-op) instead of the plain
producer run.

Progress (``_progress.py``) is drawn on stderr while the run goes, on a terminal by
default (``--progress``: elsewhere too, a plain line per report); never on stdout, so
``--json`` stays clean. The producer run shows rows and bytes delivered, their rate, the
share of ``--rows`` done and the time left; ``--spark`` shows each measured run of the
pipeline export as its Spark tasks finish (the other writers report no rows).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

from pipeline.cli._common import (
    UserError,
    add_bootstrap,
    add_producer_options,
    check_bootstrap,
    check_topic,
    producer_options,
    run_guarded,
    setup_logging,
)
from pipeline.cli._progress import (
    ExportDrawing,
    Progress,
    Snapshot,
    add_progress_arguments,
    progress_settings,
)

HELP = "measure producer throughput (embedded broker unless -b); --spark: export vs baseline"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.set_defaults(bootstrap=None)  # None: start the embedded broker
    parser.add_argument("-t", "--topic", default=None, help="topic (default: a new one)")
    parser.add_argument("-n", "--rows", type=int, default=200_000, help="messages (200000)")
    parser.add_argument("-s", "--size", type=int, default=100,
                        help="value bytes (100; --spark uses its two fixed row shapes)")
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys (0: no key)")
    parser.add_argument(
        "--topic-partitions", type=int, default=6, help="partitions of a new topic (6)"
    )
    parser.add_argument("--chunk", type=int, default=10_000, help="messages per send_many")
    parser.add_argument("--spark", action="store_true", help="run the Spark export bench")
    parser.add_argument(
        "--spark-partitions", type=int, default=2, help="Spark partitions for --spark (2)"
    )
    parser.add_argument("--master", default="local[2]", help="Spark master for --spark")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_progress_arguments(
        parser, "rows and bytes delivered, their rate, share of --rows done and ETA")
    add_producer_options(parser)


def run(args: argparse.Namespace) -> int:
    return run_guarded(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    setup_logging(args.verbose)
    if args.rows < 1 or args.size < 0:
        raise UserError("--rows must be >= 1 and --size >= 0")
    options = producer_options(args)
    try:
        args.show_progress, args.progress_every = progress_settings(
            args.progress, args.progress_interval, tty=sys.stderr.isatty())
    except ValueError as exc:
        raise UserError(str(exc)) from None
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from pipeline.testing.broker import BrokerStartError, EmbeddedBroker

        broker = EmbeddedBroker()
        try:
            broker.start()
        except BrokerStartError as exc:
            raise UserError(f"cannot start the embedded broker: {exc}") from None
        bootstrap = broker.bootstrap
        print(f"embedded broker at {bootstrap}", file=sys.stderr)
    else:
        check_bootstrap(bootstrap)
    try:
        if args.spark:
            result = _spark_bench(args, bootstrap, options)
            from pipeline.spark.bench import format_comparison

            text = format_comparison(result)
            failed = [t for t in result["results"].values() for r in t.values()
                      if r["status"] in ("failed", "INVALID")]
            result["failed"] = len(failed)
        else:
            result = _producer_bench(args, bootstrap, options)
            text = (
                f"produced {result['delivered']:,} x {args.size} B messages in "
                f"{result['seconds']:.2f} s: {result['rows_per_s']:,.0f} msg/s, "
                f"{result['mb_per_s']:.1f} MB/s (failed: {result['failed']})"
            )
    finally:
        if broker is not None:
            broker.stop()
    print(json.dumps(result, indent=2) if args.json else text)
    return 0 if not result.get("failed") else 1


def _producer_bench(args: argparse.Namespace, bootstrap: str, options: dict[str, Any]) -> dict[str, Any]:
    import trio

    from pipeline.testing.broker import create_topics

    topic = args.topic
    if topic is None:
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, {topic: args.topic_partitions})
    return trio.run(_produce, args, bootstrap, topic, options)


async def _produce(
    args: argparse.Namespace, bootstrap: str, topic: str, options: dict[str, Any]
) -> dict[str, Any]:
    import trio

    from pipeline.producer._api import open_producer
    from pipeline.producer._message import ProducerMessage

    await check_topic(bootstrap, topic, args.timeout, options)
    value = b"x" * args.size
    keys = [f"k-{i}".encode() for i in range(args.keys)] if args.keys > 0 else None
    async with open_producer(bootstrap, **options) as producer, \
            trio.open_nursery() as nursery:
        progress = None
        if args.show_progress:
            progress = Progress(sys.stderr, tty=sys.stderr.isatty(), clock=trio.current_time)

            def snapshot() -> Snapshot:
                stats = producer.statistics()
                return Snapshot(stats.succeeded, stats.delivered_bytes, stats.failed,
                                share=(stats.succeeded + stats.failed) / args.rows)

            nursery.start_soon(progress.run, args.progress_every, snapshot, trio.sleep)
        started = time.perf_counter()
        groups = []
        for start in range(0, args.rows, args.chunk):
            n = min(args.chunk, args.rows - start)
            if keys is None:
                msgs = [ProducerMessage(topic, value) for _ in range(n)]
            else:
                nk = len(keys)
                msgs = [ProducerMessage(topic, value, key=keys[(start + i) % nk]) for i in range(n)]
            groups.append(await producer.send_many(msgs))
        delivered = failed = 0
        for group in groups:
            result = await group
            delivered += result.delivered
            failed += result.failed
        seconds = time.perf_counter() - started
        nursery.cancel_scope.cancel()
        if progress is not None:
            progress.draw(Snapshot(delivered, producer.statistics().delivered_bytes, failed,
                                   share=1.0), final=True)
    return {
        "topic": topic,
        "rows": args.rows,
        "delivered": delivered,
        "failed": failed,
        "seconds": round(seconds, 3),
        "rows_per_s": round(delivered / seconds, 1),
        "mb_per_s": round(delivered * args.size / 1e6 / seconds, 2),
    }


def _spark_bench(args: argparse.Namespace, bootstrap: str, options: dict[str, Any]) -> dict[str, Any]:
    import functools
    import os

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise UserError("--spark needs pyspark: pip install -e '.[spark]'") from None
    from pipeline.spark.bench import compare_export
    from pipeline.spark.sink_jars import KafkaSinkJarsError, kafka_sink_jars
    from pipeline.testing.broker import create_topics

    builder = (
        SparkSession.builder.master(args.master).appName("pipeline-bench")
        .config("spark.ui.showConsoleProgress", "false")
    )
    try:  # Spark's own sink runs beside ours when its jars can be had (else: n/a)
        builder = builder.config("spark.jars", ",".join(kafka_sink_jars()))
    except KafkaSinkJarsError as exc:
        print(f"Spark's Kafka sink left out: {exc}", file=sys.stderr)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        options = {k: v for k, v in options.items() if k not in ("request_timeout", "delivery_timeout")}
        return compare_export(
            spark, bootstrap, create_topics=functools.partial(create_topics, bootstrap),
            rows=args.rows, partitions=args.spark_partitions,
            topic_partitions=args.topic_partitions,
            log=lambda line: print(line, file=sys.stderr, flush=True),
            progress=ExportDrawing(sys.stderr, tty=sys.stderr.isatty(), total_rows=args.rows,
                                   interval=args.progress_every).update
            if args.show_progress else None, **options,
        )
    finally:
        spark.stop()

