"""Issue 15 goal 2, the intake's side of a columnar ``send()`` burst (see
test_send_rows.py for the outcomes): which calls open and join one (the
COLUMNS_MIN threshold, a paced sender), the bytes a row reserves and the
limits it meets (max_message_bytes, a full buffer or intake), its CreateTime,
and what ends a burst so that one task's calls keep their order."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline.producer._columnar.burst import COLUMNS_MIN, RowDelivery
from pipeline.producer._outcomes.delivery import MessageDelivery
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_send_rows import LOOP, _kinds, _modes, columnar_next

__all__ = ["_modes"]  # (the autouse fixture: every schedule in both modes and await paths)


async def test_a_paced_sender_keeps_the_per_message_path(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Columnar bursts are sealed as their own batches, so only a loop whose
    last burst had COLUMNS_MIN messages or more opens one: bursts of 10 sends
    with a sleep between them stay messages, and a loop's small tail burst
    turns the next burst back into messages."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        paced = []
        for _ in range(20):
            paced += [await producer.send("t", b"p") for _ in range(10)]
            await trio.sleep(0.01)
        assert set(_kinds(paced)) == {"msg"}
        loop = [await producer.send("t", b"l") for _ in range(LOOP)]
        assert "row" in _kinds(loop)
        await trio.sleep(0.01)  # the dispatcher takes the loop's last burst
        columnar_next(producer)
        tail = [await producer.send("t", b"a") for _ in range(COLUMNS_MIN - 1)]
        await trio.sleep(0.01)  # a columnar burst of COLUMNS_MIN - 1 rows is taken
        after = await producer.send("t", b"a")
        assert set(_kinds(tail)) == {"row"} and type(after) is MessageDelivery
        await producer.flush()


async def test_a_full_buffer_keeps_the_order_and_the_rows(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """buffer_memory holds about 20 rows: the 21st send finds no room and waits
    (Intake._row_after_room), then is a row again, of the burst still open or
    of a new one (test_send_rows_room.py has the schedules); every value is in
    the log in send order."""
    fake.create_topic("t", 1)
    values = [b"%04d" % i + b"y" * 96 for i in range(200)]
    async with open_fake_producer(fake, buffer_memory=20 * 140, max_message_bytes=1000) as producer:
        columnar_next(producer)
        deliveries = [await producer.send("t", v) for v in values]
        results = [await d for d in deliveries]
    assert _kinds(deliveries) == ["row"] * 200
    assert values_in_log(fake, "t", 0) == values
    assert [r.offset for r in results] == list(range(200))


async def test_rows_take_the_wall_clock_create_time(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    import time

    fake.create_topic("t", 1)
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        columnar_next(producer)
        before = int(time.time() * 1000)
        rows = [await producer.send("t", b"v") for _ in range(100)]
        after = int(time.time() * 1000)
        results = [await d for d in rows]
    assert set(_kinds(rows)) == {"row"}
    assert all(before <= r.timestamp <= after for r in results)
    assert [d.timestamp for d in rows] == [r.timestamp for r in results]


@pytest.mark.parametrize("burst", [63, 64])
async def test_the_burst_after_one_of_columns_min_messages_is_columnar(
    fake: FakeCluster, autojump_clock: Any, burst: int
) -> None:
    """A fresh producer's first burst is messages; once the dispatcher took it,
    the next send is a row exactly when that burst had COLUMNS_MIN messages.
    The first row of a topic reports offset 0 (known), and its message copy
    its outcome."""
    fake.create_topic("t", 1)  # (literal sizes: the documented COLUMNS_MIN is 64)
    async with open_fake_producer(fake) as producer:
        first = [await producer.send("t", b"m") for _ in range(burst)]
        await trio.sleep(0.01)  # the dispatcher takes the burst (no checkpoint before)
        nxt = await producer.send("t", b"n")
        await producer.flush()
    assert set(_kinds(first)) == {"msg"}
    assert _kinds([nxt]) == (["row"] if burst == 64 else ["msg"])
    assert (await nxt).offset == burst and (await first[0]).offset_known


async def test_a_row_delivery_given_back_to_send_many_or_input_is_refused_clearly(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A row's delivery is no ProducerMessage: send_many and producer.input
    refuse it (and anything else that is not one) with a TypeError saying
    what to build instead; nothing of the call is sent, and the pipeline
    goes on."""
    from pipeline.producer._message import ProducerMessage

    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        row = await producer.send("t", b"v")
        with pytest.raises(TypeError, match=r"send_many takes ProducerMessage objects, not "
                                            r"RowDelivery .*build a new ProducerMessage"):
            await producer.send_many([ProducerMessage("t", b"a"), row])
        with pytest.raises(TypeError, match=r"producer\.input takes ProducerMessage objects"):
            await producer.input.send(row)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="not dict"):
            producer.input.send_nowait({"topic": "t"})  # type: ignore[arg-type]
        assert (await row).offset == 0
        await producer.flush()
    assert values_in_log(fake, "t", 0) == [b"v"]


@pytest.mark.parametrize("size", [0, 1, 63, 64, 8191, 8192, 20000])
async def test_a_row_reserves_the_bytes_its_message_would(
    fake: FakeCluster, autojump_clock: Any, size: int
) -> None:
    """A row holds in the buffer exactly what send()'s per-message path holds
    for the same value (the record's bound, with the length prefixes' exact
    varint widths: 1, 2 or 3 bytes at 64 and 8192): measured with Produce held,
    for the row that opens a burst and for one that joins it."""
    from .test_bad_input import PATIENT, stall_produce

    fake.create_topic("t", 1)
    value = b"x" * size
    gate = stall_produce(fake)
    async with open_fake_producer(fake, **PATIENT) as producer:
        await producer._core.cluster.partitions_for("t")
        used = producer.statistics().buffered_bytes
        await producer.send("t", value, metadata="per-message path")
        message = producer.statistics().buffered_bytes - used
        await trio.sleep(0.01)  # the dispatcher takes that burst
        columnar_next(producer)
        sizes = []
        for _ in range(2):  # the first row opens the burst, the second joins it
            used = producer.statistics().buffered_bytes
            row = await producer.send("t", value)
            sizes.append(producer.statistics().buffered_bytes - used)
            assert type(row) is RowDelivery
        assert producer._intake._rows.on_delivery is None  # (no callback list made)
        gate.set()
    assert sizes == [message, message]


async def test_a_row_at_max_message_bytes_is_accepted_and_one_byte_more_is_refused(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    from pipeline.producer._errors import MessageTooLargeError

    fake.create_topic("t", 1)
    async with open_fake_producer(fake, max_message_bytes=1000) as producer:
        columnar_next(producer)
        first = await producer.send("t", b"a")
        used = producer.statistics().buffered_bytes
        bound = 0
        while True:  # the largest value whose bound fits
            try:
                edge = await producer.send("t", b"y" * (bound + 1))
            except MessageTooLargeError:
                break
            bound += 1
            assert type(edge) is RowDelivery
        assert producer.statistics().buffered_bytes - used <= 1000 * bound
        await trio.sleep(0.01)  # the dispatcher takes the burst: the next send opens one
        columnar_next(producer)
        opening = await producer.send("t", b"y" * bound)  # at the limit, opening a burst
        with pytest.raises(MessageTooLargeError):
            await producer.send("t", b"y" * (bound + 1))
        await producer.flush()
    assert type(first) is RowDelivery and 900 < bound < 1000
    assert type(opening) is RowDelivery and (await opening).offset == bound + 1
    assert (await edge).offset == bound


async def test_rows_take_the_millisecond_the_wall_clock_reads_when_sent(
    fake: FakeCluster, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each row's CreateTime is the wall-clock millisecond of its own send()
    (as tests/producer/test_hot_path.py's for messages): within a millisecond
    the int is shared, the clock is read again once it reaches the next one
    (exactly at its boundary too), and a clock stepping back by less than a
    millisecond (NTP) keeps the millisecond already handed out."""
    from pipeline.producer._intake import intake

    times = [1_700_000_000.0001, 1_700_000_000.0009, 1_700_000_000.001, 1_700_000_000.0019,
             1_700_000_000.5, 1_700_000_000.4999, 1_700_000_001.25]
    clock = iter(times)
    monkeypatch.setattr(intake, "_time", lambda: next(clock))
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"v") for _ in times]
        stamps = [d.timestamp for d in rows]
        await producer.flush()
    expected = [1_700_000_000_000, 1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_001,
                1_700_000_000_500, 1_700_000_000_500, 1_700_000_001_250]
    assert set(_kinds(rows)) == {"row"}
    assert stamps == expected and stamps[0] is stamps[1] and stamps[2] is stamps[3]
    assert [(await d).timestamp for d in rows] == expected
    assert [e.batch.base_timestamp + e.record.timestamp_delta for e in fake.log("t", 0)] == expected


async def test_rows_fill_the_buffer_to_the_byte_and_the_next_send_waits(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """buffer_memory holds exactly four rows (Produce held, nothing released):
    the four are accepted as rows at once, no time passing; the fifth finds no
    room and waits (cancelled here after 1 s: it was never accepted), and so
    does a send that would open a new columnar burst, until Produce answers:
    then it opens one."""
    from .test_bad_input import PATIENT, stall_produce

    fake.create_topic("t", 1)
    value = b"q" * 100
    from pipeline.producer._intake.normalize import SIZE_BASE

    row_bytes = 100 + 2 + 1 + SIZE_BASE  # value, its length's varint, the null key, the rest
    gate = stall_produce(fake)
    async with open_fake_producer(fake, **PATIENT, buffer_memory=4 * row_bytes,
                                  max_message_bytes=row_bytes) as producer:
        await producer._core.cluster.partitions_for("t")
        columnar_next(producer)
        t0 = trio.current_time()
        rows = [await producer.send("t", value) for _ in range(4)]
        assert trio.current_time() == t0 and set(_kinds(rows)) == {"row"}
        assert producer.statistics().buffered_bytes == 4 * row_bytes
        with trio.move_on_after(1) as waited:
            await producer.send("t", value)
        assert waited.cancelled_caught and producer.statistics().accepted == 4
        # No room to open a new columnar burst either: the send waits, and once
        # room is made it opens one (Intake._row_after_room): a row's delivery.
        columnar_next(producer)
        later: list[Any] = []

        async def send_later() -> None:
            later.append(await producer.send("t", value))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_later)
            await trio.sleep(1)
            assert later == []
            gate.set()
        assert type(later[0]) is RowDelivery and (await later[0]).offset == 4


@pytest.mark.parametrize("burst", [63, 64])
async def test_the_burst_after_a_columnar_burst_of_64_rows_is_columnar_again(
    fake: FakeCluster, autojump_clock: Any, burst: int
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"r") for _ in range(burst)]
        await trio.sleep(0.01)  # the dispatcher takes the columnar burst
        nxt = await producer.send("t", b"n")
        await producer.flush()
    assert set(_kinds(rows)) == {"row"}
    assert _kinds([nxt]) == (["row"] if burst == 64 else ["msg"])


async def test_send_nowait_ends_the_columnar_burst_and_keeps_the_order(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """send_nowait takes the per-message path: a later send() must not join
    the columnar burst queued ahead of it."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        first = await producer.send("t", b"a")
        middle = producer.send_nowait("t", b"b")
        last = await producer.send("t", b"c")
        await producer.flush()
    assert _kinds([first, middle]) == ["row", "msg"]
    assert values_in_log(fake, "t", 0) == [b"a", b"b", b"c"]
    assert [(await d).offset for d in (first, middle, last)] == [0, 1, 2]


async def test_a_columnar_burst_that_finds_the_intake_full_is_not_opened(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """channel_capacity 2, both slots taken (two list bursts queued behind the
    one the dispatcher was handed, the dispatcher not run yet): the send that would open a columnar
    burst cannot queue its run, so it undoes its acceptance and takes the
    per-message path, which waits for room. Every count adds up at close."""
    from pipeline.producer._message import ProducerMessage

    fake.create_topic("t", 1)
    async with open_fake_producer(fake, channel_capacity=2) as producer:
        await producer._core.cluster.partitions_for("t")
        producer.send_nowait("t", b"a")  # the intake's first item: a list burst
        producer._intake.end_burst()
        producer.send_nowait("t", b"b")  # the second: another list
        producer._intake.end_burst()
        producer.send_nowait("t", b"x")  # (the first went straight to the waiting dispatcher)
        producer._intake.end_burst()
        columnar_next(producer)
        c = await producer.send("t", b"c")  # (its row's id is handed out, then taken back)
        group = await producer.send_many([ProducerMessage("t", b"d")])
        with trio.fail_after(60):
            await producer.flush()
        stats = producer.statistics()
    assert type(c) is MessageDelivery and (await c).offset == 3 and (await group).delivered == 1
    assert values_in_log(fake, "t", 0) == [b"a", b"b", b"x", b"c", b"d"]
    assert (stats.accepted, stats.succeeded, stats.outstanding) == (5, 5, 0)


@pytest.mark.parametrize("burst", ["rows", "messages"])
@pytest.mark.parametrize("call", ["send_batch", "send_many", "send_many_rows"])
async def test_a_send_while_a_bulk_chunk_waits_for_the_intake_joins_no_older_burst(
    fake: FakeCluster, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch, call: str,
    burst: str
) -> None:
    """A bulk call's chunk is accepted (its ids handed out) before it waits for room
    in the intake. A send() meanwhile must not join the burst opened before that
    chunk: it would be written before records accepted ahead of it, and a columnar
    burst's rows would not hold consecutive ids (a RowChunk's are ``_id .. _id + rows
    - 1``: its row would share an id with the chunk's first record).

    Schedule (channel_capacity 1; the dispatcher held while it starts topic "hold"):
    r0 opens a burst (of rows, or a list of messages), which fills the intake; the bulk
    call accepts b and waits; r1 is sent. Written: r0, b, r1 (the order of their ids).
    ``send_many_rows``: b is COLUMNS_MIN messages, which travel as one run of rows."""
    from pipeline.producer import ProducerMessage
    from pipeline.producer._stages.dispatcher import Dispatcher

    fake.create_topic("t", 1)
    fake.create_topic("hold", 1)
    held = trio.Event()
    start_topic = Dispatcher._start_topic

    async def hold(self: Any, nursery: Any, topic: str) -> Any:
        if topic == "hold":
            await held.wait()
        return await start_topic(self, nursery, topic)

    monkeypatch.setattr(Dispatcher, "_start_topic", hold)
    async with open_fake_producer(fake, channel_capacity=1) as producer:
        await producer.send("hold", b"h")
        await trio.testing.wait_all_tasks_blocked()  # (the dispatcher waits in hold)
        if burst == "rows":
            columnar_next(producer)
        r0 = await producer.send("t", b"r0")
        assert type(r0) is (RowDelivery if burst == "rows" else MessageDelivery)
        async with trio.open_nursery() as nursery:
            n = COLUMNS_MIN if call == "send_many_rows" else 1
            if call == "send_batch":
                nursery.start_soon(producer.send_batch, "t", [b"b"])
            else:
                nursery.start_soon(producer.send_many, [ProducerMessage("t", b"b")
                                                        for _ in range(n)])
            await trio.testing.wait_all_tasks_blocked()  # (b accepted, waiting for room)
            nursery.start_soon(producer.send, "t", b"r1")
            await trio.testing.wait_all_tasks_blocked()
            held.set()
        await producer.flush()
    assert values_in_log(fake, "t", 0) == [b"r0", *[b"b"] * n, b"r1"]
