"""Committed consumer-group offsets of the fake cluster, plain and transactional.

One `OffsetStore` per `FakeCluster` (``fake.offsets``), shared by the group coordinator
(OffsetCommit / OffsetFetch) and the transaction coordinator (TxnOffsetCommit, and the
COMMIT / ABORT that ends a transaction). Sans-I/O: nothing here awaits or reads a clock.

Kafka's rules it keeps (``GroupMetadata`` / the offsets of ``GroupCoordinatorShard``):

* a plain commit is visible at once;
* a transactional commit is *pending* for its producer id until the transaction ends:
  OffsetFetch does not show it, and with ``require_stable`` answers
  UNSTABLE_OFFSET_COMMIT for its partitions instead of the committed offset;
* COMMIT makes the pending offsets visible, ABORT drops them;
* every commit is a record in ``__consumer_offsets``; when a transaction commits, a
  pending offset only replaces the committed one if its record came later, so a plain
  commit made while the transaction was open wins over the transaction's (checked on
  Kafka 4.1: tests/testing/test_fake_vs_kafka.py). ``position`` orders the records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["CommittedOffset", "OffsetStore", "TopicPartition"]

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One committed (or pending) offset, as OffsetFetch reports it."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""
    #: order of the record in __consumer_offsets (later wins when a transaction commits)
    position: int = 0


@dataclass(slots=True)
class _Group:
    committed: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    #: producer id -> its open transaction's offsets
    pending: dict[int, dict[TopicPartition, CommittedOffset]] = field(default_factory=dict)


class OffsetStore:
    """Committed offsets per group: ``commit`` (plain), ``stage`` (in a transaction),
    ``end_transaction`` (COMMIT / ABORT), ``fetch``, ``delete``."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._position = 0  # the next __consumer_offsets record's position

    def _next(self, offset: CommittedOffset) -> CommittedOffset:
        self._position += 1
        return CommittedOffset(offset.offset, offset.leader_epoch, offset.metadata,
                               self._position)

    # ------------------------------------------------------------------ writes

    def commit(self, group: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        """A plain commit (OffsetCommit): visible at once."""
        g = self._groups.setdefault(group, _Group())
        for tp, offset in offsets.items():
            g.committed[tp] = self._next(offset)

    def stage(self, group: str, producer_id: int,
              offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        """A transactional commit (TxnOffsetCommit): pending until the producer's
        transaction ends (a later stage of the same partition replaces it)."""
        g = self._groups.setdefault(group, _Group())
        pending = g.pending.setdefault(producer_id, {})
        for tp, offset in offsets.items():
            pending[tp] = self._next(offset)

    def end_transaction(self, producer_id: int, *, commit: bool,
                        groups: Iterable[str] | None = None) -> None:
        """The producer's transaction ended (its marker reached the group's offsets
        partition): COMMIT applies its pending offsets where no later record committed
        the partition, ABORT drops them. ``groups``: only these (default: every group)."""
        names = list(self._groups) if groups is None else list(groups)
        for name in names:
            g = self._groups.get(name)
            if g is None:
                continue
            pending = g.pending.pop(producer_id, None)
            if not pending or not commit:
                continue
            for tp, offset in pending.items():
                current = g.committed.get(tp)
                if current is None or current.position < offset.position:
                    g.committed[tp] = offset

    def delete(self, group: str, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Forget a group's committed offsets (of ``partitions``, default all) (OffsetDelete,
        DeleteGroups); pending transactional offsets stay with their transaction."""
        g = self._groups.get(group)
        if g is None:
            return
        if partitions is None:
            g.committed.clear()
        else:
            for tp in partitions:
                g.committed.pop(tp, None)
        if not g.committed and not g.pending:
            del self._groups[group]

    # ------------------------------------------------------------------ reads

    def groups(self) -> list[str]:
        """Groups with committed or pending offsets."""
        return sorted(self._groups)

    def committed(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        """Every visible committed offset of ``group`` (a copy)."""
        g = self._groups.get(group)
        return dict(g.committed) if g is not None else {}

    def fetch(self, group: str, partition: TopicPartition) -> CommittedOffset | None:
        """The visible committed offset of one partition (None: nothing committed)."""
        g = self._groups.get(group)
        return g.committed.get(partition) if g is not None else None

    def is_pending(self, group: str, partition: TopicPartition) -> bool:
        """An open transaction has committed this partition (OffsetFetch with
        ``require_stable`` answers UNSTABLE_OFFSET_COMMIT for it)."""
        g = self._groups.get(group)
        return g is not None and any(partition in p for p in g.pending.values())

    def pending(self, group: str, producer_id: int) -> dict[TopicPartition, CommittedOffset]:
        """The offsets ``producer_id``'s open transaction committed for ``group``."""
        g = self._groups.get(group)
        return dict(g.pending.get(producer_id, {})) if g is not None else {}
