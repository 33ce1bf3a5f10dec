"""The invariants on where records go: P1 (each record where its partition, key and
partitioner send it, ``routing.route``) and K1 (keyless records spread as Kafka's sticky
partitioner spreads them)."""

from __future__ import annotations

from .calls import bound_of
from .checker import Violation, invariant
from .routing import OUT_OF_RANGE, ROUTING_ERRORS, route
from .trace import Trace


@invariant
def _routing(trace: Trace) -> list[Violation]:
    """P1: every record goes where its partition, key and partitioner say (`route`):
    a pinned one to that partition, a keyed one to its key's partition (murmur2 for
    the default partitioner, as Kafka's; the custom one's choice), and nowhere when
    the topic has no such partition or the partitioner failed on it: then it fails
    with that error (``PartitionOutOfRangeError`` naming the partitions the topic
    has; the partitioner's own exception; the producer's ValueError for a partition
    the partitioner named that the topic does not have), and no other record does."""
    s = trace.schedule
    if trace.crash:
        return []
    out: list[Violation] = []
    written = {value: p for p, values in trace.logs.items() for value in values}
    for m in trace.messages:
        if m.index >= len(s.sends):
            continue
        send = s.sends[m.index]
        want = route(s.partitioner, s.partitions, send.partition, send.key, m.value)
        what = f"{'row' if m.row else 'message'} #{m.index}"
        if isinstance(want, str):
            if m.ok or m.value in written:
                out.append(Violation("P1 routing", f"{what} was written (partition "
                                     f"{written.get(m.value, m.partition)}); it must fail with "
                                     f"{want}"))
            elif m.cause.startswith(ROUTING_ERRORS) and not m.cause.startswith(want):
                out.append(Violation("P1 routing", f"{what} failed with {m.cause[:120]}; "
                                     f"want {want}"))
            elif want == OUT_OF_RANGE and m.cause.startswith(want) and \
                    f"(0..{s.partitions - 1})" not in m.cause:
                out.append(Violation("P1 routing", f"{what}: {m.cause[:160]} does not name the "
                                     f"topic's partitions (0..{s.partitions - 1})"))
            continue
        if m.cause.startswith(ROUTING_ERRORS):
            out.append(Violation("P1 routing", f"{what} (partition {send.partition}, key "
                                 f"{send.key}) failed with {m.cause[:120]}"))
        elif want is not None and ((m.ok and m.partition != want)
                                   or written.get(m.value, want) != want):
            out.append(Violation("P1 routing", f"{what} (key {send.key}, partition "
                                 f"{send.partition}) went to partition "
                                 f"{written.get(m.value, m.partition)}; it belongs to {want}"))
        if len(out) >= 3:
            break
    return out


@invariant
def _sticky_spread(trace: Trace) -> list[Violation]:
    """K1: keyless records spread as Kafka's sticky partitioner spreads them
    (KIP-480/794, the Java client's ``BuiltInPartitioner``): the default
    partitioner gives the records with neither key nor partition to one
    partition until ``batch_bytes`` of them (their ``send()`` size bounds) went
    there, the record that reaches it included, then moves to another one.

    With the default partitioner, judged on the per-message path (not rows of a
    columnar burst or a ``send_batch()``, nor a ``send_many()``'s messages on its
    columnar path, which move on per full batch of rows);
    a user's partitioner is asked per record on both paths, so its rows are judged
    too (`ExplorerPartitioner` is sticky in the same way): in acceptance order,
    within each stretch of such messages no keyless row interrupts, every run of
    one partition holds less than ``batch_bytes`` before its last record, and a
    run followed by another holds at least ``batch_bytes``. (The first run of a
    stretch may continue bytes counted before it: only its upper bound holds.)"""
    s = trace.schedule
    if s.partitions < 2 or trace.crash or s.partitioner == "murmur2":  # (P1 places those)
        return []
    batch_bytes = s.option("batch_bytes")
    stretches: list[list[tuple[int, int, int]]] = [[]]  # (partition, size, index)
    for m in sorted(trace.messages, key=lambda m: m.id):
        send = s.sends[m.index] if m.index < len(s.sends) else None
        if send is None or send.key is not None or send.partition is not None:
            continue
        if (m.row or m.index in trace.columnar) and s.partitioner == "default":
            if stretches[-1]:
                stretches.append([])
            continue
        if m.partition is None or m.cause.startswith(ROUTING_ERRORS):
            continue  # never routed, or refused by the partitioner: no bytes counted
        stretches[-1].append((m.partition, bound_of(send, m.index), m.index))
    out: list[Violation] = []
    for stretch in stretches:
        runs: list[list[tuple[int, int, int]]] = []
        for item in stretch:
            if runs and runs[-1][0][0] == item[0]:
                runs[-1].append(item)
            else:
                runs.append([item])
        for k, run in enumerate(runs):
            before_last = sum(size for _, size, _ in run[:-1])
            if before_last >= batch_bytes:
                out.append(Violation("K1 sticky", f"{len(run)} keyless messages in a row "
                                     f"(#{run[0][2]}..#{run[-1][2]}) went to partition "
                                     f"{run[0][0]}: {before_last} bytes before the last, "
                                     f"batch_bytes={batch_bytes}"))
            elif 0 < k < len(runs) - 1 and before_last + run[-1][1] < batch_bytes:
                out.append(Violation("K1 sticky", f"keyless messages #{run[0][2]}..#{run[-1][2]} "
                                     f"({before_last + run[-1][1]} bytes) went to partition "
                                     f"{run[0][0]}, then the next to {runs[k + 1][0][0]}: "
                                     f"moved on before batch_bytes={batch_bytes}"))
            if out:
                return out
    return out
