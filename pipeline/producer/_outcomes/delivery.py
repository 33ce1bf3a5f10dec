"""Deliveries: the handles a caller awaits for a message's outcome, and bulk waits.

``send()`` returns a ``Delivery``: ``MessageDelivery`` (the accepted message itself)
or ``_columnar.burst.RowDelivery`` (a row of a columnar ``send()`` burst).
``send_many`` returns one ``DeliveryGroup`` for its messages; ``wait_all`` waits for
many deliveries in one pass. Awaiting a settled delivery costs no schedule point
(a cancellation check, and a full schedule point every ``_SCHEDULE_EVERY`` awaits);
the C twin of that await is ``_speedups/_delivery.c``, switched by ``_use``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from itertools import chain, cycle
from types import ModuleType
from typing import TYPE_CHECKING, Any

import trio

from pipeline.producer import _speedups
from pipeline.producer._message import (
    FAILED,
    OK,
    PENDING,
    DeliveryCallback,
    Headers,
    ProducerError,
    ProducerMessage,
    RecordMetadata,
    _metadata_py,
    _new_metadata,
)
from pipeline.producer._outcomes.unobserved import OBSERVED
from pipeline.producer._speedups import fields
from pipeline.producer._speedups.fields import names


class OnDelivery:
    """``_sink`` of a message sent with ``on_delivery=fn`` that someone also
    awaits (until then ``_sink`` is ``fn`` itself: no object per message): the
    ledger calls ``fn(metadata, None)`` or ``fn(None, error)`` exactly once,
    when it settles the message, then sets ``event``."""

    __slots__ = ("event", "fn")

    def __init__(self, fn: DeliveryCallback) -> None:
        self.fn = fn
        self.event: trio.Event | None = None


# Awaiting a settled delivery is a cancellation point every time, and a full
# schedule point (trio.lowlevel.checkpoint, ~5 us) once every _SCHEDULE_EVERY
# such awaits (~60 ns each on the C path), so other tasks still run about every
# 0.3 ms (a send() loop: ~2 ms). Measured: 512 cost 9 ns an await, 4096 ~1.
# One budget for the whole process (trio runs one task at a time, so it is
# shared fairly): ``_schedule_due()`` is True on every _SCHEDULE_EVERY-th call.
# send()'s periodic schedule point restarts it (``_restart_schedule``): the awaits
# in a loop of send() and await then add no schedule points of their own (each
# one would hand the open burst to the dispatcher: smaller bursts, more requests;
# docs/benchmarks.md).
_SCHEDULE_EVERY = 4096
_BUDGET = (False,) * (_SCHEDULE_EVERY - 1) + (True,)
_schedule_due_py = cycle(_BUDGET).__next__
#: The budget in use: ``_delivery.schedule_due`` when the C path is loaded (so the C
#: and the Python await share it), else the cycle above.
_schedule_due: Callable[[], bool] = _schedule_due_py


def _restart_schedule_py() -> None:
    """``_delivery.restart_schedule``'s twin: the next _SCHEDULE_EVERY calls are not
    due, the one after them is (send() yields on its _YIELD_EVERY-th call after its
    checkpoint: a loop that sends and awaits reaches that first)."""
    global _schedule_due_py, _schedule_due
    _schedule_due_py = _schedule_due = chain((False,), cycle(_BUDGET)).__next__


#: Restarts the budget in use: a schedule point was just made (``Intake.send``).
_restart_schedule: Callable[[], None] = _restart_schedule_py
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_checkpoint = trio.lowlevel.checkpoint

#: Builds a message's ``RecordMetadata``: ``_speedups._delivery.metadata`` (C) or its twin.
_metadata_of: Callable[[ProducerMessage], RecordMetadata] = _metadata_py


# The cancellation check of a settled ``await``: the test
# ``checkpoint_if_cancelled`` starts with, read without creating its coroutine
# or calling ``current_task()``. With the cycle above: ~170 ns less per await
# (1.41 -> 1.24 us in a loop over 200k settled deliveries, most of the rest
# being the memory reads of cold objects). It reads trio internals
# (the run context's ``task``, ``Task._cancel_status``), so a trio without
# them takes the public ``checkpoint_if_cancelled`` (correct, only slower;
# tested). A pending KeyboardInterrupt is noticed at the next full schedule
# point instead (at most _SCHEDULE_EVERY awaits later).
_run_context: Any
try:
    from trio._core._run import GLOBAL_RUN_CONTEXT as _run_context
except ImportError:  # pragma: no cover - a trio without it: the public fallback
    _run_context = None


_c: ModuleType | None = _speedups.load("_delivery")

if TYPE_CHECKING:
    class _AwaitBase:
        pass
else:
    class _NoCAwait:  # (a base of its own: ``object`` here would break the MRO)
        __slots__ = ()

    _AwaitBase = _NoCAwait if _c is None else _c.SettledAwait


class Delivery:
    """What ``send()`` returns: awaitable for the message's outcome.

    ``await delivery`` returns ``RecordMetadata`` or raises ``ProducerError``.
    Awaiting is optional: the message is delivered either way. It reads as the
    message it stands for (``topic``, ``value``, ``key``, ``headers``,
    ``partition``, ``offset``, ``timestamp``, ``metadata``) and has ``done()``,
    ``result()``, ``wait()`` and ``message``.

    Two kinds behave the same: ``MessageDelivery`` (the accepted message
    itself) and ``burst.RowDelivery`` (a row of a columnar ``send()`` burst).
    Awaiting a settled one schedules nothing (a cancellation check; a schedule
    point every ``_SCHEDULE_EVERY`` awaits); a pending one parks until its batch
    settles, which settles its neighbours too (about one park per batch).
    """

    __slots__ = ()

    if TYPE_CHECKING:  # the message's fields, as both kinds provide them
        topic: str
        value: bytes | None
        key: bytes | None
        headers: Headers
        partition: int | None
        offset: int
        timestamp: int | None
        metadata: Any
        _state: int
        _outcome: BaseException | None

        def __await__(self) -> Generator[Any, None, RecordMetadata]: ...
        def done(self) -> bool: ...
        def result(self) -> RecordMetadata: ...
        def record_metadata(self) -> RecordMetadata: ...
        async def _park(self) -> None: ...

        @property
        def message(self) -> ProducerMessage: ...

    async def wait(self) -> RecordMetadata:
        """The same as ``await delivery``."""
        return await self


class MessageDelivery(ProducerMessage, _AwaitBase, Delivery):
    """A ``Delivery`` that is the accepted message itself (not a wrapper around
    it: that saves an object per send, and ``delivery.message`` is the
    delivery itself)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        return _await_py(self)  # replaced by _await_py itself or by the C slot (below)

    def __repr__(self) -> str:
        return "<Delivery " + ProducerMessage.__repr__(self)[1:]

    @property
    def message(self) -> ProducerMessage:
        return self

    def record_metadata(self) -> RecordMetadata:
        return _metadata_of(self)

    async def _park(self) -> None:
        """Wait (a trio checkpoint) until the message is settled."""
        sink = self._sink
        event: trio.Event
        if sink is None:
            event = self._sink = trio.Event()
        elif type(sink) is OnDelivery:
            if sink.event is None:
                sink.event = trio.Event()
            event = sink.event
        elif callable(sink):  # on_delivery=fn, and now someone awaits it too
            wrapped = self._sink = OnDelivery(sink)
            event = wrapped.event = trio.Event()
        else:
            event = sink  # type: ignore[assignment]  # a trio.Event: another waiter
        await event.wait()

    def result(self) -> RecordMetadata:
        """The outcome without waiting; raises ``trio.WouldBlock`` while pending."""
        if self._state == OK:
            return self.record_metadata()
        if self._state == FAILED:
            assert self._outcome is not None
            self._sink = OBSERVED  # (settled: the ledger reads the sink no more)
            raise ProducerError(self, self._outcome)
        raise trio.WouldBlock


def _await_py(self: MessageDelivery) -> Generator[Any, None, RecordMetadata]:
    """``MessageDelivery.__await__`` in Python: the whole of it without the C module, and
    its pending / failed part with it (``_delivery.c`` hands those cases over)."""
    if self._state == OK:  # settled: the per-message path, every step inlined
        if _schedule_due():
            yield from _checkpoint().__await__()
        else:
            try:
                cancelled = _run_context.task._cancel_status.effectively_cancelled
            except AttributeError:
                cancelled = True
            if cancelled:
                yield from _checkpoint_if_cancelled().__await__()  # raises Cancelled
        return _new_metadata(RecordMetadata, (
            self.topic, self.partition, self.offset, self.timestamp, self.offset >= 0
        ))
    if self._state == PENDING:
        yield from self._park().__await__()
    else:  # failed: rare, a full checkpoint
        yield from _checkpoint().__await__()
    return self.result()


def _await_settled_checkpoint(self: MessageDelivery, full: bool) -> Generator[Any, None, RecordMetadata]:
    """The C path's settled await when it must yield: a schedule point is due
    (``full``), or the task is cancelled or its cancel status unreadable (the public
    ``checkpoint_if_cancelled`` then raises ``Cancelled`` or says why not)."""
    if full:
        yield from _checkpoint().__await__()
    else:
        yield from _checkpoint_if_cancelled().__await__()
    return _metadata_of(self)


def _use(kind: str) -> None:
    """Switch the await path of the process: ``"c"`` (needs the built extension) or
    ``"python"``. Done once at import (the C path when built); tests run both."""
    global _schedule_due, _restart_schedule, _metadata_of, DELIVERY_AWAIT
    if kind == "c":
        if _c is None:
            raise RuntimeError("pipeline.producer._speedups._delivery is not built or is disabled")
        _c.setup(
            message_type=ProducerMessage, message_fields=names(fields.DELIVERY_MESSAGE),
            metadata_type=RecordMetadata, python_await=_await_py,
            settled_checkpoint=_await_settled_checkpoint, run_context=_run_context, ok=OK,
            schedule_every=_SCHEDULE_EVERY,
        )
        _schedule_due, _metadata_of = _c.schedule_due, _c.metadata
        _restart_schedule = _c.restart_schedule
        if "__await__" in MessageDelivery.__dict__:
            del MessageDelivery.__await__  # the slot comes from _delivery.SettledAwait again
    elif kind == "python":
        _schedule_due, _metadata_of = _schedule_due_py, _metadata_py
        _restart_schedule = _restart_schedule_py
        MessageDelivery.__await__ = _await_py  # type: ignore[method-assign]
    else:
        raise ValueError(f"await path must be 'c' or 'python', not {kind!r}")
    DELIVERY_AWAIT = kind
    for hook in _USE_HOOKS:
        hook(kind)


_USE_HOOKS: list[Callable[[str], None]] = []  # called after a switch (burst.py's rows)


def _set_run_context(ctx: Any) -> Any:
    """Replace what the settled await reads ``.task`` from (both paths; tests of
    a trio without these internals); returns the old one."""
    global _run_context
    old = _run_context
    _run_context = ctx
    if DELIVERY_AWAIT == "c":
        assert _c is not None
        _c.set_run_context(ctx)
    return old


DELIVERY_AWAIT: str = "python"
"""Which settled-await path this process uses: ``"c"`` or ``"python"``."""
_use("python" if _c is None else "c")


def _observe(d: Delivery) -> None:
    """The caller read ``d``'s failure (``unobserved.py``)."""
    rows = getattr(d, "_rows", None)
    if rows is not None:  # a row of a burst: its failure is read
        if rows.outcomes is not None:
            rows.outcomes.read_row(d._row)  # type: ignore[attr-defined]
    else:
        d._sink = OBSERVED  # type: ignore[attr-defined]


async def wait_all(deliveries: Iterable[Delivery]) -> GroupResult:
    """Wait until every delivery is settled; return the counts and first errors.

    The bulk wait: one pass over the deliveries, parking only on one that is
    still pending (its batch settles many of the rest), no per-delivery
    checkpoint. Always a checkpoint itself; cancelling it cancels only the wait.
    """
    delivered = failed = 0
    errors: list[ProducerError] = []
    parked = False
    for d in deliveries:
        state = d._state
        if state == PENDING:
            await d._park()
            parked = True
            state = d._state
        if state == OK:
            delivered += 1
        else:
            failed += 1
            _observe(d)
            if len(errors) < DeliveryGroup.MAX_ERRORS_KEPT:
                assert d._outcome is not None
                errors.append(ProducerError(d.message, d._outcome))
    if not parked:
        await _checkpoint()
    return GroupResult(delivered, failed, tuple(errors))


@dataclass(frozen=True, slots=True)
class GroupResult:
    """What happened to the messages of one ``send_many`` call."""

    delivered: int
    failed: int
    errors: tuple[ProducerError, ...]  # the first few failures, in the order they happened

    @property
    def first_error(self) -> ProducerError | None:
        return self.errors[0] if self.errors else None


class DeliveryGroup:
    """The outcome of a ``send_many`` call: counts instead of one future per message.

    Bulk callers (the Spark stage) need totals, not a million awaitables; each
    message settles by decrementing ``pending``, which costs no allocation.
    """

    MAX_ERRORS_KEPT = 10

    __slots__ = ("_event", "delivered", "errors", "failed", "observed", "pending", "total")

    def __init__(self, total: int) -> None:
        self.total = total
        self.pending = total
        self.delivered = 0
        self.failed = 0
        self.errors: list[ProducerError] = []
        self.observed = False  # the caller awaited the outcome (unobserved.py)
        self._event = trio.Event()
        if total == 0:
            self._event.set()

    # The producer's side (the ledger and the intake call these; like a
    # future's set_result, not for users).
    def count(self, msg: ProducerMessage) -> None:
        """Count the outcome of one of the call's messages (settled just now)."""
        if msg._state == OK:
            self.delivered += 1
        else:
            self.failed += 1
            if len(self.errors) < self.MAX_ERRORS_KEPT:
                assert msg._outcome is not None
                self.errors.append(ProducerError(msg, msg._outcome))
        self.pending -= 1
        if self.pending == 0:
            self._event.set()

    def wake(self) -> None:
        """Every message is counted (``pending`` reached 0): wake the waiters."""
        self._event.set()

    def forget(self, never_accepted: int) -> None:
        """Forget messages of the call that were never accepted (it was cancelled)."""
        self.total -= never_accepted
        self.pending -= never_accepted
        if self.pending == 0:
            self._event.set()

    def done(self) -> bool:
        return self.pending == 0

    async def wait(self) -> GroupResult:
        self.observed = True
        await self._event.wait()
        return GroupResult(self.delivered, self.failed, tuple(self.errors))

    def __await__(self) -> Generator[Any, None, GroupResult]:
        return self.wait().__await__()
