"""What the consumer knows about each assigned partition: positions and fetched records.

Sans-I/O and single-owner: the fetch tasks, the offset resolver, the group
coordinator and the user's iteration all run in one trio thread and change this
state only between awaits, so no lock is needed; each change that another task may
be waiting for calls :meth:`Assignment.changed`.

Per partition (:class:`PartitionState`) the invariants are:

* ``position`` is the offset of the next record the application gets (Java's
  ``position()``); ``fetch_offset`` is where the next Fetch starts. Buffered records
  are exactly those in ``[position, fetch_offset)`` (minus control records and
  aborted transactions), in order.
* ``token`` changes whenever the partition's positions are set from outside the
  fetch flow (seek, reset, revocation): a fetch response or offset lookup that was
  started under another token is stale and is dropped, never applied.
* A partition is fetched only when it has a position, is not paused, has no fetch
  in flight, and buffers less than ``buffer_limit`` bytes (the consumer gives two
  fetches' worth): the bound that makes a slow application slow the fetching down
  (backpressure), while the next fetch is under way as it works through the
  current one (pipelining). A chunk's bytes count until its last record is out.

Records are handed out partition by partition in rotation (``_ready``): a partition
whose first chunk is used up goes to the back, so one busy partition cannot starve
the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import trio

from pipeline.consumer._types import ConsumedColumns, ConsumedRecord, TopicPartition

__all__ = ["Assignment", "Chunk", "PartitionState"]


@dataclass(eq=False, slots=True)
class Chunk:
    """Records of one fetch response for one partition, handed out in order.

    Decoded on first use, in the application's iteration: the fetch task only reads
    where the next fetch starts (``next_offset``, from the batch headers) and asks for
    more at once, so decoding overlaps the broker's next read. Decoded as rows
    (``load``: record iteration, ``batches()``) or as columns (``load_columns``:
    ``batches(columns=True)``), whichever is asked for first; the other form, if
    asked for later, is converted from it. Both hold the same records, so ``index``
    means the same in either."""

    records: list[ConsumedRecord] | None  # None until decoded as rows
    next_offset: int  # the position once every record here is handed out
    nbytes: int  # wire bytes, counted against the partition's buffer
    index: int = 0  # the next record to hand out
    load: Callable[[], list[ConsumedRecord]] | None = None  # decodes ``records``
    load_columns: Callable[[], ConsumedColumns] | None = None  # decodes ``columns``
    columns: ConsumedColumns | None = None  # None until decoded as columns

    def decoded(self) -> list[ConsumedRecord]:
        if self.records is None:
            if self.columns is not None:
                self.records = self.columns.records()
            else:
                assert self.load is not None
                self.records = self.load()
            self.load = self.load_columns = None
        return self.records

    def decoded_columns(self) -> ConsumedColumns:
        if self.columns is None:
            if self.records is None and self.load_columns is not None:
                self.columns = self.load_columns()
            else:
                records = self.decoded()
                first = records[0] if records else ConsumedRecord("", -1, -1, -1, None, None, ())
                self.columns = ConsumedColumns.of_records(first.topic, first.partition, records)
            self.load = self.load_columns = None
        return self.columns

    def count(self, columns: bool = False) -> int:
        """The records held (decoding them now, as columns or rows, if not yet)."""
        if self.records is not None:
            return len(self.records)
        return len(self.decoded_columns() if columns else self.decoded())

    def decoded_count(self) -> int:
        """The records held, 0 if not decoded (a dropped chunk never was)."""
        if self.records is not None:
            return len(self.records)
        return len(self.columns) if self.columns is not None else 0

    def offset_at(self, i: int) -> int:
        """The offset of decoded record ``i``."""
        if self.records is not None:
            return self.records[i].offset
        assert self.columns is not None
        return int(self.columns.offsets[i])

    def epoch_at(self, i: int) -> int:
        """The leader epoch of decoded record ``i``."""
        if self.records is not None:
            return self.records[i].leader_epoch
        assert self.columns is not None
        return int(self.columns.leader_epochs[i])


@dataclass(eq=False, slots=True)
class PartitionState:
    tp: TopicPartition
    # The position before the first chunk's next record (see ``position``); None:
    # unknown until the committed offset or a reset.
    base_position: int | None = None
    base_epoch: int = -1  # leader epoch of the record before ``base_position``
    fetch_offset: int = -1
    # Where a position lookup must reset to: "earliest" / "latest", or None.
    reset: str | None = None
    paused: bool = False
    fetching: bool = False  # a Fetch including this partition is in flight
    # The leader epoch the next fetch names (KIP-320), from the metadata; -1 unknown.
    leader_epoch: int = -1
    # Waiting for fresher metadata (the leader moved or was fenced): not fetched.
    awaiting_metadata: bool = False
    token: int = 0
    chunks: deque[Chunk] = field(default_factory=deque)
    buffered_bytes: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    # Statistics (consumer/_statistics.py), counted per fetch response and per chunk
    # handed out, never per record: fetch responses with data for it, their bytes,
    # the records of its chunks handed out to the end.
    fetches: int = 0
    fetched_bytes: int = 0
    consumed: int = 0

    @property
    def position(self) -> int | None:
        """The offset of the next record the application gets. Computed, so handing a
        record out only moves its chunk's index (the iteration's fast path)."""
        if self.chunks:
            chunk = self.chunks[0]
            if chunk.index:
                return chunk.offset_at(chunk.index - 1) + 1
        return self.base_position

    @property
    def position_epoch(self) -> int:
        """The leader epoch of the record before ``position`` (committed with it)."""
        if self.chunks:
            chunk = self.chunks[0]
            if chunk.index:
                return chunk.epoch_at(chunk.index - 1)
        return self.base_epoch

    def lag(self, read_committed: bool) -> int | None:
        """Records between the position and the end of the log the isolation level
        reads to (the last stable offset for read_committed, else the high watermark:
        Kafka sends both at either level), from the latest fetch; None before one."""
        if self.position is None or self.high_watermark < 0:
            return None
        end = self.high_watermark
        if read_committed and self.last_stable_offset >= 0:
            end = self.last_stable_offset
        return max(0, end - self.position)


class Assignment:
    """The assigned partitions' states, and the rotation of those with records ready."""

    def __init__(self, buffer_limit: int) -> None:
        self.buffer_limit = buffer_limit
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self._ready: deque[PartitionState] = deque()
        self._event = trio.Event()
        self._tokens = 0
        # The iteration's fast path (``arm``): the chunk whose records before index
        # ``fast_end`` may be taken by bumping its index, until anything changes.
        self.fast: Chunk | None = None
        self.fast_end = 0
        # Totals over every partition ever assigned (statistics): the records of the
        # chunks handed out to the end, and the bytes fetched.
        self.consumed = 0
        self.fetched_bytes = 0

    # ------------------------------------------------------------ change signal

    def changed(self) -> None:
        """Wake every task waiting in :meth:`wait_changed` (and end the fast path)."""
        self.fast = None
        self._event.set()
        self._event = trio.Event()

    async def wait_changed(self) -> None:
        await self._event.wait()

    def _next_token(self) -> int:
        self._tokens += 1
        return self._tokens

    # --------------------------------------------------------- membership

    def add(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            if tp not in self.partitions:
                self.partitions[tp] = PartitionState(tp, token=self._next_token())
        self.changed()

    def remove(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            state = self.partitions.pop(tp, None)
            if state is not None:
                state.token = self._next_token()  # in-flight answers for it are stale
                self._drop_buffer(state)
        self.changed()

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self.partitions)

    def __len__(self) -> int:
        return len(self.partitions)

    # --------------------------------------------------------- positions

    def seek(self, tp: TopicPartition, offset: int, epoch: int = -1) -> None:
        """Set the position (and fetch offset) and drop buffered records."""
        state = self.partitions[tp]
        state.token = self._next_token()
        self._drop_buffer(state)
        state.base_position = state.fetch_offset = offset
        state.base_epoch = epoch
        state.reset = None
        self.changed()

    def request_reset(self, tp: TopicPartition, strategy: str) -> None:
        """Forget the position: the offset resolver looks it up (``strategy``)."""
        state = self.partitions[tp]
        state.token = self._next_token()
        self._drop_buffer(state)
        state.base_position = None
        state.reset = strategy
        self.changed()

    def needing_position(self) -> list[PartitionState]:
        return [s for s in self.partitions.values() if s.position is None]

    def fetchable(self) -> list[PartitionState]:
        limit = self.buffer_limit
        return [
            s for s in self.partitions.values()
            if s.position is not None and not s.paused and not s.fetching
            and not s.awaiting_metadata and s.buffered_bytes < limit
        ]

    # --------------------------------------------------------- pause

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            state = self.partitions[tp]
            state.paused = True
            if state in self._ready:
                self._ready.remove(state)
        self.changed()

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            state = self.partitions[tp]
            if state.paused:
                state.paused = False
                if state.chunks:
                    self._ready.append(state)
        self.changed()

    # --------------------------------------------------------- records

    def append(self, state: PartitionState, chunk: Chunk) -> None:
        """Buffer a fetched chunk (the caller checked the token and the fetch offset)."""
        state.fetch_offset = chunk.next_offset
        if chunk.records is not None and not chunk.records:
            # Nothing to hand out (control records, an aborted transaction): the
            # position moves past it once what is buffered before it is handed out.
            if state.chunks:
                state.chunks[-1].next_offset = chunk.next_offset
            else:
                state.base_position = chunk.next_offset
            return
        state.chunks.append(chunk)
        state.buffered_bytes += chunk.nbytes
        if len(state.chunks) == 1 and not state.paused:
            self._ready.append(state)
        self.changed()

    def has_records(self, columns: bool = False) -> bool:
        """Whether a record can be taken now: decodes the next ready chunk (as columns
        with ``columns``, for :meth:`take_columns`; a chunk that holds nothing, only
        transaction markers say, is passed over). Raises ``ConsumerError`` for a chunk
        that does not decode."""
        ready = self._ready
        while ready:
            state = ready[0]
            chunk = state.chunks[0]
            if chunk.index < chunk.count(columns):
                return True
            self._finish_chunk(state, chunk)
        return False

    def take(self, limit: int) -> list[ConsumedRecord]:
        """Up to ``limit`` records of the next ready partition (positions advance)."""
        state = self._ready[0]
        chunk = state.chunks[0]
        records = chunk.decoded()
        start = chunk.index
        end = min(len(records), start + limit)
        out = records[start:end] if start or end < len(records) else records
        chunk.index = end
        if end >= len(records):
            self._finish_chunk(state, chunk)
        return out

    def take_columns(self, limit: int) -> ConsumedColumns:
        """:meth:`take` as columns (the caller checked ``has_records(columns=True)``)."""
        state = self._ready[0]
        chunk = state.chunks[0]
        columns = chunk.decoded_columns()
        start = chunk.index
        n = len(columns)
        end = min(n, start + limit)
        out = columns.slice(start, end) if start or end < n else columns
        chunk.index = end
        if end >= n:
            self._finish_chunk(state, chunk)
        return out

    def take_one(self) -> ConsumedRecord:
        """The next record of the next ready partition (the caller checked has_records)."""
        state = self._ready[0]
        chunk = state.chunks[0]
        records = chunk.decoded()
        i = chunk.index
        record = records[i]
        chunk.index = i + 1
        if i + 1 >= len(records):
            self._finish_chunk(state, chunk)
        return record

    def arm(self, run: int) -> None:
        """Let the next ``run`` records of the next ready partition's chunk be taken by
        bumping its index (never its last record: taking that finishes the chunk, which
        ``take_one`` does). Anything that calls :meth:`changed` disarms it."""
        chunk = self._ready[0].chunks[0]
        self.fast = chunk
        self.fast_end = min(len(chunk.decoded()) - 1, chunk.index + run)

    def _finish_chunk(self, state: PartitionState, chunk: Chunk) -> None:
        n = chunk.decoded_count()
        if n:
            state.consumed += n
            self.consumed += n
        state.chunks.popleft()
        state.buffered_bytes -= chunk.nbytes
        state.base_position = chunk.next_offset
        if n:  # (an undecoded chunk is only finished by a drop)
            state.base_epoch = chunk.epoch_at(n - 1)
        self._ready.popleft()
        if state.chunks:
            self._ready.append(state)  # rotation: the next partition goes first
        if self.fast is chunk:
            self.fast = None
        if state.buffered_bytes < self.buffer_limit:
            self.changed()  # it may be fetched again

    def _drop_buffer(self, state: PartitionState) -> None:
        state.chunks.clear()
        state.buffered_bytes = 0
        if state in self._ready:
            self._ready.remove(state)
