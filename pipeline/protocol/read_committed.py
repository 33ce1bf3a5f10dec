"""``read_committed``: which fetched batches a reader may deliver. Sans-I/O.

A Fetch at isolation level 1 (READ_COMMITTED) returns a partition's records up to its last
stable offset (LSO) together with the transactions aborted in that range, each as
``(producer_id, first_offset)``. The records themselves still hold the aborted
transactions' data and the control batches (the COMMIT / ABORT markers): the client drops
them. The rule, as the Java consumer's fetcher applies it:

* every batch is visited in offset order; before a batch that carries a producer id, each
  aborted transaction whose ``first_offset`` is at or before the batch's last offset is
  *opened*: its producer id joins the set of aborted producers (the list is taken in
  ``first_offset`` order, whatever order the broker sent it in);
* an ABORT marker (a control batch whose first record's type is ABORT) *closes* its
  producer id: later batches of that producer belong to a later transaction;
* a transactional batch whose producer is in the set is dropped (it belongs to an
  aborted transaction), and so is every control batch; the rest are delivered.

The caller advances its fetch position past every batch, delivered or dropped.

    keep = ReadCommittedFilter(partition_data.aborted_transactions or ())
    for batch in decode_record_batches(partition_data.records):
        if keep(batch): ...deliver batch.records...
        position = batch.last_offset + 1
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from enum import IntEnum
from typing import Protocol

from pipeline.protocol.batch_format import ControlRecordType, RecordBatch, control_record_type

__all__ = [
    "AbortedTransactionLike",
    "IsolationLevel",
    "ReadCommittedFilter",
    "committed_batches",
    "is_abort_marker",
    "isolation_level",
]


class IsolationLevel(IntEnum):
    """Fetch / ListOffsets ``isolation_level`` values."""

    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


def isolation_level(name: str) -> IsolationLevel:
    """``"read_uncommitted"`` / ``"read_committed"`` (the Java client's spelling, any case,
    ``-`` for ``_`` too) -> :class:`IsolationLevel`; anything else is a ``ValueError``."""
    if isinstance(name, str):
        key = name.strip().lower().replace("-", "_")
        if key == "read_uncommitted":
            return IsolationLevel.READ_UNCOMMITTED
        if key == "read_committed":
            return IsolationLevel.READ_COMMITTED
    raise ValueError(
        f"isolation_level must be 'read_uncommitted' or 'read_committed', not {name!r}"
    )


class AbortedTransactionLike(Protocol):
    """What the filter reads of an aborted transaction (Fetch's ``AbortedTransaction``)."""

    @property
    def producer_id(self) -> int: ...
    @property
    def first_offset(self) -> int: ...


def is_abort_marker(batch: RecordBatch) -> bool:
    """A control batch whose first record is an ABORT marker (an empty one is not)."""
    if not batch.is_control or not batch.records:
        return False
    return control_record_type(batch.records[0]) == ControlRecordType.ABORT


class ReadCommittedFilter:
    """One partition's answer to one READ_COMMITTED fetch: call it on each batch, in
    offset order; True means deliver the batch's records.

    State: the aborted transactions not yet reached (a heap on ``first_offset``) and the
    producers whose aborted transaction is open at the current batch.
    """

    __slots__ = ("_aborted_producers", "_pending")

    def __init__(self, aborted: Iterable[AbortedTransactionLike | tuple[int, int]]) -> None:
        pending: list[tuple[int, int]] = []
        for a in aborted:
            if isinstance(a, tuple):
                producer_id, first_offset = a
            else:
                producer_id, first_offset = a.producer_id, a.first_offset
            pending.append((first_offset, producer_id))
        heapq.heapify(pending)
        self._pending = pending
        self._aborted_producers: set[int] = set()

    def __call__(self, batch: RecordBatch) -> bool:
        if batch.producer_id >= 0:
            last = batch.last_offset
            pending = self._pending
            while pending and pending[0][0] <= last:
                self._aborted_producers.add(heapq.heappop(pending)[1])
            if is_abort_marker(batch):
                self._aborted_producers.discard(batch.producer_id)
            elif batch.is_transactional and batch.producer_id in self._aborted_producers:
                return False
        return not batch.is_control


def committed_batches(
    batches: Iterable[RecordBatch],
    aborted: Iterable[AbortedTransactionLike | tuple[int, int]] | None,
) -> Iterator[RecordBatch]:
    """The batches of ``batches`` (one partition's, in offset order) a READ_COMMITTED
    reader delivers, given the fetch's aborted transactions (``None``: none)."""
    keep = ReadCommittedFilter(aborted or ())
    return (b for b in batches if keep(b))
