"""The exactly-once export's ledger: a small compacted topic of per-partition markers.

Every transaction of an exactly-once export writes, beside its rows and **in the same
transaction**, one marker to the ledger: the key names the export and the Spark
partition (``"{export_id}#{partition}"``), the value (JSON, :class:`Marker`) says how many
of the partition's rows are committed, their fingerprint, and whether that is all of
them. A marker is therefore visible to a ``read_committed`` reader exactly when the rows
it counts are. Compaction keeps the latest marker per key; markers are never deleted by
the export (a rerun of an export id relies on them).

Where the markers go: every marker of one export goes to one ledger partition, chosen
from the export id (:func:`ledger_partition`), so a task reads one partition only.

Reading is ``read_committed``. A task reads its partition's markers **after** its
producer's InitProducerId fenced every earlier attempt: the coordinator has then
completed (committed or aborted) each of their transactions, but a reader sees only up
to the last stable offset, which another task's transaction still open in the same
ledger partition may hold back. So :func:`read_markers` first takes the high watermark,
then waits until the last stable offset reaches it (bounded), then reads: every marker
written before the fencing is then decided and seen.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import trio

from pipeline.spark.status import ExportTaskError

__all__ = [
    "DEFAULT_LEDGER_TOPIC",
    "EXPORT_ID",
    "Done",
    "LedgerView",
    "Marker",
    "ensure_ledger",
    "ledger_key",
    "ledger_partition",
    "mark_done",
    "parse_key",
    "read_markers",
    "snapshot",
]

#: The ledger topic when the export names none (``ledger_topic=``).
DEFAULT_LEDGER_TOPIC = "pipeline-export-ledger"
#: Partitions of a ledger the export creates. Each export's markers live in one of them;
#: more partitions keep exports apart (a transaction stuck open in one ledger partition
#: delays only the exports whose markers share it).
LEDGER_PARTITIONS = 8
#: What an export id may be: it is part of Kafka transactional ids and ledger keys.
EXPORT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
MARKER_VERSION = 1


#: Errors of a partition whose leadership is moving or not yet in place (a ledger just
#: created): the reader's ListOffsets path raises them as ConsumerError naming the code.
_TRANSIENT = ("NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PARTITION",
              "UNKNOWN_LEADER_EPOCH", "FENCED_LEADER_EPOCH", "REPLICA_NOT_AVAILABLE")
#: How long a ledger read retries such errors.
_TRANSIENT_FOR = 15.0

T = TypeVar("T")


async def _retrying(read: Callable[[], Awaitable[T]]) -> T:
    """``await read()``, again after a backoff while it fails with a transient
    partition error (up to ``_TRANSIENT_FOR`` seconds)."""
    from pipeline.cluster.errors import UnknownTopicError
    from pipeline.consumer import ConsumerError

    deadline = trio.current_time() + _TRANSIENT_FOR
    delay = 0.05
    while True:
        try:
            return await read()
        except (ConsumerError, UnknownTopicError) as exc:
            transient = isinstance(exc, UnknownTopicError) or any(
                code in str(exc) for code in _TRANSIENT)
            if not transient or trio.current_time() + delay > deadline:
                raise
        await trio.sleep(delay)
        delay = min(delay * 2, 1.0)


def ledger_key(export_id: str, partition: int) -> bytes:
    return f"{export_id}#{partition}".encode()


def parse_key(key: bytes | None) -> tuple[str, int] | None:
    """(export id, Spark partition) of a ledger key, or None for a key that is not one."""
    if not key:
        return None
    export_id, sep, partition = key.decode(errors="replace").rpartition("#")
    if not sep or not partition.isdigit():
        return None
    return export_id, int(partition)


def ledger_partition(export_id: str, partitions: int) -> int:
    """The ledger partition of every marker of ``export_id`` (CRC-32 of the id: stable
    across Python versions and processes, unlike ``hash``)."""
    return zlib.crc32(export_id.encode()) % partitions


@dataclass(frozen=True, slots=True)
class Marker:
    """One committed step of one Spark partition of an export."""

    export_id: str
    partition: int  # the Spark partition
    rows: int  # rows of the partition committed so far (a resume starts after them)
    fingerprint: str  # of those rows (pipeline.spark.fingerprint)
    complete: bool  # every row of the partition is committed
    chunks: int  # transactions committed for this partition so far
    topic: str | None  # the export's topic argument (None: a topic column)
    run_id: str  # the export_dataframe call that wrote it
    attempt: int  # the Spark task attempt that wrote it
    at: float = field(default=0.0)  # epoch seconds
    v: int = MARKER_VERSION

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> Marker:
        data = json.loads(raw)
        return cls(**{k: data[k] for k in cls.__slots__ if k in data})

    def newer_than(self, other: Marker | None) -> bool:
        """Markers of one partition only grow: more rows, then complete."""
        return other is None or (self.rows, self.complete, self.chunks) > (
            other.rows, other.complete, other.chunks)


def done_key(export_id: str) -> bytes:
    return f"{export_id}#done".encode()


@dataclass(frozen=True, slots=True)
class Done:
    """The driver's record that a job of the export finished: Spark succeeded every
    task, so each partition's last marker is its true end (a task's own ``complete``
    cannot say so: see :mod:`pipeline.spark.exactly_once`)."""

    export_id: str
    run_id: str
    partitions: int
    rows: int
    at: float = 0.0
    v: int = MARKER_VERSION

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> Done:
        data = json.loads(raw)
        return cls(**{k: data[k] for k in cls.__slots__ if k in data})


@dataclass(frozen=True, slots=True)
class LedgerView:
    """What the driver read of one export before its job: the latest marker of each
    partition found, and where in the export's ledger partition its tasks start
    reading (everything before that offset is decided and in ``markers``)."""

    partition: int  # the export's ledger partition
    start: int  # offset in it from which the tasks read
    markers: dict[int, Marker]
    done: Done | None = None  # a job of the export finished


async def read_markers(
    bootstrap: str, topic: str, ledger_part: int, start: int, export_id: str, *,
    cluster: Any, wait: float, partition: int | None = None,
) -> dict[int, Marker]:
    """The latest committed marker of each Spark partition of ``export_id`` (only
    ``partition`` when given) from ``start`` in ledger partition ``ledger_part``, once
    every transaction open there when this was called is decided (waiting up to
    ``wait`` seconds for that: :class:`ExportTaskError` after)."""
    from pipeline.consumer import read_topic, topic_offsets

    def offsets(isolation: str) -> Callable[[], Awaitable[dict[int, tuple[int, int]]]]:
        return lambda: topic_offsets(bootstrap, topic, isolation_level=isolation,  # type: ignore[arg-type]
                                     config=cluster)

    end = (await _retrying(offsets("read_uncommitted")))[ledger_part][1]
    deadline = trio.current_time() + wait
    delay = 0.01
    while True:
        stable = (await _retrying(offsets("read_committed")))[ledger_part][1]
        if stable >= end:
            break
        if trio.current_time() + delay > deadline:
            raise ExportTaskError(
                f"ledger {topic!r} partition {ledger_part} has a transaction open at offset "
                f"{stable} (another export task's, or one stuck until its transaction "
                f"timeout) for more than {wait:.0f}s: the markers after it cannot be read yet")
        await trio.sleep(delay)
        delay = min(delay * 2, 0.5)
    found: dict[int, Marker] = {}
    if stable > start:

        async def read() -> None:
            async for rec in read_topic(bootstrap, topic, partitions=[ledger_part],
                                        start={ledger_part: start}, stop_at_end=True,
                                        isolation_level="read_committed", config=cluster):
                _keep(found, rec.key, rec.value, export_id, partition)

        await _retrying(read)
    return found


def _keep(found: dict[int, Marker], key: bytes | None, value: bytes | None, export_id: str,
          partition: int | None) -> None:
    parsed = parse_key(key)
    if parsed is None or parsed[0] != export_id or value is None:
        return
    if partition is not None and parsed[1] != partition:
        return
    try:
        marker = Marker.decode(value)
    except (ValueError, TypeError, KeyError):
        return  # not a marker this version can read: never trust it
    if marker.newer_than(found.get(parsed[1])):
        found[parsed[1]] = marker


async def snapshot(bootstrap: str, topic: str, export_id: str, *, cluster: Any) -> LedgerView:
    """The driver's read of the ledger before a job: ``export_id``'s markers in every
    ledger partition (a ledger whose partition count changed keeps older markers where
    they were), read ``read_committed`` up to each partition's last stable offset."""
    from pipeline.consumer import read_topic, topic_offsets

    stable = await _retrying(lambda: topic_offsets(
        bootstrap, topic, isolation_level="read_committed", config=cluster))
    mine = ledger_partition(export_id, len(stable))
    found: dict[int, Marker] = {}
    done: list[Done] = []
    todo = [p for p, (low, end) in stable.items() if end > low]
    finished = done_key(export_id)

    async def read() -> None:
        async for rec in read_topic(bootstrap, topic, partitions=todo, start="beginning",
                                    stop_at_end=True, isolation_level="read_committed",
                                    config=cluster):
            if rec.key == finished and rec.value:
                done.append(Done.decode(rec.value))
            else:
                _keep(found, rec.key, rec.value, export_id, None)

    if todo:
        await _retrying(read)
    return LedgerView(partition=mine, start=stable[mine][1], markers=found,
                      done=done[-1] if done else None)


async def mark_done(bootstrap: str, topic: str, ledger_part: int, done: Done, *,
                    producer_options: Mapping[str, Any]) -> None:
    """Record that a job of the export finished (an idempotent, non-transactional write:
    it follows every partition's committed transactions)."""
    from pipeline.producer._api import open_producer

    options = {k: v for k, v in producer_options.items()
               if k not in ("transactional_id", "transaction_timeout")}
    async with open_producer(bootstrap, **options) as producer:
        await producer.send_and_wait(topic, done.encode(), key=done_key(done.export_id),
                                     partition=ledger_part)


async def ensure_ledger(bootstrap: str, topic: str, *, like: str | None, cluster: Any,
                        admin_timeout: float) -> bool:
    """Create the ledger topic if it is missing: compacted, with the replication factor
    (and ``min.insync.replicas``) of the topic ``like`` (the export's target; None:
    the broker's defaults). True when it was created here."""
    from pipeline.cluster.admin import Admin
    from pipeline.protocol.errors import ErrorCode

    async with Admin.open(bootstrap, cluster, timeout=admin_timeout) as admin:
        existing = (await admin.describe_topics([topic]))[topic]
        if existing.error == ErrorCode.NONE:
            return False
        replicas, config = -1, {"cleanup.policy": "compact"}
        if like is not None:
            target = (await admin.describe_topics([like]))[like]
            if target.error == ErrorCode.NONE and target.partitions:
                replicas = len(target.partitions[0].replicas)
                entry = (await admin.describe_topic_config(like, ["min.insync.replicas"])).get(
                    "min.insync.replicas")
                if entry is not None and entry.value:
                    config["min.insync.replicas"] = str(min(int(entry.value), replicas))
        created = await admin.create_topic(topic, LEDGER_PARTITIONS, replicas, config,
                                           exist_ok=True)
        if created:
            with trio.move_on_after(admin_timeout):
                await _wait_for_leaders(admin, topic)
        return created


async def _wait_for_leaders(admin: Any, topic: str) -> None:
    """A new topic's leaders reach every broker's metadata a moment after CreateTopics."""
    from pipeline.protocol.errors import ErrorCode

    while True:
        found = (await admin.describe_topics([topic]))[topic]
        if found.error == ErrorCode.NONE and found.partitions and all(
                p.leader >= 0 for p in found.partitions):
            return
        await trio.sleep(0.1)
