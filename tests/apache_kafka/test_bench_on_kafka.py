"""``make bench BROKER=kafka``: the producer benchmark on a 1-node Apache Kafka of its own.

Small runs through the real path (a fresh interpreter per run, the count verified with
Fetch on the broker); the figures are not checked, only that the report is complete and
really came from Kafka (the idempotent client's batches carry a producer id Kafka gave).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from bench import producer_bench  # noqa: E402

N = 3000


@pytest.mark.slow
def test_producer_bench_on_kafka(kafka_unavailable: str | None) -> None:
    if kafka_unavailable:
        pytest.skip(kafka_unavailable)
    lines: list[str] = []
    report = producer_bench.run(n=N, repeats=1, clients=["pipeline-send", "confluent"],
                                broker="kafka", quiet_wait=0, log=lines.append)
    json.dumps(report)
    meta = report["meta"]
    assert meta["broker_kind"] == "kafka"
    assert meta["broker"].startswith("Apache Kafka 4.")
    assert meta["broker_scope"] == "round"  # a fresh Kafka per round (one round here)
    assert len(meta["broker_start_s"]) == 1
    # warmed up before its first measured run (untimed; not in the report)
    assert f"warm-up of the fresh broker: {N:,} messages, ok" in "\n".join(lines)
    for client in ("pipeline-send", "confluent"):
        row = report["results"][client]
        (rec,) = row["runs"]
        assert row["status"] == "ok", (row.get("reason"), rec.get("traceback"))
        assert rec["landed"] == N
        assert rec["idempotent_on_wire"] is True
        assert rec["broker_cpu_s"] is not None  # the Kafka JVM's own CPU was measured
    assert "Apache Kafka" in producer_bench.format_table(report)
