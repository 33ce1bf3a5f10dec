"""Issue 15 goal 1: ``await delivery`` in C (``pipeline/producer/_speedups/_delivery.c``) and its
pure-Python twin (``_outcomes.delivery._await_py``) behave identically.

Every test with the ``await_path`` fixture (tests/conftest.py) runs once per path (the C one is skipped
only when the extension is not built, and ``test_the_c_path_is_used_when_built``
fails then unless ``PIPELINE_PURE_PYTHON`` asked for that). Task steps are counted
with a trio Instrument, never timed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from pipeline.producer import _speedups
from pipeline.producer._errors import ProducerError
from pipeline.producer._message import FAILED, OK, ProducerMessage, RecordMetadata
from pipeline.producer._outcomes import delivery as delivery_module
from pipeline.producer._outcomes.delivery import MessageDelivery, OnDelivery
from tests.scenarios.test_delivery_results import counting_steps, without_trio_internals

EVERY = delivery_module._SCHEDULE_EVERY
SPEEDUPS = Path(_speedups.__file__).parent
BUILT = any(SPEEDUPS.glob("_delivery.*.so")) or any(SPEEDUPS.glob("_delivery.*.pyd"))


def settled(offset: int = 7, partition: int | None = 2, timestamp: int | None = 1234,
            topic: str = "t") -> MessageDelivery:
    d = MessageDelivery(topic, b"v")
    d._state, d.partition, d.offset, d.timestamp = OK, partition, offset, timestamp
    return d


def sync_budget() -> None:
    """Consume the shared schedule budget up to its due call: the next due one is
    then exactly _SCHEDULE_EVERY calls away."""
    for _ in range(EVERY):
        if delivery_module._schedule_due():
            return
    raise AssertionError(f"_schedule_due() was never True in {EVERY} calls")


# -- which path is loaded --------------------------------------------------------

def test_the_c_path_is_used_when_built() -> None:
    if not BUILT:
        pytest.skip("the extension is not built here")
    if os.environ.get("PIPELINE_PURE_PYTHON", "") not in ("", "0"):
        assert delivery_module.DELIVERY_AWAIT == "python"
        return
    from pipeline.producer._speedups import _delivery

    assert delivery_module.DELIVERY_AWAIT == "c"
    assert issubclass(MessageDelivery, _delivery.SettledAwait)
    assert "__await__" not in MessageDelivery.__dict__  # the slot is SettledAwait's am_await
    assert MessageDelivery.__await__ is _delivery.SettledAwait.__await__  # type: ignore[attr-defined]
    assert delivery_module._schedule_due is _delivery.schedule_due  # one budget for both paths
    assert delivery_module._metadata_of is _delivery.metadata


def test_pure_python_switch_in_a_fresh_process() -> None:
    probe = ("from pipeline.producer._outcomes import delivery as m; "
             "assert m.DELIVERY_AWAIT == 'python', m.DELIVERY_AWAIT; "
             "assert m.MessageDelivery.__await__ is m._await_py; "
             "assert m._metadata_of is m._metadata_py; print('ok')")
    env = {**os.environ, "PIPELINE_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, timeout=120, check=True)
    assert out.stdout.strip() == "ok"


def test_switching_paths_changes_the_await_slot(await_path: str) -> None:
    if await_path == "python":
        assert MessageDelivery.__await__ is delivery_module._await_py
        assert delivery_module._schedule_due is delivery_module._schedule_due_py
    else:
        assert "__await__" not in MessageDelivery.__dict__
        assert delivery_module._schedule_due is not delivery_module._schedule_due_py
    assert delivery_module.DELIVERY_AWAIT == await_path


def test_unknown_path_is_refused() -> None:
    with pytest.raises(ValueError, match="'c' or 'python'"):
        delivery_module._use("rust")


# -- RecordMetadata ----------------------------------------------------------------

@pytest.mark.parametrize(
    ("offset", "partition", "timestamp"),
    [(0, 0, 0), (7, 2, 1234), (-1, 3, -1), (2**63 - 1, 1, 5), (2**70, 1, 5), (-(2**70), 0, 5),
     (-2, None, None)],
)
def test_metadata_is_the_same_named_tuple_on_both_paths(
    offset: int, partition: int | None, timestamp: int | None
) -> None:
    d = settled(offset, partition, timestamp, topic="orders")
    expected = RecordMetadata("orders", partition, offset, timestamp, offset >= 0)  # type: ignore[arg-type]
    assert delivery_module._metadata_py(d) == expected
    assert d.record_metadata() == expected and type(d.record_metadata()) is RecordMetadata
    assert d.result() == expected
    if delivery_module._c is not None:
        got = delivery_module._c.metadata(d)
        assert got == expected and type(got) is RecordMetadata
        assert got.offset_known is (offset >= 0)  # a bool, not just truthy
        assert got.topic is d.topic  # the slot's own object


def test_c_metadata_refuses_what_is_not_a_message() -> None:
    if delivery_module._c is None:
        pytest.skip("not built")
    with pytest.raises(TypeError, match="ProducerMessage"):
        delivery_module._c.metadata(object())
    m = ProducerMessage.__new__(ProducerMessage)  # slots never set
    with pytest.raises(AttributeError, match="topic"):
        delivery_module._c.metadata(m)
    with pytest.raises(TypeError):
        delivery_module._c.SettledAwait()  # type: ignore[call-arg]  # a mixin only


def test_plain_messages_are_not_awaitable() -> None:
    m = ProducerMessage("t", b"v")
    assert not hasattr(m, "__await__")


# -- awaiting: settled, pending, failed, cancelled, schedule due ---------------------

async def test_settled_await_returns_the_metadata_without_a_step(await_path: str) -> None:
    ds = [settled(i, i % 3, 100 + i) for i in range(10)] + [settled(-1, 0, 5)]
    sync_budget()
    with counting_steps() as steps:
        got = [await d for d in ds]
    assert steps.steps == 0
    assert got == [delivery_module._metadata_py(d) for d in ds]
    assert all(type(m) is RecordMetadata for m in got)
    assert got[-1].offset_known is False and got[0].offset_known is True


async def test_a_full_schedule_point_every_n_awaits_on_one_budget(await_path: str) -> None:
    d = settled()
    sync_budget()
    with counting_steps() as steps:
        for _ in range(EVERY - 1):
            await d
        assert steps.steps == 0
        await d  # the EVERY-th: a schedule point
        assert steps.steps == 1
        for _ in range(EVERY - 2):
            await d
        delivery_module._schedule_due()  # another user of the same budget takes one turn
        assert steps.steps == 1
        assert (await d) == delivery_module._metadata_py(d)
        assert steps.steps == 2


def test_a_restart_puts_the_next_schedule_point_a_whole_budget_away(await_path: str) -> None:
    """A schedule point made elsewhere (send()'s) restarts the shared budget: the next
    _SCHEDULE_EVERY calls are not due, whatever was spent before, and the one after
    them is; then every _SCHEDULE_EVERY-th again."""
    sync_budget()
    for _ in range(EVERY - 2):
        assert not delivery_module._schedule_due()
    delivery_module._restart_schedule()
    for _ in range(EVERY):
        assert not delivery_module._schedule_due()
    assert delivery_module._schedule_due()
    for _ in range(EVERY - 1):
        assert not delivery_module._schedule_due()
    assert delivery_module._schedule_due()
    if await_path == "python":  # (the switch binds the twin's current cycle)
        assert delivery_module._schedule_due is delivery_module._schedule_due_py


async def test_schedule_point_lets_another_task_run(await_path: str) -> None:
    d = settled()
    ran = 0

    async def other() -> None:
        nonlocal ran
        while True:
            ran += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        before = ran
        for _ in range(3 * EVERY):
            await d
        # 3 schedule points: the other task ran about once per point (trio's batch
        # order is random, so one more or less), never 0 times.
        assert 2 <= ran - before <= 4, ran - before
        nursery.cancel_scope.cancel()


async def test_settled_await_is_a_cancellation_point_every_time(await_path: str) -> None:
    d = settled()
    for _ in range(3):
        with trio.CancelScope() as scope:
            scope.cancel()
            await d
            pytest.fail("await on a settled delivery ignored a cancellation")
        assert scope.cancelled_caught
    assert (await d).offset == 7  # and afterwards it still returns


def test_the_cancellation_check_reads_the_awaiting_threads_task(await_path: str) -> None:
    """Two trio runs in two threads at once: an await in a cancelled scope of
    one raises Cancelled although the other thread's current task, whose run
    context the C path read last, is not cancelled (the C path keeps the run
    context's per-thread dict of one thread, found again for another)."""
    import threading

    d = settled()
    ready, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def other_thread() -> None:
        async def main() -> None:
            assert (await d).offset == 7  # this thread's run context was read last
            ready.set()
            await trio.to_thread.run_sync(release.wait)  # its task stays current here

        try:
            trio.run(main)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert ready.wait(10)

        async def main() -> None:
            sync_budget()  # no schedule point due: the cancellation check decides
            with trio.CancelScope() as scope:
                scope.cancel()
                await d
                pytest.fail("the await read another thread's task")
            assert scope.cancelled_caught

        trio.run(main)
    finally:
        release.set()
        thread.join(10)
    assert errors == [] and not thread.is_alive()


async def test_pending_await_parks_until_the_batch_settles(await_path: str) -> None:
    d = MessageDelivery("t", b"v")
    got: list[RecordMetadata] = []

    async def waiter() -> None:
        got.append(await d)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and isinstance(d._sink, trio.Event)
        d._state, d.partition, d.offset, d.timestamp = OK, 1, 42, 9  # what Ledger.succeed does
        d._sink.set()
    assert got == [RecordMetadata("t", 1, 42, 9, True)]


async def test_pending_await_of_an_on_delivery_message_keeps_the_callback(await_path: str) -> None:
    d = MessageDelivery("t", b"v")

    def fn(meta: Any, err: Any) -> None:
        pass

    d._sink = fn
    async with trio.open_nursery() as nursery:
        nursery.start_soon(d.wait)
        await trio.testing.wait_all_tasks_blocked()
        assert type(d._sink) is OnDelivery and d._sink.fn is fn and d._sink.event is not None
        d._state, d.partition, d.offset, d.timestamp = OK, 0, 1, 2
        d._sink.event.set()


async def test_failed_await_raises_after_a_checkpoint(await_path: str) -> None:
    d = MessageDelivery("t", b"v")
    d._state, d._outcome = FAILED, RuntimeError("broker says no")
    with counting_steps() as steps:
        with pytest.raises(ProducerError, match="broker says no") as info:
            await d
    assert steps.steps == 1  # a full checkpoint
    assert info.value.message is d and isinstance(info.value.cause, RuntimeError)


async def test_failed_await_is_a_cancellation_point(await_path: str) -> None:
    d = MessageDelivery("t", b"v")
    d._state, d._outcome = FAILED, RuntimeError("x")
    with trio.CancelScope() as scope:
        scope.cancel()
        await d
    assert scope.cancelled_caught


async def test_unreadable_cancel_status_falls_back_to_the_public_check(await_path: str) -> None:
    """A trio without Task._cancel_status: the public checkpoint_if_cancelled decides."""
    d = settled()
    with without_trio_internals():
        sync_budget()
        assert (await d).offset == 7
        with trio.CancelScope() as scope:
            scope.cancel()
            await d
            pytest.fail("not a cancellation point")
        assert scope.cancelled_caught
    assert (await d).offset == 7


def test_settled_await_outside_trio_says_so(await_path: str) -> None:
    it = settled().__await__()
    with pytest.raises(RuntimeError, match=r"async context|trio"):
        it.send(None)


async def test_the_awaitable_iterator_protocol(await_path: str) -> None:
    """``__await__()`` driven by hand (as a framework or ``yield from`` would)."""
    d = settled(3)
    sync_budget()
    with pytest.raises(StopIteration) as stop:
        next(d.__await__())
    assert stop.value.value == RecordMetadata("t", 2, 3, 1234, True)
    with pytest.raises(StopIteration) as stop:
        d.__await__().send(None)
    assert stop.value.value == RecordMetadata("t", 2, 3, 1234, True)
    it = d.__await__()
    with pytest.raises(ValueError, match="thrown"):
        it.throw(ValueError("thrown"))
    d.__await__().close()


async def test_two_awaits_of_one_delivery_in_flight(await_path: str) -> None:
    """The C path reuses its iterator only when nobody else holds it."""
    a, b = settled(1), settled(2)
    sync_budget()
    ia, ib = a.__await__(), b.__await__()
    with pytest.raises(StopIteration) as sb:
        next(ib)
    with pytest.raises(StopIteration) as sa:
        next(ia)
    assert (sa.value.value.offset, sb.value.value.offset) == (1, 2)


async def test_pending_then_failed_through_the_park(await_path: str) -> None:
    d = MessageDelivery("t", b"v")
    errors: list[BaseException] = []

    async def waiter() -> None:
        try:
            await d
        except ProducerError as e:
            errors.append(e)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        d._state, d._outcome = FAILED, TimeoutError("expired")
        assert isinstance(d._sink, trio.Event)
        d._sink.set()
    assert len(errors) == 1 and isinstance(errors[0], ProducerError)
    assert isinstance(errors[0].cause, TimeoutError) and errors[0].message is d
