"""The consumer: ``open_consumer`` and the :class:`Consumer` it yields.

Stages (each a trio task in the consumer's nursery; ``docs/consumer.md`` maps them to
the Java consumer's poll loop):

* the **group member** (``_coordinator.py``, with a group): finds the coordinator,
  joins and syncs, heartbeats in its own task, commits; assignment changes go through
  the :class:`~pipeline.consumer._handoff.Handoff` and run in the application's
  iteration;
* the **offset resolver** (``_positions.py``): committed offsets, resets;
* the **fetcher** (``_fetcher.py``): one task per leader broker, one Fetch in flight
  each, into bounded per-partition buffers (``_state.py``);
* the application's iteration (``async for record in consumer`` or ``batches()``):
  takes records from the buffers, runs pending assignment changes, raises what a
  background stage reported.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Literal, overload

import trio

from pipeline.cluster.pool import Cluster
from pipeline.cluster.stats import report_statistics
from pipeline.consumer._config import ConsumerConfig
from pipeline.consumer._errors import ConsumerClosedError, ConsumerError
from pipeline.consumer._fetcher import Fetcher
from pipeline.consumer._handoff import Callback, Handoff
from pipeline.consumer._member import GroupMember
from pipeline.consumer._member848 import GroupMember848
from pipeline.consumer._positions import OffsetResolver
from pipeline.consumer._state import Assignment, PartitionState
from pipeline.consumer._statistics import ConsumerStatistics, snapshot
from pipeline.consumer._types import (
    ConsumedColumns,
    ConsumedRecord,
    ConsumerGroupMetadata,
    ConsumerState,
    OffsetAndMetadata,
    TopicPartition,
)

__all__ = ["Consumer"]

logger = logging.getLogger("pipeline.consumer")

#: Records handed out by the fast path between two scheduler checkpoints (in
#: ``_ready``): the heartbeat and fetch tasks must get to run even under a tight loop.
_RUN = 512


def _tp(value: tuple[str, int]) -> TopicPartition:
    topic, partition = value
    if not isinstance(topic, str) or not isinstance(partition, int):
        raise TypeError(f"a partition is a (topic, partition) pair, not {value!r}")
    return TopicPartition(topic, partition)


class Consumer:
    """A running consumer; get one from :func:`open_consumer`.

    Iterate it for records (``async for record in consumer``) or call
    :meth:`batches`. Everything else is read or changed between iterations.
    """

    def __init__(
        self,
        cluster: Cluster,
        config: ConsumerConfig,
        topics: tuple[str, ...],
        partitions: tuple[TopicPartition, ...] | None,
        callbacks: dict[str, Callback | None],
    ) -> None:
        self._cluster = cluster
        self.config = config
        self._topics = topics
        self._partitions = partitions
        # Two fetches' worth per partition: one being handed out while the next is
        # fetched (pipelining), and no more (backpressure).
        self._assignment = Assignment(2 * config.max_partition_fetch_bytes)
        self._failure: BaseException | None = None
        self._closed = False
        self._started_at = trio.current_time()
        # Iterations started, and whether the application waits inside one now: what
        # the group's max_poll_interval watchdog reads.
        self.polls = 0
        self.waiting = False
        self._handoff = Handoff(
            self._assignment,
            owner=self,
            on_assigned=callbacks.get("on_assigned"),
            on_revoked=callbacks.get("on_revoked"),
            on_lost=callbacks.get("on_lost"),
            commit_before_revoke=self._commit_before_revoke if config.enable_auto_commit else None,
        )
        self._group: GroupMember | GroupMember848 | None = None
        if config.group_id is not None:
            member = GroupMember848 if config.group_protocol == "consumer" else GroupMember
            self._group = member(cluster, config, topics, self._assignment, self._handoff,
                                 self._report, self)
        self._fetcher = Fetcher(cluster, config, self._assignment, self._report)
        self._resolver = OffsetResolver(
            cluster, config, self._assignment, self._report,
            self._group.committed if self._group is not None else None,
        )

    # ------------------------------------------------------------ lifecycle

    async def _start(self, nursery: trio.Nursery) -> None:
        cfg = self.config
        if cfg.on_statistics is not None:
            nursery.start_soon(report_statistics, cfg.statistics_interval, self.statistics,
                               cfg.on_statistics, logger)
        await nursery.start(self._fetcher.run)
        await nursery.start(self._resolver.run)
        if self._group is not None:
            await nursery.start(self._group.run)
        elif self._partitions is not None:
            self._assignment.add(self._partitions)
        else:
            tps: list[TopicPartition] = []
            with trio.fail_after(self.config.default_api_timeout):
                for topic in self._topics:
                    count = await self._cluster.partitions_for(topic)
                    tps.extend(TopicPartition(topic, p) for p in range(count))
            self._assignment.add(tps)

    async def aclose(self) -> None:
        """Leave cleanly: run pending assignment changes, commit (with auto-commit),
        leave the group (a static member stays), all within ``close_timeout``."""
        if self._closed:
            return
        self._closed = True
        self._assignment.changed()  # ends the fast path: iterations see the close
        with trio.move_on_after(self.config.close_timeout) as scope:
            scope.shield = True
            if self._group is not None:
                await self._group.close()
        if scope.cancelled_caught:
            logger.warning("consumer close did not finish within close_timeout=%s",
                           self.config.close_timeout)

    def _report(self, error: BaseException) -> None:
        """A background stage's error for the application: the next iteration raises it."""
        if self._failure is None:
            logger.error("consumer failed: %s", error)
            self._failure = error
        self._assignment.changed()

    # ------------------------------------------------------------ iteration

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> ConsumedRecord:
        self.polls += 1
        assignment = self._assignment
        chunk = assignment.fast
        if chunk is not None:
            # The fast path (armed below): the next record of the current chunk, while
            # nothing changed (no rebalance change, failure, seek, pause, close). An
            # armed chunk is decoded.
            i = chunk.index
            if i < assignment.fast_end:
                chunk.index = i + 1
                return chunk.records[i]  # type: ignore[index]
        await self._ready()
        record = assignment.take_one()
        if assignment.has_records() and not self._handoff.pending and self._failure is None:
            assignment.arm(_RUN)
        return record

    @overload
    def batches(self, max_records: int | None = None, *,
                columns: Literal[False] = False) -> AsyncIterator[list[ConsumedRecord]]: ...

    @overload
    def batches(self, max_records: int | None = None, *,
                columns: Literal[True]) -> AsyncIterator[ConsumedColumns]: ...

    def batches(self, max_records: int | None = None, *, columns: bool = False
                ) -> AsyncIterator[list[ConsumedRecord]] | AsyncIterator[ConsumedColumns]:
        """Records in lists, one partition's run per list (at most ``max_records``,
        default ``max_poll_records``), as they were fetched; positions advance past each
        list as it is handed out.

        ``columns=True``: the same runs as :class:`ConsumedColumns` (the columns of the
        list that would have been handed out, decoded with no Python object per
        record); positions, commits and errors exactly as for the lists."""
        limit = max_records or self.config.max_poll_records
        if columns:
            return self._column_batches(limit)
        return self._record_batches(limit)

    async def _record_batches(self, limit: int) -> AsyncIterator[list[ConsumedRecord]]:
        while True:
            self.polls += 1
            await self._ready()
            out = self._assignment.take(limit)
            if out:
                yield out

    async def _column_batches(self, limit: int) -> AsyncIterator[ConsumedColumns]:
        while True:
            yield await self.get_columns(limit)

    async def get_columns(self, max_records: int | None = None) -> ConsumedColumns:
        """One partition's next run of records as :class:`ConsumedColumns` (at most
        ``max_records``, default ``max_poll_records``), once there is one: one step of
        ``batches(columns=True)``, for a loop that is not an ``async for`` (bound the
        wait with a cancel scope). The position advances past it."""
        limit = max_records or self.config.max_poll_records
        while True:
            self.polls += 1
            await self._ready(columns=True)
            out = self._assignment.take_columns(limit)
            if len(out):
                return out

    async def getmany(self, max_records: int | None = None) -> list[ConsumedRecord]:
        """Up to ``max_records`` (default ``max_poll_records``) records, across
        partitions, once at least one is there (bound the wait with a cancel scope:
        ``with trio.move_on_after(1): ...``). Positions advance past everything
        returned, as with Java's ``poll``."""
        limit = max_records or self.config.max_poll_records
        self.polls += 1
        await self._ready()
        out: list[ConsumedRecord] = []
        while len(out) < limit and self._assignment.has_records() and not self._handoff.pending:
            out.extend(self._assignment.take(limit - len(out)))
        return out

    async def _ready(self, columns: bool = False) -> None:
        """Wait until a record can be taken (decoded as columns with ``columns``); run
        pending changes, raise failures."""
        await trio.lowlevel.checkpoint()
        while True:
            if self._closed:
                raise ConsumerClosedError("the consumer is closed")
            if self._handoff.pending:
                # A rebalance change runs to its end even if the iteration is cancelled:
                # half a revocation (callback interrupted) would be worse than waiting.
                with trio.CancelScope(shield=True):
                    await self._handoff.run_pending()
                continue
            if self._failure is not None:
                raise self._failure
            if self._group is not None:
                self._group.check_poll()
            if self._assignment.has_records(columns):
                return
            self.waiting = True
            try:
                await self._assignment.wait_changed()
            finally:
                self.waiting = False

    # ------------------------------------------------------------ positions

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions assigned now."""
        return frozenset(self._assignment.partitions)

    def position(self, tp: tuple[str, int]) -> int | None:
        """The offset of the next record iteration gives for ``tp``; None while unknown
        (the committed offset or a reset is being looked up)."""
        return self._state(tp).position

    def _state(self, tp: tuple[str, int]) -> PartitionState:
        key = _tp(tp)
        state = self._assignment.partitions.get(key)
        if state is None:
            raise ConsumerError(f"{key.topic}[{key.partition}] is not assigned to this consumer")
        return state

    async def seek(self, tp: tuple[str, int], offset: int) -> None:
        """Continue ``tp`` from ``offset`` (records buffered for it are dropped)."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an integer >= 0, not {offset!r}")
        self._state(tp)
        self._assignment.seek(_tp(tp), offset)
        await trio.lowlevel.checkpoint()

    async def seek_to_beginning(self, tps: Iterable[tuple[str, int]] | None = None) -> None:
        """Continue from the first record still in the log (every assigned partition by default)."""
        for tp in self._tps(tps):
            self._assignment.request_reset(tp, "earliest")
        await trio.lowlevel.checkpoint()

    async def seek_to_end(self, tps: Iterable[tuple[str, int]] | None = None) -> None:
        """Continue after the last record (the last stable one under read_committed)."""
        for tp in self._tps(tps):
            self._assignment.request_reset(tp, "latest")
        await trio.lowlevel.checkpoint()

    def _tps(self, tps: Iterable[tuple[str, int]] | None) -> list[TopicPartition]:
        if tps is None:
            return list(self._assignment.partitions)
        out = [_tp(tp) for tp in tps]
        for tp in out:
            self._state(tp)
        return out

    def pause(self, tps: Iterable[tuple[str, int]]) -> None:
        """Stop fetching and handing out ``tps`` (buffered records are kept)."""
        self._assignment.pause(self._tps(tps))

    def resume(self, tps: Iterable[tuple[str, int]]) -> None:
        self._assignment.resume(self._tps(tps))

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(tp for tp, s in self._assignment.partitions.items() if s.paused)

    # ------------------------------------------------------------ commits

    def consumed_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """What :meth:`commit` commits by default: each partition's position (the
        record after the last one handed out), with that record's leader epoch."""
        return {
            tp: OffsetAndMetadata(s.position, "", s.position_epoch)
            for tp, s in self._assignment.partitions.items()
            if s.position is not None
        }

    async def commit(self, offsets: Mapping[tuple[str, int], int | OffsetAndMetadata] | None = None
                     ) -> None:
        """Commit ``offsets`` (the *next* offset to read per partition), by default the
        positions of everything handed out so far; waits for the coordinator's answer.

        Raises:
          CommitFailedError: the member is not in the generation that owns the
              partitions any more (a rebalance completed without it).
          ConsumerError: no group (``group_id`` is None), or the commit was refused.
        """
        if self._group is None:
            raise ConsumerError("commit() needs a group: open the consumer with group_id=...")
        if offsets is None:
            chosen = self.consumed_offsets()
        else:
            chosen = {
                _tp(tp): o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o)
                for tp, o in offsets.items()
            }
        await self._group.commit(chosen)

    def _on_committed(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """A commit succeeded (the interceptors' on_commit: ``_hooks.py``)."""

    async def _commit_before_revoke(self, tps: frozenset[TopicPartition]) -> None:
        offsets = {tp: o for tp, o in self.consumed_offsets().items() if tp in tps}
        if offsets and self._group is not None:
            try:
                await self._group.commit(offsets)
            except ConsumerError as exc:
                logger.warning("commit before revoking %s failed: %s", sorted(tps), exc)

    async def committed(self, tps: Iterable[tuple[str, int]]) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets for ``tps`` (None where nothing is committed)."""
        if self._group is None:
            raise ConsumerError("committed() needs a group: open the consumer with group_id=...")
        return dict(await self._group.committed(frozenset(_tp(tp) for tp in tps)))

    # ------------------------------------------------------------ health

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The member's identity in its current generation (``send_offsets_to_transaction``)."""
        if self._group is None:
            raise ConsumerError("group_metadata() needs a group: open the consumer with group_id=...")
        return self._group.metadata()

    @property
    def state(self) -> ConsumerState:
        if self._closed:
            return "closed"
        if self._failure is not None:
            return "failed"
        if self._group is None:
            return "assigned"
        return self._group.state

    def lag(self) -> dict[TopicPartition, int | None]:
        """Records behind the end of the log per assigned partition (from the latest
        fetch; None before one)."""
        read_committed = bool(self.config.isolation)
        return {tp: s.lag(read_committed) for tp, s in self._assignment.partitions.items()}

    def statistics(self) -> ConsumerStatistics:
        """The consumer's statistics now, per client, broker, topic and partition
        (docs/observability.md): state, group membership, positions, lag, fetches,
        buffers; ``.to_dict()`` / ``.to_json()`` for their plain forms."""
        return snapshot(config=self.config, state=self.state, cluster=self._cluster,
                        assignment=self._assignment, group=self._group,
                        fetches=self._fetcher.fetches, started_at=self._started_at)

