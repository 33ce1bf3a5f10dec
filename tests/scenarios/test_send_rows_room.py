"""A columnar ``send()`` loop that fills the buffer stays columnar.

A row that finds ``buffer_memory`` full waits for room (up to ``max_block``,
as a message does), then is sent again at once: it joins the burst if that is
still open, or opens a new columnar burst, whatever the length of the burst
the dispatcher took meanwhile (``Intake._row_after_room``). Before, it went
the per-message way, and so did the sends after it until the dispatcher took
a burst of ``COLUMNS_MIN`` messages: measured, 0.1-8% of a 1M ``send()`` loop
against tansu, each message several times the CPU of a row.

These schedules check that it stays columnar, and that the wait keeps the
per-message path's rules: the order of sends, a close or ``max_block`` during
the wait (nothing accepted), a cancellation (nothing accepted)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline.producer._columnar.burst import COLUMNS_MIN, RowDelivery
from pipeline.producer._errors import BufferFullError, ProducerClosed, ProducerError
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_bad_input import PATIENT, stall_produce
from .test_send_rows import _kinds, columnar_next


@pytest.fixture(autouse=True)
def _modes(both_modes: bool, await_path: str, send_path: str) -> bool:
    """Plain and idempotent, on both await paths and both send paths (the C
    row branch hands a full buffer to ``Intake.send``, which waits)."""
    return both_modes


async def test_a_send_loop_that_fills_the_buffer_again_and_again_stays_columnar(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Schedule (one partition, buffer_memory 4 KB, 3000 sends of 40 B, about
    60 rows' worth of buffer): the loop fills the buffer dozens of times. After
    the loop's first bursts (messages: not known to be a high-rate loop yet),
    every delivery is a row, although many of the bursts the dispatcher took
    were cut short by the full buffer (fewer than COLUMNS_MIN rows). Every row
    reports offset i for the i-th send, and the log holds the sends in order."""
    fake.create_topic("t", 1)
    n = 3000
    values = [b"v%038d" % i for i in range(n)]
    async with open_fake_producer(fake, buffer_memory=4096, max_message_bytes=1024,
                                  batch_bytes=1024) as producer:
        ledger = producer._ledger
        waits = 0
        reserve = ledger.reserve

        async def counted(size: int) -> None:
            nonlocal waits
            waits += 1
            await reserve(size)

        ledger.reserve = counted  # type: ignore[method-assign]
        columnar_next(producer)
        deliveries = [await producer.send("t", v) for v in values]
        results = [await d for d in deliveries]
    assert waits > n // COLUMNS_MIN  # the buffer was full again and again
    assert _kinds(deliveries) == ["row"] * n
    assert [r.offset for r in results] == list(range(n))
    assert values_in_log(fake, "t", 0) == values


async def test_a_bursts_first_row_waits_for_room_and_opens_the_next_burst(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Schedule (Produce stalled): 100 rows are sent, the dispatcher takes
    their burst (so the next send opens one), and the buffer is then exactly
    full. t0: r waits for room. t0 + 1: the stall ends; the 100 rows settle and
    free their bytes; r opens a columnar burst of its own: a row, offset 100."""
    fake.create_topic("t", 1)
    gate = stall_produce(fake)
    async with open_fake_producer(fake, **PATIENT) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"r%d" % i) for i in range(100)]
        await trio.sleep(1)  # the burst is taken (sealed) and its Produce is stalled
        assert producer.statistics().requests_sent == 1
        intake, ledger = producer._intake, producer._ledger
        assert intake._rows is None and intake._columns_next
        ledger.buffer_memory = ledger.buffered_bytes
        t0 = trio.current_time()
        got: list[tuple[float, Any]] = []

        async def late() -> None:
            delivery = await producer.send("t", b"late")
            got.append((trio.current_time(), delivery))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(late)
            await trio.sleep(1)
            assert got == []  # waiting for room
            gate.set()
        ((at, delivery),) = got
        assert at == t0 + 1
        assert type(delivery) is RowDelivery
        assert (await delivery).offset == 100
        assert [(await d).offset for d in rows] == list(range(100))
    assert values_in_log(fake, "t", 0)[-1] == b"late"


@pytest.mark.parametrize("ending", ["close", "max_block", "cancel"])
async def test_a_row_waiting_for_room_that_never_comes_accepts_nothing(
    fake: FakeCluster, autojump_clock: Any, ending: str
) -> None:
    """Schedule (Produce stalled, a taken burst's 100 rows fill the buffer): t0:
    r waits for room. Then either the producer closes (t0 + 1; close_timeout
    2 s, not idempotent: the buffered rows fail at t0 + 3, freeing room, and r raises
    ProducerClosed at that moment, "while this call waited for buffer space"),
    or max_block (5 s) passes (BufferFullError at t0 + 5), or r's caller is
    cancelled at t0 + 1. In each case r is not accepted and leaves no trace;
    the rows before it keep their one outcome each."""
    fake.create_topic("t", 1)
    gate = stall_produce(fake)
    raised: list[tuple[float, BaseException]] = []
    rows: list[Any] = []
    options: dict[str, Any] = dict(PATIENT, close_timeout=2.0, max_block=5.0)
    if ending == "close":  # (an idempotent close does not fail a batch in flight)
        options["idempotent"] = False
    async with trio.open_nursery() as outer:
        async with open_fake_producer(fake, **options) as producer:
            columnar_next(producer)
            rows = [await producer.send("t", b"r%d" % i) for i in range(100)]
            await trio.sleep(1)  # the burst is taken (sealed) and its Produce is stalled
            assert producer.statistics().requests_sent == 1
            ledger = producer._ledger
            ledger.buffer_memory = ledger.buffered_bytes  # its rows fill the buffer
            t0 = trio.current_time()
            scope = trio.CancelScope()

            async def waiting() -> None:
                with scope:
                    try:
                        await producer.send("t", b"r")
                    except (ProducerClosed, BufferFullError) as exc:
                        raised.append((trio.current_time() - t0, exc))

            outer.start_soon(waiting)
            await trio.sleep(1)
            assert producer.statistics().accepted == 100
            if ending == "max_block":
                await trio.sleep(10)
            elif ending == "cancel":
                scope.cancel()
                await trio.sleep(1)
            if ending != "close":
                assert producer.statistics().accepted == 100
                gate.set()
    gate.set()
    if ending == "close":
        ((after, exc),) = raised
        assert (after, type(exc)) == (3.0, ProducerClosed)
        assert "waited for buffer space" in str(exc)
        for d in rows:
            with pytest.raises(ProducerError):
                d.result()
    elif ending == "max_block":
        ((after, exc),) = raised
        assert (after, type(exc)) == (5.0, BufferFullError)
        assert [(await d).offset for d in rows] == list(range(100))
    else:
        assert raised == [] and scope.cancelled_caught
        assert [(await d).offset for d in rows] == list(range(100))
    stats = producer.statistics()
    assert (stats.accepted, stats.outstanding, stats.buffered_bytes) == (100, 0, 0)
