"""The schedule explorer: seeded random fault schedules against the FakeCluster.

``python -m pipeline.testing.explore --schedules N --seed S`` generates N
schedules (seeds S..S+N-1), runs each on virtual time, checks the invariants
of `checker`, shrinks any violating schedule and prints how to replay it.
See docs/architecture.md ("Testing") for what is checked and why.
"""

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
