"""bench/txn_bench.py without Kafka: its table (medians per version, size and client, the
ratio) and its refusal to run on the embedded broker."""

from __future__ import annotations

from typing import Any

from bench.txn_bench import _table, format_table, run


def _run(client: str, version: int, size: int, msgs_per_s: float) -> dict[str, Any]:
    return {"client": client, "transaction_version": version, "size": size,
            "msgs_per_s": msgs_per_s, "txns_per_s": msgs_per_s / size, "cpu_s": 0.5}


def test_the_table_has_a_row_per_version_and_size_with_medians_and_the_ratio() -> None:
    runs = [_run("pipeline", 2, 100, x) for x in (1000.0, 3000.0, 2000.0)]
    runs += [_run("confluent", 2, 100, 4000.0), _run("pipeline", 1, 100, 500.0)]
    table = _table(runs).splitlines()
    assert len(table) == 4  # header, rule, v2 and v1 rows
    assert table[2].startswith("| 2 | 100 | 2,000 | 4,000 | 0.50x | 20.0 | 40.0 |")
    assert table[3].startswith("| 1 | 100 | 500 | - | - | 5.0 | - |")


def test_it_runs_on_apache_kafka_only() -> None:
    report = run(quick=True, broker="tansu")
    assert "Apache Kafka only" in report["skipped"]
    assert format_table(report) == report["skipped"]
