"""``python -m pipeline export``: read Parquet / CSV / JSON with Spark, export to a topic.

Columns: a ``value`` column is used as is, else ``--value EXPR`` (a Spark SQL
expression), else every column as one JSON object (``to_json(struct(*))``). The key is
``--key EXPR`` or a ``key`` column; ``--header NAME=EXPR`` adds headers. The report is
printed at the end (``--json-report`` for JSON).

Progress (``_progress.py``) is drawn on stderr when it is a terminal (``--progress``:
elsewhere too, a plain line per report): rows and bytes delivered and their rate, the
Spark tasks done, and the share done with the time left: of the input's rows when they
are known (local Parquet files: their footers say), else of the tasks. Rows and bytes
count as each Spark task finishes (:mod:`pipeline.spark.progress`), so the rate is the
whole run's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.cli._common import (
    UserError,
    add_bootstrap,
    add_producer_options,
    one_line,
    producer_options,
    resolve_bootstrap,
    run_guarded,
    setup_logging,
)
from pipeline.cli._progress import ExportDrawing, add_progress_arguments, progress_settings

HELP = "export Parquet/CSV/JSON files to a topic with Spark (progress + report)"

FORMATS = ("parquet", "csv", "json")
_SCHEMES = ("hdfs://", "s3://", "s3a://", "gs://", "abfs://", "abfss://", "wasb://", "dbfs:/")


def _header_spec(text: str) -> tuple[str, str]:
    name, sep, expr = text.partition("=")
    if not sep or not name or not expr:
        raise argparse.ArgumentTypeError(f"expected NAME=SPARK_SQL_EXPR, got {text!r}")
    return name, expr


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.add_argument("-t", "--topic", required=True)
    parser.add_argument("paths", nargs="+", metavar="PATH", help="input files or directories")
    parser.add_argument(
        "-F", "--format", choices=FORMATS, default=None,
        help="input format (default: from the first path's extension)",
    )
    parser.add_argument("--value", default=None, metavar="EXPR", help="value expression")
    parser.add_argument("--key", default=None, metavar="EXPR", help="key expression")
    parser.add_argument(
        "--header", dest="headers", type=_header_spec, action="append", default=[],
        metavar="NAME=EXPR", help="add a header from an expression (repeatable)",
    )
    parser.add_argument(
        "--partitions", type=int, default=None,
        help="repartition to N Spark tasks (default: as read); with --key, by key",
    )
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")
    parser.add_argument(
        "--message-id", action="store_true",
        help="add a stable pipeline-message-id header (for downstream dedupe)",
    )
    parser.add_argument(
        "--max-failed-rows", type=int, default=0,
        help="failed rows tolerated per partition before the job fails (default 0)",
    )
    parser.add_argument("--json-report", action="store_true", help="print the report as JSON")
    add_progress_arguments(
        parser, "rows and bytes delivered (as Spark tasks finish), their rate, tasks done, "
        "share done and ETA")
    add_producer_options(parser)


def _format_of(args: argparse.Namespace) -> str:
    if args.format:
        return str(args.format)
    first = args.paths[0].rstrip("/")
    suffixes = [s.lower() for s in Path(first).suffixes]
    for fmt, exts in (("parquet", {".parquet", ".pq"}), ("csv", {".csv", ".tsv"}),
                      ("json", {".json", ".jsonl", ".ndjson"})):
        if exts & set(suffixes):
            return fmt
    if os.path.isdir(first):
        names = os.listdir(first)
        for fmt, ext in (("parquet", ".parquet"), ("csv", ".csv"), ("json", ".json")):
            if any(n.endswith(ext) for n in names):
                return fmt
    raise UserError(f"cannot tell the format of {args.paths[0]}: pass --format {'|'.join(FORMATS)}")


def _check_paths(paths: list[str]) -> None:
    for path in paths:
        if path.startswith(_SCHEMES) or "*" in path:
            continue
        if path.startswith("file://"):
            path = path[len("file://"):]
        if not os.path.exists(path):
            raise UserError(f"no such file or directory: {path}")
        if os.path.isfile(path) and not os.access(path, os.R_OK):
            raise UserError(f"cannot read {path}: permission denied")


def parquet_rows(paths: list[str]) -> int | None:
    """The rows of local Parquet inputs, from their footers (no Spark job); None when a
    path is not local, or a file Spark would read is not Parquet."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    files: list[str] = []
    for path in paths:
        path = path[len("file://"):] if path.startswith("file://") else path
        if path.startswith(_SCHEMES) or "*" in path:
            return None
        if os.path.isdir(path):
            for top, dirs, names in os.walk(path):
                dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
                files += [os.path.join(top, n) for n in names if not n.startswith(("_", "."))]
        else:
            files.append(path)
    try:
        rows: int = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except Exception:  # not Parquet after all: Spark says so, in its own words
        return None
    return rows


def run(args: argparse.Namespace) -> int:
    return run_guarded(lambda: _run(args))


def _spark_session(master: str | None, verbose: bool = False) -> tuple[Any, bool]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise UserError(
            "the export needs pyspark: pip install -e '.[spark]' (and Java 17+)"
        ) from None
    # The active session, else the default one (a notebook's, a test's): reused, and
    # never stopped here. getActiveSession() alone is per JVM thread, so the builder
    # below would hand back the default session as if new, and stop it at the end.
    try:
        return SparkSession.active(), False
    except Exception:  # PySparkRuntimeError: no active or default session
        pass
    builder = (
        SparkSession.builder.master(master or "local[*]")
        .appName("pipeline-export")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    spark = builder.getOrCreate()
    # a failed task is reported once, as our one-line error; -v shows Spark's own log
    spark.sparkContext.setLogLevel("WARN" if verbose else "FATAL")
    return spark, True


def build_frame(spark: Any, args: argparse.Namespace, fmt: str) -> Any:
    from pyspark.sql import functions as F

    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true")
    df = reader.load(args.paths)
    cols = set(df.columns)
    if args.value is not None:
        value = F.expr(args.value)
    elif "value" in cols:
        value = F.col("value")
    else:
        value = F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns]))
    out = [value.cast("string").alias("value") if args.value is not None else value.alias("value")]
    if args.key is not None:
        out.append(F.expr(args.key).cast("string").alias("key"))
    elif "key" in cols:
        out.append(F.col("key"))
    if args.headers:
        out.append(
            F.array(*[
                F.struct(F.lit(name).alias("key"), F.expr(expr).cast("string").cast("binary")
                         .alias("value"))
                for name, expr in args.headers
            ]).alias("headers")
        )
    elif "headers" in cols:
        out.append(F.col("headers"))
    if "partition" in cols:
        out.append(F.col("partition"))
    frame = df.select(*out)
    if args.partitions:
        frame = (
            frame.repartition(args.partitions, "key") if "key" in frame.columns
            else frame.repartition(args.partitions)
        )
    return frame


def _run(args: argparse.Namespace) -> int:
    setup_logging(args.verbose)
    resolve_bootstrap(args)
    options = producer_options(args)
    _check_paths(args.paths)
    fmt = _format_of(args)
    if args.partitions is not None and args.partitions < 1:
        raise UserError(f"--partitions must be >= 1, not {args.partitions}")
    tty = sys.stderr.isatty()
    try:
        show, interval = progress_settings(args.progress, args.progress_interval, tty=tty)
    except ValueError as exc:
        raise UserError(str(exc)) from None

    from pipeline.spark.export import ExportError, ExportSchemaError, export_dataframe

    spark, owned = _spark_session(args.master, args.verbose)
    if not args.verbose:
        # pyspark logs analysis errors as JSON on stderr; we report them ourselves, once
        import logging

        logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    try:
        try:
            frame = build_frame(spark, args, fmt)
        except Exception as exc:  # AnalysisException, ParseException: the user's input
            if type(exc).__module__.startswith("pyspark"):
                raise UserError(f"cannot read {args.paths[0]} as {fmt}: {_spark_error(exc)}") from None
            raise
        drawing = None
        if show:
            total = parquet_rows(args.paths) if fmt == "parquet" else None
            drawing = ExportDrawing(sys.stderr, tty=tty, total_rows=total)
        try:
            report = export_dataframe(
                frame, bootstrap=args.bootstrap, topic=args.topic,
                max_failed_rows=args.max_failed_rows, add_message_id_header=args.message_id,
                progress=drawing.update if drawing is not None else None,
                progress_interval=interval, **options,
            )
        except (ExportSchemaError, ExportError) as exc:
            raise UserError(str(exc)) from None
        finally:
            if drawing is not None:
                drawing.close()
    finally:
        if owned:
            spark.stop()
    if args.json_report:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format())
    return 0 if report.ok else 1


def _spark_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return one_line(Exception(text[0] if text else type(exc).__name__))
