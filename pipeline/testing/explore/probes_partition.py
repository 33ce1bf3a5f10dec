"""Probes of the partition producer: the watermark rules, its wake-ups, leaving a
broker producer and re-attaching (probes.py is the mechanism; GUARDS in guards.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import trio

from .probes import CLUSTER, EPS, PP, Watch, probe

# -- the partition producer (the watermark rules) ------------------------------

@probe(PP, "_handle")
def _pp_handle(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def handle(self: Any, items: Any) -> Any:
        if type(items).__name__ != "RetryList":
            w.arrived(items)
            if self.hwm > 0:
                w.reach("fresh-wait-while-chaser-out")
                if self.bp is not None:
                    w.reach("fresh-while-chaser-out-attached")
        else:
            for item in items:
                level = getattr(item, "_level", None)
                if level is None:
                    w.reach("chaser-returns")
                elif level < self.hwm:
                    w.reach("below-hwm-waits-in-its-level")
        held, out = self._held, self._out
        n_held, n_out = len(held), len(out)
        result = orig(self, items)
        hwm = self.hwm
        if hwm > 0:
            # Rule 2: while a chaser is out, what sits ready to go (held for a
            # leader, or gathered for the broker producer) is at the watermark;
            # anything lower waits in its level's buffer.
            placed = ((self._held[n_held:] if self._held is held else self._held)
                      + (self._out[n_out:] if self._out is out else self._out))
            for unit in placed:
                if unit._level < hwm:
                    w.violate("G1 below the watermark", (
                        f"partition {self.tp.partition}: a unit at level {unit._level} put "
                        f"in line for a broker producer while hwm={hwm} (a chaser is out), "
                        "not in its level's buffer"))
                    break
        return result
    return handle


@probe(PP, "_raise_watermark")
def _pp_raise(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def raise_watermark(self: Any, level: int, *, retry: bool = True) -> Any:
        if self._out and retry:
            w.reach("gathered-go-down-the-old-path")
        if level >= 2:
            w.reach("retry-at-two-levels")
        return orig(self, level, retry=retry)
    return raise_watermark


@probe(PP, "_leave_with_chaser")
def _pp_leave(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def leave(self: Any) -> Any:
        w.reach("leave-with-chaser")
        if self._out:
            w.reach("kept-below-the-watermark-after-a-give-up")
        return orig(self)
    return leave


@probe(PP, "leader_changed")
def _pp_leader_changed(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def leader_changed(self: Any) -> Any:
        if self.bp is None:
            w.reach("give-up-reported-after-we-left")
        return orig(self)
    return leader_changed


@probe(PP, "_expire")
def _pp_expire(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def expire(self: Any, now: float) -> Any:
        if any(u._deadline <= now for u in self._held):
            w.reach("held-messages-expire")
        if any(u._deadline <= now for buf in self._levels.values() for u in buf):
            w.reach("held-back-levels-expire")
        return orig(self, now)
    return expire


@probe(PP, "_flush_out")
def _pp_flush_out(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def flush_out(self: Any) -> Any:
        hwm = self.hwm
        for unit in self._out:
            if unit._level < hwm:
                w.violate("G1 below the watermark", (
                    f"partition {self.tp.partition}: a unit at level {unit._level} handed to a "
                    f"broker producer while hwm={hwm} (a chaser is out): it can overtake "
                    "older messages still coming back"))
                break
        return orig(self)
    return flush_out


@probe(PP, "_tick")
def _pp_tick(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    async def tick(self: Any) -> Any:
        if self.bp is None and self._held and not self._metadata_fresh \
                and trio.current_time() >= self._backoff_until:
            w.reach("reattach-waits-for-fresh-metadata")
        for bp, _ in self._outbox:
            stats = bp.inbox.statistics()
            if stats.current_buffer_used >= stats.max_buffer_size:
                w.reach("full-broker-input-delays-the-chaser")
                break
        return await orig(self)
    return tick


@probe(PP, "retry")
def _pp_retry(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def retry(self: Any, items: list[Any]) -> Any:
        if self._waiting is None:
            w.reach("retry-while-the-main-loop-is-busy")
        return orig(self, items)
    return retry



# -- wake-ups: nothing waits past its deadline, a backoff or a linger ------------------
# A stage that sleeps computes when to wake up; these check the result against
# the rule it implements (docs/architecture.md, "Nothing waits past
# delivery_timeout", "Backoff never blocks"): never later than the earliest
# deadline of anything it holds, the end of its backoff, or a due linger.




@probe(PP, "_wake_at")
def _pp_wake_at(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def wake_at(self: Any) -> Any:
        wake = orig(self)
        due = min((u._deadline for u in self._held), default=math.inf)
        for buf in self._levels.values():
            due = min(due, min((u._deadline for u in buf), default=math.inf))
        if self.bp is None and self._held and self._metadata_fresh:
            due = min(due, self._backoff_until)
        if wake > due + EPS:
            w.violate("G8 partition producer wake", (
                f"partition {self.tp.partition}: sleeps until {wake:.4f}, past {due:.4f} "
                "(a held message's deadline, or the end of its backoff)"))
        return wake
    return wake_at



# -- leaving and re-attaching --------------------------------------------------------


@probe(CLUSTER, "_run_round")
def _cluster_round(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    async def run_round(self: Any, rnd: Any) -> Any:
        w.rounds_started += 1
        index = w.rounds_started
        try:
            return await orig(self, rnd)
        finally:
            w.rounds_done = max(w.rounds_done, index)
    return run_round


@probe(PP, "leader_changed")
def _pp_told(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def leader_changed(self: Any) -> Any:
        if self.bp is not None:
            w.told[id(self)] = (self, self.bp)
        w.failed[id(self)] = (self, w.rounds_started, trio.current_time(), None)
        return orig(self)
    return leader_changed


@probe(PP, "_tick")
def _pp_tick_leaves(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    async def tick(self: Any) -> Any:
        told = w.told.pop(id(self), None)
        result = await orig(self)
        if told is not None and told[0] is self and self.bp is told[1]:
            w.violate("G11 leader_changed ignored", (
                f"partition {self.tp.partition}: its broker producer gave up after an error "
                "that says the leader may be gone, and the next pass did not leave it for "
                "fresh metadata"))
        return result
    return tick


@probe(PP, "_raise_watermark")
def _pp_failed(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def raise_watermark(self: Any, level: int, *, retry: bool = True) -> Any:
        if retry:  # (without: leaving after leader_changed, which was the failure)
            w.failed[id(self)] = (self, w.rounds_started, trio.current_time(), level)
        return orig(self, level, retry=retry)
    return raise_watermark


@probe(PP, "_attach")
def _pp_attach(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    async def attach(self: Any) -> Any:
        failed = w.failed.get(id(self))
        result = await orig(self)
        if self.bp is not None and failed is not None and failed[0] is self:
            del w.failed[id(self)]
            _, rounds, at, level = failed
            now = trio.current_time()
            # (the wait for fresh metadata gives up after request_timeout: the cached
            # view it is then)
            waited_out = now >= at + self._config.request_timeout - EPS
            if w.rounds_done <= rounds and not waited_out:
                w.violate("G12 stale re-attach", (
                    f"partition {self.tp.partition}: re-attached at {now:.4f} after a "
                    f"failure at {at:.4f}, before any metadata refresh that started after "
                    "the failure had completed"))
            c = self._config.cluster
            shortest = 0.0 if level is None else shortest_backoff(
                c.retry_backoff, c.retry_backoff_max, c.retry_backoff_jitter, level)
            if now < at + shortest - EPS:  # (None: left after leader_changed, no backoff)
                w.violate("G15 retry backoff", (
                    f"partition {self.tp.partition}: re-attached at {now:.4f}, a retry at "
                    f"level {level} raised at {at:.4f}: its backoff is {shortest:.4f} s at "
                    "least (retry_backoff, doubled per level, less the jitter)"))
        return result
    return attach


class _Lowest:
    """An rng whose every draw is 0: ``Backoff.delay`` gives its shortest delay."""

    def random(self) -> float:
        return 0.0


def shortest_backoff(base: float, most: float, jitter: float, level: int) -> float:
    """The shortest delay the producer's retry backoff may give for ``level``
    (``context.retry_backoff``: 0 when ``retry_backoff`` is 0)."""
    from pipeline.util.backoff import Backoff

    if base == 0:
        return 0.0
    backoff = Backoff(base, most, jitter=jitter, rng=_Lowest())  # type: ignore[arg-type]
    return backoff.delay(max(level, 1))
