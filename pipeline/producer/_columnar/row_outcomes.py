"""Where each row of a columnar ``send()`` burst ended up (``burst.py``).

A burst's rows are split by the topic producer into runs (``rows.assign_rows``):
one per partition and batch. The ledger records each run here when it settles
(``RowOutcomes.record``: one entry per run, nothing per row); a row's delivery
then finds its run, and its offset is the run's base offset plus the row's
place in it. The rows' ``on_delivery`` callbacks are called from here too.

*Wire order* is the order of a burst's rows once split: each partition's rows
in call order, partition after partition (``RowRun.place`` is a run's first
position in it). A run covers consecutive positions of the wire order, so the
settled runs are sorted, disjoint spans of it (``bounds``). Without keys the
wire order is the call order (the null-key split cuts consecutive rows); a
keyed burst's rows are spread over partitions by murmur2 (pinned partitions and
a custom partitioner spread them too), so the topic producer has its outcomes
``follow_wire_order`` before it splits the run, and a row's wire position is
then read from ``inverse`` (row -> position), which is filled lazily,
from the runs recorded since (``unmapped``), by the first lookup that needs
it: a ``flush()`` caller, who looks up no row, pays nothing per row for it.

Invariants: a row is in at most one span (spans never overlap: asserted); a
row in no span is pending; ``inverse`` holds a position for exactly the rows
of the recorded runs not in ``unmapped``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, Protocol

import trio

from pipeline.producer._message import (
    FAILED,
    OK,
    DeliveryCallback,
    ProducerError,
    ProducerMessage,
    RecordMetadata,
)
from pipeline.producer._speedups import fields
from pipeline.producer._speedups.fields import slots

if TYPE_CHECKING:
    from pipeline.producer._columnar.rows import RowRun

__all__ = ["RowOutcomes", "UnheardRows", "call_back_ok"]

_new_metadata = tuple.__new__

#: ``RowOutcomes.timestamps`` of a burst without callbacks: only ``call_back``
#: (and ``errors``, for it) read it; a row's delivery reads its ``RowBurst``.
_NOT_KEPT: list[int] = []
#: One span of ``RowOutcomes.bounds``: a settled run's first wire position and the one after its last.
_PAIR = struct.Struct("=qq")


class BurstView(Protocol):
    """What the outcomes read of a sealed ``RowBurst`` (``burst.py``; a protocol, so
    this module needs no import of it)."""

    topic: str
    values: list[bytes | None]
    timestamps: list[int]
    keys: list[bytes | None] | None
    on_delivery: list[DeliveryCallback | None] | None
    metadata: list[Any] | None
    header_keys: list[str] | None
    header_values: list[bytes | None] | None
    header_ends: list[int] | None


def _spans_from(bounds: bytearray, at: int) -> int:
    """How many spans of ``bounds`` (sorted) start at or before position ``at``."""
    lo, hi = 0, len(bounds) // _PAIR.size
    while lo < hi:
        mid = (lo + hi) // 2
        if _PAIR.unpack_from(bounds, _PAIR.size * mid)[0] <= at:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _rows_of(run: RowRun) -> Any:
    """The burst's rows ``run`` holds, in wire order: a range (a null-key
    split, or the whole unsplit burst) or int64 row indices (a keyed split)."""
    return range(run.count) if run.rows is None else run.rows


def _take(column: list[Any], run: RowRun) -> list[Any]:
    """``column``'s items for the rows of ``run``, in its wire order."""
    rows = _rows_of(run)
    if type(rows) is range:
        return column[rows.start:rows.stop]
    return list(map(column.__getitem__, rows))


class RowOutcomes:
    """A burst's settled runs: written by the ledger when a run of the burst
    settles, read by the rows' deliveries. Shared by the chunk (which drops it
    with its last row: ``runs`` are runs, and runs point at the chunk) and the
    ``RowBurst``, so neither keeps the other alive."""

    __slots__ = slots(fields.DELIVERY_OUTCOMES, (
        "_positions", "event", "headers", "keys", "metadata", "on_delivery", "read",
        "timestamps", "topic", "unmapped", "values"))

    def __init__(self, rows: BurstView) -> None:
        # The settled runs in wire order: ``runs[i]`` settled wire positions
        # [start, stop) = ``bounds`` int64 pair i (a bytearray _delivery.c reads in
        # place). O(runs): nothing per row (a per-row list was 8 bytes a kept row).
        self.bounds = bytearray()
        self.runs: list[RowRun] = []
        # A split burst's row -> wire position (int64 per row, -1: not mapped), made
        # by ``follow_wire_order`` and filled lazily from ``unmapped`` (module
        # docstring). _delivery.c reads it in place and leaves a -1 to this lookup.
        # None: the wire order is the call order, the position is the row.
        self.inverse: bytearray | None = None
        self._positions: memoryview | None = None  # (inverse as int64s, for the writes)
        self.unmapped: list[RowRun] = []
        # The rows whose failure the caller read (None: none): theirs are not reported
        # as unobserved, the others' are (unobserved.py, UnheardRows). Failures are
        # rare: nothing is kept per row otherwise.
        self.read: set[int] | None = None
        # Set when a run settles while someone waits for a row (then replaced).
        self.event: trio.Event | None = None
        # The rows' on_delivery callbacks (None: no row has one), called per row by
        # the ledger when a run settles (with the row's metadata, or its error
        # naming its value and key: hence the lists, kept only then; a delivery
        # reads its value, key and timestamp from its ``RowBurst``).
        self.on_delivery = rows.on_delivery
        self.topic = rows.topic
        kept = rows.on_delivery is not None
        self.timestamps = rows.timestamps if kept else _NOT_KEPT
        self.values = rows.values if kept else None
        self.keys = rows.keys if kept else None
        self.metadata = rows.metadata if kept else None
        # (keys, values, ends) of the rows' headers (burst.py), for the errors
        hkeys, hvalues, hends = rows.header_keys, rows.header_values, rows.header_ends
        self.headers: tuple[list[str], list[bytes | None], list[int]] | None = (
            (hkeys, hvalues, hends) if kept and hkeys is not None and hvalues is not None
            and hends is not None else None)

    def follow_wire_order(self, rows: int) -> None:
        """The burst's ``rows`` rows were split by partition (keys, pinned
        partitions or a partitioner asked per row): its wire order is not the call
        order, so a row's position is read from ``inverse`` (made here, once: a
        burst is one run until the topic producer splits it, and before any of its
        split runs settles)."""
        assert self.inverse is None, "the wire order is fixed once"
        assert not self.runs, "the wire order is fixed before a split run settles"
        self.inverse = bytearray(b"\xff" * (8 * rows))
        self._positions = memoryview(self.inverse).cast("q")

    def record(self, run: RowRun) -> None:
        """``run`` settled (its ``_state``, ``offset`` and ``timestamp`` are set)."""
        a = run.place
        b = a + run.count
        i = _spans_from(self.bounds, a)
        at = _PAIR.size * i  # (spans before it end by a; those after start at b or later)
        assert i == 0 or _PAIR.unpack_from(self.bounds, at - _PAIR.size)[1] <= a, "spans overlap"
        assert at == len(self.bounds) or b <= _PAIR.unpack_from(self.bounds, at)[0]
        self.bounds[at:at] = _PAIR.pack(a, b)
        self.runs.insert(i, run)
        if self.inverse is not None:
            self.unmapped.append(run)
        if self.event is not None:
            self.event.set()
            self.event = None

    def locate(self, row: int) -> tuple[RowRun, int] | None:
        """The settled run of ``row`` and the row's place in it (None: pending)."""
        at = row
        positions = self._positions
        if positions is not None:
            for run in self.unmapped:  # (filled on demand: the module docstring)
                rows = _rows_of(run)
                if type(rows) is range:  # (the whole unsplit burst: a close failed it)
                    _map_rows_py(positions, rows, run.place)
                else:
                    map_rows(positions, rows, run.place)
            self.unmapped.clear()
            at = positions[row]  # (-1, in no recorded run: before every span, pending)
        i = _spans_from(self.bounds, at) - 1
        if i < 0:
            return None
        start, stop = _PAIR.unpack_from(self.bounds, _PAIR.size * i)
        if at >= stop:
            return None
        return self.runs[i], at - start

    def run_for(self, row: int) -> RowRun | None:
        """The settled run of ``row`` (None: pending)."""
        found = self.locate(row)
        return None if found is None else found[0]

    def read_row(self, row: int) -> None:
        """The caller read the failure of ``row`` (its delivery raised it)."""
        if self.read is None:
            self.read = set()
        self.read.add(row)

    def unheard(self, run: RowRun) -> UnheardRows | None:
        """The rows of ``run`` (failed) with no ``on_delivery``, whose failure reaches
        no callback (only their deliveries, if someone reads them); None: none."""
        rows = _rows_of(run)
        if self.on_delivery is not None:
            rows = [r for r, fn in zip(rows, _take(self.on_delivery, run), strict=True)
                    if fn is None]
        return UnheardRows(self, rows) if len(rows) else None

    def call_back(self, run: RowRun, failed: Callable[[Any, Any], None]) -> None:
        """Call the ``on_delivery`` of each row of ``run`` (settled, recorded)
        once, in wire order: ``fn(metadata, None)`` or ``fn(None, error)``. A
        callback that raises is reported with ``failed(fn, what)`` from the
        ``except`` block (the ledger logs and counts it), and the next row
        still hears."""
        assert self.on_delivery is not None
        fns = _take(self.on_delivery, run)
        if run._state == OK:  # the common case: one C loop (or its twin)
            call_back_ok(fns, run.topic, run.partition, run.offset,
                         _take(self.timestamps, run), run.timestamp, failed)
            return
        for error, fn in zip(self.errors(run), fns, strict=True):
            if fn is not None:
                try:
                    fn(None, error)
                except Exception:
                    failed(fn, error.message)

    def errors(self, run: RowRun) -> Iterator[ProducerError]:
        """The ``ProducerError`` of each row of ``run`` (failed), in wire order,
        naming the row's value and key."""
        values, keys, metadata, cause = self.values, self.keys, self.metadata, run._outcome
        assert values is not None
        assert cause is not None
        headers = self.headers
        for row in _rows_of(run):
            msg = ProducerMessage(self.topic, values[row], None if keys is None else keys[row],
                                  () if headers is None else row_headers(*headers, row),
                                  run.partition, self.timestamps[row],
                                  None if metadata is None else metadata[row])
            msg._state = FAILED
            yield ProducerError(msg, cause)


def row_headers(keys: list[str], values: list[bytes | None], ends: list[int], row: int
                ) -> tuple[tuple[str, bytes | None], ...]:
    """Row ``row``'s headers from a burst's flat header columns (``burst.py``), as
    ``normalize`` leaves a message's: a tuple of (key, value) pairs."""
    a, b = ends[row], ends[row + 1]
    return tuple(zip(keys[a:b], values[a:b], strict=True))


def _map_rows_py(positions: Any, rows: Any, place: int) -> None:
    """``_delivery.map_rows``'s twin: ``positions[rows[k]] = place + k``."""
    for at, row in enumerate(rows, place):
        if not 0 <= row < len(positions):
            raise ValueError(f"map_rows: row {row} is outside 0..{len(positions) - 1}")
        positions[row] = at


def _row_metadata_each(topic: str, partition: int | None, base: int, stamps: list[int],
                       append_time: int) -> Iterator[RecordMetadata]:
    """The ``RecordMetadata`` of each row of a run settled OK, lazily (as
    ``_delivery.call_back_ok`` builds them): row i's offset is ``base + i``
    (-1, unknown, when ``base`` < 0), its timestamp ``append_time`` when >= 0
    (the broker's LogAppendTime), else ``stamps[i]``. C-level maps, no
    bytecode per row."""
    n = len(stamps)
    offsets = range(base, base + n) if base >= 0 else repeat(-1, n)
    times = stamps if append_time < 0 else repeat(append_time, n)
    return map(_new_metadata, repeat(RecordMetadata), zip(
        repeat(topic, n), repeat(partition), offsets, times, repeat(base >= 0)))


def _call_back_ok_py(fns: list[DeliveryCallback | None], topic: str, partition: int | None,
                     base: int, stamps: list[int], append_time: int,
                     failed: Callable[[Any, Any], None]) -> None:
    """``_delivery.call_back_ok``'s twin: ``fn(meta, None)`` for each row of a
    run settled OK whose callback is not None, in row order; an ``Exception``
    from one goes to ``failed(fn, meta)`` (from the ``except`` block, which
    logs it), and the next row still hears."""
    metas = _row_metadata_each(topic, partition, base, stamps, append_time)
    for meta, fn in zip(metas, fns, strict=True):
        if fn is not None:
            try:
                fn(meta, None)
            except Exception:
                failed(fn, meta)


#: Calls the callbacks of a run settled OK: ``_delivery.call_back_ok`` or its
#: twin (``burst._use_rows`` binds it).
call_back_ok: Callable[..., None] = _call_back_ok_py
#: Fills a keyed burst's row -> wire position map: ``_delivery.map_rows`` or its twin.
map_rows: Callable[[Any, Any, int], None] = _map_rows_py


class UnheardRows:
    """Failed rows of a burst that no ``on_delivery`` hears, as ``Unobserved`` holds
    them: observed once the caller read each one's failure (``RowOutcomes.read``); a
    row read does not make its burst's other rows observed."""

    __slots__ = ("outcomes", "rows")

    def __init__(self, outcomes: RowOutcomes, rows: Sequence[int]) -> None:
        self.outcomes = outcomes
        self.rows = rows

    def unread(self) -> int:
        """How many of the rows' failures nobody read yet."""
        read = self.outcomes.read
        return len(self.rows) if read is None else sum(r not in read for r in self.rows)

    @property
    def observed(self) -> bool:
        return not self.unread()
