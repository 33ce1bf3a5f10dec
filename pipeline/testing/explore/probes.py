"""Probes: which protocol guards a run reached, and the guards' own invariants.

For one run (`watching`), the explorer wraps a few methods of the protocol's
stages (partition and broker producers, the accumulator, idempotence) on their
classes, and restores them afterwards. A wrapper looks at the stage's state
when the method is called (or returns) and

* marks the guards whose state it sees (`guards.GUARDS`: e.g. fresh level-0
  messages arriving at a partition producer while its chaser is out), so a
  sweep reports the guards it never put the protocol in front of, and
* checks the invariants a guard keeps where they are cheaper to check directly
  than through their effect on the logs (e.g. a partition producer hands a
  broker producer nothing below its watermark): a broken guard is seen the
  moment it acts, even when the interleaving that would turn it into a
  reordered log never comes.

The producer itself carries nothing for this: no call, flag or counter on its
paths; everything here is the explorer's, installed for the length of a run.
The wrappers read the stages' private fields by name: `tests/explore`
(``test_probes.py``) fails, naming the field, when a rename leaves a probe
reading nothing.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

PP = "pipeline.producer._stages.partition_producer:PartitionProducer"
BP = "pipeline.producer._stages.broker_producer:BrokerProducer"
ACC = "pipeline.producer._stages.accumulator:Accumulator"
IDEM = "pipeline.producer._stages.idempotence:Idempotence"

# A violation kind is reported once per run with its first detail.
MAX_DETAILS = 1


@dataclass
class Watch:
    """What one run's probes saw."""

    reached: Counter[str] = field(default_factory=Counter)
    violations: dict[str, str] = field(default_factory=dict)  # kind -> first detail
    # Per partition producer, the order fresh units reached it (their arrival
    # numbers; the unit object kept alive so its id() stays its own).
    arrival: dict[int, tuple[Any, int]] = field(default_factory=dict)
    next_arrival: int = 0
    # Per (broker producer, partition): the last arrival number it was handed
    # since that partition's last chaser there.
    session: dict[tuple[int, Any], int] = field(default_factory=dict)
    # Per (producer id, epoch, partition): the next sequence a fresh batch takes.
    sequences: dict[tuple[int, int, Any], int] = field(default_factory=dict)
    # Per sealed batch sent: (the batch, its producer id, epoch, base sequence).
    stamps: dict[int, tuple[Any, tuple[int, int, int]]] = field(default_factory=dict)
    epochs_started: int = 0
    # Per message: (the message, requests built with it) and (the message, splits).
    attempts: dict[int, tuple[Any, int]] = field(default_factory=dict)
    splits: dict[int, tuple[Any, int]] = field(default_factory=dict)
    # Recoveries seen: [epochs bumped locally, new producer ids].
    recoveries: list[int] = field(default_factory=lambda: [0, 0])
    # A broker fenced the current epoch (the next recovery must take a new id);
    # a broker refused a locally bumped epoch (every later one must).
    fenced: bool = False
    refused: bool = False
    local_epoch: bool = False  # the current epoch is one the producer bumped itself
    # Metadata rounds started and the highest one completed (rounds run one at a time).
    rounds_started: int = 0
    rounds_done: int = 0
    # Per partition producer: (it, the broker producer it was attached to) when
    # told leader_changed; (it, rounds started, when) at its last failure (a retry
    # coming back, or leader_changed): it re-attaches on metadata fresher than that.
    told: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    failed: dict[int, tuple[Any, int, float]] = field(default_factory=dict)
    # The schedule scripts OUT_OF_ORDER_SEQUENCE_NUMBER answers (else one that no
    # earlier failure explains is the producer's own gap).
    scripted_out_of_order: bool = False

    def attempts_of(self, msg: Any) -> tuple[int, int]:
        """(requests built with ``msg``, splits of a batch holding it); -1: not a message."""
        if type(msg).__name__ == "RowDelivery":
            return -1, 0
        seen = self.attempts.get(id(msg))
        split = self.splits.get(id(msg))
        return (seen[1] if seen is not None and seen[0] is msg else 0,
                split[1] if split is not None and split[0] is msg else 0)

    def reach(self, guard: str) -> None:
        self.reached[guard] += 1

    def violate(self, kind: str, detail: str) -> None:
        if kind not in self.violations:
            self.violations[kind] = detail

    # -- arrival order ---------------------------------------------------------
    def arrived(self, units: list[Any]) -> None:
        for u in units:
            self.next_arrival += 1
            self.arrival[id(u)] = (u, self.next_arrival)

    def arrival_of(self, unit: Any) -> int | None:
        """The arrival number of a unit (a sealed batch: its first message's)."""
        msgs = getattr(unit, "messages", None)
        first = msgs[0] if msgs else unit
        seen = self.arrival.get(id(first))
        return seen[1] if seen is not None and seen[0] is first else None


def _resolve(target: str) -> type:
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


Wrapper = Callable[[Watch, Callable[..., Any]], Callable[..., Any]]
_PROBES: list[tuple[str, str, Wrapper]] = []


def probe(target: str, method: str) -> Callable[[Wrapper], Wrapper]:
    """Register ``wrapper(watch, original) -> replacement`` for ``target.method``."""

    def register(wrapper: Wrapper) -> Wrapper:
        _PROBES.append((target, method, wrapper))
        return wrapper

    return register


@contextmanager
def watching(watch: Watch) -> Iterator[Watch]:
    """Install every probe for the length of the block (one run)."""
    saved: list[tuple[type, str, Any]] = []
    try:
        for target, method, wrapper in _PROBES:
            cls = _resolve(target)
            original = cls.__dict__[method]
            replacement = functools.wraps(original)(wrapper(watch, original))
            saved.append((cls, method, original))
            setattr(cls, method, replacement)
        yield watch
    finally:
        for cls, method, original in reversed(saved):
            setattr(cls, method, original)


def targets() -> list[tuple[str, str]]:
    return [(t, m) for t, m, _ in _PROBES]


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


# -- the broker producer ---------------------------------------------------------

@probe(BP, "_accept")
def _bp_accept(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def accept(self: Any, item: Any) -> Any:
        key = (id(self), item.tp)
        part = self._parts.get(item.tp)
        if hasattr(item, "level"):  # the chaser
            w.session.pop(key, None)
            w.reach("chaser-reaches-the-old-broker-producer")
        else:
            if part is not None and part.retrying is not None:
                w.reach("arrival-at-a-retrying-partition-goes-back")
            last = w.session.get(key, 0)
            for unit in item.messages:
                n = w.arrival_of(unit)
                if n is None:
                    continue
                if n <= last:
                    w.violate("G2 hand-off order", (
                        f"broker {self.node_id}, partition {item.tp.partition}: handed a unit "
                        f"that reached its partition producer as #{n} after #{last}, with no "
                        "chaser between"))
                    break
                last = n
            w.session[key] = last
        return orig(self, item)
    return accept


@probe(BP, "_maybe_bounce")
def _bp_maybe_bounce(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def maybe_bounce(self: Any, tp: Any, part: Any) -> Any:
        if not part.in_flight and part.retrying is not None:
            if len(part.failed) >= 2:
                w.reach("several-failed-batches-bounce-in-order")
            if part.failed and (part.sealed or part.msgs):
                w.reach("waiting-units-bounce-without-spending-a-retry")
        return orig(self, tp, part)
    return maybe_bounce


@probe(BP, "_gave_up")
def _bp_gave_up(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def gave_up(self: Any, tp: Any, part: Any) -> Any:
        code = getattr(part.retrying, "code", None)
        from pipeline.producer._stages.batches import REFRESH_CODES

        if code is not None and code not in REFRESH_CODES:
            w.reach("give-up-the-leader-answered-ends-the-retry-state")
        else:
            w.reach("give-up-that-may-have-lost-the-leader")
        return orig(self, tp, part)
    return gave_up


@probe(BP, "_handle_partition")
def _bp_handle_partition(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    from pipeline.producer._stages.batches import MAYBE_WRITTEN, TOO_LARGE
    from pipeline.protocol.errors import ErrorCode

    def handle_partition(self: Any, tp: Any, batch: Any, result: Any) -> Any:
        if result is not None and result.error_code:
            code = ErrorCode(result.error_code)
            part = self._parts[tp]
            if code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and self._idem is not None:
                explained = part.retrying is not None or part.failed
                w.reach("out-of-order-explained" if explained else "out-of-order-unexplained")
                # A re-sent batch may be answered so legitimately: written before, it
                # fell out of the broker's cache of the last 5 batches meanwhile. A first
                # send nothing explains means the producer left a gap.
                first_send = w.attempts_of(batch.messages[0])[0] == 1
                if not explained and first_send and not w.scripted_out_of_order:
                    w.violate("G10 sequence gap", (
                        f"broker {self.node_id}, partition {tp.partition}: answered "
                        "OUT_OF_ORDER_SEQUENCE_NUMBER to a batch's first send, with no earlier "
                        "batch of the partition failing: the producer skipped sequences "
                        "without a new epoch"))
            elif code == ErrorCode.UNKNOWN_PRODUCER_ID and self._idem is not None:
                w.reach("unknown-producer-id")
            elif code in TOO_LARGE and _records(batch) > 1 and not batch.fate_unknown:
                w.reach("too-large-batch-split")
                for m in batch.messages:
                    seen = w.splits.get(id(m))
                    w.splits[id(m)] = (m, seen[1] + 1 if seen is not None and seen[0] is m else 1)
            elif code in MAYBE_WRITTEN:
                w.reach("after-append-answer-makes-the-fate-unknown")
        return orig(self, tp, batch, result)
    return handle_partition


@probe(BP, "_expire")
def _bp_expire(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def expire(self: Any, now: float) -> Any:
        for part in self._parts.values():
            if part.failed and part.failed[0]._deadline <= now and part.in_flight:
                w.reach("failed-batch-expires-before-its-partitions-flights")
                break
        for flight in self._in_flight:
            if flight.deadline <= now:
                w.reach("in-flight-batch-expires")
                break
        return orig(self, now)
    return expire


@probe(BP, "_next_wake")
def _bp_next_wake(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def next_wake(self: Any, slot_free: bool) -> Any:
        if not slot_free and self._flusher_until is None:
            now = trio.current_time()
            if len(self._in_flight) >= self._config.max_in_flight and self._acc.ready(now):
                w.reach("flusher-waits-for-a-free-slot")
            elif self._idem is not None and self._idem.paused and any(
                    p.msgs for p in self._parts.values()):
                w.reach("flusher-waits-while-sealing-is-paused")
        return orig(self, slot_free)
    return next_wake


# -- the accumulator ----------------------------------------------------------------

@probe(ACC, "drain")
def _acc_drain(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def drain(self: Any) -> Any:
        idem = self._idem
        if idem is not None and idem.paused:
            w.violate("G4 sealed while paused", "the accumulator drained batches while "
                      "sealing was paused for a new epoch")
        in_flight = {tp: part.in_flight for tp, part in self.parts.items()}
        if self._config.batch_bytes > self._batch_cap and any(
                part.nbytes > self._batch_cap for part in self.parts.values()):
            w.reach("batch-capped-at-max-message-bytes")
        taken = orig(self)
        attempts = w.attempts
        for batch in taken.values():
            for m in batch.messages:
                seen = attempts.get(id(m))
                attempts[id(m)] = (m, seen[1] + 1 if seen is not None and seen[0] is m else 1)
        for tp, batch in taken.items():
            before = in_flight.get(tp, 0)
            if before:
                w.reach("several-batches-of-a-partition-in-flight")
            limit = 1 if idem is None or tp not in idem.confirmed else self._per_partition
            if before + 1 > limit:
                w.violate("G3 muting", (
                    f"partition {tp.partition}: batch {before + 1} in flight "
                    f"(idempotent={idem is not None}, limit {limit})"))
            if idem is not None:
                if (batch.producer_id, batch.producer_epoch) != (idem.producer_id,
                                                                  idem.producer_epoch):
                    w.violate("G5 epoch", f"partition {tp.partition}: a batch of epoch "
                              f"{batch.producer_epoch} sent in epoch {idem.producer_epoch}")
                stamp = (batch.producer_id, batch.producer_epoch, batch.base_sequence)
                stamped = w.stamps.get(id(batch))
                if stamped is None or stamped[0] is not batch or stamped[1] != stamp:
                    # sealed or re-stamped now: it takes the partition's next sequences
                    w.stamps[id(batch)] = (batch, stamp)
                    key = (batch.producer_id, batch.producer_epoch, tp)
                    expected = w.sequences.get(key, 0)
                    # (below it: a KIP-126 half, which keeps its batch's sequences)
                    if batch.base_sequence > expected:
                        w.violate("G5 sequence gap", (
                            f"partition {tp.partition}: a batch stamped with base sequence "
                            f"{batch.base_sequence} when the next is {expected}"))
                    w.sequences[key] = max(expected, batch.base_sequence + _records(batch))
        return taken
    return drain


def _records(batch: Any) -> int:
    n = 0
    for m in batch.messages:
        n += getattr(m, "count", 1) if type(m).__name__ == "RowRun" else 1
    return n


@probe(ACC, "restamp")
def _acc_restamp(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def restamp(self: Any, tp: Any, batch: Any) -> Any:
        idem = self._idem
        old = idem is not None and (batch.producer_id, batch.producer_epoch) != (
            idem.producer_id, idem.producer_epoch)
        unknown = old and batch.fate_unknown and not idem.never_written(batch)
        ok = orig(self, tp, batch)
        if old:
            w.reach("retried-batch-restamped-after-a-bump" if ok
                    else "batch-of-unknown-fate-not-restamped")
            if ok and unknown:
                w.violate("G6 restamped", (
                    f"partition {tp.partition}: a batch whose fate is unknown was re-stamped "
                    "with the new epoch (a duplicate if it was written)"))
        return ok
    return restamp


@probe(ACC, "ready")
def _acc_ready(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def ready(self: Any, now: float) -> Any:
        result = orig(self, now)
        if result and self._config.linger > 0:
            for part in self.parts.values():
                if part.msgs and part.retrying is None and now < part.first_at + self._linger_due:
                    if self._flush.depth > 0:
                        w.reach("flush-ignores-linger")
                    elif (part.nbytes >= self._batch_cap
                          or len(part.msgs) >= self._config.max_batch_messages):
                        w.reach("full-batch-does-not-wait-for-linger")
        return result
    return ready


# -- idempotence --------------------------------------------------------------------

@probe(IDEM, "_start_epoch")
def _idem_start_epoch(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def start_epoch(self: Any, pid: int, epoch: int, *, bumped_locally: bool) -> Any:
        if w.epochs_started:
            w.reach("epoch-bumped" if bumped_locally else "new-producer-id-in-a-recovery")
            w.recoveries[0 if bumped_locally else 1] += 1
            if self.in_flight:
                w.violate("G7 bump under flight", (
                    f"a new epoch started with {self.in_flight} batches of the old one "
                    "in flight"))
            if not bumped_locally and not (w.fenced or w.refused or self.producer_epoch >= 32767):
                w.violate("G7 needless new id", (
                    "a recovery took a new producer id although no broker fenced the epoch, "
                    "none refused a local bump and the epoch is not exhausted: it bumps "
                    "its own epoch then (KIP-360)"))
            if bumped_locally and (w.fenced or w.refused):
                w.violate("G7 bump after fencing", (
                    "the producer bumped its own epoch although a broker fenced the current "
                    "one" + (" (and refused an epoch it bumped itself before)" if w.refused
                             else "") + ": only a new producer id recovers from that"))
            if bumped_locally and (pid, epoch) != (self.producer_id, self.producer_epoch + 1):
                w.violate("G7 bump", f"a local bump from {self.producer_id}/"
                          f"{self.producer_epoch} to {pid}/{epoch}")
            if not bumped_locally and pid == self.producer_id:
                w.violate("G7 new id", f"a recovery with a new id kept producer id {pid}")
        w.fenced = False
        w.local_epoch = bumped_locally
        w.epochs_started += 1
        return orig(self, pid, epoch, bumped_locally=bumped_locally)
    return start_epoch


@probe(IDEM, "epoch_fenced")
def _idem_epoch_fenced(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def epoch_fenced(self: Any, producer_id: int, producer_epoch: int, code: Any) -> Any:
        if (producer_id, producer_epoch) == (self.producer_id, self.producer_epoch):
            w.reach("epoch-fenced-takes-a-new-id")
            w.fenced = True
            if w.local_epoch:
                w.refused = True  # from now on every recovery takes a new id
        return orig(self, producer_id, producer_epoch, code)
    return epoch_fenced


@probe(IDEM, "batch_failed")
def _idem_batch_failed(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def batch_failed(self: Any, batch: Any, reason: str) -> Any:
        if (batch.producer_id, batch.producer_epoch) == (self.producer_id, self.producer_epoch):
            w.reach("failed-batch-starts-a-new-epoch")
        return orig(self, batch, reason)
    return batch_failed


# -- wake-ups: nothing waits past its deadline, a backoff or a linger ------------------
# A stage that sleeps computes when to wake up; these check the result against
# the rule it implements (docs/architecture.md, "Nothing waits past
# delivery_timeout", "Backoff never blocks"): never later than the earliest
# deadline of anything it holds, the end of its backoff, or a due linger.

EPS = 1e-9


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


def _bp_due(bp: Any, slot_free: bool) -> float:
    """When a broker producer's flusher must wake at the latest."""
    due = math.inf
    acc = bp._acc
    for tp, part in bp._parts.items():
        for unit in (*part.msgs[:1], *part.sealed, *part.failed):
            due = min(due, unit._deadline)
        if slot_free and part.msgs and acc.sendable(part, tp):
            due = min(due, part.first_at + acc._linger_due)
    for flight in bp._in_flight:
        due = min(due, flight.deadline)
    return due


@probe(BP, "_next_wake")
def _bp_next_wake_rule(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def next_wake(self: Any, slot_free: bool) -> Any:
        wake = orig(self, slot_free)
        due = _bp_due(self, slot_free)
        if wake > due + EPS:
            w.violate("G8 broker producer wake", (
                f"broker {self.node_id}: the flusher's next wake-up {wake:.4f} is past "
                f"{due:.4f} (a deadline, or a linger with a request slot free)"))
        return wake
    return next_wake


@probe(BP, "_poke_flusher")
def _bp_poke(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def poke(self: Any) -> Any:
        result = orig(self)
        until = self._flusher_until
        if until is not None and not self._wake_flusher.is_set():
            now = trio.current_time()
            slot_free = len(self._in_flight) < self._config.max_in_flight
            paused = self._idem is not None and self._idem.paused
            if slot_free and self._acc.ready(now):
                w.violate("G9 flusher left asleep", (
                    f"broker {self.node_id}: a partition is ready with a request slot free, "
                    f"and the flusher sleeps until {until:.4f}"))
            elif _bp_due(self, slot_free and not paused) < until - EPS:
                w.violate("G9 flusher left asleep", (
                    f"broker {self.node_id}: something is due at "
                    f"{_bp_due(self, slot_free and not paused):.4f}, and the flusher sleeps "
                    f"until {until:.4f}"))
        return result
    return poke


# -- leaving and re-attaching --------------------------------------------------------
CLUSTER = "pipeline.cluster.pool:Cluster"


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
        w.failed[id(self)] = (self, w.rounds_started, trio.current_time())
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
            w.failed[id(self)] = (self, w.rounds_started, trio.current_time())
        return orig(self, level, retry=retry)
    return raise_watermark


@probe(PP, "_attach")
def _pp_attach(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    async def attach(self: Any) -> Any:
        failed = w.failed.get(id(self))
        result = await orig(self)
        if self.bp is not None and failed is not None and failed[0] is self:
            del w.failed[id(self)]
            _, rounds, at = failed
            # (the wait for fresh metadata gives up after request_timeout: the cached
            # view it is then)
            waited_out = trio.current_time() >= at + self._config.request_timeout - EPS
            if w.rounds_done <= rounds and not waited_out:
                w.violate("G12 stale re-attach", (
                    f"partition {self.tp.partition}: re-attached at "
                    f"{trio.current_time():.4f} after a failure at {at:.4f}, before any "
                    "metadata refresh that started after the failure had completed"))
        return result
    return attach
