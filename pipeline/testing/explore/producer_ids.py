"""What an idempotent producer asks InitProducerId for, and how it retries it (P2)."""

from __future__ import annotations

import math
from bisect import bisect_right

from .checker import Violation, invariant
from .probes_partition import shortest_backoff
from .trace import Trace

EPS = 1e-9


@invariant
def _init_producer_id(trace: Trace) -> list[Violation]:
    """P2: every InitProducerId of an idempotent producer asks for a new producer id
    (no transactional id, producer id and epoch -1) with ``delivery_timeout`` as its
    transaction timeout; every id granted in time before the close is taken (the first,
    then one per recovery with a new id); and after an InitProducerId the broker answered with an error,
    the next one waits at least the shortest retry backoff of that attempt (the
    failures answered in a row so far, at least: ``retry_backoff`` doubled per
    attempt, less the jitter)."""
    s = trace.schedule
    if not s.idempotent or trace.crash:
        return []
    timeout_ms = int(s.option("delivery_timeout") * 1000)
    for _, request in trace.init_requests:
        asked = (request.transactional_id, request.producer_id, request.producer_epoch,
                 request.transaction_timeout_ms)
        if asked != (None, -1, -1, timeout_ms):
            return [Violation("P2 InitProducerId", f"asked (transactional id, producer id, "
                              f"epoch, timeout ms) = {asked}; a new id is (None, -1, -1, "
                              f"{timeout_ms})")]
    arrivals = [at for at, _ in trace.init_requests]
    if trace.idem_counts is not None:
        request_timeout = s.option("request_timeout")
        # (an answer written after the request timed out is one the producer ignored)
        closing = trace.close_start if trace.close_start >= 0 else math.inf
        granted = sum(1 for at, code in trace.init_answers if code == 0 and at < closing and
                      at - arrivals[bisect_right(arrivals, at + EPS) - 1] < request_timeout - EPS)
        if granted > 1 + trace.idem_counts[1]:
            return [Violation("P2 InitProducerId", f"{granted} InitProducerId answers granted "
                              f"a producer id in time; the producer took "
                              f"{1 + trace.idem_counts[1]} (its first and each new one)")]
    failed_in_a_row = 0
    for at, code in trace.init_answers:
        if code == 0:
            failed_in_a_row = 0
            continue
        failed_in_a_row += 1
        # (one at a time: the request answered is the last one in by then)
        after = bisect_right(arrivals, at + EPS)
        if after >= len(arrivals):
            continue
        backoff = shortest_backoff(s.option("retry_backoff"), s.option("retry_backoff_max"),
                                   s.option("retry_backoff_jitter"), failed_in_a_row)
        if arrivals[after] < at + backoff - EPS:
            return [Violation("P2 InitProducerId backoff", f"InitProducerId answered with "
                              f"error {code} at {at:.4f} ({failed_in_a_row} in a row) was "
                              f"asked again at {arrivals[after]:.4f}: the backoff is "
                              f"{backoff:.4f} s at least")]
    return []


@invariant
def _recovery_warnings(trace: Trace) -> list[Violation]:
    """W1: an idempotent producer says once that a recovery starts: its warnings number
    the recoveries that started (epochs bumped, new producer ids), and one more at most,
    for a recovery the close cut short. Requests for a recovery already under way join
    it without another warning."""
    s = trace.schedule
    if not s.idempotent or trace.crash or trace.recovery_warnings < 0 or s.workload != "producer":
        return []
    started = sum(trace.epochs_started)
    if not started <= trace.recovery_warnings <= started + 1:
        return [Violation("W1 recovery warnings", f"{trace.recovery_warnings} warnings that a "
                          f"recovery starts; {started} recoveries started")]
    return []
