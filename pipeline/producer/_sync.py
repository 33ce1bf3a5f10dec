"""SyncProducer: the trio pipeline for plain blocking code.

A background thread runs ``trio.run`` with one ``open_producer`` block. A hop into it
(``trio.from_thread.run``) costs tens of microseconds, so ``send`` does not hop: it
appends the call to a pending list and returns a ``SyncDelivery`` (a future, as the Java
client's ``send`` returns one); a pump task in the producer's thread takes the whole list
at a time and hands each call to the async ``send``. The pending list is bounded
(``_PENDING_MAX``): a caller that outruns the pump waits, as an async ``send`` waits for
buffer memory. Everything else (``flush``, ``send_many``, ``send_batch``, transactions,
``statistics``) is one hop that waits in the producer's thread.

Errors: a wrong type raises from ``send`` itself (nothing is queued); what the async
``send`` refuses (a record over ``max_message_bytes``, a closed producer, no open
transaction) is the ``SyncDelivery``'s outcome, as in the Java client's future.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from time import sleep as _sleep
from typing import Any, TypeVar

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer import _speedups
from pipeline.producer._api import Producer, open_producer
from pipeline.producer._config import ProducerConfig
from pipeline.producer._errors import ProducerClosed
from pipeline.producer._intake import send_path
from pipeline.producer._message import ProducerMessage, RecordMetadata
from pipeline.producer._outcomes.delivery import Delivery, GroupResult
from pipeline.producer._speedups import fields
from pipeline.producer._stages.transactions import State
from pipeline.producer._statistics import ProducerStatistics
from pipeline.protocol._columns import ColumnInput, HeadersInput, IntsInput

#: Calls waiting for the pump at most; a caller beyond it waits (backpressure) until the
#: pump has taken the queue down to _PENDING_LOW: woken at each call taken, it would
#: queue one call and wait again, a thread switch per record.
_PENDING_MAX = 65536
_PENDING_LOW = _PENDING_MAX // 2
#: Every this + 1 queued calls, send() hands the GIL to the pump (``time.sleep(0)``).
#: Otherwise the caller keeps it for the interpreter's whole switch interval (5 ms)
#: each time the pump lets it go, which the pump does at every schedule point (trio
#: polls for I/O), so the pump got one schedule point's worth of calls per 5 ms and
#: the queue filled (measured: 1M plain sends at 0.33x the async send()).
_HAND_OVER_MASK = 2047

_T = TypeVar("_T")


def _identity(obj: _T) -> _T:
    return obj


_send_c = _speedups.load("_send")
#: Takes a queued ``SyncDelivery`` out of the cyclic GC (``_send.untracked``; the twin
#: keeps it tracked). The caller and the pump take the queue in turns, so queued
#: handles outlive young collections and, tracked, were promoted and walked by full
#: collections. Only a plain call's handle is untracked: it refers to its producer,
#: its topic, an atomic value, its ``Delivery`` (no callback of the user's) and a
#: refusal, none of which refers back to it once the pump has taken it (the pump's
#: frame drops its last handle: see ``_pump_locked``).
_untracked: Callable[[Any], Any] = _send_c.untracked if _send_c is not None else _identity


class SyncDelivery:
    """What ``SyncProducer.send`` returns: the record's outcome, later (a future).

    ``get(timeout=None)`` blocks until the record is acknowledged and returns its
    ``RecordMetadata``, or raises: ``ProducerError`` (not delivered), the error that
    refused the record (e.g. ``MessageTooLargeError``), ``TimeoutError`` after
    ``timeout`` seconds (the record keeps its own outcome). ``done()`` never blocks.
    """

    # A queued call is its own SyncDelivery (topic, value, kwargs: one object per record,
    # no tuple beside it); the pump sets _delivery or _error: neither while queued.
    # Sender.pump (_send.c) writes the fields of fields.SYNC_HANDLE.
    __slots__ = fields.slots(fields.SYNC_HANDLE, ("_sync",))

    def __init__(self, sync: SyncProducer, topic: str, value: Any,
                 kwargs: dict[str, Any] | None) -> None:
        self._sync = sync
        self._topic, self._value, self._kwargs = topic, value, kwargs
        self._delivery: Delivery | None = None  # set by the pump once the send accepted it
        self._error: BaseException | None = None  # the send refused it

    def done(self) -> bool:
        """True once the outcome is known (acknowledged, failed or refused)."""
        if self._error is not None:
            return True
        d = self._delivery
        return d is not None and d.done()

    def get(self, timeout: float | None = None) -> RecordMetadata:
        d = self._delivery
        if d is not None and d.done():  # settled: read it here, no hop
            return d.result()
        if self._error is not None:
            raise self._error
        limit = timeout if timeout is not None else float("inf")
        try:
            result: RecordMetadata = self._sync._call(self._wait, limit)
        except trio.TooSlowError:
            raise TimeoutError(f"no outcome within {timeout}s; the record keeps its own "
                               "(get() again to wait longer)") from None
        return result

    async def _wait(self, limit: float) -> RecordMetadata:
        sync = self._sync
        with trio.fail_after(limit):
            while self._delivery is None and self._error is None:
                await sync._pumped_wait()
            if self._error is not None:
                raise self._error
            assert self._delivery is not None
            return await self._delivery

    def __repr__(self) -> str:
        state = ("refused" if self._error is not None else "queued" if self._delivery is None
                 else "done" if self.done() else "pending")
        return f"<SyncDelivery {state}>"


if _send_c is not None:
    _send_c.setup_sync(handle_type=SyncDelivery, handle_fields=fields.names(fields.SYNC_HANDLE))


class SyncProducer:
    """A blocking producer. Use as a context manager or call ``close()``.

    Example::

        with SyncProducer("127.0.0.1:9092") as producer:
            for line in lines:
                producer.send("events", line)          # returns a SyncDelivery at once
            producer.flush()                           # every record has its outcome
            meta = producer.send_and_wait("events", b"one more")
    """

    def __init__(
        self, bootstrap: str | Sequence[str], config: ProducerConfig | None = None, **options: Any
    ) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._producer: Producer | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._closed = False
        self._serializes_values = False
        # The calls send() queued, in order (a deque: append and popleft are atomic, so
        # the caller's thread and the pump share it without a lock), and the pump's
        # wake-up (asked for when the deque was empty: one hop per batch, not per record).
        self._pending: deque[SyncDelivery] = deque()
        self._room = threading.Condition()  # a caller waits here while _PENDING_MAX are queued
        self._blocked = False  # a caller waits for room (set under _room; the pump clears it)
        self._wake: trio.Event | None = None
        self._pumped: trio.Event | None = None
        self._pump_lock: trio.Lock
        self._thread = threading.Thread(
            target=trio.run,
            args=(functools.partial(self._main, bootstrap, config, options),),
            name="pipeline-sync-producer",
            daemon=True,
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        # The plain call in C (_send.c's SyncQueue); every other call, and every call on
        # the pure-Python path, is the method below (its twin).
        self._queue: Any = None
        if _send_c is not None and send_path.SEND_PATH == "c":
            assert self._token is not None
            self._queue = _send_c.SyncQueue(
                sync=self, pending=self._pending, slow=types.MethodType(SyncProducer.send, self),
                wake=functools.partial(self._token.run_sync_soon, self._wake_pump),
                sleep=_sleep, max=_PENDING_MAX, mask=_HAND_OVER_MASK)
            self.send = self._queue

    async def _main(
        self, bootstrap: str | Sequence[str], config: ProducerConfig | None, options: dict[str, Any]
    ) -> None:
        try:
            async with open_producer(bootstrap, config, **options) as producer, \
                    trio.open_nursery() as nursery:
                self._producer = producer
                # a value_serializer takes any object: the type check is then its own
                self._serializes_values = producer._config.value_serializer not in (None, "bytes")
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._wake, self._pumped = trio.Event(), trio.Event()
                self._pump_lock = trio.Lock()
                nursery.start_soon(self._pump, producer)
                self._ready.set()
                await self._stop.wait()
                await self._pump_all(producer)  # what was queued before close() is sent
                nursery.cancel_scope.cancel()
        except BaseException as exc:
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()
                return
            raise

    # -- the pump (the producer's thread) ----------------------------------------------
    async def _pump(self, producer: Producer) -> None:
        while True:
            # A new Event before the drain: a wake-up asked for after the drain's last
            # look finds this one set, so no queued call is left waiting.
            self._wake = trio.Event()
            await self._pump_all(producer)
            await self._wake.wait()

    async def _pump_all(self, producer: Producer) -> None:
        """Send what is queued, in order (one pumper at a time: a flush and the pump
        task must not interleave two batches)."""
        async with self._pump_lock:
            await self._pump_locked(producer)

    async def _pump_locked(self, producer: Producer) -> None:
        pending, send = self._pending, producer.send
        popleft = pending.popleft
        # _send.c's Sender takes the plain calls at the head of the queue through its
        # row branch, without an awaitable each; what it leaves goes the awaited way
        # (the twin: every call, on the pure-Python path or with hooks).
        sender: Any = send
        take = sender.pump if _send_c is not None and type(sender) is _send_c.Sender else None
        while pending:
            if take is not None and take(pending):
                if self._blocked and len(pending) <= _PENDING_LOW:
                    self._unblock()
                continue
            handle = popleft()
            try:
                if handle._kwargs is None:
                    handle._delivery = await send(handle._topic, handle._value)
                else:
                    handle._delivery = await send(handle._topic, handle._value, **handle._kwargs)
            except Exception as exc:  # refused: the handle's outcome
                handle._error = exc
            handle._value = handle._kwargs = None  # (the pump's copy is the producer's now)
            # A refusal's traceback holds this frame: with a handle in its locals,
            # handle -> refusal -> traceback -> frame -> handle would be a cycle the GC
            # cannot see (the handle is untracked).
            del handle
            if self._blocked and len(pending) <= _PENDING_LOW:
                self._unblock()
        pumped, self._pumped = self._pumped, trio.Event()
        assert pumped is not None
        pumped.set()

    def _unblock(self) -> None:
        """Wake a caller waiting for room in the queue (``send``)."""
        with self._room:
            self._blocked = False
            self._room.notify_all()

    async def _pumped_wait(self) -> None:
        assert self._pumped is not None
        await self._pumped.wait()

    def _wake_pump(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the caller's thread ----------------------------------------------------------
    def _call(self, afn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed or self._producer is None:
            raise ProducerClosed("the SyncProducer is closed")
        return trio.from_thread.run(
            functools.partial(afn, *args, **kwargs), trio_token=self._token
        )

    def send(self, topic: str, value: Any, **kwargs: Any) -> SyncDelivery:
        """Queue one record (the async ``send``'s keywords: ``key``, ``headers``,
        ``partition``, ``timestamp``, ``metadata``, ``on_delivery``); return its
        ``SyncDelivery`` at once. Raises ``TypeError`` for a wrong type (nothing is
        queued) and ``ProducerClosed`` after ``close()``; waits while
        ``_PENDING_MAX`` calls are queued."""
        if self._closed:
            raise ProducerClosed("the SyncProducer is closed")
        if type(topic) is not str:
            raise self._type_error(topic, value)
        if type(value) is bytes or type(value) is str or value is None:
            handle = (SyncDelivery(self, topic, value, kwargs) if kwargs
                      else _untracked(SyncDelivery(self, topic, value, None)))
        elif self._serializes_values:  # (a serializer's object may refer to anything)
            handle = SyncDelivery(self, topic, value, kwargs or None)
        else:
            raise self._type_error(topic, value)
        pending = self._pending
        if len(pending) >= _PENDING_MAX:
            with self._room:
                while len(pending) >= _PENDING_MAX and not self._closed:
                    self._blocked = True
                    self._room.wait(0.1)
        pending.append(handle)
        queued = len(pending)
        if queued == 1:  # the pump may be asleep: wake it
            assert self._token is not None
            self._token.run_sync_soon(self._wake_pump)
        elif not queued & _HAND_OVER_MASK:
            _sleep(0)  # the GIL to the pump (see _HAND_OVER_MASK)
        return handle

    @staticmethod
    def _type_error(topic: Any, value: Any) -> TypeError:
        return TypeError(
            f"send(topic, value): topic must be a str and value bytes, str or None, "
            f"not {type(topic).__name__} and {type(value).__name__}")

    def send_and_wait(self, topic: str, value: Any, **kwargs: Any,
                      ) -> RecordMetadata:
        """Send one record and block until it is acknowledged (or raise ``ProducerError``)."""
        return self.send(topic, value, **kwargs).get()

    def send_many(self, messages: Iterable[ProducerMessage]) -> GroupResult:
        """Send many messages and block until all have an outcome."""
        assert self._producer is not None
        producer = self._producer

        async def run() -> GroupResult:
            await self._pump_all(producer)  # (keep the order of earlier send()s)
            group = await producer.send_many(list(messages))
            return await group.wait()

        result: GroupResult = self._call(run)
        return result

    def send_batch(self, topic: str, values: ColumnInput, keys: ColumnInput | None = None,
                   headers: HeadersInput | None = None, partitions: IntsInput | None = None,
                   timestamps: IntsInput | None = None) -> GroupResult:
        """The async ``send_batch`` (rows as columns), blocking until every row has its
        outcome."""
        assert self._producer is not None
        producer = self._producer

        async def run() -> GroupResult:
            await self._pump_all(producer)
            group = await producer.send_batch(topic, values, keys, headers, partitions,
                                              timestamps)
            return await group.wait()

        result: GroupResult = self._call(run)
        return result

    def flush(self) -> None:
        """Block until every record sent before this call has its outcome."""
        assert self._producer is not None
        producer = self._producer

        async def run() -> None:
            await self._pump_all(producer)
            await producer.flush()

        self._call(run)

    def statistics(self) -> ProducerStatistics:
        assert self._producer is not None
        producer = self._producer

        async def run() -> ProducerStatistics:
            return producer.statistics()

        result: ProducerStatistics = self._call(run)
        return result

    # -- transactions (transactional_id=...): the async producer's, blocking -------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[SyncProducer]:
        """Begin a transaction; commit it when the block ends normally, abort it when
        the block raises, or its commit fails while the transaction can still be
        aborted (the exception then propagates)."""
        self.begin_transaction()
        try:
            yield self
        except BaseException as exc:
            self._abort_for(exc)
            raise
        try:
            self.commit_transaction()
        except BaseException as exc:
            assert self._producer is not None
            if self._producer._transactions().state in (State.IN_TRANSACTION, State.ABORTABLE):
                self._abort_for(exc)
            raise

    def _abort_for(self, exc: BaseException) -> None:
        try:
            self.abort_transaction()
        except KafkaError as abort_error:
            exc.add_note(f"(aborting the transaction failed too: {abort_error!r})")

    def begin_transaction(self) -> None:
        assert self._producer is not None
        self._call(self._in_order, self._producer.begin_transaction)

    def commit_transaction(self) -> None:
        assert self._producer is not None
        self._call(self._in_order, self._producer.commit_transaction)

    def abort_transaction(self) -> None:
        assert self._producer is not None
        self._call(self._in_order, self._producer.abort_transaction)

    def send_offsets_to_transaction(self, offsets: Mapping[Any, int], group_metadata: Any) -> None:
        assert self._producer is not None
        self._call(self._in_order, self._producer.send_offsets_to_transaction, offsets,
                   group_metadata)

    async def _in_order(self, afn: Any, *args: Any) -> Any:
        """``afn`` after every ``send()`` queued before it (a transaction's records go
        in before it commits, and none of the next one's before it begins)."""
        assert self._producer is not None
        await self._pump_all(self._producer)
        return await afn(*args)

    def close(self) -> None:
        """Send what is queued, flush (up to ``close_timeout``) and stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._queue is not None:
            self._queue.closed = True
        stop = self._stop
        if stop is not None:
            trio.from_thread.run_sync(stop.set, trio_token=self._token)
        self._thread.join()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
