"""The verdict on one run: the client's reported outcomes against the log, read by an
independent reader (confluent-kafka's consumer, ``assign()`` mode, CRC checks on) on the
brokers' INTERNAL listeners (never through a fault proxy), from offset 0 up to each
partition's high watermark once every node is back.

Counted (``Verdict``):

* ``delivered`` / ``failed`` / ``stuck``: accepted messages acknowledged, failed, or with
  no outcome at all after close; ``multi``: second outcomes (a message reported twice);
* ``lost``: acknowledged, yet not in the log; ``misplaced``: acknowledged and in the log,
  but not at the partition (or offset, when the client reported one) it was acknowledged at
  (any copy's offset counts: a non-idempotent retry is acknowledged at its own copy);
* ``duplicated``: extra copies of a message in the log (acknowledged or not);
* ``reordered``: records whose seq is below an earlier record's in the same partition
  (per-partition order must be strictly increasing: every key stays on one partition,
  and a client sends in seq order);
* ``failed_written``: failed messages that are in the log anyway (their fate was unknown:
  allowed, reported for information);
* ``foreign``: records that do not belong to this run (must be 0).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

OK, FAILED, REFUSED, PENDING = 1, 2, 3, 0


@dataclass
class Verdict:
    client: str
    seed: int
    family: str
    accepted: int = 0
    delivered: int = 0
    failed: int = 0
    stuck: int = 0
    refused: int = 0
    multi: int = 0
    lost: int = 0
    misplaced: int = 0
    duplicated: int = 0
    reordered: int = 0
    failed_written: int = 0
    foreign: int = 0
    in_log: int = 0
    close_s: float | None = None
    recover_s: float | None = None
    post_heal_failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    first_error: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_log(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0
             ) -> dict[int, list[tuple[int, bytes]]]:
    """``{partition: [(offset, value), ...]}`` from offset 0 to the high watermark."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"chaos-judge-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        "check.crcs": True,
        "isolation.level": "read_uncommitted",
    })
    try:
        highs = {}
        for p in range(partitions):
            _, high = consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, p), timeout=15)
            highs[p] = high
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        todo = {p for p in range(partitions) if highs[p] > 0}
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                if msg.error() is not None:
                    raise RuntimeError(f"the reader failed: {msg.error()}")
                p, offset = msg.partition(), msg.offset()
                if p in todo and offset < highs[p]:
                    out[p].append((offset, msg.value()))
                    if offset == highs[p] - 1:
                        todo.discard(p)
        if todo:
            raise RuntimeError(f"the reader did not reach the high watermark of partitions "
                               f"{sorted(todo)} within {timeout:.0f}s: {highs}")
        for records in out.values():
            records.sort()
        return out
    finally:
        consumer.close()


def judge(verdict: Verdict, report: Mapping[str, Any], log: Mapping[int, list[tuple[int, bytes]]],
          run_id: int) -> Verdict:
    """Fill ``verdict`` from the worker's ``report`` and the ``log``; returns it."""
    status = bytes.fromhex(report["status"])
    partition, offset = report["partition"], report["offset"]
    verdict.accepted = sum(1 for s in status if s != REFUSED)
    verdict.refused = len(status) - verdict.accepted
    verdict.delivered = status.count(OK)
    verdict.failed = status.count(FAILED)
    verdict.stuck = status.count(PENDING)
    verdict.multi = int(report.get("multi", 0))
    verdict.errors = dict(report.get("errors", {}))
    verdict.first_error = dict(report.get("first_error", {}))
    verdict.extra = dict(report.get("extra", {}))
    if report.get("error"):
        verdict.extra["worker_error"] = report["error"]
    verdict.close_s = report.get("close_s")
    verdict.recover_s = report.get("recover_s")
    heal_seq = report.get("heal_seq")
    if heal_seq is not None:
        verdict.post_heal_failed = status[heal_seq:].count(FAILED)

    where: dict[int, tuple[int, int]] = {}  # seq -> (partition, offset) of its first copy
    # seq -> offsets of its later copies: without idempotence the acknowledgement of a
    # retry carries the offset of the copy it wrote, not of the first.
    later: dict[int, list[int]] = {}
    for p, records in log.items():
        last = -1
        for off, value in records:
            verdict.in_log += 1
            try:
                run, seq_text, _ = value.split(b":", 2)
                run_ok, seq = int(run) == run_id, int(seq_text)
            except ValueError:
                run_ok, seq = False, -1
            if not run_ok or not 0 <= seq < len(status):
                verdict.foreign += 1
                continue
            if seq in where:
                verdict.duplicated += 1
                later.setdefault(seq, []).append(off)
                continue
            where[seq] = (p, off)
            if seq < last:
                verdict.reordered += 1
            last = max(last, seq)
    for seq, s in enumerate(status):
        if s == OK:
            found = where.get(seq)
            if found is None:
                verdict.lost += 1
            elif found[0] != partition[seq] or (
                    offset[seq] >= 0 and offset[seq] not in (found[1], *later.get(seq, ()))):
                verdict.misplaced += 1
        elif s == FAILED and seq in where:
            verdict.failed_written += 1
        elif s == REFUSED and seq in where:
            verdict.foreign += 1  # never accepted, yet written
    return verdict


def check(verdict: Verdict, *, close_bound: float, recover_bound: float,
          idempotent: bool = True) -> list[str]:
    """The invariants; returns (and stores) the violations, empty when all hold.

    Without idempotence (the ``pipeline-nonidem`` control) a retry after a lost response
    writes the batch again: duplicates are expected there and reported, not violations;
    every other invariant (the first copies in send order included) still holds."""
    v = verdict
    out = []
    for name in ("lost", "misplaced", "duplicated", "reordered", "stuck", "multi", "foreign"):
        if name == "duplicated" and not idempotent:
            continue
        if getattr(v, name):
            out.append(f"{name}={getattr(v, name)}")
    if v.close_s is None or v.close_s < 0:
        out.append("close did not return")
    elif v.extra.get("stop_timed_out"):
        out.append(f"close had not returned after {v.close_s:.1f}s: cancelled")
    elif v.close_s > close_bound:
        out.append(f"close took {v.close_s:.1f}s > {close_bound:g}s")
    if v.recover_s is None:
        out.append("no message sent after the heal was acknowledged")
    elif v.recover_s > recover_bound:
        out.append(f"first post-heal acknowledgement after {v.recover_s:.1f}s > "
                   f"{recover_bound:g}s")
    if "worker_error" in v.extra:
        out.append(f"worker error: {v.extra['worker_error']}")
    v.violations = out
    return out
