"""What ``statistics()`` must say: its counts against the outcomes (O4) and its gauges
while the run goes on (O9)."""

from __future__ import annotations

from collections import Counter

from .checker import Violation, invariant
from .trace import Trace

# A record batch's fixed overhead (v2 header): a batch on the wire holds at least this.
BATCH_OVERHEAD = 61


@invariant
def _counts(trace: Trace) -> list[Violation]:
    """O4: the ledger counts what the messages report (statistics() is a promise too),
    every on_delivery call that raised (``calls.raises``), and every Produce request
    the brokers received as sent."""
    if trace.crash or trace.counted == (0, 0, 0, 0):
        return []
    ok = sum(m.ok for m in trace.messages)
    failed = sum(not m.ok and not m.pending for m in trace.messages)
    seen = (len(trace.messages), ok, failed)
    out: list[Violation] = []
    if trace.counted[:3] != seen:
        out.append(Violation("O4 statistics", f"statistics() counts accepted, succeeded, failed "
                             f"= {trace.counted[:3]}; the messages report {seen}"))
    counted, started = trace.idem_counts, trace.epochs_started
    if counted is not None and counted != started:
        out.append(Violation("O4 statistics", f"idempotence counts {counted[0]} epochs bumped and "
                             f"{counted[1]} new producer ids; {started[0]} and {started[1]} "
                             "started"))
    if trace.callback_errors != trace.callbacks_raised:
        out.append(Violation("O4 statistics", f"statistics() counts {trace.callback_errors} "
                             f"on_delivery callbacks that raised; {trace.callbacks_raised} "
                             "did"))
    if trace.produce_written >= 0 and trace.counted[3] != trace.produce_written:
        out.append(Violation("O4 statistics", f"statistics() counts {trace.counted[3]} Produce "
                             f"requests written; the connections wrote {trace.produce_written}"))
    if trace.counted[3] < len(trace.produce_requests):
        out.append(Violation("O4 statistics", f"statistics() counts {trace.counted[3]} requests "
                             f"sent; the brokers received {len(trace.produce_requests)}"))
    return out


@invariant
def _partition_counts(trace: Trace) -> list[Violation]:
    """O4, per partition: after the close, each partition's ``failed_messages`` and
    ``delivered_messages`` are the records that failed and were acknowledged there
    (partition -1: records that failed before one was chosen)."""
    if trace.crash or not trace.partition_counts:
        return []
    seen: dict[int, list[int]] = {}
    for m in trace.messages:
        if m.pending:
            continue
        p = -1 if m.partition is None else m.partition
        seen.setdefault(p, [0, 0])[0 if not m.ok else 1] += 1
    out: list[Violation] = []
    for p in sorted(set(seen) | set(trace.partition_counts)):
        counted = trace.partition_counts.get(p, (0, 0))
        if counted != tuple(seen.get(p, (0, 0))):
            out.append(Violation("O4 statistics", f"partition {p}: statistics() counts "
                                 f"{counted[0]} failed and {counted[1]} delivered records; "
                                 f"the outcomes say {seen.get(p, [0, 0])}"))
    return out[:2]


@invariant
def _wire_counts(trace: Trace) -> list[Violation]:
    """O4, against the wire: per partition, after the close, ``delivered_bytes`` is the
    size bounds of the records acknowledged there; ``batches`` (sealed) at least the
    distinct batches the brokers received (in a run without KIP-126 splits or
    columnar rows, whose halves are not sealed); ``retries`` and ``retried_messages``
    at least the batches, and their records, the brokers received again (a retry the
    brokers never received counts too)."""
    if trace.crash or not trace.wire_counts:
        return []
    bounds = trace.size_bounds
    delivered: dict[int, int] = {}
    for m in trace.messages:
        if m.ok and m.partition is not None and not m.row and m.index in bounds:
            delivered[m.partition] = delivered.get(m.partition, 0) + bounds[m.index]
    received: dict[int, Counter[tuple[bytes, bytes, int]]] = {}
    for _, parts in trace.received():
        for p, _, values in parts:
            seen = received.setdefault(p, Counter())
            if values:
                seen[values[0], values[-1], len(values)] += 1
    rows = {m.partition for m in trace.messages if m.row or m.index in trace.columnar}
    # (a split's halves are not sealed, and a columnar run's rows may be split too)
    whole = not rows and not any(m.splits for m in trace.messages)
    for p, (batches, retries, retried, delivered_bytes) in sorted(trace.wire_counts.items()):
        seen = received.get(p, Counter())
        again = sum(n - 1 for n in seen.values())
        again_records = sum((n - 1) * key[2] for key, n in seen.items())
        if p not in rows and delivered_bytes != delivered.get(p, 0):
            return [Violation("O4 statistics", f"partition {p}: statistics() counts "
                              f"{delivered_bytes} bytes delivered; the records acknowledged "
                              f"there are {delivered.get(p, 0)}")]
        if whole and batches < len(seen):
            return [Violation("O4 statistics", f"partition {p}: statistics() counts {batches} "
                              f"batches sealed; the brokers received {len(seen)}")]
        if retries < again or retried < again_records:
            return [Violation("O4 statistics", f"partition {p}: statistics() counts {retries} "
                              f"retries of {retried} records; the brokers received {again} "
                              f"batches of {again_records} records again")]
    return []


@invariant
def _gauges(trace: Trace) -> list[Violation]:
    """O9: at every reading while the run goes on, no gauge is negative; each batch in
    flight holds a record and a batch's overhead at least; queued records hold a byte
    each at least; the records queued or in flight are no more than those not settled
    yet, and exactly those, with their bytes, when nothing is between the stages
    (``at_rest``, ``runner._at_rest``: the partition and broker stages hold them all);
    and no broker producer has more than ``max_in_flight`` requests on the wire."""
    out: list[Violation] = []
    most = trace.schedule.option("max_in_flight")
    for g in trace.gauges:
        if g.requests > most:
            out.append(Violation("O9 gauges", f"at {g.at:.4f}: a broker producer had "
                                 f"{g.requests} requests on the wire; max_in_flight={most}"))
            return out
        waiting = waiting_bytes = 0
        for p, (queued, queued_bytes, batches, flying, flying_bytes) in sorted(
                g.partitions.items()):
            waiting_bytes += queued_bytes + flying_bytes
            if min(queued, queued_bytes, batches, flying, flying_bytes) < 0 or \
                    flying < batches or flying_bytes < BATCH_OVERHEAD * batches or \
                    queued_bytes < queued or (batches == 0 and (flying or flying_bytes)):
                out.append(Violation("O9 gauges", f"at {g.at:.4f}, partition {p}: queued "
                                     f"{queued} ({queued_bytes} bytes), in flight {batches} "
                                     f"batches of {flying} records ({flying_bytes} bytes)"))
                return out
            waiting += queued + flying
        if g.at_rest and g.outstanding_bytes >= 0 and waiting_bytes != g.outstanding_bytes:
            out.append(Violation("O9 gauges", f"at {g.at:.4f}: {waiting_bytes} bytes queued or "
                                 f"in flight, {g.outstanding_bytes} in the records not settled "
                                 "(nothing between the stages)"))
            return out
        if waiting > g.unsettled or (g.at_rest and waiting != g.unsettled):
            out.append(Violation("O9 gauges", f"at {g.at:.4f}: {waiting} records queued or in "
                                 f"flight, {g.unsettled} not settled"
                                 f"{' (nothing between the stages)' if g.at_rest else ''}"))
            return out
    return out


@invariant
def _handed_over(trace: Trace) -> list[Violation]:
    """O5, at the close: every ``producer.input`` outcome that should come out of
    ``producer.successes`` or ``errors`` and never did was one the close could not
    hand over, and counted in its warning ("N outcomes could not be handed over")."""
    if trace.crash or trace.lost_reports < 0:
        return []
    s = trace.schedule
    missing = sum(1 for m in trace.messages if m.reported == (0, 0) and not m.pending
                  and (not m.ok or s.option("return_successes")))
    if missing != trace.lost_reports:
        return [Violation("O5 reports", f"{missing} producer.input outcomes never came out of "
                          f"producer.successes/errors; the close counted {trace.lost_reports} "
                          "not handed over")]
    return []
