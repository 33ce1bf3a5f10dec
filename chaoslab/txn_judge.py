"""The verdict on a transactional run: the client's reported transaction outcomes against
what a ``read_committed`` reader sees (confluent-kafka's consumer on the INTERNAL
listeners, once every partition is stable: its last stable offset at its high
watermark, so no transaction is still open).

Each record's value names its run, its seq and the attempt that wrote it
(``chaoslab.txn_worker``). Counted (``TxnVerdict``):

* ``attempts`` / ``committed`` / ``aborted`` / ``unknown`` / ``open``: the outcomes the
  client reported (``open``: none at all after the close);
* ``partial``: attempts visible in part (a transaction is whole or absent);
* ``twice``: messages visible more than once (a batch committed by two attempts, or an
  aborted attempt visible beside its redo);
* ``committed_missing``: attempts reported committed that are not whole;
* ``aborted_visible``: attempts reported aborted with any record visible;
* ``reordered``: visible records whose seq is below an earlier one in the partition
  (batches commit in order, each partition's share of a batch in send order);
* ``foreign``: visible records of no attempt the client reported, or outside its batch;
* ``unknown_visible``: attempts of unknown outcome found whole (allowed: it may have
  committed; reported for information), ``written_aborted``: records in the log that
  read_committed hides (aborted transactions: the faults made the clients abort).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

__all__ = ["TxnVerdict", "check_txn", "judge_txn", "read_records", "wait_stable"]

COMMITTED, ABORTED, UNKNOWN, OPEN = "committed", "aborted", "unknown", "open"

Log = dict[int, list[tuple[int, bytes]]]


@dataclass
class TxnVerdict:
    client: str
    seed: int
    family: str
    attempts: int = 0
    committed: int = 0
    aborted: int = 0
    unknown: int = 0
    open: int = 0
    msgs_committed: int = 0
    visible: int = 0
    partial: int = 0
    twice: int = 0
    committed_missing: int = 0
    aborted_visible: int = 0
    reordered: int = 0
    foreign: int = 0
    unknown_visible: int = 0
    written_aborted: int = 0
    close_s: float | None = None
    stop_s: float | None = None
    recover_s: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    first_error: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"transactional": True, **asdict(self)}


def wait_stable(bootstrap: str, topic: str, timeout: float) -> bool:
    """Wait until every partition's last stable offset is its high watermark (every
    transaction ended, its markers written); False if not within ``timeout``."""
    from pipeline.consumer import topic_offsets

    deadline = time.monotonic() + timeout
    while True:
        committed = trio.run(functools.partial(topic_offsets, bootstrap, topic,
                                               isolation_level="read_committed"))
        if committed == trio.run(topic_offsets, bootstrap, topic):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def read_records(bootstrap: str, topic: str, partitions: int, isolation: str,
                 timeout: float = 60.0) -> Log:
    """``{partition: [(offset, value), ...]}`` as confluent-kafka reads at
    ``isolation``, from offset 0 to each partition's end (control records are never
    handed out, so the end is the consumer's end-of-partition event)."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"chaos-txn-judge-{time.monotonic_ns()}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "enable.partition.eof": True, "check.crcs": True, "isolation.level": isolation,
    })
    try:
        out: Log = {p: [] for p in range(partitions)}
        todo = set(range(partitions))
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        todo.discard(msg.partition())
                        continue
                    raise RuntimeError(f"the reader failed: {err}")
                partition, offset, value = msg.partition(), msg.offset(), msg.value()
                if partition is None or offset is None or value is None:
                    raise RuntimeError(f"the reader handed out a record without a place or value: {msg}")
                out[partition].append((offset, value))
        if todo:
            raise RuntimeError(f"the {isolation} reader did not reach the end of partitions "
                               f"{sorted(todo)} within {timeout:.0f}s")
        for records in out.values():
            records.sort()
        return out
    finally:
        consumer.close()


def _parse(value: bytes, run_id: int) -> tuple[int, int] | None:
    """(seq, attempt) of a record of this run, or None."""
    try:
        run, seq, attempt, _ = value.split(b":", 3)
        if int(run) != run_id:
            return None
        return int(seq), int(attempt)
    except ValueError:
        return None


def judge_txn(verdict: TxnVerdict, report: Mapping[str, Any], committed: Log,
              everything: Log, run_id: int) -> TxnVerdict:
    """Fill ``verdict`` from the worker's ``report`` and the two reads of the log."""
    v = verdict
    txns = {int(row[0]): row for row in report.get("txns", [])}
    outcomes = Counter(row[4] for row in txns.values())
    v.attempts = len(txns)
    v.committed, v.aborted = outcomes[COMMITTED], outcomes[ABORTED]
    v.unknown, v.open = outcomes[UNKNOWN], outcomes[OPEN]
    v.msgs_committed = sum(int(row[3]) for row in txns.values() if row[4] == COMMITTED)
    v.errors = dict(report.get("errors", {}))
    v.first_error = dict(report.get("first_error", {}))
    v.extra = dict(report.get("extra", {}))
    if report.get("error"):
        v.extra["worker_error"] = report["error"]
    v.close_s, v.stop_s = report.get("close_s"), report.get("stop_s")
    v.recover_s = report.get("recover_s")

    seen_by_attempt: dict[int, set[int]] = {}
    copies: Counter[int] = Counter()
    for records in committed.values():
        last = -1
        for _, value in records:
            v.visible += 1
            parsed = _parse(value, run_id)
            row = txns.get(parsed[1]) if parsed is not None else None
            if parsed is None or row is None or not (
                    int(row[2]) <= parsed[0] < int(row[2]) + int(row[3])):
                v.foreign += 1
                continue
            seq, attempt = parsed
            seen_by_attempt.setdefault(attempt, set()).add(seq)
            copies[seq] += 1
            if seq < last:
                v.reordered += 1
            last = max(last, seq)
    v.twice = sum(n - 1 for n in copies.values() if n > 1)
    for attempt, row in txns.items():
        seen = len(seen_by_attempt.get(attempt, ()))
        whole = seen == int(row[3])
        if seen and not whole:
            v.partial += 1
        if row[4] == COMMITTED and not whole:
            v.committed_missing += 1
        elif row[4] == ABORTED and seen:
            v.aborted_visible += 1
        elif row[4] == UNKNOWN and whole:
            v.unknown_visible += 1
    visible_at = {(p, off) for p, records in committed.items() for off, _ in records}
    v.written_aborted = sum(1 for p, records in everything.items() for off, value in records
                            if (p, off) not in visible_at and _parse(value, run_id) is not None)
    return v


def check_txn(verdict: TxnVerdict, *, close_bound: float, recover_bound: float) -> list[str]:
    """The invariants; returns (and stores) the violations, empty when all hold."""
    v = verdict
    out = [f"{name}={getattr(v, name)}"
           for name in ("partial", "twice", "committed_missing", "aborted_visible",
                        "reordered", "foreign", "open") if getattr(v, name)]
    if not v.committed:
        out.append("no transaction committed")
    if v.close_s is None or v.close_s < 0:
        out.append("close did not return")
    elif v.close_s > close_bound:
        out.append(f"close took {v.close_s:.1f}s > {close_bound:g}s")
    if v.recover_s is None:
        out.append("no transaction begun after the heal committed")
    elif v.recover_s > recover_bound:
        out.append(f"first post-heal commit after {v.recover_s:.1f}s > {recover_bound:g}s")
    if "worker_error" in v.extra:
        out.append(f"worker error: {v.extra['worker_error']}")
    if "unstable" in v.extra:
        out.append(f"log not stable: {v.extra['unstable']}")
    v.violations = out
    return out
