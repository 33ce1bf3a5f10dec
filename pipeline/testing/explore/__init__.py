"""The schedule explorer: seeded random fault schedules against the FakeCluster.

``python -m pipeline.testing.explore --schedules N --seed S`` generates N
schedules (seeds S..S+N-1), runs each on virtual time, checks the invariants
of `checker`, shrinks any violating schedule and prints how to replay it.
See docs/testing.md ("The schedule explorer") for what is checked and why.

In code: ``generate(seed, mode)`` (mode ``"on"``/``"off"`` fixes idempotence, ``"both"``
draws it) gives a :class:`Schedule` (plain data); ``run_schedule(schedule)`` runs it,
deterministically on virtual time, into a :class:`Trace`; ``check(trace)`` returns the
:class:`Violation` list; ``shrink.shrink(schedule, violations)`` finds a smaller schedule
that still violates; ``to_json`` / ``from_json`` read and write the regression files.
"""

# (they register: statistics' invariants, routing's, the transactions workload)
from . import (  # noqa: F401
    counts,
    placement,
    producer_ids,
    txn_checker,
    txn_runner,
    wire_limits,
)
from .checker import Violation, check
from .runner import Trace, run_schedule
from .schedule import Event, Schedule, Send, from_json, generate, to_json

__all__ = [
    "Event",
    "Schedule",
    "Send",
    "Trace",
    "Violation",
    "check",
    "from_json",
    "generate",
    "run_schedule",
    "to_json",
]
