"""Shrinking a violating schedule to a small one that still violates.

Greedy and deterministic: each step proposes a smaller schedule (fewer
events, fewer messages, also within a send() loop, fewer flushes, fewer
partitions or brokers, plainer options and sends), runs it, and keeps it when it still shows a violation of one of
the kinds we are shrinking for. Removals go by halves first, then one by one
(delta debugging), and the whole round repeats until nothing more goes or
the run budget is spent. A shrunk schedule is its own deterministic replay:
the interleaving comes from the schedule's seed and its contents, so the
shrunk one is kept as JSON (`to_json`), not as a seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from .checker import Violation, check
from .runner import run_schedule
from .schedule import Event, Schedule, Send, with_options

T = TypeVar("T")

# Plainer values tried for each option (first the plainest).
_PLAIN: dict[str, tuple[Any, ...]] = {
    "linger": (0.0,),
    "channel_capacity": (1024,),
    "buffer_memory": (32 * 1024 * 1024,),
    "max_request_bytes": (1024 * 1024,),
    "max_block": (5.0,),
    "metadata_max_age": (300.0,),
    "retry_backoff_jitter": (0.0,),
    "return_successes": (False,),
    "max_batch_messages": (100, 1),
    "max_in_flight": (1, 5),
    "retries": (2**31 - 1,),
    "close_timeout": (10.0,),
    "batch_bytes": (16384,),
    "acks": ("all",),
}


def _with(schedule: Schedule, field: str, value: tuple[Any, ...]) -> Schedule:
    changes: dict[str, Any] = {field: value}
    return replace(schedule, **changes)


class Shrinker:
    def __init__(self, kinds: set[str], budget: int = 400,
                 log: Callable[[str], None] | None = None) -> None:
        self.kinds = kinds
        self.budget = budget
        self.runs = 0
        self.log = log or (lambda _: None)

    def violations(self, schedule: Schedule) -> list[Violation]:
        self.runs += 1
        return check(run_schedule(schedule, real_time_limit=30.0))

    def fails(self, schedule: Schedule) -> bool:
        if self.runs >= self.budget:
            return False
        return any(v.kind in self.kinds for v in self.violations(schedule))

    def shrink(self, schedule: Schedule) -> Schedule:
        best = schedule
        while self.runs < self.budget:
            before = (best.size, best.options, best.heal_at, best.close_at)
            best = self._drop(best, "events", best.events)
            best = self._drop(best, "sends", best.sends)
            best = self._drop(best, "flushes", best.flushes)
            best = self._fewer_partitions(best)
            best = self._fewer_brokers(best)
            best = self._plainer(best)
            if (best.size, best.options, best.heal_at, best.close_at) == before:
                break
        return best

    # -- steps ---------------------------------------------------------------
    def _drop(self, best: Schedule, field: str, items: Sequence[T]) -> Schedule:
        """Delta debugging over one list: drop halves, quarters, ..., single items."""
        items = list(items)
        chunk = max(len(items) // 2, 1)
        while items:
            i, progressed = 0, False
            while i < len(items):
                kept = items[:i] + items[i + chunk:]
                candidate = _with(best, field, tuple(kept))
                if self.fails(candidate):
                    best, items, progressed = candidate, kept, True
                    self.log(f"  {field}: {len(items)} left")
                else:
                    i += chunk
            if chunk == 1 and not progressed:
                break
            chunk = max(chunk // 2, 1)
        return best

    def _fewer_partitions(self, best: Schedule) -> Schedule:
        while best.partitions > 1:
            n = best.partitions - 1
            candidate = replace(
                best,
                partitions=n,
                leaders=best.leaders[:n],
                sends=tuple(
                    replace(s, partition=s.partition % n) if s.partition is not None else s
                    for s in best.sends
                ),
                events=tuple(e for e in best.events if e.partition < n),
            )
            if not self.fails(candidate):
                break
            best = candidate
            self.log(f"  partitions: {n}")
        return best

    def _fewer_brokers(self, best: Schedule) -> Schedule:
        while best.brokers > 1:
            n = best.brokers - 1
            candidate = replace(
                best,
                brokers=n,
                leaders=tuple(leader % n for leader in best.leaders),
                events=tuple(e for e in best.events if e.node < n),
            )
            if not self.fails(candidate):
                break
            best = candidate
            self.log(f"  brokers: {n}")
        return best

    def _plainer(self, best: Schedule) -> Schedule:
        for name, values in _PLAIN.items():
            for value in values:
                if dict(best.options).get(name) == value:
                    break
                candidate = with_options(best, **{name: value})
                if self.fails(candidate):
                    best = candidate
                    self.log(f"  {name}={value}")
                    break
        # plainer messages: one source, loops not forced columnar and not
        # awaited, plain send(), no keys (a loop's messages are shrunk one by
        # one by _drop, like any others)
        changes: tuple[Callable[[Send], Send], ...] = (
            lambda s: replace(s, source=0),
            lambda s: replace(s, wait=False),
            lambda s: replace(s, callback=False),
            lambda s: replace(s, columns=False),
            lambda s: replace(s, via="send") if s.via != "input" else s,
            lambda s: replace(s, key=None, partition=0) if s.key is not None else s,
        )
        for change in changes:
            sends = tuple(change(s) for s in best.sends)
            if sends != best.sends:
                candidate = replace(best, sends=sends)
                if self.fails(candidate):
                    best = candidate
        return best


def shrink(schedule: Schedule, violations: list[Violation], *, budget: int = 400,
           log: Callable[[str], None] | None = None) -> tuple[Schedule, int]:
    """The smallest schedule found that still violates one of `violations`' kinds,
    and how many runs it took."""
    shrinker = Shrinker({v.kind for v in violations}, budget, log)
    return shrinker.shrink(schedule), shrinker.runs


__all__ = ["Event", "Send", "Shrinker", "shrink"]
