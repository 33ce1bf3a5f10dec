"""Export throughput: ``export_dataframe`` beside the other ways to write a DataFrame to Kafka.

Five writers (:mod:`pipeline.spark.bench_writers`): ours at least once and exactly once,
a hand-written ``foreachPartition`` + confluent-kafka exporter, Spark's own
``format("kafka")`` sink, and a ``mapInArrow`` no-op (the ceiling). For each row shape
they run on the same cached DataFrame, in the same Spark session, against the same broker,
each into its own fresh topic, in rounds (the writers' order rotates each round, so drift
hits all alike); what each wrote is read back with confluent-kafka (``read_committed``)
and a run that lost, duplicated or changed a row is INVALID. Reported per (shape,
writer): the median, min and max rows/s of the verified runs; ratios are of medians, with
the per-round ratios beside them. The exactly-once writer is ``n/a`` on a broker that
does not isolate transactions (:func:`~pipeline.spark.bench_writers.transactions_reason`
asks it first), as Spark's sink is in a session without its jars.

Used by ``bench/export_bench.py`` (``make bench``) and ``python -m pipeline bench --spark``.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pipeline.cluster.security import redact_options
from pipeline.spark.bench_writers import (
    SHAPES,
    TRANSACTIONAL,
    WRITERS,
    bench_frame,
    read_back,
    sample_rows,
    sink_jars_reason,
    transactions_reason,
    write,
)

if TYPE_CHECKING:
    from pipeline.spark.progress import ExportProgress

#: ``create_topics({name: partitions})``: how the caller makes topics on its broker
#: (the CLI and ``bench/export_bench.py`` pass the testing kit's; the spark layer does
#: not import the testing kit).
CreateTopics = Callable[[Mapping[str, int]], object]
Log = Callable[[str], None]

__all__ = ["LABELS", "TARGETS", "CreateTopics", "compare_export", "format_comparison",
           "summarize"]

LABELS = {
    "pipeline": "pipeline export_dataframe",
    "pipeline_eos": "pipeline export_dataframe, exactly once",
    "foreach": "foreachPartition + confluent-kafka",
    "spark_kafka": 'Spark format("kafka") sink',
    "noop_arrow": "mapInArrow no-op (ceiling)",
}
#: (numerator, denominator, threshold): the export's targets (docs/benchmarks.md): >= 3x the
#: hand-written exporter, >= 1x Spark's own sink; exactly once >= 0.8x our at-least-once
#: export (what the transactions may cost) and still >= 1x Spark's own (at-least-once) sink
TARGETS = (("pipeline", "foreach", 3.0), ("pipeline", "spark_kafka", 1.0),
           ("pipeline_eos", "pipeline", 0.8), ("pipeline_eos", "spark_kafka", 1.0))
#: the writers each ratio of the report is taken for, over every other writer:
#: ``ratios[shape]["vs_X"]`` is ours (at least once) / X, ``["pipeline_eos_vs_X"]`` the
#: exactly-once export / X
_RATIO_NUMERATORS = {"pipeline": "vs_", "pipeline_eos": "pipeline_eos_vs_"}


def _quiet(_: str) -> None:
    pass


def compare_export(
    spark: Any,
    bootstrap: str,
    *,
    create_topics: CreateTopics,
    rows: int = 500_000,
    rounds: int = 1,
    shapes: Sequence[str] = SHAPES,
    writers: Sequence[str] = WRITERS,
    partitions: int = 2,
    topic_partitions: int = 6,
    warmup_rows: int = 2_000,
    log: Log = _quiet,
    progress: Callable[[ExportProgress], None] | None = None,
    **producer_options: Any,
) -> dict[str, Any]:
    """Run every writer ``rounds`` times per shape; return the report (JSON-ready).

    First each writer runs once, untimed, on ``warmup_rows`` rows (0: no warm-up).
    ``progress``: ``export_dataframe``'s progress callback for the measured ``pipeline``
    runs (one report per interval and a ``final`` one per run; the other writers have
    no such reports).
    ``producer_options`` go to the ``pipeline`` and ``pipeline_eos`` writers
    (``ProducerConfig`` fields). Spark's sink is reported ``n/a`` when the session lacks
    its jars; the exactly-once writer when the broker does not isolate transactions
    (asked first, on a topic of its own: :func:`transactions_reason`).
    """
    unknown = [w for w in writers if w not in WRITERS] + [s for s in shapes if s not in SHAPES]
    if unknown:
        raise ValueError(f"unknown writer/shape {unknown}: writers {WRITERS}, shapes {SHAPES}")
    unavailable: dict[str, str] = {}
    reason = sink_jars_reason(spark)
    if reason and "spark_kafka" in writers:
        unavailable["spark_kafka"] = reason
    tag = uuid.uuid4().hex[:6]
    if TRANSACTIONAL.intersection(writers):
        probe = f"bench-txn-probe-{tag}"
        create_topics({probe: 1})
        reason = transactions_reason(bootstrap, probe)
        if reason:
            unavailable.update({w: reason for w in writers if w in TRANSACTIONAL})
            log(f"[export] exactly-once writer left out: {reason}")
    active = [w for w in writers if w not in unavailable]
    started = time.time()
    load_before = os.getloadavg()
    warmup = _warm_up(spark, bootstrap, create_topics, active, shapes, tag, topic_partitions,
                      partitions, producer_options, warmup_rows) if warmup_rows else {}
    log("[export] warm-up (untimed; Python workers, imports, class loading, Spark's producer "
        "cache): " + ", ".join(f"{k} {v:.1f} s" for k, v in warmup.items()))
    runs: list[dict[str, Any]] = []
    for shape in shapes:
        t0 = time.perf_counter()
        df = bench_frame(spark, shape, rows, partitions=partitions)
        sample = sample_rows(df, rows)
        log(f"[export] {shape}: {rows:,} rows cached in {time.perf_counter() - t0:.1f} s, "
            f"{len(sample)} sampled for the content check")
        try:
            for rnd in range(rounds):
                order = active[rnd % len(active):] + active[:rnd % len(active)]
                for writer in order:
                    run = _run_once(writer, df, bootstrap, create_topics, shape=shape,
                                    rows=rows, topic=f"bench-{writer}-{shape}-{tag}-{rnd}",
                                    topic_partitions=topic_partitions, sample=sample,
                                    producer_options=producer_options, progress=progress)
                    run["round"] = rnd + 1
                    runs.append(run)
                    log(_run_line(run, rounds))
        finally:
            df.unpersist()
    results = summarize(runs, shapes, writers, unavailable)
    return {
        "meta": {
            "rows": rows, "rounds": rounds, "shapes": list(shapes), "writers": list(writers),
            "spark_partitions": partitions, "topic_partitions": topic_partitions,
            "spark_master": spark.sparkContext.master, "spark_version": spark.version,
            "acks": "all", "idempotent": True, "linger_ms": 5, "statistic": "median",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": round(time.time() - started, 1),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "producer_options": {k: repr(v) for k, v in redact_options(producer_options).items()},
            "warmup_seconds": warmup,
        },
        "results": results,
        "ratios": _ratios(results, runs, shapes),
        "targets": _targets(results, runs, shapes),
        "runs": runs,
    }


def _warm_up(spark: Any, bootstrap: str, create_topics: CreateTopics, writers: list[str],
             shapes: Sequence[str], tag: str, topic_partitions: int, partitions: int,
             producer_options: dict[str, Any], rows: int) -> dict[str, float]:
    """One small untimed run per writer, so that no measured run pays for what only the
    first one would (starting Python workers, importing the package, loading the
    connector's classes, creating Spark's cached producer)."""
    shape = "keyed_headers" if "keyed_headers" in shapes else shapes[0]
    df = bench_frame(spark, shape, rows, partitions=partitions)
    took: dict[str, float] = {}
    try:
        for writer in writers:
            topic = f"bench-warmup-{writer}-{tag}"
            if writer != "noop_arrow":
                create_topics({topic: topic_partitions})
            options = producer_options if writer in _RATIO_NUMERATORS else None
            took[writer] = round(write(writer, df, bootstrap, topic,
                                       producer_options=options)["seconds"], 2)
    finally:
        df.unpersist()
    return took


def _run_once(writer: str, df: Any, bootstrap: str, create_topics: CreateTopics, *,
              shape: str, rows: int, topic: str, topic_partitions: int,
              sample: dict[bytes, tuple[Any, ...]], producer_options: dict[str, Any],
              progress: Callable[[ExportProgress], None] | None) -> dict[str, Any]:
    run: dict[str, Any] = {"writer": writer, "shape": shape, "rows": rows, "topic": topic,
                           "loadavg_1m_before": os.getloadavg()[0]}
    if writer != "noop_arrow":
        create_topics({topic: topic_partitions})
    try:
        if writer == "pipeline":
            measured = write(writer, df, bootstrap, topic, producer_options=producer_options,
                             progress=progress)
        elif writer == "pipeline_eos":
            measured = write(writer, df, bootstrap, topic, producer_options=producer_options)
        else:
            measured = write(writer, df, bootstrap, topic)
    except Exception as exc:
        run.update(status="failed", error=f"{type(exc).__name__}: {str(exc)[:2000]}")
        return run
    run.update(measured)
    run["rows_per_s"] = rows / measured["seconds"]
    run["loadavg_1m_after"] = os.getloadavg()[0]
    if writer == "noop_arrow":
        ok = measured.get("rows_seen") == rows
        run["verify"] = {"ok": ok, "rows_seen": measured.get("rows_seen")}
    else:
        run["verify"] = read_back(bootstrap, topic, rows=rows, partitions=topic_partitions,
                                  sample=sample, keyed=shape != "plain",
                                  isolation="read_committed")
    run["status"] = "ok" if run["verify"]["ok"] else "INVALID"
    return run


def _run_line(run: dict[str, Any], rounds: int) -> str:
    head = f"[export] round {run.get('round', '?')}/{rounds} {run['shape']:<13} {run['writer']:<11}"
    if run["status"] == "failed":
        return f"{head} FAILED: {run['error'][:300]}"
    v = run["verify"]
    check = (f"{v.get('rows_seen', 0):,} rows seen" if "rows_seen" in v else
             f"read back {v['records']:,} (dupes {v['duplicates']}, missing {v['missing']}, "
             f"sample {v['sample_checked'] - len(v['sample_bad'])}/{v['sample_checked']} exact)")
    return (f"{head} {run['rows_per_s']:>11,.0f} rows/s  {run['seconds']:6.2f} s  "
            f"load {run['loadavg_1m_before']:.1f}  {check}  {run['status']}")


def summarize(runs: list[dict[str, Any]], shapes: Sequence[str], writers: Sequence[str],
              unavailable: Mapping[str, str]) -> dict[str, dict[str, dict[str, Any]]]:
    """{shape: {writer: row}}: median/min/max rows/s of the verified runs and a status."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for shape in shapes:
        out[shape] = {}
        for writer in writers:
            row: dict[str, Any] = {"label": LABELS[writer]}
            if writer in unavailable:
                row.update(status="n/a", reason=unavailable[writer])
                out[shape][writer] = row
                continue
            mine = [r for r in runs if r["shape"] == shape and r["writer"] == writer]
            good = [r["rows_per_s"] for r in mine if r["status"] == "ok"]
            bad = [r for r in mine if r["status"] != "ok"]
            if good:
                row.update(rows_per_s=statistics.median(good), min=min(good), max=max(good),
                           runs_rows_per_s=good)
            if not mine:
                row.update(status="not run")
            elif bad:
                first = bad[0]
                why = first.get("error") or f"read-back check failed: {first.get('verify')}"
                row.update(status="failed" if not good else "INVALID", reason=why[:2000])
            else:
                row["status"] = "ok"
            out[shape][writer] = row
    return out


def _rate(results: Mapping[str, Mapping[str, Any]], shape: str, writer: str) -> float | None:
    row = results.get(shape, {}).get(writer)
    if row is None or row.get("status") != "ok":
        return None
    value: float = row["rows_per_s"]
    return value


def _ratio(results: Mapping[str, Mapping[str, Any]], runs: Sequence[Mapping[str, Any]],
           shape: str, num: str, den: str) -> dict[str, Any] | None:
    """``num`` / ``den`` for ``shape``: the ratio of their medians, and round by round
    (rounds where both verified); None unless both have verified runs."""
    a, b = _rate(results, shape, num), _rate(results, shape, den)
    if a is None or b is None:
        return None
    by_round: dict[int, float] = {}
    for r in runs:
        if r["shape"] == shape and r["writer"] == num and r["status"] == "ok":
            peer = next((p for p in runs if p["shape"] == shape and p["writer"] == den
                         and p["round"] == r["round"] and p["status"] == "ok"), None)
            if peer is not None:
                by_round[r["round"]] = round(r["rows_per_s"] / peer["rows_per_s"], 3)
    return {"median": round(a / b, 3), "rounds": list(by_round.values())}


def _ratios(results: dict[str, dict[str, dict[str, Any]]], runs: list[dict[str, Any]],
            shapes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per shape: ours (``vs_X``) and the exactly-once export (``pipeline_eos_vs_X``) over
    each other writer, of the medians and round by round."""
    out: dict[str, dict[str, Any]] = {}
    for shape in shapes:
        ratios: dict[str, Any] = {}
        for num, prefix in _RATIO_NUMERATORS.items():
            for other in WRITERS:
                if other != num:
                    got = _ratio(results, runs, shape, num, other)
                    if got is not None:
                        ratios[f"{prefix}{other}"] = got
        if ratios:
            out[shape] = ratios
    return out


def _targets(results: dict[str, dict[str, dict[str, Any]]], runs: Sequence[Mapping[str, Any]],
             shapes: Sequence[str]) -> list[dict[str, Any]]:
    """Each target of :data:`TARGETS` per shape: PASS when the ratio of the medians reaches
    the threshold, MISS below it, n/a (with the reason) when a side has no verified run;
    the per-round ratios beside it."""
    targets = []
    for shape in shapes:
        for num, den, threshold in TARGETS:
            got = _ratio(results, runs, shape, num, den)
            entry: dict[str, Any] = {
                "target": f"{shape}: {num} >= {threshold:g}x {den}", "shape": shape,
                "numerator": num, "denominator": den, "threshold": threshold}
            if got is None:
                missing = [w for w in (num, den) if _rate(results, shape, w) is None]
                entry.update(ratio=None, rounds=[], verdict="n/a", reason="; ".join(
                    f"{w}: {results.get(shape, {}).get(w, {}).get('status', 'not run')}"
                    for w in missing))
            else:
                entry.update(ratio=got["median"], rounds=got["rounds"],
                             verdict="PASS" if got["median"] >= threshold else "MISS")
            targets.append(entry)
    return targets


def format_comparison(report: dict[str, Any]) -> str:
    """The report as a table: rows/s per (shape, writer), ours (at least once) / it and the
    exactly-once export / it, then each target's verdict with its per-round ratios."""
    meta = report["meta"]
    lines = [
        f"Spark export: {meta['rows']:,} rows per run, {meta['spark_partitions']} Spark partitions "
        f"-> {meta['topic_partitions']} topic partitions, {meta['spark_master']}, Spark "
        f"{meta['spark_version']}, acks=all, idempotent, linger 5 ms; median [min - max] of "
        f"{meta['rounds']} round(s), every run read back with confluent-kafka "
        f"({meta['date']}, load average {meta['loadavg_before'][0]:.1f} -> "
        f"{meta['loadavg_after'][0]:.1f})",
        f"{'shape':<14} {'writer':<40} {'rows/s':>10} {'min':>10} {'max':>10}  "
        f"{'ours / it':>9}  {'eos / it':>8}  status",
    ]
    for shape, rows in report["results"].items():
        ratios = report["ratios"].get(shape, {})
        for writer, row in rows.items():
            cells = []
            for key, width in ((f"vs_{writer}", 9), (f"pipeline_eos_vs_{writer}", 8)):
                ratio = ratios.get(key, {}).get("median")
                cells.append(format("" if ratio is None else f"{ratio:.2f}x", f">{width}"))
            if row.get("rows_per_s") is None:
                lines.append(f"{shape:<14} {row['label']:<40} {row['status']}: "
                             f"{row.get('reason', '')[:200]}")
                continue
            status = row["status"] if row["status"] == "ok" else (
                f"{row['status']}: {row.get('reason', '')[:200]}")
            lines.append(
                f"{shape:<14} {row['label']:<40} {row['rows_per_s']:>10,.0f} {row['min']:>10,.0f} "
                f"{row['max']:>10,.0f}  {cells[0]}  {cells[1]}  {status}")
    lines.append("targets:")
    for t in report["targets"]:
        got = "" if t["ratio"] is None else f"{t['ratio']:.2f}x"
        per = (" (rounds: " + ", ".join(f"{x:.2f}" for x in t["rounds"]) + ")"
               if t.get("rounds") else "")
        why = f" ({t['reason'][:300]})" if t.get("reason") else ""
        lines.append(f"  {t['verdict']:<4} {t['target']:<50} {got}{per}{why}")
    return "\n".join(lines)
