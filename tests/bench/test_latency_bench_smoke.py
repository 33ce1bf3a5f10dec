"""The latency bench (``bench/latency_bench.py``), its statistics, the broker seam and the
charts. Tiny runs through the real path (fresh interpreters, a real broker, the count
checked); the numbers themselves are not checked."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from bench import latency_bench  # noqa: E402
from bench.brokers import open_broker  # noqa: E402


def test_latency_statistics() -> None:
    """Latency is ack - send per message (not ack - schedule), failures (0.0) are counted
    apart, the achieved rate comes from the send times, lateness from the schedule."""
    n = 1000
    scheduled = [i / 1000 for i in range(n)]  # 1,000 msg/s
    sent = [s + (0.002 if i == 500 else 0.0) for i, s in enumerate(scheduled)]
    acked = [s + (i % 100 + 1) / 1000 for i, s in enumerate(sent)]  # 1..100 ms
    acked[3] = 0.0  # failed
    out = latency_bench.summarize_latencies(scheduled, sent, acked)
    assert out["messages"] == n and out["acked"] == n - 1 and out["failed"] == 1
    lat = out["latency_ms"]
    assert lat["p50"] == pytest.approx(50, abs=1) and lat["p99"] == pytest.approx(99, abs=1)
    assert lat["max"] == pytest.approx(100) and lat["min"] == pytest.approx(1)
    assert out["achieved_rate"] == pytest.approx(1000, rel=0.01)
    assert out["schedule_lateness_ms"]["max"] == pytest.approx(2)
    assert out["schedule_lateness_ms"]["p50"] == pytest.approx(0)
    assert len(out["latency_curve_ms"]) == 101
    assert out["latency_curve_ms"] == sorted(out["latency_curve_ms"])


def _check(report: dict[str, Any]) -> None:
    json.dumps(report)
    for client in latency_bench.CLIENTS:
        row = report["results"][client]
        assert row["status"] == "ok", row
        (run,) = row["runs"]
        assert run["landed"] == run["messages"] + 1  # + the warm-up message
        assert run["failed"] == 0
        assert row["achieved_rate"]["median"] > 0
        assert 0 < row["latency_ms"]["p50"]["median"] <= row["latency_ms"]["p99"]["median"]
    assert [t["verdict"] in ("PASS", "MISS") for t in report["targets"]] == [True, True]
    assert report["meta"]["loadavg_before"] and report["meta"]["machine"]
    table = latency_bench.format_table(report)
    assert "targets:" in table and "confluent-kafka" in table


@pytest.mark.slow
@pytest.mark.integration
def test_latency_bench_runs_every_client(tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka")
    lines: list[str] = []
    report = latency_bench.run(rate=2000, seconds=0.5, rounds=1, log=lines.append)
    _check(report)
    assert len(lines) == len(latency_bench.CLIENTS) == 3
    pytest.importorskip("matplotlib")
    from bench.charts import latency_chart

    png = latency_chart(report, tmp_path / "latency.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.kafka
def test_latency_bench_on_apache_kafka() -> None:
    """--broker kafka: a 1-node KafkaCluster from the same seam (bench/brokers.py)."""
    pytest.importorskip("confluent_kafka")
    report = latency_bench.run(rate=1000, seconds=0.5, rounds=1, broker="kafka",
                               log=lambda _: None)
    _check(report)
    assert report["meta"]["broker"].startswith("Apache Kafka")


def test_unknown_broker_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown broker 'redpanda': choose from tansu, kafka"):
        with open_broker("redpanda"):
            pass


def test_charts_from_reports(tmp_path: Path) -> None:
    """Every chart draws from a report of its bench's shape; a missing report is skipped."""
    pytest.importorskip("matplotlib")
    from bench.charts import draw_all

    meta = {"date": "2026-01-01T00:00:00Z", "machine": "2 CPUs", "loadavg_before": [1.0]}
    producer = {
        "meta": {**meta, "n": 1000, "value_size": 100, "repeats": 3, "broker": "tansu"},
        "results": {
            "pipeline-send": {"label": "pipeline send()", "status": "ok", "msgs_per_s": 2e5,
                              "runs_msgs_per_s": [1.5e5, 2e5, 2.5e5]},
            "confluent": {"label": "confluent", "status": "ok", "msgs_per_s": 4e5,
                          "runs_msgs_per_s": [3e5, 4e5, 5e5]},
            "aiokafka": {"label": "aiokafka", "status": "failed", "reason": "x"},
        },
        "ratios": {"pipeline-send": {"vs_confluent": 0.5}},
    }
    (tmp_path / "producer.json").write_text(json.dumps(producer))
    written = draw_all(tmp_path, tmp_path / "out")
    assert [p.name for p in written] == ["producer.png"]
    assert written[0].read_bytes()[:4] == b"\x89PNG"
