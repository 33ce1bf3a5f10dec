"""``send()`` bursts as columns: the per-message call without a per-message
object in the stages.

A high-rate loop of common ``send()`` calls (a ``bytes`` value, a ``bytes`` key or
none, either of them a ``str`` sent as UTF-8; no headers, partition, timestamp or
``metadata``; an ``on_delivery`` callable or none; the default partitioner) appends
each call's value, key and timestamp to the columns of one open ``RowBurst``, as
Java's ``RecordAccumulator`` appends into its batch buffer, and returns a two-slot
``RowDelivery``. When the dispatcher takes the burst, its columns are packed once
(the C kernel's ``pack_binary``) and the burst travels through the four stages as a
``send_batch`` ``RowRun`` does (``rows.py``): split per partition and batch by the topic producer, ordered as
one unit by the partition producer, sealed by the columnar encoder, settled by
the ledger as a whole. Why: a 15-slot ``Delivery`` per message, its share of the
cyclic GC, and the per-message work of every stage would be most of ``send()`` +
``flush()``'s CPU (``docs/benchmarks.md``).

Per-row outcomes are read lazily: when one of the chunk's runs settles, the
ledger records the run's span of rows (``row_outcomes.py``: one entry per
run, nothing per row; keyed rows spread over partitions, see there), and a
``RowDelivery`` finds its row's run there (its offset is the run's base plus the
row's place in it). ``flush()`` callers drop
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

import sys
from array import array
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import trio

from pipeline.producer._columnar import row_outcomes as _outcomes
from pipeline.producer._columnar.row_outcomes import RowOutcomes, _call_back_ok_py, row_headers
from pipeline.producer._columnar.rows import RowChunk, RowRun
from pipeline.producer._message import (
    FAILED,
    OK,
    PENDING,
    DeliveryCallback,
    ProducerError,
    ProducerMessage,
    RecordMetadata,
)
from pipeline.producer._outcomes import delivery as _delivery
from pipeline.producer._outcomes.delivery import Delivery, _checkpoint, _checkpoint_if_cancelled
from pipeline.producer._speedups import fields
from pipeline.producer._speedups.fields import names, slots
from pipeline.protocol.columnar import BinaryColumn, Columns, HeaderColumn, kernel

__all__ = ["COLUMNS_MIN", "RowBurst", "RowDelivery", "RowOutcomes", "pack_columns"]

#: A burst opens as columns only after a burst of at least this many messages
#: was taken (a high-rate loop): each burst's runs are sealed as their own
#: batches, so small bursts (a paced sender) keep the per-message path, whose
#: messages share batches across bursts during ``linger``.
COLUMNS_MIN = 64

_new_metadata = tuple.__new__

# What a sealed burst whose rows have callbacks keeps per row beyond the bytes its size
# counts, until its last row settles (``RowOutcomes`` keeps the column lists to call each
# row back and to name it in a failure): a row's value bytes object, its timestamp int,
# their list slots and its callback's; a key's bytes object and slot; a header's value
# bytes object, its two slots; the row's header end (an int past the small ints, and its
# slot). Its seal reserves these too, as a send_many chunk does (``messages.py``), so a
# buffer of such rows is a buffer_memory of memory, not two (held to what the
# interpreter allocates by tests/producer/test_held_bytes.py).
KEPT_ROW_BYTES = sys.getsizeof(b"") + sys.getsizeof(1 << 40) + 3 * 8
KEPT_KEY_BYTES = sys.getsizeof(b"") + 8
KEPT_HEADER_BYTES = sys.getsizeof(b"") + 2 * 8
KEPT_ENDS_BYTES = sys.getsizeof(1 << 20) + 8


class RowBurst:
    """One ``send()`` burst: its columns while open (a list per column), then
    the deliveries' view of its rows."""
    __slots__ = slots(fields.SEND_BURST, fields.DELIVERY_BURST, (
        "chunk", "deadline", "event", "run"))

    def __init__(self, topic: str, run: RowRun, chunk: RowChunk) -> None:
        self.topic = topic
        # Each row's on_delivery (or None), once a row had one; None: no row had.
        self.on_delivery: list[DeliveryCallback | None] | None = None
        # Only bytes and ints: lists the cyclic GC need not walk (new_column).
        self.values: list[bytes | None] = new_column()  # (None: a null value)
        self.timestamps: list[int] = new_column()
        # Each row's key (bytes or None), once a row had one; None: no row had (the
        # burst then splits as keyless rows do; with keys, by murmur2 as send_batch).
        self.keys: list[bytes | None] | None = None
        # Headers, flat, once a row had some (None: no row had): each header's key
        # (an exact str) and value (bytes or None), and per row the end of its
        # headers in them, after a leading 0 (row i's are ends[i]:ends[i + 1]).
        self.header_keys: list[str] | None = None
        self.header_values: list[bytes | None] | None = None
        self.header_ends: list[int] | None = None
        # Each row's pinned partition (-1: the partitioner's choice), once a row
        # pinned one; None: no row did.
        self.partitions: list[int] | None = None
        # Each row's metadata (None: none), once a row had some: kept for the rows'
        # callbacks' errors until the last row settles (a row's delivery holds its
        # own: MetadataRowDelivery); None: no row had.
        self.metadata: list[Any] | None = None
        # True once one of those columns exists: every later row adds to them.
        self.extras = False
        self.size = 0  # bytes reserved (the per-message bounds)
        # The burst's run, in the intake until the dispatcher takes it (None after).
        self.run: RowRun | None = run
        self.deadline = run._deadline  # its rows' delivery deadline (run's is set first)
        self.chunk = chunk
        self.outcomes: RowOutcomes | None = None  # set when sealed
        self.event: trio.Event | None = None  # set when sealed, if someone waits

    def first_key(self, key: bytes) -> None:
        """The burst's first keyed row is the next one: the rows before it had none."""
        self.keys = keys = new_column()  # (bytes and None only, as the values)
        keys.extend([None] * len(self.values))
        keys.append(key)

    def add_extras(self, headers: tuple[tuple[str, bytes | None], ...],
                   partition: int, metadata: Any) -> None:
        """The next row's headers (exact str keys, bytes or None values), pinned
        partition (-1: none) and metadata (call it before the row's value is
        appended): each column is made by its first row that has one, with the
        rows before it filled in, and ``extras`` is set (``_send.c``'s row branch
        does the same in C)."""
        ends = self.header_ends
        if headers:
            if ends is None:  # the burst's first headers: the rows before had none
                self.header_keys, self.header_values = new_column(), new_column()
                self.header_ends = ends = new_column()
                ends.extend([0] * (len(self.values) + 1))
                self.extras = True
            keys, values = self.header_keys, self.header_values
            assert keys is not None
            assert values is not None
            for hkey, hvalue in headers:
                keys.append(hkey)
                values.append(hvalue)
            ends.append(len(keys))
        elif ends is not None:
            ends.append(ends[-1])
        if (parts := self.partitions) is not None:
            parts.append(partition)
        elif partition >= 0:
            self.partitions = parts = new_column()
            parts.extend([-1] * len(self.values))
            parts.append(partition)
            self.extras = True
        if (kept := self.metadata) is not None:
            kept.append(metadata)
        elif metadata is not None:
            self.metadata = [None] * len(self.values) + [metadata]
            self.extras = True

    def row_headers(self, row: int) -> tuple[tuple[str, bytes | None], ...]:
        """Row ``row``'s headers, as ``normalize`` leaves a message's."""
        ends = self.header_ends
        if ends is None:
            return ()
        assert self.header_keys is not None
        assert self.header_values is not None
        return row_headers(self.header_keys, self.header_values, ends, row)

    def kept(self) -> int:
        """What the burst's rows keep once sealed beyond their size bounds
        (``KEPT_ROW_BYTES`` ...): only with callbacks, whose outcomes keep the columns."""
        if self.on_delivery is None:
            return 0
        n = len(self.values)
        kept = n * KEPT_ROW_BYTES
        if self.keys is not None:
            kept += n * KEPT_KEY_BYTES
        if self.header_keys is not None:
            kept += len(self.header_keys) * KEPT_HEADER_BYTES + n * KEPT_ENDS_BYTES
        return kept

    def seal(self) -> int:
        """The burst is closed (the dispatcher took it, or the producer closes):
        its columns are packed into the run, and its rows become pending rows
        of the chunk. Returns the bytes of that packed copy, and of what its rows
        keep with callbacks (``kept``)."""
        columns, copied = pack_columns(self.values, self.keys, self.header_keys,
                                       self.header_values, self.header_ends, self.timestamps,
                                       self.partitions)
        copied += self.kept()
        n = len(self.values)
        run, chunk = self.run, self.chunk
        assert run is not None, "a burst is sealed once"
        self.run = None  # it travels on; the burst's deliveries must not keep its columns
        run.columns = columns
        run.count = n
        run._size = self.size
        chunk.pending = n
        self.outcomes = chunk.outcomes = RowOutcomes(self)
        self.on_delivery = None  # the outcomes hold them until the last row settles
        self.metadata = None  # (as the callbacks: each row's delivery holds its own)
        if self.event is not None:
            self.event.set()
        return copied


def pack_columns(values: list[bytes | None], keys: list[bytes | None] | None,
                 header_keys: list[str] | None, header_values: list[bytes | None] | None,
                 header_ends: list[int] | None, timestamps: list[int],
                 partitions: list[int] | None) -> tuple[Columns, int]:
    """Column lists (a burst's, or a ``send_many`` chunk's: ``messages.py``) packed into
    one ``Columns`` by the kernel, and the bytes of that copy."""
    pack = kernel().pack_binary
    packed_values = _binary(pack(values, "values"))
    copied = _nbytes(packed_values)
    packed_keys = None
    if keys is not None:  # (None where a row had no key: the validity bitmap)
        packed_keys = _binary(pack(keys, "keys"))
        copied += _nbytes(packed_keys)
    headers = None
    if header_ends is not None:
        assert header_keys is not None
        assert header_values is not None
        ends = kernel().pack_ints(header_ends, True)
        assert ends is not None, "header ends are ascending ints from 0"
        headers = HeaderColumn(memoryview(ends).cast("q"),
                               _binary(pack(header_keys, "header keys")),
                               _binary(pack(header_values, "header values")))
        copied += len(ends) + _nbytes(headers.keys) + _nbytes(headers.values)
    pinned = None
    if partitions is not None:  # (-1: the partitioner's choice)
        pinned = memoryview(array("i", partitions))
        copied += pinned.nbytes
    packed = kernel().pack_ints(timestamps, True)  # (None: an injected clock's odd
    stamps = (memoryview(array("q", timestamps)) if packed is None  # value: array's)
              else memoryview(packed).cast("q"))
    return Columns(packed_values, packed_keys, headers, stamps, pinned), copied + stamps.nbytes


def _binary(packed: tuple[bytes, bytes, bytes | None, int]) -> BinaryColumn:
    """``pack_binary``'s result as a column (a validity bitmap where a row is None)."""
    offsets, data, validity, nulls = packed
    return BinaryColumn(memoryview(offsets).cast("q"), memoryview(data),
                        None if validity is None else memoryview(validity), 0, nulls)


def _nbytes(column: BinaryColumn) -> int:
    return column.offsets.nbytes + column.data.nbytes + (
        0 if column.validity is None else column.validity.nbytes)


if TYPE_CHECKING:
    class _RowAwaitBase:
        pass
else:
    class _NoCRowAwait:  # (a base of its own: ``object`` here would break the MRO;
        __slots__ = ("_row", "_rows")  # its fields, as _delivery.RowAwait has them)

    _RowAwaitBase = _NoCRowAwait if _delivery._c is None else _delivery._c.RowAwait


class RowDelivery(Delivery, _RowAwaitBase):
    """What ``send()`` returns for a row of a columnar burst: the same API as
    a message's ``Delivery``, read from the burst (two slots, no copy).

    Where the C extension is built, its two fields are ``_delivery.RowAwait``'s
    (the row's index a C integer) and its instances are no GC objects
    (``make_untracked`` in ``_delivery.c``, at import): a loop keeping 200k of
    them then triggers no collection. That is safe because nothing it refers to
    can lead back to it once its burst is settled: ``_rows`` is a ``RowBurst``
    whose values are ``bytes``, timestamps ``int``s, and whose only user
    objects, the rows' ``on_delivery`` callbacks, are dropped when the last
    row settled (until then a callback that refers to its own delivery makes
    a cycle that the settling breaks; every accepted row settles). Its await
    is ``_delivery.RowAwait``'s ``am_await`` when the C path is in use (the
    settled case without a Python frame), else ``_row_await_py``."""

    __slots__ = ()  # its two fields are its base's (_delivery.c makes it GC-free)
    _rows: RowBurst  # the burst (set by new_row)
    _row: int  # the row's index in it

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        return _row_await_py(self)  # replaced by the C slot (_use_rows)

    # -- the message's fields ----------------------------------------------------
    @property
    def topic(self) -> str:  # type: ignore[override]
        return self._rows.topic

    @property
    def value(self) -> bytes | None:  # type: ignore[override]
        return self._rows.values[self._row]

    @property
    def key(self) -> bytes | None:  # type: ignore[override]
        keys = self._rows.keys
        return None if keys is None else keys[self._row]

    @property
    def headers(self) -> tuple[tuple[str, bytes | None], ...]:  # type: ignore[override]
        return self._rows.row_headers(self._row)

    @property
    def metadata(self) -> Any:
        return None  # (a row sent with metadata is a MetadataRowDelivery)

    def _run(self) -> RowRun | None:
        outcomes = self._rows.outcomes
        return None if outcomes is None else outcomes.run_for(self._row)  # (None: pending)

    @property
    def partition(self) -> int | None:  # type: ignore[override]
        run = self._run()
        if run is not None:
            return run.partition
        pinned = self._rows.partitions  # (pending: its pinned partition, as a message's)
        return None if pinned is None or pinned[self._row] < 0 else pinned[self._row]

    @property
    def offset(self) -> int:  # type: ignore[override]
        outcomes = self._rows.outcomes
        found = None if outcomes is None else outcomes.locate(self._row)
        if found is None or found[0]._state != OK or found[0].offset < 0:
            return -1
        return found[0].offset + found[1]  # the run's base offset plus the row's place

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
        msg = ProducerMessage(self.topic, self.value, self.key, self.headers, self.partition,
                              self.timestamp, self.metadata)
        msg.offset = self.offset
        msg._state = self._state
        return msg

    def __repr__(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}[{self.partition}]"
        state = ("pending", "ok", "failed")[self._state]
        off = f" offset={self.offset}" if self._state == OK else ""
        return f"<Delivery {where} key={self.key!r} {state}{off}>"

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
            outcomes = self._rows.outcomes
            assert outcomes is not None, "a settled row's burst is sealed"
            outcomes.read_row(self._row)  # the caller read this row's failure
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


class MetadataRowDelivery(RowDelivery):
    """A row sent with ``metadata``: a ``RowDelivery`` that holds it. A GC object
    (``RowDelivery``'s are not), so a metadata object that refers to its own
    delivery makes a cycle the collector can see and free; the burst keeps the
    rows' metadata only for their callbacks' errors, until its last row settles."""

    __slots__ = ("_metadata",)
    _metadata: Any

    @property
    def metadata(self) -> Any:
        return self._metadata


def new_metadata_row(rows: RowBurst, row: int, metadata: Any) -> MetadataRowDelivery:
    """A row's delivery when the row has ``metadata`` (not None); ``_send.c`` calls it too."""
    delivery = _new_metadata_delivery(MetadataRowDelivery)
    delivery._rows = rows
    delivery._row = row
    delivery._metadata = metadata
    return delivery


_new_metadata_delivery = MetadataRowDelivery.__new__


def _row_await_py(self: RowDelivery) -> Generator[Any, None, RecordMetadata]:
    """``RowDelivery.__await__`` in Python: all of it without the C module, and
    its pending / failed part with it (``RowAwait`` hands those cases over)."""
    run = self._run()
    if run is not None and run._state == OK:  # settled: no schedule pass
        if _delivery._schedule_due():  # (the process-wide budget and check of delivery.py)
            yield from _checkpoint().__await__()
        else:
            try:
                cancelled = _delivery._run_context.task._cancel_status.effectively_cancelled
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
    row = self._row
    found = outcomes.locate(row)
    assert found is not None
    run, place = found
    offset = run.offset
    if offset >= 0:
        offset += place
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


def _new_row_py(rows: RowBurst, row: int) -> RowDelivery:
    """``_delivery.new_row``'s twin (a GC object when the extension is not built)."""
    delivery = _new_delivery(RowDelivery)
    delivery._rows = rows
    delivery._row = row
    return delivery


_new_delivery = RowDelivery.__new__


#: A burst's column list: ``_send.atomic_list`` (a list the cyclic GC does not
#: track: its items are bytes or ints, in no cycle) when that module is loaded
#: (``_intake/send_path.py`` sets it), else ``list``.
new_column: Callable[[], list[Any]] = list

#: ``send()``'s row constructor: ``_delivery.new_row`` or its twin (``_use_rows``).
new_row: Callable[[RowBurst, int], RowDelivery] = _new_row_py


def _setup_rows(row_type: type) -> None:
    """Bind ``_delivery.c``'s rows to ``row_type`` (``RowDelivery``) and to the fields
    of ``fields.DELIVERY_BURST``, ``DELIVERY_OUTCOMES`` and ``DELIVERY_RUN``."""
    assert _delivery._c is not None
    _delivery._c.setup_rows(
        row_type=row_type,
        rows_type=RowBurst, rows_fields=names(fields.DELIVERY_BURST),
        outcomes_type=RowOutcomes, outcomes_fields=names(fields.DELIVERY_OUTCOMES),
        run_type=RowRun, run_fields=names(fields.DELIVERY_RUN),
        python_await=_row_await_py, settled_checkpoint=_row_settled_checkpoint)


def _use_rows(kind: str) -> None:
    """Bind the rows' await to the process's path (``message._use`` calls this
    after every switch): the C slot and allocator, or the Python twins."""
    global new_row
    if kind == "c":
        assert _delivery._c is not None
        _setup_rows(RowDelivery)
        new_row = _delivery._c.new_row
        _outcomes.call_back_ok = _delivery._c.call_back_ok
        _outcomes.map_rows = _delivery._c.map_rows
        if "__await__" in RowDelivery.__dict__:
            del RowDelivery.__await__  # the slot comes from _delivery.RowAwait again
    else:
        new_row = _new_row_py
        _outcomes.call_back_ok = _call_back_ok_py
        _outcomes.map_rows = _outcomes._map_rows_py
        RowDelivery.__await__ = _row_await_py  # type: ignore[method-assign]


_delivery._USE_HOOKS.append(_use_rows)
_use_rows(_delivery.DELIVERY_AWAIT)
