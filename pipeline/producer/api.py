"""The public producer: ``open_producer`` and ``Producer``.

Acceptance is the line that matters to users. ``send()`` validates the
message, reserves buffer memory (waiting up to ``max_block``), then puts it on
the intake channel. Only after that does the message count as accepted: from
then on it gets exactly one outcome, even if the caller is cancelled, the
producer closes, or every broker is down. A ``send()`` cancelled before that
point sends nothing and leaves no trace.

``send()`` is a checkpoint (cancellation and schedule point) at least every
``_YIELD_EVERY`` calls and whenever it has to wait (buffer or intake full), so
a tight loop of sends neither starves the pipeline nor pays a scheduler pass
per message; the checkpoint comes before acceptance, so a cancelled ``send()``
never accepted its message.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from itertools import accumulate
from operator import attrgetter
from typing import Any

import trio

from pipeline.cluster.errors import AuthenticationError, BrokerConnectionError, KafkaError
from pipeline.cluster.pool import Cluster
from pipeline.producer.async_producer import Dispatcher, FlushMark, InputChannel, IntakeItem
from pipeline.producer.config import ProducerConfig, make_config
from pipeline.producer.core import ProducerCore
from pipeline.producer.errors import (
    BufferFullError,
    MessageTooLargeError,
    ProducerClosed,
    ProducerError,
)
from pipeline.producer.ledger import Ledger
from pipeline.producer.message import (
    OK,
    PENDING,
    TO_CHANNELS,
    Delivery,
    DeliveryCallback,
    DeliveryGroup,
    Headers,
    OnDelivery,
    ProducerMessage,
    RecordMetadata,
)
from pipeline.producer.partitioner import make_partitioner
from pipeline.producer.rows import RowChunk, RowRun, slice_columns
from pipeline.protocol._columns import ColumnInput, HeadersInput, IntsInput
from pipeline.protocol.columnar import build_columns, first_row_over, record_size_bounds
from pipeline.protocol.records import batch_size_for_record
from pipeline.util.groups import unwrap_single_errors

log = logging.getLogger("pipeline.producer")

_YIELD_EVERY = 512  # measured: fewer pipeline rounds per message, ~0.4 ms between yields
# batch_size_for_record(None, None) minus the two null markers: the fixed part
# of the bound (61-byte batch header + the record's varint overhead, headers count).
_SIZE_BASE = batch_size_for_record(None, None) - 2


def _prefix_size(n: int) -> int:
    """Bytes of the zigzag varint length prefix of an ``n``-byte key or value
    (as in batch_size_for_record); the hot paths inline the first two widths."""
    return 1 if n < 64 else 2 if n < 8192 else 3 if n < 1 << 20 else 4 if n < 1 << 27 else 5
_BYTES_LIKE = (bytes, bytearray, memoryview)


_time = time.time
_new_delivery = object.__new__
_id_of = attrgetter("_id")


def _wall_clock_ms() -> int:
    return int(_time() * 1000)


def _as_bytes(what: str, value: object) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, _BYTES_LIKE):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(
        f"{what} must be bytes, bytearray, memoryview, str (sent as UTF-8) or None, "
        f"not {type(value).__name__}: serialize it first (e.g. json.dumps(obj).encode())"
    )


def _as_headers(headers: object) -> tuple[tuple[str, bytes | None], ...]:
    if not headers:
        return ()
    if isinstance(headers, Mapping):
        headers = list(headers.items())
    elif isinstance(headers, (str, bytes)):
        raise TypeError(
            f"headers must be a sequence of (str, bytes | None) pairs or a mapping, "
            f"not {type(headers).__name__}"
        )
    out = []
    try:
        for key, value in headers:  # type: ignore[attr-defined]
            if not isinstance(key, str):
                raise TypeError(f"header key must be str, not {type(key).__name__}")
            out.append((key, _as_bytes(f"header {key!r} value", value)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"headers must be a sequence of (str, bytes | None) pairs: {exc}") from None
    return tuple(out)


# The intake's send side closes at the end of a close; a call still waiting then
# sees one of these, and reports ProducerClosed instead.
_CLOSED = (trio.ClosedResourceError, trio.BrokenResourceError)


def _closed_while_waiting(what: str) -> ProducerClosed:
    """A send that waited for `what` while the producer closed: not accepted.
    (Before, the message stayed registered forever and trio.ClosedResourceError
    reached the caller; found by the schedule explorer.)"""
    return ProducerClosed(
        f"the producer closed while this call waited for {what}: the message was not accepted"
    )


def _copied_bytes(columns: Any) -> Any:
    """``(start, stop) -> bytes`` of the rows' copies that ``build_columns`` made
    (Python lists and numpy object arrays are packed into new buffers; Arrow
    buffers are borrowed): a chunk reserves them from ``buffer_memory`` too,
    because they live until its last row settles, beside the encoded batches."""
    parts = []
    for col in (columns.values, columns.keys):
        if col is not None and type(col.data.obj) is bytes:
            parts.append(col.offsets)
    headers = columns.headers
    if headers is not None and type(headers.values.data.obj) is bytes:
        parts.append(None)  # header entries: counted per row below (rare and small)

    def copied(start: int, stop: int) -> int:
        total = 0
        for offsets in parts:
            if offsets is None:
                hoff = headers.offsets
                a, b = hoff[start], hoff[stop]
                total += (headers.keys.offsets[b] - headers.keys.offsets[a]
                          + headers.values.offsets[b] - headers.values.offsets[a] + 16 * (b - a))
            else:
                total += offsets[stop] - offsets[start] + 8 * (stop - start)
        return total

    return copied


def _on_delivery(fn: DeliveryCallback) -> OnDelivery:
    if not callable(fn):
        raise TypeError(
            f"on_delivery must be a callable taking (metadata, error), not {type(fn).__name__}"
        )
    return OnDelivery(fn)


def _reused_error(msg: ProducerMessage) -> ValueError:
    return ValueError(
        f"{msg!r} was already sent: a ProducerMessage is sent once (it carries that send's "
        "outcome); build a new ProducerMessage to send the same record again"
    )


@dataclass(frozen=True, slots=True)
class ProducerStatistics:
    accepted: int
    succeeded: int
    failed: int
    outstanding: int
    buffered_bytes: int
    requests_sent: int
    double_settles: int  # a bug if ever > 0: a message settled twice
    callback_errors: int = 0  # on_delivery callbacks that raised (each one logged)


class Producer:
    """A running producer. Get one from ``open_producer``."""

    def __init__(self, core: ProducerCore) -> None:
        self._core = core
        self._config = config = core.config
        self._ledger = core.ledger
        self._partitioner = make_partitioner(config.partitioner, core.rng)
        self._timestamp_ms = config.timestamp_ms or _wall_clock_ms
        self._wall_clock = config.timestamp_ms is None  # send() reads time.time itself
        self._intake_send, self._intake_receive = trio.open_memory_channel[IntakeItem](
            config.channel_capacity
        )
        self._successes_send, self.successes = trio.open_memory_channel[ProducerMessage](
            config.channel_capacity
        )
        self._errors_send, self.errors = trio.open_memory_channel[ProducerError](
            config.channel_capacity
        )
        #: sarama-style input: put ``ProducerMessage`` objects here; their outcomes
        #: arrive on ``successes`` (when ``return_successes``) and ``errors``.
        self.input = InputChannel(self, self._intake_send.clone())
        self._ledger.return_successes = config.return_successes
        self._closing = False
        self._until_yield = _YIELD_EVERY
        self._open_batch: list[ProducerMessage] | None = None
        # Messages whose producer.input.send() waits for buffer space: shutdown
        # accepts and fails them (ProducerClosed) with the rest.
        self._input_waiting: set[ProducerMessage] = set()
        self._shut_down = False  # set once the close has failed everything outstanding
        self._open_deadline = 0.0  # delivery deadline shared by the open burst
        self._open_topic: str | None = None  # the burst's one topic (None: maybe mixed)
        # send()'s CreateTime: the current millisecond, and when it ends (time.time()
        # seconds). One int per millisecond, not per message, which also lets the
        # batch encoder skip the timestamp arithmetic for records that share it.
        self._ms = 0
        self._ms_ends = 0.0
        # trio.current_time() walks several layers; the clock object is fixed per run.
        self._now = trio.lowlevel.current_clock().current_time
        self._delivery_timeout = config.delivery_timeout
        self._max_message_bytes = config.max_message_bytes

    # -- accepting ---------------------------------------------------------
    def _prepare(self, msg: ProducerMessage) -> int:
        """Validate and normalize ``msg`` in place; return its size in bytes.

        The per-message hot path of every entry point: fields are read once
        into locals, and only unusual values take the slow helpers.
        """
        topic, value, key, headers = msg.topic, msg.value, msg.key, msg.headers
        if type(topic) is not str or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        if value is not None and type(value) is not bytes:
            msg.value = value = _as_bytes("value", value)
        if key is not None and type(key) is not bytes:
            msg.key = key = _as_bytes("key", key)
        if headers:
            msg.headers = headers = _as_headers(headers)
            size = batch_size_for_record(key, value, headers)
        else:
            # Same bound as batch_size_for_record, inlined for the common case:
            # batch header + max record overhead + varint-prefixed key and value.
            size = _SIZE_BASE + (
                1 if key is None else len(key) + _prefix_size(len(key))
            ) + (1 if value is None else len(value) + _prefix_size(len(value)))
        partition = msg.partition
        if partition is not None and (type(partition) is not int or partition < 0):
            if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                raise ValueError(f"partition must be None or an int >= 0, not {partition!r}")
            msg.partition = int(partition)
        timestamp = msg.timestamp
        if timestamp is None:
            msg.timestamp = self._current_ms()
        elif type(timestamp) is not int or timestamp < 0:
            if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
                raise ValueError(
                    f"timestamp must be None or milliseconds since the epoch (int >= 0), "
                    f"not {timestamp!r}"
                )
            msg.timestamp = int(timestamp)
        if size > self._max_message_bytes:
            raise MessageTooLargeError(
                f"message of {size} bytes (key, value, headers and batch overhead) exceeds "
                f"max_message_bytes={self._config.max_message_bytes}: raise max_message_bytes "
                "(and the topic's max.message.bytes on the broker) or send smaller values"
            )
        msg._size = size
        return size

    def _current_ms(self) -> int:
        """CreateTime for a message without one (``send()`` inlines this)."""
        if not self._wall_clock:
            return self._timestamp_ms()  # an injected clock (tests)
        now = _time()
        if now < self._ms_ends:
            return self._ms  # the same millisecond: share the int
        ms = self._ms = int(now * 1000)
        self._ms_ends = (ms + 1) / 1000
        return ms

    def _check_open(self) -> None:
        if self._closing:
            raise ProducerClosed("the producer is closed: no new messages are accepted")

    def _accept(self, msg: ProducerMessage) -> None:
        self._ledger.accept(msg, self._now() + self._delivery_timeout)

    async def send(
        self,
        topic: str,
        value: bytes | str | None,
        *,
        key: bytes | str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        metadata: Any = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> Delivery:
        """Queue one message; return once it is accepted (backpressure).

        Returns a ``Delivery``: ``await`` it for ``RecordMetadata`` (or a
        ``ProducerError``). ``on_delivery(metadata, error)``, if given, is
        called exactly once when the message settles (in the pipeline's task:
        keep it short; an exception from it is logged and counted in
        ``statistics().callback_errors``). Raises, without accepting the
        message, on bad input, ``BufferFullError`` after ``max_block``, or
        ``ProducerClosed``.
        """
        # A schedule point every _YIELD_EVERY calls (and whenever it must wait
        # below), not on every call: a checkpoint costs more than the rest of
        # send(), and the pipeline moves the whole burst in one pass anyway.
        self._until_yield -= 1
        if self._until_yield <= 0:
            self._until_yield = _YIELD_EVERY
            await trio.lowlevel.checkpoint()
        if self._closing:
            raise ProducerClosed("the producer is closed: no new messages are accepted")
        if (
            headers is None and partition is None and timestamp is None
            and type(value) is bytes and (key is None or type(key) is bytes)
            and type(topic) is str and topic
        ):
            # The common call, validated in place (same rules and size bound as
            # _prepare, which handles everything else and raises its errors).
            # The bound of batch_size_for_record (exact varint widths of the
            # length prefixes), with the two common widths inlined.
            size = len(value)
            size += _SIZE_BASE + (
                1 if size < 64 else 2 if size < 8192 else _prefix_size(size)
            ) + (
                1 if key is None
                else len(key) + (1 if len(key) < 64 else _prefix_size(len(key)))
            )
            # Delivery.__init__, inlined (a class call costs more than these
            # stores); every slot is set here or below (tests check that).
            msg = _new_delivery(Delivery)
            msg.topic = topic
            msg.value = value
            msg.key = key
            msg.headers = ()
            msg.partition = None
            if not self._wall_clock:
                msg.timestamp = self._timestamp_ms()  # an injected clock (tests)
            elif (now := _time()) < self._ms_ends:
                msg.timestamp = self._ms  # the same millisecond: share the int
            else:
                msg.timestamp = ms = self._ms = int(now * 1000)
                self._ms_ends = (ms + 1) / 1000
            msg.metadata = metadata
            msg.offset = -1
            msg._level = 0
            msg._state = PENDING
            msg._outcome = None
            if on_delivery is None:
                msg._sink = None
            elif callable(on_delivery):  # OnDelivery(on_delivery), inlined
                msg._sink = sink = _new_delivery(OnDelivery)
                sink.fn = on_delivery
                sink.event = None
            else:
                msg._sink = _on_delivery(on_delivery)  # raises TypeError
            msg._size = size
            if size > self._max_message_bytes:
                self._prepare(msg)  # raises MessageTooLargeError
        else:
            msg = Delivery(topic, value, key, headers, partition, timestamp, metadata)  # type: ignore[arg-type]
            size = self._prepare(msg)
            if on_delivery is not None:
                msg._sink = _on_delivery(on_delivery)
        ledger = self._ledger
        used = ledger.buffered_bytes
        if used + size <= ledger.buffer_memory or not used:
            ledger.buffered_bytes = used + size
        else:
            await ledger.reserve(size)
            if self._closing:
                ledger.release(size)
                raise _closed_while_waiting("buffer space")
        # Registered before it is enqueued: once in the intake the dispatcher
        # may see it at any moment, and must see it as accepted (ledger.accept,
        # inlined: this is the per-message hot path).
        msg_id = msg._id = ledger._next_id
        ledger._next_id = msg_id + 1
        ledger.outstanding[msg_id] = msg
        burst = self._open_batch
        if burst is not None:
            # Joins the burst already in the intake, and shares its deadline:
            # no checkpoint has passed since the burst opened, so no trio time
            # has either (exact under autojump_clock); in real time the shift
            # is bounded by the _YIELD_EVERY sends between two checkpoints.
            msg._deadline = self._open_deadline
            if topic is not self._open_topic:
                self._open_topic = None  # mixed (or an equal str object): the dispatcher checks
            burst.append(msg)
            return msg
        msg._deadline = deadline = self._now() + self._delivery_timeout
        if not self._enqueue_nowait(msg, deadline):
            try:
                await self._intake_send.send([msg])
            except BaseException as exc:
                if msg._state == PENDING:  # (else the close failed it meanwhile)
                    ledger.unaccept(msg)  # cancelled before acceptance: leave no trace
                if isinstance(exc, _CLOSED):
                    raise _closed_while_waiting("room in the intake") from None
                raise
        return msg

    def _enqueue_nowait(self, msg: ProducerMessage, deadline: float) -> bool:
        """Put an accepted message on the intake without waiting; False if full.

        Consecutive sends share one *open* list (a burst) that is already in
        the intake channel: a burst costs one channel operation, not one per
        message. The dispatcher closes the list when it takes it (same thread,
        between two checkpoints, so no send can slip in between).
        """
        batch = self._open_batch
        if batch is not None:
            msg._deadline = self._open_deadline
            batch.append(msg)
            return True
        batch = [msg]
        try:
            self._intake_send.send_nowait(batch)
        except trio.WouldBlock:
            return False
        self._open_batch = batch
        self._open_deadline = deadline
        self._open_topic = msg.topic
        return True

    def _close_open_batch(self, batch: list[ProducerMessage]) -> str | None:
        """Close ``batch`` if it is the open burst; return its topic when every
        message of it is known to have that topic (None: unknown, check)."""
        if batch is self._open_batch:
            self._open_batch = None
            return self._open_topic
        return None

    def send_nowait(
        self,
        topic: str,
        value: bytes | str | None,
        *,
        key: bytes | str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        metadata: Any = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> Delivery:
        """Like ``send`` but never waits: raises ``BufferFullError`` instead."""
        self._check_open()
        msg = Delivery(topic, value, key, headers, partition, timestamp, metadata)  # type: ignore[arg-type]
        size = self._prepare(msg)
        if on_delivery is not None:
            msg._sink = _on_delivery(on_delivery)
        ledger = self._ledger
        if not ledger.try_reserve(size):
            raise ledger.buffer_full_error(size)
        deadline = self._now() + self._delivery_timeout
        ledger.accept(msg, deadline)
        if not self._enqueue_nowait(msg, deadline):
            ledger.unaccept(msg)
            raise ledger.buffer_full_error(size)
        return msg

    async def send_and_wait(self, topic: str, value: bytes | str | None, **kw: Any) -> RecordMetadata:
        """``send`` then wait for the outcome."""
        delivery = await self.send(topic, value, **kw)
        return await delivery

    async def send_many(self, messages: Iterable[ProducerMessage]) -> DeliveryGroup:
        """Queue many messages at once; the bulk path for callers like the Spark stage.

        Every message is validated before any is accepted: a bad one raises
        and none of the call's messages are sent. Returns a ``DeliveryGroup``
        whose ``await`` gives counts and the first errors.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        msgs = messages if isinstance(messages, list) else list(messages)
        if any(map(_id_of, msgs)):
            raise _reused_error(next(m for m in msgs if m._id))
        prepare = self._prepare
        cumulative = list(accumulate(map(prepare, msgs)))
        total = len(msgs)
        group = DeliveryGroup(total)
        ledger = self._ledger
        limit = max(1, ledger.buffer_memory // 4)
        start = 0
        while start < total:
            # Reserve in chunks so one call never needs the whole buffer: the
            # longest run from start within limit bytes, at least one message.
            before = cumulative[start - 1] if start else 0
            end = max(start + 1, bisect_right(cumulative, before + limit, start))
            chunk_bytes = cumulative[end - 1] - before
            chunk = msgs[start:end]
            if not ledger.try_reserve(chunk_bytes):
                try:
                    await ledger.reserve(chunk_bytes)
                except BaseException:
                    # Accepted chunks keep their outcome; the rest never happened.
                    group._shrink(len(msgs) - start)
                    raise
                if self._closing:
                    ledger.release(chunk_bytes)
                    group._shrink(len(msgs) - start)
                    raise _closed_while_waiting("buffer space")
            elif self._closing:  # closed while an earlier chunk waited to be enqueued
                ledger.release(chunk_bytes)
                group._shrink(len(msgs) - start)
                raise _closed_while_waiting("room in the intake")
            # ledger.accept for the chunk: consecutive ids, one deadline.
            deadline = self._now() + self._delivery_timeout
            first_id = ledger._next_id
            for msg_id, m in enumerate(chunk, first_id):
                m._id = msg_id
                m._deadline = deadline
                m._sink = group
            ledger._next_id = first_id + len(chunk)
            ledger.outstanding.update(zip(range(first_id, ledger._next_id), chunk, strict=True))
            try:
                self._intake_send.send_nowait(chunk)
            except trio.WouldBlock:
                try:
                    await self._intake_send.send(chunk)
                except BaseException as exc:
                    pending = [m for m in chunk if m._state == PENDING]
                    for m in pending:
                        m._sink = None
                        ledger.unaccept(m)
                    # Messages the close failed meanwhile keep that outcome.
                    group._shrink(len(pending) + len(msgs) - end)
                    if isinstance(exc, _CLOSED):
                        raise _closed_while_waiting("room in the intake") from None
                    raise
            # The chunk now sits in the intake behind the open send() burst, if
            # any: a later send() must not join that burst (it would be written
            # before this chunk, although sent after it). Found by the explorer.
            self._open_batch = None
            start = end
        # A schedule point, as trio's async calls are: without it a caller
        # feeding lists would run ahead until the buffer is full, and the
        # pipeline would only ever see a full buffer. Shielded: everything is
        # accepted now, so the caller must get the group.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return group

    async def send_batch(
        self,
        topic: str,
        values: ColumnInput,
        keys: ColumnInput | None = None,
        headers: HeadersInput | None = None,
        partitions: IntsInput | None = None,
        timestamps: IntsInput | None = None,
    ) -> DeliveryGroup:
        """Queue many rows given as columns: the columnar bulk path.

        Each column is an Arrow array (borrowed, not copied), a Python list,
        or a numpy array (``protocol/_columnar_input.py`` lists every form);
        ``headers`` per row, ``partitions`` (None/null: the partitioner
        decides; keyed rows go on Java's murmur2 partition) and
        ``timestamps`` (ms; None/null: now) are optional. The rows move
        through the same stages as ``send()``'s messages, as runs of rows
        (``producer/rows.py``), and are encoded without a Python object per
        record. Returns a ``DeliveryGroup``: ``await`` it for the counts
        (delivered, failed, first errors), one outcome per row.

        Every row is checked before any is accepted: bad input (lengths that
        differ, a wrong type, a row over ``max_message_bytes``) raises
        ``TypeError``/``ValueError``/``MessageTooLargeError`` naming the
        column and row, and nothing of the call is sent. Rows are accepted in
        chunks of at most a quarter of ``buffer_memory``, waiting for space
        as ``send()`` does; if the call is cancelled or fails while waiting,
        the chunks already accepted keep their outcomes (the group counts only
        them) and the rest was never sent.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if type(topic) is not str or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        columns = build_columns(values, keys, headers, timestamps, partitions,
                                default_timestamp=self._current_ms())
        total = len(columns)
        bounds = record_size_bounds(columns)
        over = first_row_over(bounds, self._max_message_bytes)
        if over >= 0:
            raise MessageTooLargeError(
                f"send_batch row {over} is {bounds[over]} bytes (key, value, headers and batch "
                f"overhead), over max_message_bytes={self._max_message_bytes}: raise "
                "max_message_bytes (and the topic's max.message.bytes) or split that value; "
                "no row of this call was sent"
            )
        group = DeliveryGroup(total)
        ledger = self._ledger
        limit = max(1, ledger.buffer_memory // 4)
        copied = _copied_bytes(columns)
        per_chunk = max(1, int(limit * total / max(1, sum(bounds) + copied(0, total))))
        start = 0
        while start < total:
            stop = min(total, start + per_chunk)
            bound = sum(bounds[start:stop])
            while bound + copied(start, stop) > limit and stop - start > 1:  # uneven rows
                stop = start + (stop - start) // 2
                bound = sum(bounds[start:stop])
            extra = copied(start, stop)
            nbytes = bound + extra
            rows = stop - start
            if not ledger.try_reserve(nbytes):
                try:
                    await ledger.reserve(nbytes)
                except BaseException:
                    group._shrink(total - start)  # accepted chunks keep their outcome
                    raise
                if self._closing:
                    ledger.release(nbytes)
                    group._shrink(total - start)
                    raise _closed_while_waiting("buffer space")
            elif self._closing:
                ledger.release(nbytes)
                group._shrink(total - start)
                raise _closed_while_waiting("room in the intake")
            # Accepted: ids start .. start + rows - 1, one ledger entry.
            chunk = RowChunk(group, rows)
            chunk._id = ledger._next_id
            chunk.extra = extra
            ledger._next_id += rows
            run = RowRun(topic, slice_columns(columns, start, stop), None, rows, bound, chunk,
                         start)
            run._deadline = self._now() + self._delivery_timeout
            chunk.runs = [run]
            ledger.outstanding[chunk._id] = chunk
            try:
                self._intake_send.send_nowait(run)
            except trio.WouldBlock:
                try:
                    await self._intake_send.send(run)
                except BaseException as exc:
                    if run._state == PENDING:  # (else the close failed it meanwhile)
                        del ledger.outstanding[chunk._id]
                        ledger._unaccepted += rows
                        ledger.release(nbytes)
                        group._shrink(total - start)
                    else:
                        group._shrink(total - stop)
                    if isinstance(exc, _CLOSED):
                        raise _closed_while_waiting("room in the intake") from None
                    raise
            self._open_batch = None  # a later send() must not join a burst queued before it
            start = stop
        # A schedule point (see send_many); shielded: what is accepted has its group.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return group

    # -- producer.input ----------------------------------------------------
    # Invariant: every item in the intake holds its buffer bytes already, so the
    # dispatcher never waits for space. It used to reserve for input messages
    # itself, in intake order; then a message queued behind one (send() from
    # another task) could hold the very bytes it waited for, and the whole
    # intake stalled for max_block before failing it. Found by the schedule
    # explorer. So producer.input.send() reserves in the sender's task, as
    # send() does, and applies the same backpressure.

    def _input_reserved(self, msg: ProducerMessage) -> bool:
        return msg._sink is TO_CHANNELS and msg._size > 0 and not msg._id

    def _reserve_input_nowait(self, msg: ProducerMessage) -> bool | None:
        """Reserve for a message put on ``producer.input``: True (enqueue it),
        False (no space now), None (wait for space). A reused or invalid
        message is enqueued unreserved: the dispatcher accepts and fails it, so
        its outcome reaches ``producer.errors``."""
        if msg._id or self._closing or self._input_reserved(msg):
            return True  # (closing: the intake closes soon and refuses it itself)
        try:
            size = self._prepare(msg)
        except (TypeError, ValueError):
            msg._size = 0
            return True
        if self._ledger.try_reserve(size):
            msg._sink = TO_CHANNELS
            return True
        return None

    async def _reserve_input(self, msg: ProducerMessage) -> bool:
        """As ``_reserve_input_nowait``, waiting up to max_block. False: the
        message is settled already (it waited past max_block: accepted and
        failed with BufferFullError; or the producer closed meanwhile)."""
        ready = self._reserve_input_nowait(msg)
        if ready is not None:
            return ready
        size, ledger = msg._size, self._ledger
        self._input_waiting.add(msg)
        try:
            await ledger.reserve(size)
        except BufferFullError as exc:
            if not msg._id:  # (else shutdown took it meanwhile)
                msg._sink, msg._size = TO_CHANNELS, 0
                self._accept(msg)
                ledger.fail([msg], exc)
            return False
        except BaseException:
            msg._size = 0  # cancelled: nothing reserved, nothing accepted
            raise
        finally:
            self._input_waiting.discard(msg)
        if msg._id:  # shutdown accepted and failed it while this task woke up
            ledger.release(size)
            return False
        msg._sink = TO_CHANNELS
        return True

    def _unreserve_input(self, msg: ProducerMessage) -> None:
        """The enqueue of a reserved input message failed (cancelled, closed)."""
        if self._input_reserved(msg):
            self._ledger.release(msg._size)
            msg._sink, msg._size = None, 0

    def _accept_from_channel(self, msg: ProducerMessage) -> bool:
        """Accept a message a user put on ``producer.input`` (runs in the dispatcher)."""
        if self._shut_down and not msg._id:
            # The dispatcher was handed this message in the instant the close
            # failed everything outstanding, and runs once more before its
            # cancellation lands: accepted now, it would never be settled. It
            # fails like the rest (nobody reads producer.errors any more, so its
            # outcome is only on the message). Found by the schedule explorer.
            if self._input_reserved(msg):
                self._ledger.release(msg._size)
            msg._sink, msg._size = None, 0
            self._accept(msg)
            self._ledger.fail([msg], ProducerClosed("the producer closed before this "
                                                    "message was accepted"))
            return False
        if msg._id:
            # Already accepted once: its outcome belongs to that send. The error
            # carries a fresh copy, so the first outcome is left untouched.
            copy = ProducerMessage(msg.topic, msg.value, msg.key, msg.headers, msg.partition,
                                   msg.timestamp, msg.metadata)
            copy._sink = TO_CHANNELS
            self._accept(copy)
            self._ledger.fail([copy], _reused_error(msg))
            return False
        if self._input_reserved(msg):
            self._accept(msg)
            return True
        msg._sink = TO_CHANNELS
        try:
            size = self._prepare(msg)
        except (TypeError, ValueError) as exc:
            msg._size = 0
            self._accept(msg)
            self._ledger.fail([msg], exc)
            return False
        # Valid but unreserved: changed after it was put on producer.input, or put
        # there while the producer closed. Its bytes are counted (the buffer may
        # go over by this one message) rather than waited for here.
        self._ledger.buffered_bytes += size
        self._accept(msg)
        return True

    def _take_unaccepted_input(self) -> None:
        """At shutdown: accept what users put on ``producer.input`` that the
        dispatcher never accepted (and messages whose ``input.send()`` still
        waits for space), so it fails with the rest instead of vanishing;
        release flushes waiting for a FlushMark."""
        pending: list[ProducerMessage] = []
        for msg in self._input_waiting:  # holds no bytes yet
            msg._size = 0
            pending.append(msg)
        while True:
            try:
                item = self._intake_receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            if type(item) is FlushMark:
                item.reached.set()
            elif isinstance(item, ProducerMessage):
                if not self._input_reserved(item):
                    item._size = 0  # holds no bytes
                pending.append(item)
            # a list was accepted by its sender: the ledger already holds it
        for msg in pending:
            if msg._id:
                continue
            msg._sink = TO_CHANNELS
            self._accept(msg)

    # -- flushing and closing ---------------------------------------------
    async def flush(self) -> None:
        """Wait until every message accepted before this call has its outcome,
        including messages already put on ``producer.input``."""
        self._core.start_flushing()
        try:
            mark = FlushMark()
            try:
                await self._intake_send.send(mark)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # closing: nothing new can be on the intake
            else:
                await mark.reached.wait()
            await self._ledger.wait_settled_through(self._ledger.last_accepted_id)
        finally:
            self._core.stop_flushing()

    def statistics(self) -> ProducerStatistics:
        ledger = self._ledger
        return ProducerStatistics(
            accepted=ledger.accepted,
            succeeded=ledger.succeeded,
            failed=ledger.failed,
            outstanding=len(ledger.outstanding),
            buffered_bytes=ledger.buffered_bytes,
            requests_sent=sum(bp.requests_sent for bp in self._core.broker_producers()),
            double_settles=ledger.double_settles,
            callback_errors=ledger.callback_errors,
        )

    async def _report(self) -> None:
        """Hand channel-mode outcomes to ``successes`` / ``errors`` (may block on the user)."""
        ledger = self._ledger
        while True:
            await ledger.reports_ready.wait()
            ledger.reports_ready = trio.Event()
            while ledger.reports:
                # Popped before the send: trio's send() hands the item over and
                # then yields, and shutdown's _report_leftovers must not see it again.
                msg = ledger.reports.popleft()
                try:
                    if msg._state == OK:
                        await self._successes_send.send(msg)
                    else:
                        await self._errors_send.send(ledger.error_for(msg))
                except BaseException:
                    ledger.reports.appendleft(msg)  # a failed trio send() delivered nothing
                    raise
                ledger.release(msg._size)

    def _report_leftovers(self) -> None:
        ledger = self._ledger
        lost = 0
        while ledger.reports:
            msg = ledger.reports.popleft()
            try:
                if msg._state == OK:
                    self._successes_send.send_nowait(msg)
                else:
                    self._errors_send.send_nowait(ledger.error_for(msg))
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                lost += 1
            ledger.release(msg._size)
        if lost:
            log.warning(
                "%d outcomes could not be handed over: producer.successes/errors were not drained",
                lost,
            )
        self._successes_send.close()
        self._errors_send.close()


@asynccontextmanager
async def open_producer(
    bootstrap: str | Sequence[str],
    config: ProducerConfig | None = None,
    *,
    connector: Any = None,
    **options: Any,
) -> AsyncIterator[Producer]:
    """Run a producer for the duration of an ``async with`` block.

    Args:
        bootstrap: ``"host:port"``, a comma-separated list, or a sequence of them.
        config: a ``ProducerConfig``; keyword ``options`` override its fields.
        connector: the transport seam (tests pass a fake cluster's connector);
            the same as the ``connector`` option.

    Leaving the block normally flushes (up to ``close_timeout``) and closes;
    whatever is still undelivered then fails with ``ProducerClosed``. Leaving
    it by cancellation or an error closes without waiting.

    Raises:
        ConfigError: an invalid option, before anything connects.
        KafkaError: no bootstrap broker answered within ``request_timeout``.
    """
    if connector is not None:
        options["connector"] = connector
    cfg = make_config(config, options)
    # Nurseries wrap errors in groups; at the public boundary one error is
    # raised as itself (`except BrokerConnectionError:` works, a user's own
    # exception comes out unchanged), several stay a group (pipeline.util.groups).
    with unwrap_single_errors():
        async with _run_producer(bootstrap, cfg) as producer:
            yield producer


@asynccontextmanager
async def _run_producer(
    bootstrap: str | Sequence[str], cfg: ProducerConfig
) -> AsyncIterator[Producer]:
    ledger = Ledger(cfg.buffer_memory, cfg.max_block)
    async with Cluster.open(bootstrap, cfg.cluster) as cluster:
        await _bootstrap(cluster, bootstrap, cfg.request_timeout)
        core = ProducerCore(cfg, cluster, ledger)
        producer = Producer(core)
        async with trio.open_nursery() as outer:
            pipeline_scope = trio.CancelScope()

            async def run_pipeline(*, task_status: trio.TaskStatus[None]) -> None:
                with pipeline_scope:
                    async with trio.open_nursery() as nursery:
                        core.nursery = nursery
                        if core.idempotence is not None:
                            await _start_idempotence(nursery, core)
                        dispatcher = Dispatcher(producer, producer._intake_receive)
                        await nursery.start(dispatcher.run)
                        nursery.start_soon(producer._report)
                        task_status.started()

            await outer.start(run_pipeline)
            graceful = False
            try:
                yield producer
                graceful = True
            finally:
                await _shutdown(producer, pipeline_scope, graceful=graceful)


async def _bootstrap(cluster: Cluster, bootstrap: object, limit: float) -> None:
    """Fetch cluster metadata once, so an unreachable cluster fails fast and clearly."""
    try:
        with trio.fail_after(limit):
            await cluster.refresh(force=True)
    except AuthenticationError:
        raise  # TLS or SASL refused us: that is the reason, said as is
    except (trio.TooSlowError, KafkaError) as exc:
        last = cluster.last_error
        detail = f": {exc}" if isinstance(exc, KafkaError) else (
            f" (last error: {last})" if last is not None else "")
        raise BrokerConnectionError(
            f"no bootstrap broker of {bootstrap!r} answered within request_timeout={limit}s"
            f"{detail}; check the address and that the broker is running"
        ) from exc


async def _start_idempotence(nursery: trio.Nursery, core: ProducerCore) -> None:
    """Obtain the first producer id, failing clearly within request_timeout."""
    assert core.idempotence is not None
    timeout = core.config.request_timeout
    try:
        with trio.fail_after(timeout):
            await nursery.start(core.idempotence.run)
    except trio.TooSlowError:
        raise BrokerConnectionError(
            f"could not obtain a producer id (InitProducerId) within request_timeout={timeout}s; "
            "the broker may not support idempotence: pass idempotent=False to produce without it"
        ) from None


async def _shutdown(producer: Producer, pipeline_scope: trio.CancelScope, *, graceful: bool) -> None:
    producer._closing = True
    producer._open_batch = None
    cfg = producer._config
    with trio.CancelScope(shield=True):
        if graceful:
            with trio.move_on_after(cfg.close_timeout):
                await producer.flush()
        idem = producer._core.idempotence
        if idem is not None and idem.in_flight:
            # Never abandon an idempotent request on the wire (franz-go #930):
            # seal nothing new, and wait (bounded) for the answers to come back.
            idem.paused = True
            with trio.move_on_after(cfg.request_timeout):
                await idem.wait_drained()
        pipeline_scope.cancel()
        producer._take_unaccepted_input()
        producer._shut_down = True
        left = producer._ledger.fail_all_outstanding(ProducerClosed(
            "the producer closed before this message was acknowledged"
            + (f" (close_timeout={cfg.close_timeout}s ran out)" if graceful else "")
            + "; it may or may not have been written"
        ))
        if left:
            log.warning("producer closed with %d undelivered messages", left)
        producer._report_leftovers()
        producer.input.close()
        producer._intake_send.close()
