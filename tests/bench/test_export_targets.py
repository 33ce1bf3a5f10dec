"""The Spark export bench's arithmetic without Spark or a broker: the summary of the runs
(median, min, max of the verified ones), the ratios of medians with their per-round ratios,
and the targets' verdicts (PASS at the threshold, MISS below, n/a when a side has no
verified run), the exactly-once export's among them."""

from __future__ import annotations

from typing import Any

from pipeline.spark.bench import TARGETS, _ratios, _targets, format_comparison, summarize
from pipeline.spark.bench_writers import WRITERS


def _run(writer: str, rnd: int, rows_per_s: float, *, shape: str = "plain",
         status: str = "ok") -> dict[str, Any]:
    return {"writer": writer, "shape": shape, "round": rnd, "rows_per_s": rows_per_s,
            "status": status, "verify": {"ok": status == "ok"}}


def _report(runs: list[dict[str, Any]], unavailable: dict[str, str] | None = None,
            shapes: tuple[str, ...] = ("plain",)) -> dict[str, Any]:
    results = summarize(runs, shapes, WRITERS, unavailable or {})
    return {"results": results, "ratios": _ratios(results, runs, shapes),
            "targets": _targets(results, runs, shapes), "runs": runs}


def _target(report: dict[str, Any], num: str, den: str) -> dict[str, Any]:
    (found,) = [t for t in report["targets"] if (t["numerator"], t["denominator"]) == (num, den)]
    return found


RUNS = [  # three rounds; medians: pipeline 200, eos 170, spark 180, foreach 50, noop 1000
    *(_run("pipeline", r, x) for r, x in ((1, 100.0), (2, 200.0), (3, 300.0))),
    *(_run("pipeline_eos", r, x) for r, x in ((1, 150.0), (2, 170.0), (3, 190.0))),
    *(_run("spark_kafka", r, x) for r, x in ((1, 200.0), (2, 180.0), (3, 160.0))),
    *(_run("foreach", r, 50.0) for r in (1, 2, 3)),
    *(_run("noop_arrow", r, 1000.0) for r in (1, 2, 3)),
]


def test_the_exactly_once_targets_are_ratios_of_medians_with_per_round_ratios() -> None:
    assert ("pipeline_eos", "pipeline", 0.8) in TARGETS
    assert ("pipeline_eos", "spark_kafka", 1.0) in TARGETS
    report = _report(RUNS)
    row = report["results"]["plain"]["pipeline_eos"]
    assert (row["status"], row["rows_per_s"], row["min"], row["max"]) == ("ok", 170.0, 150.0,
                                                                          190.0)
    vs_ours = _target(report, "pipeline_eos", "pipeline")
    assert (vs_ours["ratio"], vs_ours["verdict"]) == (0.85, "PASS")  # 170 / 200 >= 0.8
    assert vs_ours["rounds"] == [1.5, 0.85, 0.633]  # 150/100, 170/200, 190/300
    vs_spark = _target(report, "pipeline_eos", "spark_kafka")
    assert (vs_spark["ratio"], vs_spark["verdict"]) == (0.944, "MISS")  # 170 / 180 < 1.0
    assert vs_spark["rounds"] == [0.75, 0.944, 1.188]
    # the at-least-once targets are unchanged: 200 / 50, 200 / 180
    assert (_target(report, "pipeline", "foreach")["ratio"],
            _target(report, "pipeline", "spark_kafka")["ratio"]) == (4.0, 1.111)
    assert len(report["targets"]) == len(TARGETS)
    ratios = report["ratios"]["plain"]
    assert ratios["vs_pipeline_eos"]["median"] == 1.176  # ours / exactly once
    assert ratios["pipeline_eos_vs_pipeline"] == {"median": 0.85, "rounds": [1.5, 0.85, 0.633]}
    assert ratios["pipeline_eos_vs_noop_arrow"]["median"] == 0.17


def test_a_target_is_met_at_its_threshold_exactly() -> None:
    runs = [_run("pipeline", 1, 100.0), _run("pipeline_eos", 1, 80.0),
            _run("spark_kafka", 1, 80.0)]
    report = _report(runs)
    assert _target(report, "pipeline_eos", "pipeline")["verdict"] == "PASS"  # 0.8x
    assert _target(report, "pipeline_eos", "spark_kafka")["verdict"] == "PASS"  # 1.0x
    runs[1]["rows_per_s"] = 79.9
    report = _report(runs)
    assert _target(report, "pipeline_eos", "pipeline")["verdict"] == "MISS"
    assert _target(report, "pipeline_eos", "spark_kafka")["verdict"] == "MISS"


def test_an_exactly_once_writer_the_broker_cannot_run_is_n_a_with_its_reason() -> None:
    why = "the broker does not isolate transactions: ... (--broker kafka)"
    runs = [r for r in RUNS if r["writer"] != "pipeline_eos"]
    report = _report(runs, {"pipeline_eos": why})
    assert report["results"]["plain"]["pipeline_eos"] == {
        "label": "pipeline export_dataframe, exactly once", "status": "n/a", "reason": why}
    for den in ("pipeline", "spark_kafka"):
        target = _target(report, "pipeline_eos", den)
        assert (target["verdict"], target["ratio"]) == ("n/a", None)
        assert target["reason"] == "pipeline_eos: n/a"
    assert _target(report, "pipeline", "spark_kafka")["verdict"] == "PASS"
    assert not any(k.startswith("pipeline_eos") or k == "vs_pipeline_eos"
                   for k in report["ratios"]["plain"])


def test_an_exactly_once_run_that_failed_its_read_back_has_no_verdict() -> None:
    runs = [r for r in RUNS if not (r["writer"] == "pipeline_eos" and r["round"] == 2)]
    runs.append(_run("pipeline_eos", 2, 900.0, status="INVALID"))
    report = _report(runs)
    assert report["results"]["plain"]["pipeline_eos"]["status"] == "INVALID"
    target = _target(report, "pipeline_eos", "pipeline")
    assert (target["verdict"], target["reason"]) == ("n/a", "pipeline_eos: INVALID")


def test_the_table_shows_the_exactly_once_column_and_each_target_with_its_rounds() -> None:
    report = _report(RUNS)
    report["meta"] = {"rows": 1000, "spark_partitions": 2, "topic_partitions": 6,
                      "spark_master": "local[2]", "spark_version": "4.x", "rounds": 3,
                      "date": "2026-11-28T01:00:00Z", "loadavg_before": [1.0, 1.0, 1.0],
                      "loadavg_after": [1.0, 1.0, 1.0]}
    table = format_comparison(report).splitlines()
    (eos,) = [ln for ln in table if "exactly once" in ln]
    assert "170" in eos and "1.18x" in eos and "ok" in eos  # ours / it: 200 / 170
    (spark,) = [ln for ln in table if 'format("kafka")' in ln]
    assert "1.11x" in spark and "0.94x" in spark  # ours / it, eos / it
    (line,) = [ln for ln in table if "pipeline_eos >= 0.8x pipeline" in ln]
    assert line.split()[0] == "PASS" and "0.85x (rounds: 1.50, 0.85, 0.63)" in line
    (line,) = [ln for ln in table if "pipeline_eos >= 1x spark_kafka" in ln]
    assert line.split()[0] == "MISS" and "0.94x (rounds: 0.75, 0.94, 1.19)" in line
