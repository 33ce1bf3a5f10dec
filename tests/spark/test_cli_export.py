"""``python -m pipeline export`` in-process, on the session's Spark (the CLI reuses an
active session instead of starting a JVM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture
def orders_parquet(tmp_path: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "orders.parquet"
    pq.write_table(
        pa.table({
            "order_id": [f"o-{i}" for i in range(300)],
            "customer": [f"c-{i % 7}" for i in range(300)],
            "amount": list(range(300)),
        }),
        path,
    )
    return path


def test_export_parquet_with_key_headers_and_report(
    spark: Any, kafka_bootstrap: str, new_topic: Any, kafka_records: Any,
    orders_parquet: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    topic = new_topic(partitions=3)
    code = main([
        "export", "-b", kafka_bootstrap, "-t", topic, str(orders_parquet),
        "--key", "customer", "--header", "source='cli-test'", "--header", "oid=order_id",
        "--message-id", "--json-report", "-X", "linger=0.001",
    ])
    out, err = capsys.readouterr()
    assert code == 0, err
    # The CLI reused the running session and left it running: it used to take the
    # default session for its own (getActiveSession() is per JVM thread) and stop it.
    assert spark.range(3).count() == 3
    report = json.loads(out)
    assert report["delivered"] == 300
    assert report["failed"] == 0
    assert report["topic"] == topic
    got = kafka_records(kafka_bootstrap, topic, 300)
    assert len(got) == 300
    first = json.loads(got[0].value())
    assert set(first) == {"order_id", "customer", "amount"}
    headers = dict(got[0].headers())
    assert headers["source"] == b"cli-test"
    assert headers["oid"].decode() == first["order_id"]
    assert got[0].key().decode() == first["customer"]


def test_export_csv_text_report(
    spark: Any, kafka_bootstrap: str, new_topic: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = new_topic()
    csv = tmp_path / "in.csv"
    csv.write_text("id,name\n1,a\n2,b\n3,c\n")
    assert main(["export", "-b", kafka_bootstrap, "-t", topic, str(csv), "--value", "name",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "exported 3 of 3 rows" in out
    assert "rows/s" in out
    assert "MB/s" in out


@pytest.mark.parametrize(
    ("argv_tail", "needle"),
    [
        (["-t", "no-such-topic-cli"], "no-such-topic-cli"),
        (["-t", "{topic}", "--value", "nosuchcol"], "nosuchcol"),
    ],
)
def test_export_errors_are_one_line(
    spark: Any, kafka_bootstrap: str, new_topic: Any, orders_parquet: Path,
    capsys: pytest.CaptureFixture[str], argv_tail: list[str], needle: str,
) -> None:
    topic = new_topic()
    argv = ["export", "-b", kafka_bootstrap, str(orders_parquet), "--no-progress"]
    argv += [a.replace("{topic}", topic) for a in argv_tail]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ")
    assert needle in err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1
