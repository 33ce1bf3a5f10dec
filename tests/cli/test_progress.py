"""``produce``'s progress: the report's text on a fixed clock, the input's size, and the
command on a real terminal (a pseudo-terminal: one line redrawn in place, as rows come
typed or from a file) and into a pipe (a plain line per report, and nothing unless asked)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli._progress import (
    ExportDrawing,
    Progress,
    Snapshot,
    input_size,
    progress_settings,
    share_of_input,
)
from tests.cli.test_pty import ENV, ROOT, Terminal


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_report_rows_rate_share_and_time_left() -> None:
    clock = Clock()
    out = io.StringIO()
    progress = Progress(out, tty=False, clock=clock)
    clock.now += 2.0
    # 400 rows read from 200 of 1,000 bytes: 2,000 rows expected; 500 delivered in 2 s
    share = share_of_input(500, 400, 200, 1000)
    assert share == 0.25
    assert progress.text(Snapshot(500, 50_000, share=share)) == (
        "500 rows delivered (50.0 kB), 250 rows/s (25.0 kB/s), 25%, ETA 0:06, 0:02 elapsed")
    clock.now += 1.0  # the rates are the last interval's
    share = share_of_input(1510, 2000, 1000, 1000)
    assert progress.text(Snapshot(1500, 2_550_000, 10, share=share)) == (
        "1,500 rows delivered (2.5 MB), 10 failed, 1,000 rows/s (2.5 MB/s), 76%, ETA 0:01, "
        "0:03 elapsed")
    clock.now += 3597.0
    progress.draw(Snapshot(2000, 3_600_000, share=1.0), final=True)  # the whole run's rates
    assert out.getvalue() == ("progress: 2,000 rows delivered (3.6 MB), 1 rows/s (1.0 kB/s), "
                              "100%, ETA 0:00, 1:00:00 elapsed\n")


def test_without_a_size_no_share_and_on_a_terminal_one_line() -> None:
    clock = Clock()
    out = io.StringIO()
    progress = Progress(out, tty=True, clock=clock)
    assert share_of_input(0, 0, 0, None) is None
    assert progress.text(Snapshot(0, 0)) == \
        "0 rows delivered (0 B), 0 rows/s (0 B/s), 0:00 elapsed"
    clock.now += 1.0
    progress.draw(Snapshot(7, 700))
    progress.close()  # ends the line left open (an error follows)
    progress.close()  # once
    progress.draw(Snapshot(9, 900), final=True)
    progress.close()  # the final report ended it
    assert out.getvalue() == (
        "\r7 rows delivered (700 B), 7 rows/s (700 B/s), 0:01 elapsed\x1b[K\n"
        "\r9 rows delivered (900 B), 9 rows/s (900 B/s), 0:01 elapsed\x1b[K\n")
    nothing_yet = Progress(out, tty=True, clock=clock)
    share = share_of_input(0, 0, 0, 50)
    assert nothing_yet.text(Snapshot(0, 0, share=share)).endswith("0%, ETA --:--, 0:00 elapsed")


def test_an_export_shows_its_tasks_and_rates_over_the_whole_run() -> None:
    """Rows that move in steps (an export's, per finished Spark task): ``average`` rates,
    or a report between two steps would say 0 rows/s."""
    clock = Clock()
    out = io.StringIO()
    progress = Progress(out, tty=False, clock=clock, average=True)
    clock.now += 4.0
    progress.draw(Snapshot(3_000, 72_000, tasks=(3, 4), share=0.75))
    clock.now += 1.0  # no task finished meanwhile
    progress.draw(Snapshot(3_000, 72_000, tasks=(3, 4), share=0.75))
    assert out.getvalue().splitlines() == [
        "progress: 3,000 rows delivered (72.0 kB), 3/4 tasks, 750 rows/s (18.0 kB/s), 75%, "
        "ETA 0:01, 0:04 elapsed",
        "progress: 3,000 rows delivered (72.0 kB), 3/4 tasks, 600 rows/s (14.4 kB/s), 75%, "
        "ETA 0:02, 0:05 elapsed",
    ]


def test_the_progress_options() -> None:
    assert progress_settings(None, None, tty=True) == (True, 0.5)
    assert progress_settings(None, None, tty=True, quiet=True) == (False, 0.5)
    assert progress_settings(None, None, tty=False) == (False, 10.0)
    assert progress_settings(True, 2.0, tty=False) == (True, 2.0)
    assert progress_settings(False, None, tty=True) == (False, 0.5)
    with pytest.raises(ValueError, match="--progress-interval must be a number of seconds > 0"):
        progress_settings(True, 0.0, tty=True)


def test_the_input_size_is_known_for_regular_files_only(tmp_path: Path) -> None:
    path = tmp_path / "in"
    path.write_bytes(b"a\nbb\n")
    with open(path, "rb") as f1, open(path, "rb") as f2:
        f2.read(2)
        assert input_size([f1, f2]) == 5 + 3
        r, w = os.pipe()
        with os.fdopen(r, "rb") as pipe:
            os.close(w)
            assert input_size([f1, pipe]) is None


@pytest.mark.integration
def test_on_a_terminal_a_file_shows_its_share_and_time_left(
        kafka_bootstrap: str, new_topic: Any, tmp_path: Path) -> None:
    topic = new_topic()
    path = tmp_path / "rows.txt"
    path.write_bytes(b"".join(b"row %d\n" % i for i in range(20000)))
    term = Terminal(["-m", "pipeline", "produce", "-b", kafka_bootstrap, "-t", topic,
                     "--progress-interval", "0.05", str(path)])
    try:
        term.wait_for(b"produced 20000 message(s)")
        assert term.exit_status() == 0
    finally:
        term.kill()
    screen = term.screen
    assert b"\r0 rows delivered" in screen  # the first report, before anything is sent
    # the last report ends its line before the summary
    assert b"\r20,000 rows delivered (" in screen
    assert b", 100%, ETA 0:00, " in screen
    assert screen.index(b"100%, ETA 0:00") < screen.index(b"\x1b[K\r\nproduced 20000")
    assert b"Traceback" not in screen


@pytest.mark.integration
def test_on_a_terminal_typed_rows_are_counted_as_they_come(
        kafka_bootstrap: str, new_topic: Any) -> None:
    topic = new_topic()
    term = Terminal(["-m", "pipeline", "produce", "-b", kafka_bootstrap, "-t", topic,
                     "--progress-interval", "0.1"])
    try:
        term.wait_for(b"\r0 rows delivered")
        term.type(b"one\n")
        term.wait_for(b"\r1 rows delivered")  # redrawn while the command still reads
        term.type(b"two\n")
        term.wait_for(b"\r2 rows delivered")
        term.type(b"\x04")  # Ctrl-D: the end of the input
        assert term.exit_status() == 0
    finally:
        term.kill()
    assert b"produced 2 message(s)" in term.screen
    assert b"ETA" not in term.screen  # a terminal's input has no size


@pytest.mark.integration
@pytest.mark.parametrize("asked", [True, False])
def test_into_a_pipe_plain_lines_only_when_asked(
        kafka_bootstrap: str, new_topic: Any, tmp_path: Path, asked: bool) -> None:
    topic = new_topic()
    path = tmp_path / "rows.txt"
    path.write_bytes(b"".join(b"row %d\n" % i for i in range(1000)))
    argv = [sys.executable, "-m", "pipeline", "produce", "-b", kafka_bootstrap, "-t", topic,
            *(["--progress", "--progress-interval", "0.05"] if asked else [])]
    with open(path, "rb") as stdin:  # stdin redirected from a file: its size is known
        proc = subprocess.run(argv, stdin=stdin, capture_output=True, cwd=ROOT, env=ENV,
                              timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.decode().splitlines()
    assert lines[-1] == f"produced 1000 message(s) to {topic}"
    if not asked:
        assert lines == [lines[-1]]
        return
    assert "\r" not in proc.stderr.decode() and "\x1b" not in proc.stderr.decode()
    reports = lines[:-1]
    assert reports and all(line.startswith("progress: ") for line in reports)
    assert reports[0].startswith("progress: 0 rows delivered (0 B), 0 rows/s (0 B/s), ")
    assert reports[-1].startswith("progress: 1,000 rows delivered (")
    assert ", 100%, ETA 0:00, " in reports[-1]


@pytest.mark.integration
def test_bench_on_a_terminal_redraws_its_line_and_ends_it(kafka_bootstrap: str) -> None:
    term = Terminal(["-m", "pipeline", "bench", "-b", kafka_bootstrap, "-n", "200000",
                     "--chunk", "5000", "--progress-interval", "0.02"])
    try:
        term.wait_for(b"produced 200,000 x 100 B messages", timeout=120)
        assert term.exit_status() == 0
    finally:
        term.kill()
    screen = term.screen
    assert b"\r0 rows delivered (0 B), 0 rows/s (0 B/s), 0%, ETA --:--, " in screen
    assert b"\r200,000 rows delivered (" in screen
    # the last report: all of --rows, then the line is ended before the summary
    assert screen.index(b", 100%, ETA 0:00, ") < screen.index(
        b"\x1b[K\r\nproduced 200,000 x 100 B")
    assert b"progress: " not in screen and b"Traceback" not in screen


@pytest.mark.integration
@pytest.mark.parametrize("asked", [True, False])
def test_bench_json_on_stdout_progress_on_stderr_when_asked(
        kafka_bootstrap: str, asked: bool) -> None:
    argv = [sys.executable, "-m", "pipeline", "bench", "-b", kafka_bootstrap, "-n", "20000",
            "--json", *(["--progress", "--progress-interval", "0.02"] if asked else [])]
    proc = subprocess.run(argv, capture_output=True, cwd=ROOT, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout holds the JSON and nothing else
    assert result["delivered"] == 20000
    err = proc.stderr.decode()
    if not asked:
        assert err == ""
        return
    reports = err.splitlines()
    assert reports and all(line.startswith("progress: ") for line in reports), err
    assert "\r" not in err and "\x1b" not in err
    assert reports[-1].startswith("progress: 20,000 rows delivered (")
    assert ", 100%, ETA 0:00, " in reports[-1]


def test_exports_drawn_each_on_their_own_clock() -> None:
    """``export``'s and ``bench --spark``'s drawing of ``export_dataframe`` reports: each
    export from its first report to its final one, at most every interval in between,
    with the job's own elapsed time; the next export starts a new drawing."""
    from pipeline.spark import ExportProgress

    out = io.StringIO()
    drawing = ExportDrawing(out, tty=False, total_rows=2_000, interval=1.0)
    for _ in range(2):
        drawing.update(ExportProgress(0, 2, 0, 0, 0, 0.5))
        drawing.update(ExportProgress(1, 2, 1_000, 10_000, 0, 1.0))  # within the interval
        drawing.update(ExportProgress(2, 2, 2_000, 20_000, 0, 2.0, final=True))
    lines = out.getvalue().splitlines()
    assert lines == [
        "progress: 0 rows delivered (0 B), 0/2 tasks, 0 rows/s (0 B/s), 0%, ETA --:--, "
        "0:00 elapsed",
        "progress: 2,000 rows delivered (20.0 kB), 2/2 tasks, 1,000 rows/s (10.0 kB/s), "
        "100%, ETA 0:00, 0:02 elapsed",
    ] * 2
    # No row count: the share of the tasks; on a terminal, a failed export's line ended.
    screen = io.StringIO()
    tasks = ExportDrawing(screen, tty=True)
    tasks.update(ExportProgress(1, 4, 1_000, 10_000, 3, 4.0))
    tasks.close()
    assert screen.getvalue() == (
        "\r1,000 rows delivered (10.0 kB), 3 failed, 1/4 tasks, 250 rows/s (2.5 kB/s), 25%, "
        "ETA 0:12, 0:04 elapsed\x1b[K\n")
