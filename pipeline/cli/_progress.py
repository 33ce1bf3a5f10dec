"""Progress of long commands on stderr (``produce``, ``export``, ``bench``): rows and bytes
delivered, their rates, and when the share done is known, the share and the time left.

On a terminal one line is redrawn in place (``\\r``, then erase to the end of the
line) every interval; elsewhere (a log file, a pipe) each report is a plain line of its
own (``progress: ...``), so a log holds the history. The last report is drawn when the
work is done (``final``), and a terminal's line is then ended so that what follows (the
summary, an error) starts on a line of its own.

Each command says how much of its work is done, when it knows (:class:`Snapshot`'s
``share``): ``produce`` from the input's size (:func:`share_of_input`), ``bench`` from
the rows it was asked for, ``export`` from the input's row count (Parquet files) or the
Spark tasks done. Without a share there is no time left, only rows and the rate.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.spark.progress import ExportProgress

__all__ = [
    "ExportDrawing",
    "Progress",
    "Snapshot",
    "add_progress_arguments",
    "input_size",
    "position",
    "progress_settings",
    "share_of_input",
]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one report shows."""

    rows: int  # rows delivered
    bytes: int  # bytes of those rows
    failed: int = 0  # rows that failed
    share: float | None = None  # of the work done, 0..1 (None: not known: no time left)
    tasks: tuple[int, int] | None = None  # Spark tasks (done, total), when they count


def add_progress_arguments(parser: Any, what: str) -> None:
    """``--progress/--no-progress`` and ``--progress-interval`` (alike on every command)."""
    import argparse

    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help=f"report progress on stderr: {what} (default: on a terminal only; elsewhere "
        "a plain line per report)",
    )
    parser.add_argument(
        "--progress-interval", type=float, default=None, metavar="SECONDS",
        help="seconds between progress reports (default: 0.5 on a terminal, 10 elsewhere)",
    )


def progress_settings(show: bool | None, interval: float | None, *, tty: bool,
                      quiet: bool = False) -> tuple[bool, float]:
    """(draw or not, seconds between reports) from ``--progress`` and
    ``--progress-interval``. Raises ``ValueError`` for an interval that is not > 0."""
    if interval is not None and not interval > 0:
        raise ValueError(f"--progress-interval must be a number of seconds > 0, not {interval}")
    drawn = show if show is not None else tty and not quiet
    return drawn, interval or (0.5 if tty else 10.0)


def input_size(streams: list[IO[bytes]]) -> int | None:
    """The bytes left to read in ``streams``, or None when one is not a regular file."""
    total = 0
    for stream in streams:
        try:
            info = os.fstat(stream.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None
            total += info.st_size - stream.tell()
        except (OSError, ValueError, AttributeError):
            return None
    return total


def position(streams: list[IO[bytes]], start: int) -> int:
    """Bytes read so far from ``streams`` (regular files; ``start``: where reading began)."""
    return sum(s.tell() for s in streams) - start


def share_of_input(done: int, read_rows: int, read_bytes: int,
                   total_bytes: int | None) -> float | None:
    """The share of an input of ``total_bytes`` bytes that ``done`` rows are, estimated
    from the ``read_rows`` rows read from its first ``read_bytes`` bytes (rows, not
    bytes, are what is counted delivered). None: the size is not known."""
    if total_bytes is None:
        return None
    if total_bytes == 0 or read_bytes <= 0 or read_rows <= 0:
        return 0.0
    expected = read_rows * total_bytes / read_bytes
    return min(1.0, done / expected) if expected else 0.0


def _size(nbytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:,.0f} {unit}" if unit == "B" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Draws :class:`Snapshot` reports.

    Args:
        out: where to draw (stderr).
        tty: redraw one line (a terminal) or write a line per report.
        clock: seconds, monotonic (trio's clock in a trio command).
        average: rates over the whole run in every report (for counts that move in
            steps, as an export's per finished Spark task); else over the interval
            since the previous report (the final report's are the whole run's).

    Reports may come from another thread than the one that made it (an export's from
    Spark's progress thread): drawing holds a lock.
    """

    def __init__(self, out: IO[str], *, tty: bool, clock: Callable[[], float],
                 average: bool = False) -> None:
        self._out = out
        self._tty = tty
        self._clock = clock
        self._average = average
        self._start = clock()
        # (time, rows delivered, bytes delivered) at the previous report
        self._last = (self._start, 0, 0)
        self._lock = threading.Lock()
        self._open = False  # a terminal's line is drawn and not ended

    def text(self, snap: Snapshot, *, final: bool = False) -> str:
        """One report (without line control): rows and bytes, rates, share, time left."""
        now = self._clock()
        elapsed = now - self._start
        then, rows_before, bytes_before = self._last
        self._last = (now, snap.rows, snap.bytes)
        if final or self._average or now <= then:
            span, rows, nbytes = elapsed, snap.rows, snap.bytes
        else:
            span, rows, nbytes = now - then, snap.rows - rows_before, snap.bytes - bytes_before
        rate, byte_rate = (rows / span, nbytes / span) if span > 0 else (0.0, 0.0)
        parts = [f"{snap.rows:,} rows delivered ({_size(snap.bytes)})"]
        if snap.failed:
            parts.append(f"{snap.failed:,} failed")
        if snap.tasks is not None:
            parts.append(f"{snap.tasks[0]:,}/{snap.tasks[1]:,} tasks")
        parts.append(f"{rate:,.0f} rows/s ({_size(byte_rate)}/s)")
        if snap.share is not None:
            share = min(1.0, max(0.0, snap.share))
            parts.append(f"{share:.0%}")
            if share >= 1.0:
                parts.append("ETA 0:00")
            elif share > 0 and elapsed > 0:
                parts.append(f"ETA {_duration(elapsed * (1 - share) / share)}")
            else:
                parts.append("ETA --:--")
        parts.append(f"{_duration(elapsed)} elapsed")
        return ", ".join(parts)

    def draw(self, snap: Snapshot, *, final: bool = False) -> None:
        with self._lock:
            line = self.text(snap, final=final)
            if self._tty:
                self._out.write(f"\r{line}\x1b[K" + ("\n" if final else ""))
                self._open = not final
            else:
                self._out.write(f"progress: {line}\n")
            self._out.flush()

    def close(self) -> None:
        """End a terminal's line left open (the work ended without a final report: an
        error follows)."""
        with self._lock:
            if self._open:
                self._out.write("\n")
                self._out.flush()
                self._open = False

    async def run(self, interval: float, snapshot: Callable[[], Snapshot],
                  sleep: Callable[[float], Any]) -> None:
        """Draw ``snapshot()`` every ``interval`` seconds, until cancelled."""
        while True:
            self.draw(snapshot())
            await sleep(interval)


class ExportDrawing:
    """Draws ``export_dataframe``'s :class:`~pipeline.spark.progress.ExportProgress`
    reports (its ``progress=`` is :meth:`update`), one drawing per export: begun at its
    first report, ended by its ``final`` one (a next export begins a new one).

    The clock is the export's own (``elapsed``: since its job started), so the rate and
    the time left are the job's. Rows move per finished Spark task: rates over the whole
    run. The share done is of ``total_rows`` when known, else of the tasks.
    ``interval``: draw at most this often (None: every report).
    """

    def __init__(self, out: IO[str], *, tty: bool, total_rows: int | None = None,
                 interval: float | None = None) -> None:
        self._out = out
        self._tty = tty
        self._total_rows = total_rows
        self._interval = interval
        self._elapsed = 0.0
        self._drawn_at = 0.0
        self.progress: Progress | None = None

    def update(self, p: ExportProgress) -> None:
        if self.progress is None:
            self._elapsed = 0.0  # the drawing's clock starts where the job did
            self.progress = Progress(self._out, tty=self._tty, clock=self._clock, average=True)
        elif (not p.final and self._interval is not None
              and p.elapsed - self._drawn_at < self._interval):
            return
        self._elapsed = self._drawn_at = p.elapsed
        if self._total_rows:
            share: float | None = (p.rows + p.failed) / self._total_rows
        else:
            share = p.share
        if p.final and p.tasks_total and p.tasks_done == p.tasks_total:
            share = 1.0  # every task done (an input's row count may be off: its footers')
        tasks = (p.tasks_done, p.tasks_total) if p.tasks_total else None
        self.progress.draw(Snapshot(p.rows, p.bytes, p.failed, share=share, tasks=tasks),
                           final=p.final)
        if p.final:
            self.progress = None

    def close(self) -> None:
        """End a terminal's line left open (the export failed before its final report)."""
        if self.progress is not None:
            self.progress.close()

    def _clock(self) -> float:
        return self._elapsed
