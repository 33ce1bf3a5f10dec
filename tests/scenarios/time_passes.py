"""Virtual time that passes *while* a task runs, as a real clock's does.

On trio's virtual clock (``autojump_clock``) no time passes while tasks run,
and each pass of the run loop fires every timer due before it runs the tasks
they woke. So at an instant T, a task woken by its own timer (a broker
producer's flusher waking for a delivery deadline) always runs before a task
that an event wakes at T (the responder, once the connection's reader has read
an answer; the intake, once a partition producer has sent to it): those need
one more pass. On a real clock that is not so: time passes while tasks step
(decoding a response, writing a request to a socket that applies
back-pressure), so a task made runnable at T - e may run at T + e', before the
run loop has looked at the timers due at T.

``jump_before_step`` reproduces that, deterministically and with public trio
API only (an Instrument and ``MockClock.jump``): just before the first step of
a task that ``when`` picks, the clock jumps ``seconds``. That task runs at the
later time; the timers due in between fire only after its step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio
import trio.testing
from trio.lowlevel import Task


class _JumpBeforeStep(trio.abc.Instrument):
    def __init__(self, clock: trio.testing.MockClock, seconds: float,
                 when: Callable[[Task], bool]) -> None:
        self._clock = clock
        self._seconds = seconds
        self._when = when
        self.jumped_at: float | None = None

    def before_task_step(self, task: Task) -> None:
        if self.jumped_at is None and self._when(task):
            self.jumped_at = trio.current_time()
            self._clock.jump(self._seconds)


@contextmanager
def jump_before_step(
    clock: trio.testing.MockClock, seconds: float, when: Callable[[Task], bool]
) -> Iterator[_JumpBeforeStep]:
    """Jump ``clock`` by ``seconds`` just before the first task step ``when``
    accepts (``when`` sees the task; it may look at the time or at the
    producer's state). ``jumped_at`` is the instant it happened (None: never,
    which the caller should assert against, or the test proves nothing)."""
    instrument = _JumpBeforeStep(clock, seconds, when)
    trio.lowlevel.add_instrument(instrument)
    try:
        yield instrument
    finally:
        trio.lowlevel.remove_instrument(instrument)


def named(task: Task, suffix: str) -> bool:
    """``task`` runs a method whose qualified name ends with ``suffix`` (e.g.
    ``"BrokerProducer._responder"``)."""
    return task.name.endswith(suffix)
