"""Read a "workloads" run's topic back and check it record by record.

``read_back(bootstrap, topic, high_watermarks, workload, n)`` reads every partition of
``topic`` from offset 0 to its high watermark with confluent-kafka (librdkafka, an
independent reader: CRCs checked, ``assign()``, no offsets committed) and feeds each record
to ``RecordCheck``, which holds it against what the workload sends for its id
(``bench.peers.workload_record``):

- exactly ``n`` records, every id ``0..n-1`` exactly once (the id is the value's 10-digit
  field, ``bench.peers.distinct_value``);
- the value bytes, the key (None for "nokey") and the headers (none, or the two of the
  headers workloads, in order) equal what was sent for that id;
- in each partition the ids of one key increase with the offset (per-key order; the
  keyless records of a partition count as one key: one producer's records of a partition
  keep their send order), and every record of a key is in one partition.

The verdict is a JSON-ready dict: ``{"ok": True, "records": n, "seconds": s}`` or, when
something differs, ``"ok": False`` with the count of each kind of mismatch and the first
few of them spelled out. ``check_records`` is the same check over a list (no broker).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from bench.peers import make_event_values, make_keys, workload_record

MAX_SHOWN = 5  # mismatches (and missing ids) spelled out in a verdict
READ_BATCH = 10_000  # records per consume() call


class RecordCheck:
    """Checks the records of one run of ``workload`` (``n`` messages), one ``add`` per
    record in any partition order but in offset order within a partition."""

    def __init__(self, workload: str, n: int) -> None:
        self.workload = workload
        self.n = n
        self.events = make_event_values()
        self.keys = make_keys(len(self.events))
        workload_record(workload, 0, self.events, self.keys)  # an unknown workload: now
        self.records = 0
        self._seen = bytearray(n)  # 1 once the id was read: duplicates and missing ids
        # (partition, key) -> the last id read there: per-key order
        self._last: dict[tuple[int, bytes | None], int] = {}
        self._key_partition: dict[bytes, int] = {}  # a key's records stay in one partition
        self.counts: dict[str, int] = {}
        self.shown: list[str] = []

    def _mismatch(self, kind: str, text: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if len(self.shown) < MAX_SHOWN:
            self.shown.append(f"{kind}: {text}")

    def add(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
            headers: Sequence[tuple[str, bytes | None]] | None) -> None:
        self.records += 1
        field = value[6:16] if value is not None else b""
        if len(field) != 10 or not field.isdigit() or int(field) >= self.n:
            self._mismatch("no id", f"{_at(partition, offset)}: value {value!r:.60} has no "
                           f"id in 0..{self.n - 1}")
            return
        i = int(field)
        if self._seen[i]:
            self._mismatch("duplicate", f"{_at(partition, offset)}: id {i} read again")
        self._seen[i] = 1
        want_key, want_value, want_headers = workload_record(
            self.workload, i, self.events, self.keys)
        if value != want_value:
            self._mismatch("value", f"{_at(partition, offset)}: id {i} value {value!r:.60} "
                           f"!= {want_value!r:.60}")
        if key != want_key:
            self._mismatch("key", f"{_at(partition, offset)}: id {i} key {key!r} != "
                           f"{want_key!r}")
        got_headers = list(headers) if headers else None  # (no headers: None or [])
        if got_headers != want_headers:
            self._mismatch("headers", f"{_at(partition, offset)}: id {i} headers "
                           f"{got_headers!r} != {want_headers!r}")
        last = self._last.get((partition, key))
        if last is not None and last >= i:
            self._mismatch("order", f"{_at(partition, offset)}: id {i} after id {last} of "
                           f"key {key!r} in the same partition")
        self._last[partition, key] = i
        if key is not None:
            home = self._key_partition.setdefault(key, partition)
            if home != partition:
                self._mismatch("key partition", f"{_at(partition, offset)}: key {key!r} "
                               f"also in partition {home}")

    def verdict(self) -> dict[str, Any]:
        missing = self.n - self._seen.count(1)
        out: dict[str, Any] = {"ok": self.records == self.n and not missing and not self.counts,
                               "records": self.records, "expected": self.n}
        if missing:
            out["missing"] = missing
            out["first_missing"] = [i for i in range(self.n) if not self._seen[i]][:MAX_SHOWN]
        if self.counts:
            out["mismatches"] = dict(self.counts)
            out["first_mismatches"] = list(self.shown)
        return out


def _at(partition: int, offset: int) -> str:
    return f"partition {partition} offset {offset}"


def check_records(workload: str, n: int, records: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """``RecordCheck``'s verdict over ``records``: ``(partition, offset, key, value,
    headers)`` each, as confluent-kafka's ``Message`` gives them, per partition in offset
    order."""
    check = RecordCheck(workload, n)
    for partition, offset, key, value, headers in records:
        check.add(partition, offset, key, value, headers)
    return check.verdict()


def read_back(bootstrap: str, topic: str, high_watermarks: Sequence[int], workload: str,
              n: int, timeout: float | None = None) -> dict[str, Any]:
    """Read ``topic`` (partition ``p`` up to ``high_watermarks[p]``) and check it; the
    verdict carries ``seconds`` (reading and checking). Gives up after ``timeout``
    seconds (default 30 + 1 s per 10k records) with ``"ok": False`` and ``"error"``."""
    import confluent_kafka

    started = time.perf_counter()
    timeout = 30 + n / 10_000 if timeout is None else timeout
    deadline = time.monotonic() + timeout
    check = RecordCheck(workload, n)
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-readback-{time.monotonic_ns()}",  # never joined nor committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_uncommitted",
        "enable.partition.eof": False,
        "check.crcs": True,
        "socket.timeout.ms": 5000,
    })
    error = None
    try:
        # a partition's next offset; done once it reaches the high watermark
        position = {p: 0 for p, high in enumerate(high_watermarks) if high > 0}
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in position])
        add = check.add
        while position:
            if time.monotonic() >= deadline:
                error = (f"timed out after {timeout:.0f}s with partitions "
                         f"{sorted(position)} short of their high watermarks "
                         f"(at {position}, highs {list(high_watermarks)})")
                break
            for msg in consumer.consume(num_messages=READ_BATCH, timeout=0.5):
                if msg.error() is not None:
                    error = f"consumer error: {msg.error()}"
                    break
                p, offset = msg.partition(), msg.offset()
                if offset is None or p not in position:
                    continue
                headers: Any = msg.headers()  # (a list of (str, bytes | None) pairs or None)
                add(p, offset, msg.key(), msg.value(), headers)
                position[p] = offset + 1
                if offset + 1 >= high_watermarks[p]:
                    del position[p]
            if error:
                break
    finally:
        consumer.close()
    out = check.verdict()
    if error:
        out.update(ok=False, error=error)
    out["seconds"] = round(time.perf_counter() - started, 3)
    return out
