"""The intake stage, send side: where a message is accepted.

Acceptance is the line that matters to users. ``send()`` validates the message,
reserves buffer memory (waiting up to ``max_block``), then puts it on the intake
channel. Only then is it accepted: from then on it gets exactly one outcome, even
if the caller is cancelled, the producer closes, or every broker is down. A
``send()`` cancelled before that point sends nothing and leaves no trace.

``Intake`` owns the intake channel (its send side; the dispatcher,
``_stages/dispatcher.py``, receives) and the *burst*: consecutive ``send()`` calls
share one open list (or columnar ``RowBurst``) already queued in the channel, so a
burst costs one channel operation, not one per message. The dispatcher closes it
when it takes it (``close_burst``, ``close_rows``); anything else put on the
channel (``producer.input``, a ``send_many`` or ``send_batch`` chunk) ends the
burst first, so a later ``send()`` never joins a burst queued ahead of it.

``send()`` is a checkpoint (cancellation and schedule point) every ``_YIELD_EVERY``
rows or ``_YIELD_EVERY / _MESSAGE_COST`` messages, and whenever it has to wait (buffer or
intake full): a tight loop of sends neither starves the pipeline nor pays a scheduler
pass per message. The checkpoint comes before acceptance, so a cancelled ``send()``
never accepted its message. It restarts the settled awaits' budget too
(``delivery._restart_schedule``): a loop that sends and awaits yields as often as one
that only sends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import trio

from pipeline.producer._columnar import burst as _burst
from pipeline.producer._columnar.burst import COLUMNS_MIN, RowBurst, RowDelivery
from pipeline.producer._columnar.rows import RowChunk, RowRun
from pipeline.producer._config import ProducerConfig
from pipeline.producer._errors import BufferFullError, ProducerClosed
from pipeline.producer._intake.normalize import (
    SIZE_BASE,
    RowExtras,
    closed_while_waiting,
    normalize,
    on_delivery_sink,
    prefix_size,
    row_extras,
)
from pipeline.producer._message import PENDING, DeliveryCallback, Headers, ProducerMessage
from pipeline.producer._outcomes import delivery as _delivery
from pipeline.producer._outcomes.delivery import Delivery, MessageDelivery
from pipeline.producer._outcomes.ledger import Ledger
from pipeline.producer._speedups import fields
from pipeline.producer._speedups.fields import slots
from pipeline.producer._stages.envelopes import FlushMark

# Rows between two schedule points (where the dispatcher may take the open burst; a burst
# costs ~0.2 ms whatever its size): 1M send() + flush() on tansu, 1,361k msgs/s at 512,
# 2,081k at 4096 (~2 ms apart). A send() that becomes a message costs _MESSAGE_COST of it:
# 512 messages a burst (4096 cost a keyed loop 28% more CPU: 2.61 -> 3.33 s per 1M).
_YIELD_EVERY, _MESSAGE_COST = 4096, 8

_time = time.time
_new_delivery = object.__new__

_KEYWORDS_ONLY = object()  # see Intake.send

# What a call still waiting sees once a close closed the send side (-> ProducerClosed).
CLOSED = (trio.ClosedResourceError, trio.BrokenResourceError)


def _closed() -> BaseException:
    return ProducerClosed("the producer is closed: no new messages are accepted")


#: The intake channel's items: a burst or ``send_many`` chunk (accepted by its sender), a
#: ``send_batch`` chunk, a raw ``producer.input`` message (the dispatcher accepts it), a mark.
IntakeItem = ProducerMessage | list[ProducerMessage] | FlushMark | RowRun


class Intake:
    """The intake channel's send side, the open burst and the CreateTime clock."""

    # send()'s row branch in C (_send.c) shares the fields of fields.SEND_INTAKE
    __slots__ = slots(fields.SEND_INTAKE, (
        "_burst", "_burst_deadline", "_burst_topic", "_columns_next",
        "_delivery_timeout", "_dispatcher", "_now", "_refusal", "_stopped"))

    def __init__(
        self, config: ProducerConfig, ledger: Ledger, dispatcher: trio.MemorySendChannel[IntakeItem]
    ) -> None:
        self._ledger = ledger
        # The send side of the dispatcher's inbox (the dispatcher made it).
        self._dispatcher = dispatcher
        self._timestamp_ms = config.timestamp_ms or self._wall_clock_ms
        self._wall_clock = config.timestamp_ms is None  # send() reads time.time itself
        self._delivery_timeout = config.delivery_timeout
        self._max_message_bytes = config.max_message_bytes
        # _closing: True while every entry point refuses records, with _refusal() as
        # the error: a close began (_stopped, for good), or a transactional producer
        # has no transaction open. The C send path reads _closing only.
        self._closing = False
        self._stopped = False
        self._refusal: Callable[[], BaseException] = _closed
        self._until_yield = _YIELD_EVERY
        # The open burst: a list already in the channel that send() appends to until the
        # dispatcher takes it (None: none). Its messages share the deadline (no trio time
        # passes between two checkpoints) and, while all have one, the topic (None: mixed).
        self._burst: list[ProducerMessage] | None = None
        self._burst_deadline = 0.0
        self._burst_topic: str | None = None
        # The open columnar burst (burst.py; None: none open): a run already in the
        # channel whose RowBurst the common send() appends to, until the dispatcher takes
        # it or anything else is put on the channel. One of _burst and _rows at a time.
        self._rows: RowBurst | None = None
        # Open the next burst as columns: the last burst taken had COLUMNS_MIN messages or
        # more (a high-rate sender; a paced one's messages share batches during linger).
        self._columns_next = False
        # send()'s CreateTime: the current millisecond, and when it ends (time.time() s).
        # One int per millisecond, which lets the encoder skip records that share it.
        self._ms = 0
        self._ms_ends = 0.0
        # trio.current_time() walks several layers; the clock object is fixed per run.
        self._now = trio.lowlevel.current_clock().current_time

    def sender(self) -> trio.MemorySendChannel[IntakeItem]:
        """A clone of the dispatcher's inbox (``producer.input`` writes through one)."""
        return self._dispatcher.clone()

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def max_message_bytes(self) -> int:
        return self._max_message_bytes

    def check_open(self) -> None:
        if self._closing:
            raise self._refusal()

    def check_transaction(self) -> None:
        """Raise the refusal of a transactional producer outside a transaction
        (``producer.input``: a close refuses at the dispatcher, as it always did)."""
        if self._closing and not self._stopped:
            raise self._refusal()

    def refused_while_waiting(self, what: str) -> BaseException:
        """The error of a call that waited for ``what`` while the intake began to refuse."""
        return closed_while_waiting(what) if self._stopped else self._refusal()

    def refuse(self, refusal: Callable[[], BaseException] | None) -> None:
        """Refuse every record with ``refusal()`` from now on, or (None) accept again:
        a transactional producer outside a transaction. A close refuses for good."""
        if self._stopped:
            return
        self._closing = refusal is not None
        if refusal is not None:
            self._refusal = refusal
            self._burst = None
            self._rows = None

    def deadline(self) -> float:
        """The delivery deadline of a message accepted now."""
        return self._now() + self._delivery_timeout

    # -- normalisation -----------------------------------------------------------
    @staticmethod
    def _wall_clock_ms() -> int:
        return int(_time() * 1000)

    def current_ms(self) -> int:
        """CreateTime for a message without one (``send()`` inlines this)."""
        if not self._wall_clock:
            return self._timestamp_ms()  # an injected clock (tests)
        if (now := _time()) < self._ms_ends:
            return self._ms  # the same millisecond: share the int
        ms = self._ms = int(now * 1000)
        self._ms_ends = (ms + 1) / 1000
        return ms

    def prepare(self, msg: ProducerMessage) -> int:
        """Validate and normalize ``msg`` in place; return its size in bytes."""
        return normalize(msg, self.current_ms, self._max_message_bytes)

    # -- send() --------------------------------------------------------------------
    async def send(
        self,
        topic: str,
        value: bytes | str | None,
        _keywords_only: object = _KEYWORDS_ONLY,
        key: bytes | str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        metadata: Any = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> Delivery:
        """``Producer.send`` (see there): this bound method, or ``_send.c``'s row branch
        in front of it. Options are keyword-only without a ``*`` (keyword-only defaults
        cost 140 ns a call for these six); ``_keywords_only`` catches a third positional."""
        # A schedule point every _YIELD_EVERY rows (and whenever it must wait): a
        # checkpoint costs more than the rest of send(); the burst moves in one pass.
        until_yield = self._until_yield - 1
        if until_yield > 0:
            self._until_yield = until_yield
        else:
            self._until_yield = _YIELD_EVERY
            await trio.lowlevel.checkpoint()
            _delivery._restart_schedule()  # (the awaits' budget counts from here too)
        if self._closing:
            raise self._refusal()
        if type(value) is str:  # sent as UTF-8 (normalize's rule), as rows too
            value = value.encode()
        if type(key) is str:
            key = key.encode()
        if (
            _keywords_only is _KEYWORDS_ONLY
            and (value is None or type(value) is bytes) and (key is None or type(key) is bytes)
            and type(topic) is str and topic
        ):
            # Validated in place (normalize's rules and bound, batch_size_for_record's,
            # with the two common prefix widths inlined).
            size = SIZE_BASE + (
                1 if value is None else len(value) + (
                    1 if len(value) < 64 else 2 if len(value) < 8192 else prefix_size(len(value)))
            ) + (
                1 if key is None
                else len(key) + (1 if len(key) < 64 else prefix_size(len(key)))
            )
            if headers is None and partition is None and timestamp is None:
                if metadata is None and (on_delivery is None or callable(on_delivery)):
                    rows = self._rows  # a row of a columnar burst (burst.py)?
                    if size > self._max_message_bytes:
                        pass  # (the per-message path raises MessageTooLargeError)
                    elif rows is not None and topic == rows.topic:
                        if self._ledger.admit_row(size):
                            values = rows.values
                            delivery = _burst.new_row(rows, len(values))
                            fns = rows.on_delivery  # each row's own (or None)
                            if fns is not None:
                                fns.append(on_delivery)
                            elif on_delivery is not None:  # the burst's first callback
                                rows.on_delivery = [None] * len(values) + [on_delivery]
                            if (keys := rows.keys) is not None:  # each row's key (or None)
                                keys.append(key)
                            elif key is not None:  # the burst's first key
                                rows.first_key(key)
                            if rows.extras:  # (no headers, partition or metadata)
                                rows.add_extras((), -1, None)
                            values.append(value)
                            if not self._wall_clock:
                                rows.timestamps.append(self._timestamp_ms())
                            elif (now := _time()) < self._ms_ends:
                                rows.timestamps.append(self._ms)
                            else:
                                rows.timestamps.append(ms := int(now * 1000))
                                self._ms = ms
                                self._ms_ends = (ms + 1) / 1000
                            rows.size += size
                            return delivery
                        return await self._row_after_room(topic, value, key, on_delivery, size)
                    elif rows is None and self._columns_next and self._burst is None:
                        if not self._ledger.try_reserve(size):
                            return await self._row_after_room(topic, value, key, on_delivery,
                                                              size)
                        opened = self._open_rows(topic, value, key, on_delivery, size)
                        if opened is not None:
                            return opened
                elif (on_delivery is None or callable(on_delivery)) and (
                        size <= self._max_message_bytes) and self._row_may_join(topic):
                    return await self._extras_row(topic, value, key, (size, (), -1, None),
                                                  metadata, on_delivery)
                # Delivery.__init__, inlined (a class call costs more than these
                # stores); every slot is set here or below (tests check that).
                msg = _new_delivery(MessageDelivery)
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
                elif callable(on_delivery):  # on_delivery_sink, inlined
                    msg._sink = on_delivery
                else:
                    msg._sink = on_delivery_sink(on_delivery)  # raises TypeError
                msg._size = size
                if size > self._max_message_bytes:
                    self.prepare(msg)  # raises MessageTooLargeError
                return await self._accept(msg, size)
            if (on_delivery is None or callable(on_delivery)) and self._row_may_join(topic):
                # a row with headers, a partition or its own timestamp?
                extras = row_extras(key, value, headers, partition, timestamp)
                if extras is not None and extras[0] <= self._max_message_bytes:
                    return await self._extras_row(topic, value, key, extras, metadata, on_delivery)
        elif _keywords_only is not _KEYWORDS_ONLY:
            raise TypeError("send() takes 2 positional arguments (topic, value); pass key=, "
                            "headers=, partition=, timestamp=, metadata=, on_delivery= by keyword")
        msg = MessageDelivery(topic, value, key, headers, partition, timestamp, metadata)  # type: ignore[arg-type]
        size = self.prepare(msg)
        if on_delivery is not None:
            msg._sink = on_delivery_sink(on_delivery)
        return await self._accept(msg, size)

    def _row_may_join(self, topic: str) -> bool:
        """A row of ``topic`` joins the open columnar burst, or may open one."""
        rows = self._rows
        if rows is not None:
            return topic == rows.topic
        return self._columns_next and self._burst is None

    async def _accept(self, msg: MessageDelivery, size: int) -> MessageDelivery:
        """Accept a validated message: it joins the open list burst, or opens one."""
        # Reserved and accepted (Ledger.admit) before it is enqueued: once in the
        # intake the dispatcher may see it at any moment, and must see it as accepted.
        # It joins the burst already in the intake, and shares its deadline: no
        # checkpoint (so no trio time) passed since the burst opened; in real time
        # the shift is bounded by the _YIELD_EVERY sends between two checkpoints.
        burst = self._burst
        if burst is None or not self._ledger.admit(msg, size, self._burst_deadline):
            return await self._accept_alone(msg, size)  # (ends the columnar burst)
        if msg.topic is not self._burst_topic:
            self._burst_topic = None  # mixed (or an equal str object): the dispatcher checks
        burst.append(msg)
        self._until_yield -= _MESSAGE_COST - 1
        return msg

    async def _extras_row(self, topic: str, value: bytes | None, key: bytes | None,
                          extras: RowExtras, metadata: Any,
                          on_delivery: DeliveryCallback | None) -> Delivery:
        """A row with headers, a pinned partition, its own timestamp or metadata
        (``row_extras`` checked them): appended to the open burst of ``topic``, or
        opening one; its delivery holds ``metadata`` (``MetadataRowDelivery``)."""
        size, headers, partition, timestamp = extras
        rows = self._rows
        if rows is not None:
            if not self._ledger.admit_row(size):
                return await self._row_after_room(topic, value, key, on_delivery, size,
                                                  extras, metadata)
            delivery = self._append_row(rows, value, key, extras, metadata, on_delivery)
            rows.size += size
            return delivery
        if not self._ledger.try_reserve(size):
            return await self._row_after_room(topic, value, key, on_delivery, size, extras,
                                              metadata)
        opened = self._open_rows(topic, value, key, on_delivery, size, extras, metadata)
        if opened is not None:
            return opened
        # (no room in the intake: the per-message path waits for it)
        msg = MessageDelivery(topic, value, key, headers, None if partition < 0 else partition,
                              timestamp, metadata)
        self.prepare(msg)
        if on_delivery is not None:
            msg._sink = on_delivery
        return await self._accept(msg, size)

    def _append_row(self, rows: RowBurst, value: bytes | None, key: bytes | None,
                    extras: RowExtras, metadata: Any,
                    on_delivery: DeliveryCallback | None) -> RowDelivery:
        """Append a row (its bytes reserved) to ``rows``: ``send()``'s row branch for a
        row with extras, in the order of the common row's steps."""
        _, headers, partition, timestamp = extras
        values = rows.values
        row = len(values)
        delivery = (_burst.new_row(rows, row) if metadata is None
                    else _burst.new_metadata_row(rows, row, metadata))
        fns = rows.on_delivery
        if fns is not None:
            fns.append(on_delivery)
        elif on_delivery is not None:
            rows.on_delivery = [None] * row + [on_delivery]
        if (keys := rows.keys) is not None:
            keys.append(key)
        elif key is not None:
            rows.first_key(key)
        rows.add_extras(headers, partition, metadata)
        values.append(value)
        rows.timestamps.append(self.current_ms() if timestamp is None else timestamp)
        return delivery

    async def _row_after_room(self, topic: str, value: bytes | None, key: bytes | None,
                              on_delivery: DeliveryCallback | None, size: int,
                              extras: RowExtras | None = None, metadata: Any = None) -> Delivery:
        """A row found the buffer full: wait for room (up to ``max_block``), then send
        it again with no checkpoint between, so the room is still there and the row
        joins the open burst or opens one even if the burst taken meanwhile was short:
        a loop stays columnar under backpressure (it went per-message: 0.1-8% of 1M)."""
        ledger = self._ledger
        await ledger.reserve(size)
        ledger.release(size)
        if self._closing:
            raise self.refused_while_waiting("buffer space")
        self._until_yield = _YIELD_EVERY  # (the wait was a schedule point)
        self._columns_next = True  # (a high-rate sender: see the docstring)
        if extras is None:
            return await self.send(topic, value, key=key, on_delivery=on_delivery)
        _, headers, partition, timestamp = extras
        return await self.send(topic, value, key=key, headers=headers,
                               partition=None if partition < 0 else partition,
                               timestamp=timestamp, metadata=metadata, on_delivery=on_delivery)

    def _open_rows(self, topic: str, value: bytes | None, key: bytes | None,
                   on_delivery: DeliveryCallback | None, size: int,
                   extras: RowExtras | None = None, metadata: Any = None) -> RowDelivery | None:
        """Open a columnar burst with this first row (``size`` bytes, reserved): one
        chunk accepted with one row, its run put on the channel now. None (the bytes
        given back): no room in the intake; the per-message path waits for it."""
        ledger = self._ledger
        chunk = RowChunk(None, 0)
        ledger.accept_rows(chunk, 1)
        run = RowRun(topic, None, None, 0, 0, chunk, 0)  # type: ignore[arg-type]  # sealed later
        run._deadline = self._now() + self._delivery_timeout
        chunk.runs = [run]
        try:
            self._dispatcher.send_nowait(run)
        except trio.WouldBlock:
            ledger.unaccept_rows(chunk, 1, size)
            return None
        rows = chunk.burst = self._rows = RowBurst(topic, run, chunk)
        if extras is not None:
            delivery = self._append_row(rows, value, key, extras, metadata, on_delivery)
            rows.size += size
            return delivery
        if on_delivery is not None:
            rows.on_delivery = [on_delivery]
        if key is not None:
            rows.first_key(key)
        rows.values.append(value)
        rows.timestamps.append(self.current_ms())
        rows.size += size
        return _burst.new_row(rows, 0)

    def close_rows(self, run: RowRun) -> None:
        """The dispatcher took ``run``: if it is a columnar burst, seal it (it takes
        no more rows) and pack its columns, whose copy the buffer counts until the
        last row settles (``chunk.extra``; over ``buffer_memory`` if need be: the
        dispatcher never waits; docs/architecture.md, "send() bursts as columns")."""
        chunk = run._sink
        rows = chunk.burst
        if rows is None:
            return  # a send_batch chunk (or sealed at a close)
        chunk.burst = None
        if rows is self._rows:
            self._rows = None
        chunk.extra = copy = rows.seal()
        self._ledger.reserve_over(copy)
        self._columns_next = run.count >= COLUMNS_MIN

    async def _accept_alone(self, msg: MessageDelivery, size: int) -> MessageDelivery:
        """``send()`` with no open burst (it opens one), or no room in the buffer
        (it waits up to max_block)."""
        ledger = self._ledger
        deadline = self._now() + self._delivery_timeout
        if not ledger.admit(msg, size, deadline):
            await ledger.reserve(size)
            if self._closing:
                ledger.release(size)
                raise self.refused_while_waiting("buffer space")
            burst = self._burst  # (it may have opened while this call waited)
            deadline = self._burst_deadline if burst is not None else (
                self._now() + self._delivery_timeout)
            ledger.accept(msg, deadline)
        if not self._enqueue_nowait(msg, deadline):
            # Only a cancellation ends this wait with an error, and the message
            # is still pending then: a close first lets every waiting list in
            # (the dispatcher's leftovers() drains its inbox), then fails what is outstanding,
            # and only then closes the channel.
            try:
                await self._dispatcher.send([msg])
            except BaseException:
                ledger.unaccept(msg)  # cancelled before acceptance: leave no trace
                raise
        return msg

    def _enqueue_nowait(self, msg: ProducerMessage, deadline: float) -> bool:
        """Put an accepted message on the intake without waiting; False if full.
        It joins the open burst, or opens one: a list put on the channel now, which
        later sends append to until the dispatcher takes it (same thread, between
        two checkpoints, so no send can slip in between)."""
        self._rows = None  # msg goes behind it
        burst = self._burst
        if burst is not None:
            msg._deadline = self._burst_deadline
            burst.append(msg)
            return True
        burst = [msg]
        try:
            self._dispatcher.send_nowait(burst)
        except trio.WouldBlock:
            return False
        self._burst = burst
        self._burst_deadline = deadline
        self._burst_topic = msg.topic
        return True

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
        """``Producer.send_nowait`` (see there)."""
        self.check_open()
        msg = MessageDelivery(topic, value, key, headers, partition, timestamp, metadata)  # type: ignore[arg-type]
        size = self.prepare(msg)
        if on_delivery is not None:
            msg._sink = on_delivery_sink(on_delivery)
        ledger = self._ledger
        if not ledger.try_reserve(size):
            raise ledger.buffer_full_error(size)
        deadline = self.deadline()
        ledger.accept(msg, deadline)
        if not self._enqueue_nowait(msg, deadline):
            ledger.unaccept(msg)
            capacity = self._dispatcher.statistics().max_buffer_size
            raise BufferFullError(
                f"the intake is full ({capacity} items wait for the dispatcher; "
                f"channel_capacity={capacity}): use await send() to wait for room, "
                "or raise channel_capacity"
            )
        return msg

    # -- the dispatcher's side ------------------------------------------------------
    def close_burst(self, batch: list[ProducerMessage]) -> str | None:
        """The dispatcher took ``batch``: close it if it is the open burst, and
        return its topic when every message of it is known to have that topic
        (None: unknown, check)."""
        if batch is self._burst:
            self._burst = None
            self._columns_next = len(batch) >= COLUMNS_MIN
            return self._burst_topic
        return None

    # -- other items ---------------------------------------------------------------
    def end_burst(self) -> None:
        """Something was put on the channel behind the open burst, or accepted to go
        there (a bulk chunk, before it waits for room): a later ``send()`` must not
        join that burst (it would be written before that item, although sent after
        it, and a columnar burst's rows would not hold consecutive ids, ``RowChunk``):
        ``test_one_task_send_then_other_entry_then_send_keeps_order``,
        ``test_a_send_while_a_bulk_chunk_waits_for_the_intake_joins_no_older_burst``."""
        self._burst = None
        self._rows = None

    async def put(self, item: list[ProducerMessage] | RowRun) -> None:
        """Put an accepted ``send_many`` / ``send_batch`` chunk on the channel,
        waiting for room; then the burst ends (``end_burst``). Raises only when
        cancelled, and then the chunk never reached the channel: the close drains
        the channel (``Dispatcher.leftovers``, which lets a waiting put in) before
        it closes it, and callers check ``closing`` right before they put."""
        try:
            self._dispatcher.send_nowait(item)
        except trio.WouldBlock:
            await self._dispatcher.send(item)
        self._burst = None
        self._rows = None

    async def reach_flush_mark(self) -> None:
        """Put a ``FlushMark`` on the channel and wait until the dispatcher
        reaches it (at once when the producer is closing)."""
        mark = FlushMark()
        try:
            await self._dispatcher.send(mark)
        except CLOSED:
            return  # closing: nothing new can be on the intake
        await mark.reached.wait()

    # -- closing -----------------------------------------------------------------------
    def stop_accepting(self) -> None:
        """The close began: every entry point now raises ``ProducerClosed``."""
        self._closing = self._stopped = True
        self._refusal = _closed
        self._burst = None
        self._rows = None

    def close(self) -> None:
        """The end of a close: a later ``put`` or flush mark sees ``CLOSED``. No
        call is still waiting for room by then: the dispatcher's ``leftovers`` drained
        its inbox, which let every waiting item in."""
        self._dispatcher.close()

