"""Issue 15 goal 1: awaited results as cheap as flush, on_delivery callbacks, wait_all.

Awaiting a settled delivery must not be a scheduler pass (a checkpoint per message is
what made `await d` cost 16 us each); a pending one parks until its batch settles, so
awaiting a whole burst in order parks about once per batch. Counted with a trio
Instrument (task steps), never timed. Each test runs on both await paths (the
``await_path`` fixture: pipeline/producer/_speedups/_delivery.c and its pure-Python twin)."""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

from pipeline.producer._errors import ProducerClosed, ProducerError
from pipeline.producer._message import RecordMetadata
from pipeline.producer._outcomes.delivery import wait_all
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log

# Every test here runs on both await paths: _delivery.c and its pure-Python twin.
pytestmark = pytest.mark.usefixtures("await_path")


class _Steps(trio.abc.Instrument):
    """Counts the steps of one task (each is a pass through the scheduler)."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task, self.steps = task, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


@contextmanager
def counting_steps() -> Iterator[_Steps]:
    """Count the current task's steps (scheduler passes) inside the block."""
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        yield steps
    finally:
        trio.lowlevel.remove_instrument(steps)


@contextmanager
def without_trio_internals() -> Iterator[None]:
    """Inside the block the settled await finds no ``Task._cancel_status`` (as
    with a trio that changed them), on both await paths."""
    from pipeline.producer._outcomes import delivery as _delivery

    old = _delivery._set_run_context(types.SimpleNamespace(task=object()))
    try:
        yield
    finally:
        _delivery._set_run_context(old)


async def test_awaiting_settled_deliveries_schedules_about_never(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 3)
    async with open_fake_producer(fake) as producer:
        deliveries = [await producer.send("t", b"v%d" % i) for i in range(5000)]
        await producer.flush()
        with counting_steps() as steps:
            metas = [await d for d in deliveries]
    assert all(isinstance(m, RecordMetadata) for m in metas)
    # One schedule point per _SCHEDULE_EVERY (4096) awaits (5000 // 4096 = 1), not 5000.
    assert steps.steps <= 2, steps.steps
    assert sorted(m.offset for m in metas if m.partition == metas[0].partition) == list(
        range(sum(m.partition == metas[0].partition for m in metas))
    )


async def test_awaiting_a_settled_delivery_is_still_a_cancellation_point(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        d = await producer.send("t", b"x")
        await d
        with trio.CancelScope() as scope:
            scope.cancel()
            await d  # raises Cancelled: caught by the scope
            pytest.fail("await on a settled delivery ignored a cancellation")
        assert scope.cancelled_caught


async def test_awaiting_a_burst_in_order_parks_about_once_per_batch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, max_batch_messages=1000) as producer:
        deliveries = [await producer.send("t", b"v%d" % i, partition=0) for i in range(4000)]
        with counting_steps() as steps:
            offsets = [(await d).offset for d in deliveries]
    assert offsets == list(range(4000))
    # 4 batches of 1000: a park (and wake) per batch plus the periodic schedule points.
    assert steps.steps <= 20, steps.steps


async def test_on_delivery_called_once_with_metadata_or_error(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 2)
    calls: list[tuple[Any, Any]] = []

    def record(meta: RecordMetadata | None, error: ProducerError | None) -> None:
        calls.append((meta, error))

    async with open_fake_producer(fake) as producer:
        for i in range(10):
            await producer.send("t", b"v%d" % i, partition=i % 2, on_delivery=record)
        await producer.send("t", b"bad", partition=7, on_delivery=record)  # out of range
        # Awaited *and* called back: both hear of the one outcome.
        d = await producer.send("t", b"both", partition=0, on_delivery=record)
        assert (await d).offset == 5
        await producer.flush()
    assert len(calls) == 12
    ok = [m for m, e in calls if e is None]
    failed = [e for m, e in calls if m is None]
    assert len(ok) == 11 and all(isinstance(m, RecordMetadata) for m in ok)
    assert len(failed) == 1 and "partition 7 does not exist" in str(failed[0])
    assert sorted((m.partition, m.offset) for m in ok) == sorted(
        [(0, i) for i in range(6)] + [(1, i) for i in range(5)]
    )


async def test_on_delivery_exception_is_reported_not_swallowed(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fake.create_topic("t", 1)
    seen: list[int] = []

    def flaky(meta: RecordMetadata | None, error: ProducerError | None) -> None:
        assert meta is not None
        seen.append(meta.offset)
        if meta.offset == 1:
            raise RuntimeError("user bug in callback")

    caplog.set_level(logging.ERROR, logger="pipeline.producer")
    async with open_fake_producer(fake) as producer:
        ds = [await producer.send("t", b"v%d" % i, on_delivery=flaky) for i in range(3)]
        result = await wait_all(ds)
        assert producer.statistics().callback_errors == 1
    assert result.delivered == 3 and result.failed == 0
    assert seen == [0, 1, 2]  # the raise did not stop the others
    assert "user bug in callback" in caplog.text and "on_delivery callback" in caplog.text
    assert values_in_log(fake, "t", 0) == [b"v0", b"v1", b"v2"]


async def test_on_delivery_hears_of_the_close(fake: FakeCluster, autojump_clock: Any) -> None:
    """An undeliverable message's callback runs with the close's error, once."""
    errors: list[Any] = []
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, close_timeout=1.0, delivery_timeout=30.0) as producer:
        fake.stop_broker(0, elect=False)  # no leader: the message waits until the close
        await producer.send("t", b"x", on_delivery=lambda m, e: errors.append(e))
    assert len(errors) == 1
    assert isinstance(errors[0], ProducerError)
    assert isinstance(errors[0].cause, ProducerClosed)


async def test_on_delivery_must_be_callable(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        with pytest.raises(TypeError, match="on_delivery must be a callable"):
            await producer.send("t", b"x", on_delivery=42)  # type: ignore[arg-type]
        assert producer.statistics().accepted == 0


async def test_wait_all_counts_and_first_errors(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 2)
    async with open_fake_producer(fake) as producer:
        ds = [await producer.send("t", b"v", partition=i % 3) for i in range(9)]
        result = await wait_all(ds)
    assert (result.delivered, result.failed) == (6, 3)
    assert len(result.errors) == 3 and "partition 2 does not exist" in str(result.first_error)
    assert all(d.done() for d in ds)


async def test_cancellation_check_falls_back_to_trio_public_api(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """If trio's internals change (no Task._cancel_status), awaiting a settled delivery
    still works and is still a cancellation point (the public checkpoint_if_cancelled)."""
    with without_trio_internals():
        await _fallback_check(fake)


async def _fallback_check(fake: FakeCluster) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        d = await producer.send("t", b"x")
        assert (await d).offset == 0
        assert (await d).offset == 0  # settled: the fallback path
        with trio.CancelScope() as scope:
            scope.cancel()
            await d
            pytest.fail("not a cancellation point")
        assert scope.cancelled_caught


async def test_on_delivery_exception_without_an_await_is_counted(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The callback alone (nobody awaits the delivery: ``_sink`` is the callable
    itself, no ``OnDelivery`` object): an exception from it is logged and
    counted, and every other message still hears of its outcome once."""
    fake.create_topic("t", 1)
    seen: list[int] = []

    def flaky(meta: RecordMetadata | None, error: ProducerError | None) -> None:
        assert meta is not None
        seen.append(meta.offset)
        if meta.offset % 2:
            raise RuntimeError("user bug in callback")

    caplog.set_level(logging.ERROR, logger="pipeline.producer")
    async with open_fake_producer(fake) as producer:
        for i in range(6):
            await producer.send("t", b"v%d" % i, on_delivery=flaky)
        await producer.flush()
        assert producer.statistics().callback_errors == 3
    assert seen == [0, 1, 2, 3, 4, 5]
    assert len([r for r in caplog.records if "on_delivery callback" in r.getMessage()]) == 3


async def test_send_takes_two_positional_arguments(fake: FakeCluster, autojump_clock: Any) -> None:
    """``send``'s options are keyword-only (the producer's bound ``send`` checks
    it itself, see ``Intake.send``): a third positional argument is refused
    before anything is accepted."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        for args in [("t", b"v", b"key"), ("t", b"v", None), ("t", b"v", b"k", [("h", b"x")])]:
            with pytest.raises(TypeError, match="positional argument"):
                await producer.send(*args)
        assert producer.statistics().accepted == 0
        assert (await (await producer.send("t", b"v", key=b"key"))).offset == 0
