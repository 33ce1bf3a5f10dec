"""Probes of the broker producer and its accumulator: bounces, give-ups, answers,
expiry, muting, sequences, re-stamping, the flusher's wake-ups (probes.py is the
mechanism; GUARDS in guards.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import trio

from .probes import ACC, BP, CLUSTER, EPS, RETRY_ERRORS, Watch, probe, records_in

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

        answered = code is not None and code not in REFRESH_CODES
        if answered:
            w.reach("give-up-the-leader-answered-ends-the-retry-state")
        else:
            w.reach("give-up-that-may-have-lost-the-leader")
        pp = self._sinks.retry_sink(tp)
        told = pp._reroute
        result = orig(self, tp, part)
        told = pp._reroute and not told
        if answered and (part.retrying is not None or told):
            w.violate("G18 give-up", (
                f"broker {self.node_id}, partition {tp.partition}: everything failed here "
                f"after the leader's own answer ({getattr(code, 'name', code)}): nothing "
                "moved, so the retry "
                "state ends here and the partition producer stays (it was " +
                ("told to leave)" if told else "left retrying)")))
        elif not answered and not pp._reroute:
            w.violate("G18 give-up", (
                f"broker {self.node_id}, partition {tp.partition}: everything failed here "
                f"after {type(part.retrying).__name__ if part.retrying is not None else 'an error'}"
                ", which says the leader may be gone, and the partition producer was not "
                "told to leave with a chaser (leader_changed)"))
        return result
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
            elif code in TOO_LARGE and records_in(batch) > 1 and not batch.fate_unknown:
                w.reach("too-large-batch-split")
                for m in batch.messages:
                    seen = w.splits.get(id(m))
                    w.splits[id(m)] = (m, seen[1] + 1 if seen is not None and seen[0] is m else 1)
            elif code in MAYBE_WRITTEN:
                w.reach("after-append-answer-makes-the-fate-unknown")
        idem = self._idem
        current = idem is not None and (batch.producer_id, batch.producer_epoch) == (
            idem.producer_id, idem.producer_epoch)
        outcome = orig(self, tp, batch, result)
        if result is not None and not result.error_code:
            w.delivered[tp] = w.step()  # (the partition's last error is behind it: T1)
            if current and tp not in idem.confirmed:
                w.violate("G16 confirmation", (
                    f"broker {self.node_id}, partition {tp.partition}: acknowledged under "
                    "the current epoch, and still unconfirmed: it keeps one batch in flight "
                    "for good"))
        return outcome
    return handle_partition


@probe(BP, "_maybe_bounce")
def _bp_bounce_records_the_error(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def maybe_bounce(self: Any, tp: Any, *args: Any, **kwargs: Any) -> Any:
        before = self._errors.last.get(tp)
        result = orig(self, tp, *args, **kwargs)
        if self._errors.last.get(tp) is not before:
            w.errored[tp] = w.step()
        return result
    return maybe_bounce


@probe(RETRY_ERRORS, "delivery_timeout_error")
def _timeout_names_the_last_error(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def delivery_timeout_error(self: Any, tp: Any, cause: Any, *args: Any, **kwargs: Any) -> Any:
        if cause is None and self.abort is None and tp in self.last and \
                w.delivered.get(tp, -1) > w.errored.get(tp, -1):
            w.violate("T1 stale last error", (
                f"partition {tp.partition}: a delivery timeout names {self.last[tp]!r} as "
                "its last error, and the partition was acknowledged since"))
        return orig(self, tp, cause, *args, **kwargs)
    return delivery_timeout_error


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

@probe(ACC, "unsend")
def _acc_unsend(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def unsend(self: Any, taken: Any) -> Any:
        # Drained but never written (its wait for a request slot ended first): not an
        # attempt (R1), so the drain's count of it is taken back.
        attempts = w.attempts
        for batch in taken.values():
            for m in batch.messages:
                seen = attempts.get(id(m))
                if seen is not None and seen[0] is m:
                    attempts[id(m)] = (m, seen[1] - 1)
        return orig(self, taken)
    return unsend


@probe(ACC, "drain")
def _acc_drain(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def drain(self: Any) -> Any:
        idem = self._idem
        # (a new epoch is awaited from the moment it is requested until it starts)
        if idem is not None and (idem.paused or idem._bump_requested.is_set()):
            w.violate("G4 sealed while paused", "the accumulator drained batches while "
                      "sealing was paused for a new epoch")
        in_flight = {tp: part.in_flight for tp, part in self.parts.items()}
        retrying = {tp for tp, part in self.parts.items() if part.retrying is not None}
        if self._config.batch_bytes > self._batch_cap and any(
                part.nbytes > self._batch_cap for part in self.parts.values()):
            w.reach("batch-capped-at-max-message-bytes")
        taken = orig(self)
        attempts = w.attempts
        for batch in taken.values():
            for m in batch.messages:
                seen = attempts.get(id(m))
                attempts[id(m)] = (m, seen[1] + 1 if seen is not None and seen[0] is m else 1)
        txn = self._txn
        for tp, batch in taken.items():
            if tp in retrying:
                w.violate("G3 muting", (
                    f"partition {tp.partition}: a batch drained while the partition is "
                    "retrying (a failed batch of it waits to go back): it could overtake"))
            if txn is not None and txn.version < 2 and tp not in txn.added:
                w.violate("G17 partition not added", (
                    f"partition {tp.partition}: a transactional batch drained before "
                    "AddPartitionsToTxn added its partition (transaction version 1: the "
                    "broker refuses it, and the transaction must abort)"))
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
                    w.sequences[key] = max(expected, batch.base_sequence + records_in(batch))
        return taken
    return drain


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



def _ready(acc: Any, now: float) -> bool:
    """Whether a request is due (the rule, stated apart from ``Accumulator.ready``): a
    sendable partition with a batch sealed for a re-send, or with loose records that
    fill a batch (``batch_bytes``, ``max_batch_messages``), or whose linger is over, or
    while a flush runs; nothing while a new epoch is awaited."""
    if acc._idem is not None and acc._idem.paused:
        return False
    config = acc._config
    for tp, part in acc.parts.items():
        if not acc.sendable(part, tp):
            continue
        if part.sealed or (part.msgs and (
                acc._flush.depth > 0 or part.nbytes >= acc._batch_cap
                or len(part.msgs) >= config.max_batch_messages
                # (over by more than a rounding: the start is a subtraction)
                or now >= linger_start(acc, part) + acc._linger_due + EPS)):
            return True
    return False


def linger_start(acc: Any, part: Any) -> float:
    """When the linger of a partition's loose records began, by the accumulator's
    promise rather than its ``first_at``: when ``send()`` accepted the oldest of them
    (its deadline less ``delivery_timeout``; the hops to the accumulator count in it)."""
    return float(part.msgs[0]._deadline - acc._config.delivery_timeout)


def _bp_due(bp: Any, slot_free: bool) -> float:
    """When a broker producer's flusher must wake at the latest."""
    due = math.inf
    acc = bp._acc
    for tp, part in bp._parts.items():
        for unit in (*part.msgs[:1], *part.sealed, *part.failed):
            due = min(due, unit._deadline)
        if slot_free and part.msgs and acc.sendable(part, tp):
            due = min(due, linger_start(acc, part) + acc._linger_due)
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
        was_set = self._wake_flusher.is_set()
        result = orig(self)
        until = self._flusher_until
        if until is not None and not was_set and self._wake_flusher.is_set():
            now = trio.current_time()
            slot_free = len(self._in_flight) < self._config.max_in_flight
            paused = self._idem is not None and self._idem.paused
            due = _bp_due(self, slot_free and not paused)
            if not (slot_free and _ready(self._acc, now)) and due > until + EPS:
                w.violate("G9 needless wake-up", (
                    f"broker {self.node_id}: the flusher, asleep until {until:.4f}, was woken "
                    f"with nothing ready and nothing due before {due:.4f}"))
        if until is not None and not self._wake_flusher.is_set():
            now = trio.current_time()
            slot_free = len(self._in_flight) < self._config.max_in_flight
            paused = self._idem is not None and self._idem.paused
            if slot_free and _ready(self._acc, now):
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


def _left_retrying(bp: Any, tp: Any, part: Any) -> bool:
    """``part`` stays retrying at ``bp`` with nothing left there, and its partition
    producer, still attached, was told nothing: no chaser is coming, and the partition's
    next message would go back once for nothing."""
    if part.retrying is None or part.in_flight or part.failed or part.sealed or part.msgs:
        return False
    pp = bp._sinks.retry_sink(tp)
    return bool(pp.bp is bp and not pp._reroute and not pp._retries)


@probe(BP, "_settled")
def _bp_settled(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def settled(self: Any, tp: Any) -> Any:
        result = orig(self, tp)
        if _left_retrying(self, tp, self._parts[tp]):
            w.violate("G13 retry state left behind", (
                f"broker {self.node_id}, partition {tp.partition}: everything failed "
                "here, and the partition stays retrying with no chaser on its way "
                "(neither ended here nor reported with leader_changed)"))
        return result
    return settled


@probe(CLUSTER, "connection")
def _cluster_connection(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    from pipeline.cluster.errors import KafkaError

    async def connection(self: Any, node_id: int) -> Any:
        try:
            return await orig(self, node_id)
        except KafkaError:
            w.unreachable.add((id(trio.lowlevel.current_task()), node_id))
            raise
    return connection


@probe(BP, "_send_one")
def _bp_send_one(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    async def send_one(self: Any) -> Any:
        key = (id(trio.lowlevel.current_task()), self.node_id)
        w.unreachable.discard(key)
        result = await orig(self)
        if key not in w.unreachable:
            return result
        w.unreachable.discard(key)
        # The broker is unreachable: what could go to it went back to its partition
        # producers (which find the leader again), and a partition left with nothing,
        # retrying, had its partition producer told to leave.
        for tp, part in self._parts.items():
            if (part.msgs or part.sealed) and self._acc.sendable(part, tp):
                w.violate("G19 unreachable broker", (
                    f"broker {self.node_id} could not be reached and kept what partition "
                    f"{tp.partition} could send there instead of sending it back"))
            elif _left_retrying(self, tp, part):
                w.violate("G19 unreachable broker", (
                    f"broker {self.node_id} could not be reached: partition "
                    f"{tp.partition} is left retrying with nothing, and its partition "
                    "producer was not told to leave"))
        return result
    return send_one
