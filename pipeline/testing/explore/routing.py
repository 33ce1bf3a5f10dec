"""Where each record of a schedule belongs (judged by ``placement.py``: P1 and K1).

A schedule routes with the producer's default partitioner (``Schedule.partitioner
== "default"``: murmur2 of the key, keyless records sticky, KIP-480), with
librdkafka's ``"murmur2"`` (keyless records hash as the empty key: one partition),
or with a user's (``"custom"``: `ExplorerPartitioner`, a pure function of the record
for keyed records, sticky for keyless ones, with two user bugs on a few records). A
send may also be pinned to a partition the topic does not have. `route` says,
from the schedule alone, what the producer must do with each record.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import replace
from typing import TYPE_CHECKING

from pipeline.producer._stages.partitioner import murmur2

if TYPE_CHECKING:
    from .schedule import Schedule

# A custom schedule's partitioner refuses one record in BUG_EVERY by raising, and
# names a partition the topic does not have for another one in BUG_EVERY (by the
# crc32 of the record's value, which is unique per send).
BUG_EVERY = 16
_RAISES, _OUT_OF_RANGE = 0, 1

# The errors a routing failure carries (a message's cause starts with one of these).
OUT_OF_RANGE = "PartitionOutOfRangeError"
RAISED = "PartitionerBug"
NAMED_NO_PARTITION = "ValueError: partitioner"
ROUTING_ERRORS = (OUT_OF_RANGE, RAISED, NAMED_NO_PARTITION)


class PartitionerBug(Exception):
    """What the custom partitioner raises for the records it refuses."""


class ExplorerPartitioner:
    """A user's partitioner: a keyed record goes to ``crc32(key) % n``; keyless
    records stay on one partition until ``on_new_batch`` moves them to the next
    (sticky, as the default is, so K1 holds them to the same spread); one record in
    ``BUG_EVERY`` raises `PartitionerBug` and another returns ``n`` (a partition
    the topic does not have: the producer's validation refuses it, ValueError)."""

    def __init__(self) -> None:
        self._current = 0

    def partition(self, topic: str, key: bytes | None, value: bytes | None,
                  num_partitions: int) -> int:
        bug = _bug(value)
        if bug == _RAISES:
            raise PartitionerBug(f"refuses the record {bytes(value or b'')[:12]!r}")
        if bug == _OUT_OF_RANGE:
            return num_partitions
        if key is not None:
            return zlib.crc32(key) % num_partitions
        return self._current % num_partitions

    def on_new_batch(self, topic: str, num_partitions: int, prev_partition: int) -> None:
        self._current = prev_partition + 1


def _bug(value: bytes | None) -> int:
    return zlib.crc32(value or b"") % BUG_EVERY


def route(partitioner: str, partitions: int, partition: int | None, key: str | None,
          value: bytes) -> int | str | None:
    """The partition a record must be written to, or the start of the cause it must
    fail with (`ROUTING_ERRORS`), or None: a keyless record (the sticky choice, which
    K1 judges)."""
    if partition is not None:
        return partition if partition < partitions else OUT_OF_RANGE
    if partitioner == "custom":
        bug = _bug(value)
        if bug == _RAISES:
            return RAISED
        if bug == _OUT_OF_RANGE:
            return NAMED_NO_PARTITION
        if key is None:
            return None
        return zlib.crc32(key.encode()) % partitions
    if key is None:
        # ("murmur2", librdkafka's: a keyless record hashes as the empty key)
        return (murmur2(b"") & 0x7FFFFFFF) % partitions if partitioner == "murmur2" else None
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def misrouted(schedule: Schedule, rng: random.Random) -> Schedule:
    """``schedule`` with about a quarter of its pinned sends pinned one past the
    topic's last partition instead (keyless, as pinned sends are)."""
    sends = tuple(replace(s, partition=schedule.partitions, key=None)
                  if s.partition is not None and rng.random() < 0.25 else s
                  for s in schedule.sends)
    return replace(schedule, sends=sends)
