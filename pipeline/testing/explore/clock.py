"""The explorer's clock and guards: virtual time, determinism, and the end of a stuck run.

`VirtualClock` jumps to the next deadline whenever every task waits (trio's
MockClock with autojump_threshold=0, minus its machinery) and ends the run on
a deadlock or a busy loop, which virtual time alone would turn into a hang.
`deterministic_trio` seeds trio's scheduler; `time_limit` (real time) is the
last backstop.
"""

from __future__ import annotations

import gc
import math
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio
from trio._core import _run as trio_run


class HangError(Exception):
    """A schedule ran longer than its real-time limit (a hang on virtual time)."""


class Deadlock(Exception):
    """Every task waits and no deadline is set anywhere: nothing can ever happen."""


class Spin(Exception):
    """Tasks keep running while virtual time stands still: a busy loop."""


# Scheduler passes at one virtual instant before the run counts as a busy loop
# (the most seen in normal runs: about 120).
SPIN_PASSES = 10_000


class VirtualClock(trio.abc.Clock, trio.abc.Instrument):
    """Virtual time that jumps to the next deadline whenever every task waits
    (trio's MockClock with autojump_threshold=0, minus its machinery). It ends
    the run instead of hanging: a deadlock (every task waits, no deadline
    anywhere) and a busy loop (trio keeps scheduling at one virtual instant)
    would otherwise never finish, since virtual time only moves when idle."""

    def __init__(self) -> None:
        self._now = 0.0
        self._stalled = 0  # consecutive asks with no deadline at all
        self._passes = 0  # scheduler passes at the current instant
        self._passes_at = 0.0
        self._spin: str | None = None

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        if self._spin is not None:
            raise Spin(self._spin)  # from trio's run loop too: the run ends
        return self._now

    def before_io_wait(self, timeout: float) -> None:  # the Instrument hook, once per pass
        if self._now != self._passes_at:
            self._passes_at, self._passes = self._now, 0
            return
        self._passes += 1
        if self._passes > SPIN_PASSES and self._spin is None:
            self._spin = f"busy loop at t={self._now:.4f}:\n" + task_tree()

    def deadline_to_sleep_time(self, deadline: float) -> float:
        # trio asks only when no task is runnable: every task waits.
        if deadline < math.inf:
            self._stalled = 0
            self._now = max(self._now, deadline)
            return 0.0
        # No deadline: only real I/O could still wake a task (trio's own wakeup
        # socket, e.g. while it finishes after the main task). Give that a few
        # short real waits; then nothing can ever happen.
        self._stalled += 1
        if self._stalled > 5 and trio_run.GLOBAL_RUN_CONTEXT.runner.main_task_outcome is None:
            raise Deadlock(f"deadlock at t={self._now:.4f}:\n" + task_tree())
        return 0.001


def task_tree() -> str:
    """Every task and where it waits (for a deadlock report)."""
    lines: list[str] = []

    def walk(task: trio.lowlevel.Task, depth: int) -> None:
        chain: list[str] = []
        coro: Any = task.coro
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        lines.append("  " * depth + task.name.rsplit(".", 2)[-1] + "  " + " > ".join(chain[-6:]))
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child, depth + 1)

    root = trio.lowlevel.current_root_task()
    if root is not None:
        walk(root, 0)
    return "\n".join(lines)


@contextmanager
def deterministic_trio(seed: int) -> Iterator[None]:
    # trio wakes the tasks of one scheduling batch in random order (to flush out
    # order dependencies). Its Hypothesis mode sorts them by creation and then
    # shuffles with trio_run._r, which we seed: same schedule, same interleaving.
    allowed = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    state = trio_run._r.getstate()
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio_run._r.seed(seed)
    try:
        yield
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = allowed  # type: ignore[misc]
        trio_run._r.setstate(state)


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """A backstop against a hang that virtual time cannot end (a task blocked
    forever with no deadline anywhere, inside a shielded scope)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise HangError(f"schedule still running after {seconds}s of real time")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)



def describe_exception(exc: BaseException) -> str:
    """First line: the innermost exceptions (what went wrong); then the traceback."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner)
        else:
            leaves.append(e)

    walk(exc)
    summary = "; ".join(f"{type(e).__name__}: {e}" for e in leaves)
    return summary.replace("\n", " ") + "\n" + "".join(traceback.format_exception(exc))


def collect_abandoned() -> None:
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


