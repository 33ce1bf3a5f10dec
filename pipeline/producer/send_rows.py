"""``send()`` bursts as columns: the per-message call without a per-message
object in the stages.

A high-rate loop of common ``send()`` calls (``bytes`` value, no key, headers,
partition, timestamp or ``metadata``; an ``on_delivery`` callable or none;
the default partitioner) appends each call's value and timestamp to the columns of one
open ``SendRows``, as Java's ``RecordAccumulator`` appends into its batch
buffer, and returns a two-slot ``RowDelivery``. When the dispatcher takes the
burst, its columns are packed once (the C kernel's ``pack_binary``) and the
burst travels through the four stages as a ``send_batch`` ``RowRun`` does
(``rows.py``): split per partition and batch by the topic producer, ordered as
one unit by the partition producer, sealed by the columnar encoder, settled by
the ledger as a whole. Measured (issue 15 goal 2): the 15-slot ``Delivery`` per
message, its share of the cyclic GC, and the per-message work of every stage
were most of ``send()`` + ``flush()``'s CPU.

Per-row outcomes are read lazily: when one of the chunk's runs settles, the
ledger records the run's span of rows (``RowOutcomes.record``: one entry per
run, nothing per row), and a ``RowDelivery`` finds its row's run there (its
offset is the run's base plus the row's place in it). ``flush()`` callers drop
their deliveries at once, so the burst's value and timestamp lists die when its
columns are packed: a waiting burst holds its packed columns and nothing per
row besides (measured at the peak of the 1M ``send()`` bench: the two lists
were 4.7 MB of its 81 MB). Callbacks keep the values and timestamps lists (an
error names its row's value, metadata carries its timestamp).

Invariants:
* Rows are accepted in call order and the ids of a burst are consecutive: a
  burst is open only while nothing else was put on the intake after it
  (``Intake`` ends it on any other item, as it ends a list burst).
* ``chunk.pending`` counts the burst's rows only once it is sealed (by the
  dispatcher taking it, or by a close); nothing settles a row before that,
  because its run reaches no stage before the dispatcher takes it.
* A row's outcome is written once: the row enters a span of
  ``RowOutcomes.bounds`` when its run settles (write-once ``_state`` per run),
  a run settles once, and the spans of a burst's runs never overlap.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Generator, Iterator
from itertools import repeat
from typing import TYPE_CHECKING, Any

import trio

from pipeline.producer import message as _m
from pipeline.producer.message import (
    FAILED,
    OK,
    PENDING,
    Delivery,
    DeliveryCallback,
    ProducerError,
    ProducerMessage,
    RecordMetadata,
    _checkpoint,
    _checkpoint_if_cancelled,
)
from pipeline.producer.rows import RowChunk, RowRun
from pipeline.protocol.columnar import BinaryColumn, Columns, kernel

__all__ = ["COLUMNS_MIN", "RowDelivery", "RowOutcomes", "SendRows"]

#: A burst opens as columns only after a burst of at least this many messages
#: was taken (a high-rate loop): each burst's runs are sealed as their own
#: batches, so small bursts (a paced sender) keep the per-message path, whose
#: messages share batches across bursts during ``linger``.
COLUMNS_MIN = 64

_new_metadata = tuple.__new__

#: ``RowOutcomes.timestamps`` of a burst without callbacks: only ``call_back``
#: (and ``errors``, for it) read it; a row's delivery reads its ``SendRows``.
_NOT_KEPT: list[int] = []
#: One span of ``RowOutcomes.bounds``: a settled run's first row and the row after its last.
_PAIR = struct.Struct("=qq")


def _spans_from(bounds: bytearray, row: int) -> int:
    """How many spans of ``bounds`` (sorted) start at or before ``row``."""
    lo, hi = 0, len(bounds) // _PAIR.size
    while lo < hi:
        mid = (lo + hi) // 2
        if _PAIR.unpack_from(bounds, _PAIR.size * mid)[0] <= row:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _span(run: RowRun) -> tuple[int, int]:
    """The rows of a burst's run: consecutive, as the null-key split and the
    KIP-126 halves cut them (``None``: the burst's whole unsplit run)."""
    rows = run.rows
    if rows is None:
        return 0, run.count
    assert type(rows) is range, "a burst's runs are ranges of rows"
    assert rows.step == 1
    return rows.start, rows.stop


def row_offset(run: RowRun, row: int) -> int:
    """The offset of ``row`` of a burst, written by ``run`` (settled OK): the
    run's base offset plus the row's place in it; -1 when the broker gave no
    offset (acks=0, or a duplicate's answer)."""
    base = run.offset
    if base < 0:
        return -1
    start: int = run.rows.start  # (settled OK: split, so its rows are a range)
    return base + row - start


class RowOutcomes:
    """Where each row of a burst ended up: written by the ledger when a run of
    the burst settles, read by the rows' deliveries. Shared by the chunk (which
    drops it with its last row: ``runs`` are runs, and runs point at the
    chunk) and the ``SendRows``, so neither keeps the other alive."""

    __slots__ = ("bounds", "event", "on_delivery", "runs", "timestamps", "topic", "values")

    def __init__(self, rows: SendRows) -> None:
        # The settled runs in row order: ``runs[i]`` settled rows [start, stop)
        # = ``bounds`` int64 pair i (a bytearray _delivery.c reads in place); a
        # row in no span is pending. O(runs): nothing per row (a per-row list
        # was 8 bytes a kept row). A row's offset: ``row_offset``.
        self.bounds = bytearray()
        self.runs: list[RowRun] = []
        # Set when a run settles while someone waits for a row (then replaced).
        self.event: trio.Event | None = None
        # The rows' on_delivery callbacks (None: no row has one), called per row by
        # the ledger when a run settles (with the row's metadata, or its error
        # naming its value: hence the lists, kept only then; a delivery reads
        # its value and timestamp from its ``SendRows``).
        self.on_delivery = rows.on_delivery
        self.topic = rows.topic
        self.timestamps = rows.timestamps if rows.on_delivery is not None else _NOT_KEPT
        self.values = rows.values if rows.on_delivery is not None else None

    def record(self, run: RowRun) -> None:
        """``run`` settled (its ``_state``, ``offset`` and ``timestamp`` are set)."""
        a, b = _span(run)
        i = _spans_from(self.bounds, a)
        at = _PAIR.size * i  # (spans before it end by a; those after start at b or later)
        assert i == 0 or _PAIR.unpack_from(self.bounds, at - _PAIR.size)[1] <= a, "spans overlap"
        assert at == len(self.bounds) or b <= _PAIR.unpack_from(self.bounds, at)[0]
        self.bounds[at:at] = _PAIR.pack(a, b)
        self.runs.insert(i, run)
        if self.event is not None:
            self.event.set()
            self.event = None

    def run_for(self, row: int) -> RowRun | None:
        """The settled run of ``row`` (None: pending), as _delivery.c finds it."""
        i = _spans_from(self.bounds, row) - 1
        if i < 0 or row >= _PAIR.unpack_from(self.bounds, _PAIR.size * i)[1]:
            return None
        return self.runs[i]

    def call_back(self, run: RowRun, failed: Callable[[Any, Any], None]) -> None:
        """Call the ``on_delivery`` of each row of ``run`` (settled, recorded)
        once, in row order: ``fn(metadata, None)`` or ``fn(None, error)``. A
        callback that raises is reported with ``failed(fn, what)`` from the
        ``except`` block (the ledger logs and counts it), and the next row
        still hears."""
        assert self.on_delivery is not None
        a, b = _span(run)
        if run._state == OK:  # the common case: one C loop (or its twin)
            call_back_ok(self.on_delivery[a:b], run.topic, run.partition, run.offset,
                         self.timestamps[a:b], run.timestamp, failed)
            return
        for error, fn in zip(self.errors(run), self.on_delivery[a:b], strict=True):
            if fn is not None:
                try:
                    fn(None, error)
                except Exception:
                    failed(fn, error.message)

    def errors(self, run: RowRun) -> Iterator[ProducerError]:
        """The ``ProducerError`` of each row of ``run`` (failed), in row order,
        naming the row's value."""
        values, cause = self.values, run._outcome
        assert values is not None
        assert cause is not None
        for row in range(*_span(run)):
            msg = ProducerMessage(self.topic, values[row], None, None, run.partition,
                                  self.timestamps[row])
            msg._state = FAILED
            yield ProducerError(msg, cause)


class SendRows:
    """One ``send()`` burst: its columns while open (a list per column), then
    the deliveries' view of its rows."""
    __slots__ = ("chunk", "deadline", "event", "on_delivery", "outcomes", "run",
                 "size", "timestamps", "topic", "values")

    def __init__(self, topic: str, run: RowRun, chunk: RowChunk) -> None:
        self.topic = topic
        # Each row's on_delivery (or None), once a row had one; None: no row had.
        self.on_delivery: list[DeliveryCallback | None] | None = None
        # Only bytes and ints: lists the cyclic GC need not walk (new_column).
        self.values: list[bytes] = new_column()
        self.timestamps: list[int] = new_column()
        self.size = 0  # bytes reserved (the per-message bounds)
        # The burst's run, in the intake until the dispatcher takes it (None after).
        self.run: RowRun | None = run
        self.deadline = run._deadline  # its rows' delivery deadline (run's is set first)
        self.chunk = chunk
        self.outcomes: RowOutcomes | None = None  # set when sealed
        self.event: trio.Event | None = None  # set when sealed, if someone waits

    def seal(self) -> int:
        """The burst is closed (the dispatcher took it, or the producer closes):
        its columns are packed into the run, and its rows become pending rows
        of the chunk. Returns the bytes of that packed copy."""
        pack = kernel().pack_binary
        offsets, data, validity, _ = pack(self.values, "values")
        assert validity is None, "send() put only bytes values here"
        values = BinaryColumn(memoryview(offsets).cast("q"), memoryview(data))
        n = len(self.values)
        run, chunk = self.run, self.chunk
        assert run is not None, "a burst is sealed once"
        self.run = None  # it travels on; the burst's deliveries must not keep its columns
        packed = kernel().pack_ints(self.timestamps, True)  # (None: an injected clock's odd
        stamps = (memoryview(array("q", self.timestamps)) if packed is None  # value: array's)
                  else memoryview(packed).cast("q"))
        run.columns = Columns(values, None, None, stamps)
        run.count = n
        run._size = self.size
        chunk.pending = n
        self.outcomes = chunk.outcomes = RowOutcomes(self)
        self.on_delivery = None  # the outcomes hold them until the last row settles
        if self.event is not None:
            self.event.set()
        return values.offsets.nbytes + values.data.nbytes + stamps.nbytes


if TYPE_CHECKING:
    class _RowAwaitBase:
        pass
else:
    class _NoCRowAwait:  # (a base of its own: ``object`` here would break the MRO;
        __slots__ = ("_row", "_rows")  # its fields, as _delivery.RowAwait has them)

    _RowAwaitBase = _NoCRowAwait if _m._c is None else _m._c.RowAwait


class RowDelivery(Delivery, _RowAwaitBase):
    """What ``send()`` returns for a row of a columnar burst: the same API as
    a message's ``Delivery``, read from the burst (two slots, no copy).

    Where the C extension is built, its two fields are ``_delivery.RowAwait``'s
    (the row's index a C integer) and its instances are no GC objects
    (``make_untracked`` in ``_delivery.c``, at import): a loop keeping 200k of
    them then triggers no collection. That is safe because nothing it refers to
    can lead back to it once its burst is settled: ``_rows`` is a ``SendRows``
    whose values are ``bytes``, timestamps ``int``s, and whose only user
    objects, the rows' ``on_delivery`` callbacks, are dropped when the last
    row settled (until then a callback that refers to its own delivery makes
    a cycle that the settling breaks; every accepted row settles). Its await
    is ``_delivery.RowAwait``'s ``am_await`` when the C path is in use (the
    settled case without a Python frame), else ``_row_await_py``."""

    __slots__ = ()  # its two fields are its base's (_delivery.c makes it GC-free)
    _rows: SendRows  # the burst (set by new_row)
    _row: int  # the row's index in it

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        return _row_await_py(self)  # replaced by the C slot (_use_rows)

    # -- the message's fields ----------------------------------------------------
    @property
    def topic(self) -> str:  # type: ignore[override]
        return self._rows.topic

    @property
    def value(self) -> bytes:  # type: ignore[override]
        return self._rows.values[self._row]

    @property
    def key(self) -> None:  # type: ignore[override]
        return None

    @property
    def headers(self) -> tuple[()]:  # type: ignore[override]
        return ()

    @property
    def metadata(self) -> None:
        return None

    def _run(self) -> RowRun | None:
        outcomes = self._rows.outcomes
        return None if outcomes is None else outcomes.run_for(self._row)  # (None: pending)

    @property
    def partition(self) -> int | None:  # type: ignore[override]
        run = self._run()
        return None if run is None else run.partition

    @property
    def offset(self) -> int:  # type: ignore[override]
        run = self._run()
        if run is None or run._state != OK:
            return -1
        return row_offset(run, self._row)

    @property
    def timestamp(self) -> int:  # type: ignore[override]
        run = self._run()
        if run is not None and run._state == OK and run.timestamp >= 0:
            return run.timestamp  # the broker's LogAppendTime
        return self._rows.timestamps[self._row]

    @property
    def _state(self) -> int:  # type: ignore[override]
        run = self._run()
        return PENDING if run is None else run._state

    @property
    def _outcome(self) -> BaseException | None:  # type: ignore[override]
        run = self._run()
        return None if run is None else run._outcome

    @property
    def message(self) -> ProducerMessage:
        """The row as a ``ProducerMessage`` (a copy, with its outcome's fields)."""
        msg = ProducerMessage(self.topic, self.value, None, None, self.partition, self.timestamp)
        msg.offset = self.offset
        msg._state = self._state
        return msg

    def __repr__(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}[{self.partition}]"
        state = ("pending", "ok", "failed")[self._state]
        off = f" offset={self.offset}" if self._state == OK else ""
        return f"<Delivery {where} key=None {state}{off}>"

    def done(self) -> bool:
        return self._state != PENDING

    def record_metadata(self) -> RecordMetadata:
        offset = self.offset
        return _new_metadata(RecordMetadata, (
            self._rows.topic, self.partition, offset, self.timestamp, offset >= 0))

    def result(self) -> RecordMetadata:
        state = self._state
        if state == OK:
            return self.record_metadata()
        if state == FAILED:
            outcome = self._outcome
            assert outcome is not None
            raise ProducerError(self.message, outcome)
        raise trio.WouldBlock

    async def _park(self) -> None:
        """Wait (a trio checkpoint) until the row is settled: woken whenever a
        run of its burst settles, so a loop awaiting a burst's rows in order
        parks about once per batch."""
        rows = self._rows
        while True:
            outcomes = rows.outcomes
            if outcomes is not None and self._run() is not None:
                await trio.lowlevel.checkpoint()
                return
            if outcomes is None:  # not sealed yet: the dispatcher has not taken it
                if rows.event is None:
                    rows.event = trio.Event()
                await rows.event.wait()
                continue
            if outcomes.event is None:
                outcomes.event = trio.Event()
            await outcomes.event.wait()


def _row_await_py(self: RowDelivery) -> Generator[Any, None, RecordMetadata]:
    """``RowDelivery.__await__`` in Python: all of it without the C module, and
    its pending / failed part with it (``RowAwait`` hands those cases over)."""
    run = self._run()
    if run is not None and run._state == OK:  # settled: no schedule pass
        if _m._schedule_due():  # (the process-wide budget and check of message.py)
            yield from _checkpoint().__await__()
        else:
            try:
                cancelled = _m._run_context.task._cancel_status.effectively_cancelled
            except AttributeError:
                cancelled = True
            if cancelled:
                yield from _checkpoint_if_cancelled().__await__()  # raises Cancelled
        return _row_metadata_py(self)
    yield from self._park().__await__()  # pending: waits; failed: a checkpoint
    return self.result()


def _row_metadata_py(self: RowDelivery) -> RecordMetadata:
    """The ``RecordMetadata`` of a row settled OK (``_delivery.row_metadata``'s twin)."""
    outcomes = self._rows.outcomes
    assert outcomes is not None
    run = outcomes.run_for(self._row)
    assert run is not None
    row = self._row
    offset = run.offset
    if offset >= 0:  # (row_offset, inlined)
        offset += row - run.rows.start
    timestamp = run.timestamp
    return _new_metadata(RecordMetadata, (
        run.topic, run.partition, offset,
        timestamp if timestamp >= 0 else self._rows.timestamps[row], offset >= 0))


def _row_settled_checkpoint(self: RowDelivery, full: bool) -> Generator[Any, None, RecordMetadata]:
    """The C path's settled await when it must yield: a schedule point is due
    (``full``), or the task is cancelled or its cancel status unreadable."""
    if full:
        yield from _checkpoint().__await__()
    else:
        yield from _checkpoint_if_cancelled().__await__()
    return _row_metadata_py(self)


def _new_row_py(rows: SendRows, row: int) -> RowDelivery:
    """``_delivery.new_row``'s twin (a GC object when the extension is not built)."""
    delivery = _new_delivery(RowDelivery)
    delivery._rows = rows
    delivery._row = row
    return delivery


_new_delivery = RowDelivery.__new__


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
#: twin (``_use_rows``).
call_back_ok: Callable[..., None] = _call_back_ok_py

#: A burst's column list: ``_send.atomic_list`` (a list the cyclic GC does not
#: track: its items are bytes or ints, in no cycle) when that module is loaded
#: (``fast_send.py`` sets it), else ``list``.
new_column: Callable[[], list[Any]] = list

#: ``send()``'s row constructor: ``_delivery.new_row`` or its twin (``_use_rows``).
new_row: Callable[[SendRows, int], RowDelivery] = _new_row_py


def _use_rows(kind: str) -> None:
    """Bind the rows' await to the process's path (``message._use`` calls this
    after every switch): the C slot and allocator, or the Python twins."""
    global call_back_ok, new_row
    if kind == "c":
        assert _m._c is not None
        _m._c.setup_rows(row_type=RowDelivery, rows_type=SendRows, outcomes_type=RowOutcomes,
                         run_type=RowRun, python_await=_row_await_py,
                         settled_checkpoint=_row_settled_checkpoint)
        new_row = _m._c.new_row
        call_back_ok = _m._c.call_back_ok
        if "__await__" in RowDelivery.__dict__:
            del RowDelivery.__await__  # the slot comes from _delivery.RowAwait again
    else:
        new_row = _new_row_py
        call_back_ok = _call_back_ok_py
        RowDelivery.__await__ = _row_await_py  # type: ignore[method-assign]


_m._USE_HOOKS.append(_use_rows)
_use_rows(_m.DELIVERY_AWAIT)
