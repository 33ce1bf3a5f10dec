"""``python -m pipeline export`` in-process, on the session's Spark (the CLI reuses an
active session instead of starting a JVM)."""

from __future__ import annotations

import io
import json
import sys
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


def test_export_progress_into_a_log(
    spark: Any, kafka_bootstrap: str, new_topic: Any, orders_parquet: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Not a terminal: ``--progress`` writes a plain line per report; the share is of the
    Parquet input's 300 rows (its footer says), and the last line says all of them."""
    from pipeline.cli.export import parquet_rows

    assert parquet_rows([str(orders_parquet)]) == 300
    assert parquet_rows([str(orders_parquet.parent)]) == 300  # a directory of them
    assert parquet_rows(["s3a://bucket/orders"]) is None
    topic = new_topic(partitions=2)
    assert main(["export", "-b", kafka_bootstrap, "-t", topic, str(orders_parquet),
                 "--partitions", "3", "--progress", "--progress-interval", "0.05",
                 "-X", "linger=0.001"]) == 0
    out, err = capsys.readouterr()
    assert "exported 300 of 300 rows" in out and "progress: " not in out
    reports = err.splitlines()
    assert reports and all(line.startswith("progress: ") for line in reports), err
    assert "\r" not in err and "\x1b" not in err
    assert reports[-1].startswith("progress: 300 rows delivered (")
    assert ", 3/3 tasks, " in reports[-1] and ", 100%, ETA 0:00, " in reports[-1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_export_progress_on_a_terminal(
    spark: Any, kafka_bootstrap: str, new_topic: Any, orders_parquet: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a terminal (the default): one line redrawn in place, ended after the last
    report, so the report printed next starts on a line of its own."""
    screen = _Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    topic = new_topic()
    assert main(["export", "-b", kafka_bootstrap, "-t", topic, str(orders_parquet),
                 "--partitions", "2", "--progress-interval", "0.05"]) == 0
    drawn = screen.getvalue()
    assert drawn.startswith("\r") and drawn.endswith("\x1b[K\n"), drawn
    assert drawn.count("\n") == 1  # one line, redrawn
    last = drawn.rsplit("\r", 1)[1]
    assert last.startswith("300 rows delivered (") and ", 2/2 tasks, " in last
    assert ", 100%, ETA 0:00, " in last
    assert "exported 300 of 300 rows" in capsys.readouterr().out
