"""``produce``'s progress on stderr: rows and bytes delivered, their rates, and with a
known input size the share done and the time left.

On a terminal one line is redrawn in place (``\\r``, then erase to the end of the
line) every ``interval``; elsewhere (a log file, a pipe) each report is a plain line of
its own, so a log holds the history. The last report is drawn when the input is all
delivered, and a terminal's line is then ended so the summary that follows starts on a
line of its own.

The share done needs the input's size: it is known when every input is a regular file
(files given as arguments, or stdin redirected from a file). Rows, not bytes, are
what the report counts, so the expected total is estimated from the rows read so far
and the share of the input's bytes they came from; with a pipe or a terminal as input
there is no share and no time left, only rows and the rate.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import IO, Any

__all__ = ["Progress", "input_size", "position"]


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
    """Draws reports of ``(rows delivered, bytes delivered, rows failed, rows read,
    bytes read)`` (bytes delivered: the producer's ``delivered_bytes``; bytes read: of
    the input, to estimate the rows expected).

    Args:
        out: where to draw (stderr).
        tty: redraw one line (a terminal) or write a line per report.
        total_bytes: the input's size (None: unknown).
        clock: seconds, monotonic (trio's clock in the CLI).
    """

    def __init__(self, out: IO[str], *, tty: bool, total_bytes: int | None,
                 clock: Callable[[], float]) -> None:
        self._out = out
        self._tty = tty
        self._total = total_bytes
        self._clock = clock
        self._start = clock()
        # (time, rows delivered, bytes delivered) at the previous report
        self._last = (self._start, 0, 0)
        self._drawn = False

    def text(self, delivered: int, delivered_bytes: int, failed: int, read_rows: int,
             read_bytes: int, *, final: bool = False) -> str:
        """One report (without line control): rows and bytes, rates, share, time left.
        Rates are over the last interval; the final report's over the whole run."""
        now = self._clock()
        elapsed = now - self._start
        then, rows_before, bytes_before = self._last
        self._last = (now, delivered, delivered_bytes)
        if final or now <= then:
            span, rows, nbytes = elapsed, delivered, delivered_bytes
        else:
            span, rows, nbytes = now - then, delivered - rows_before, \
                delivered_bytes - bytes_before
        rate, byte_rate = (rows / span, nbytes / span) if span > 0 else (0.0, 0.0)
        parts = [f"{delivered:,} rows delivered ({_size(delivered_bytes)})"]
        if failed:
            parts.append(f"{failed:,} failed")
        parts.append(f"{rate:,.0f} rows/s ({_size(byte_rate)}/s)")
        if self._total is not None:
            done = delivered + failed
            if final:
                share = 1.0
            elif self._total == 0 or read_bytes <= 0 or read_rows <= 0:
                share = 0.0
            else:
                expected = read_rows * self._total / read_bytes
                share = min(1.0, done / expected) if expected else 0.0
            parts.append(f"{share:.0%}")
            if share >= 1.0:
                parts.append("ETA 0:00")
            elif share > 0 and elapsed > 0:
                parts.append(f"ETA {_duration(elapsed * (1 - share) / share)}")
            else:
                parts.append("ETA --:--")
        parts.append(f"{_duration(elapsed)} elapsed")
        return ", ".join(parts)

    def draw(self, *counts: int, final: bool = False) -> None:
        line = self.text(*counts, final=final)
        if self._tty:
            self._out.write(f"\r{line}\x1b[K" + ("\n" if final else ""))
        else:
            self._out.write(f"progress: {line}\n")
        self._out.flush()
        self._drawn = True

    async def run(self, interval: float, counts: Callable[[], tuple[int, int, int, int, int]],
                  sleep: Callable[[float], Any]) -> None:
        """Draw ``counts()`` every ``interval`` seconds, until cancelled."""
        while True:
            self.draw(*counts())
            await sleep(interval)
