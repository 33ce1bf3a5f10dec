"""Issue 15 goal 2: a loop of common ``send()`` calls travels as columns.

After a burst of ``COLUMNS_MIN`` or more messages was taken, the next burst of
common calls (bytes value, no key, headers, partition, timestamp, metadata or
on_delivery) appends to the columns of one ``SendRows`` and returns
``RowDelivery`` objects (``pipeline/producer/send_rows.py``). These schedules
check that every such row gets exactly the outcome the per-message path would
give it: its offset in send order, its partition, its timestamp, its error,
and its place among messages sent around it."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline.producer.errors import ProducerClosed, ProducerError
from pipeline.producer.message import MessageDelivery
from pipeline.producer.send_rows import COLUMNS_MIN, RowDelivery
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log

T = 1_700_000_000_000  # the conftest's injected CreateTime

# A send() loop checkpoints every _YIELD_EVERY (512) calls, where the dispatcher
# may take the burst (trio orders a batch's tasks at random): the loop's first
# bursts are messages (not known to be a high-rate loop yet), later ones rows.
LOOP = 2000


def _kinds(deliveries: list[Any]) -> list[str]:
    return ["row" if type(d) is RowDelivery else "msg" for d in deliveries]


def columnar_next(producer: Any) -> None:
    """The next common send() opens a columnar burst, as after a taken burst of
    COLUMNS_MIN messages or more (without depending on where trio lets the
    dispatcher take one; test_a_paced_sender... checks that rule). The bursts
    of a loop after it are then all columnar: each is taken at a checkpoint,
    512 sends after the last."""
    producer._intake._columns_next = True


@pytest.fixture(autouse=True)
def _modes(both_modes: bool, await_path: str) -> bool:
    """Every schedule runs plain and idempotent, on both await paths (the C
    ``_delivery.RowAwait`` and ``new_row``, and their Python twins)."""
    return both_modes


async def test_a_send_loop_becomes_columnar_and_keeps_every_outcome(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Schedule (one partition): 2000 sends in a loop, no await between them.
    The first 511 or more are messages, the rest rows; awaiting the last one first
    parks it until its burst is sealed and settled. Every delivery then reports
    offset i for the i-th send, in the log in send order, CreateTime T."""
    fake.create_topic("t", 1)
    values = [b"v%d" % i for i in range(LOOP)]
    async with open_fake_producer(fake) as producer:
        deliveries = [await producer.send("t", v) for v in values]
        kinds = _kinds(deliveries)
        messages = kinds.count("msg")
        assert 511 <= messages <= 1023 and kinds == ["msg"] * messages + ["row"] * (LOOP - messages)
        last = deliveries[-1]
        assert not last.done()
        with pytest.raises(trio.WouldBlock):
            last.result()
        assert last.partition is None and last.offset == -1
        assert (await last).offset == LOOP - 1  # parked: sealed, then settled
        results = [await d for d in deliveries]
    assert [r.offset for r in results] == list(range(LOOP))
    assert {(r.topic, r.partition, r.timestamp, r.offset_known) for r in results} == {
        ("t", 0, T, True)}
    assert values_in_log(fake, "t", 0) == values
    i = LOOP - 5
    row = deliveries[i]
    assert (row.topic, row.value, row.key, row.headers, row.metadata) == (
        "t", values[i], None, (), None)
    assert (row.partition, row.offset, row.timestamp, row.done()) == (0, i, T, True)
    assert row.result() == results[i] == row.record_metadata()
    assert repr(row) == f"<Delivery t[0] key=None ok offset={i}>"
    message = row.message
    assert (message.topic, message.value, message.partition, message.offset) == (
        "t", values[i], 0, i)


async def test_rows_and_messages_sent_between_them_keep_the_send_order(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Schedule (one partition): a loop in which every 100th send carries a
    key and every 250th goes to another topic (both take the per-message
    path: the open columnar burst ends, and the next common send opens a new
    one behind them). The log holds every value of "t" in send order."""
    fake.create_topic("t", 1)
    fake.create_topic("u", 1)
    sent: list[bytes] = []
    async with open_fake_producer(fake) as producer:
        deliveries = []
        columnar_next(producer)
        for i in range(LOOP):
            value = b"v%d" % i
            if i % 250 == 249:
                deliveries.append(await producer.send("u", value))
                continue
            key = b"k" if i % 100 == 99 else None
            deliveries.append(await producer.send("t", value, key=key))
            sent.append(value)
        kinds = _kinds(deliveries)
        await producer.flush()
    assert kinds[:99] == ["row"] * 99 and kinds[99] == "msg"
    assert all(d.done() for d in deliveries)
    assert values_in_log(fake, "t", 0) == sent
    assert [(await d).offset for d in deliveries if d.topic == "t"] == list(range(len(sent)))


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


async def test_rows_the_broker_rejects_fail_with_the_error_and_their_values(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Schedule (plain producer, retries=0, one partition): after 10 messages
    were written, the next Produce request (the first columnar batch) is
    answered NOT_ENOUGH_REPLICAS: each of its rows fails with that error, and
    the error names the row's own value; later rows are written."""
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.errors import ErrorCode

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, idempotent=False, retries=0, batch_bytes=4096) as producer:
        first = [await producer.send("t", b"m%d" % i) for i in range(10)]
        await producer.flush()
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        columnar_next(producer)
        rows = [await producer.send("t", b"r%d:" % i + b"x" * 100) for i in range(300)]
        await producer.flush()
    assert set(_kinds(first)) == {"msg"} and set(_kinds(rows)) == {"row"}
    failed = [d for d in rows if d._state == 2]
    assert 0 < len(failed) < 300 and failed == rows[:len(failed)]
    for i, d in enumerate(failed):
        with pytest.raises(ProducerError, match="NOT_ENOUGH_REPLICAS") as info:
            await d
        assert info.value.message.value == b"r%d:" % i + b"x" * 100
        assert d.offset == -1 and d.partition == 0
    assert [(await d).offset for d in rows[len(failed):]] == list(
        range(10, 10 + 300 - len(failed)))


async def test_a_close_fails_a_burst_the_dispatcher_never_took(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A producer left by an error while a columnar burst is still in the
    intake (never taken, so never sealed): the close seals it and fails each of
    its rows with ProducerClosed, once; every byte is released."""
    fake.create_topic("t", 1)
    rows: list[Any] = []
    with pytest.raises(RuntimeError, match="leave"):  # noqa: PT012
        async with open_fake_producer(fake) as producer:
            [await producer.send("t", b"m") for _ in range(12)]
            await producer.flush()
            columnar_next(producer)
            rows = [await producer.send("t", b"r%d" % i) for i in range(100)]
            raise RuntimeError("leave")
    assert set(_kinds(rows)) == {"row"}
    for i, d in enumerate(rows):
        with pytest.raises(ProducerError) as info:
            d.result()
        assert isinstance(info.value.cause, ProducerClosed)
        assert info.value.message.value == b"r%d" % i
    stats = producer.statistics()
    assert stats.outstanding == 0 and stats.buffered_bytes == 0
    assert (stats.accepted, stats.succeeded, stats.failed) == (112, 12, 100)


async def test_a_settled_row_is_still_a_cancellation_point(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"v") for _ in range(100)]
        await producer.flush()
        assert type(rows[0]) is RowDelivery and rows[0].done()
        with trio.CancelScope() as scope:
            scope.cancel()
            await rows[0]
            pytest.fail("a settled await in a cancelled scope returned")  # pragma: no cover
        assert scope.cancelled_caught


async def test_rows_get_the_log_append_time_the_broker_gave(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """LogAppendTime answers (offset 7 for every batch of 1 KiB: several runs)
    the rows report the broker's time, not their own CreateTime, awaited and
    to their callbacks, and offsets from 7 per batch."""
    from pipeline.protocol.api import ApiKey

    from .test_ledger_rules import answer_with_log_append_time

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, batch_bytes=1024) as producer:
        fake.control(ApiKey.PRODUCE, answer_with_log_append_time(T + 5), sticky=True)
        columnar_next(producer)
        heard: list[Any] = []
        rows = [await producer.send("t", b"r" * 50, on_delivery=lambda m, e: heard.append(m))
                for _ in range(100)]
        results = [await d for d in rows]
    assert set(_kinds(rows)) == {"row"}
    assert {r.timestamp for r in results} == {m.timestamp for m in heard} == {T + 5}
    assert results[0].offset == 7 and rows[0].timestamp == T + 5 and len(heard) == 100


async def test_a_too_large_columnar_batch_is_split_and_each_row_reports_its_offset(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """KIP-126 for a columnar burst: 40 rows over the topic's 1200-byte limit are
    halved until each part fits (the halves replace the run in its chunk); every
    row reports the offset of its own place in the log."""
    from .test_idempotence import sent_batches

    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 1, configs={"max.message.bytes": "1200"})
    values = [b"%03d:" % i + b"x" * 100 for i in range(40)]
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", v) for v in values]
        results = [await d for d in rows]
    assert set(_kinds(rows)) == {"row"}
    assert [b[4] for b in sent_batches(fake, "t", 0)] == [40, 20, 10, 10, 20, 10, 10]
    assert values_in_log(fake, "t", 0) == values
    assert [r.offset for r in results] == list(range(40))


async def test_a_full_buffer_ends_the_columnar_burst_and_keeps_the_order(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """buffer_memory holds about 20 rows: the 21st send finds no room, takes the
    per-message path and waits (the open columnar burst ends there, so nothing
    sent later can pass it); every value is in the log in send order."""
    fake.create_topic("t", 1)
    values = [b"%04d" % i + b"y" * 96 for i in range(200)]
    async with open_fake_producer(fake, buffer_memory=20 * 140, max_message_bytes=1000) as producer:
        columnar_next(producer)
        deliveries = [await producer.send("t", v) for v in values]
        results = [await d for d in deliveries]
    kinds = _kinds(deliveries)
    assert kinds[0] == "row" and "msg" in kinds
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


async def test_wait_all_counts_rows_and_their_errors(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The bulk wait over row deliveries (one failed batch of retries=0)."""
    from pipeline.producer.message import wait_all
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.errors import ErrorCode

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, idempotent=False, retries=0, batch_bytes=4096) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        columnar_next(producer)
        rows = [await producer.send("t", b"v%d:" % i + b"x" * 100) for i in range(100)]
        result = await wait_all(rows)
    assert set(_kinds(rows)) == {"row"}
    assert 0 < result.failed < 100 and result.delivered == 100 - result.failed
    assert len(result.errors) == 10 and result.errors[3].message.value == b"v3:" + b"x" * 100


async def test_a_settled_burst_leaves_no_reference_cycle(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A flush() caller drops its row deliveries: the burst's values, columns and
    outcomes are then freed by reference counting, not left to the cyclic GC
    (runs point at their chunk, the chunk at its outcomes and runs)."""
    import gc

    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        for _ in range(600):
            await producer.send("t", b"w")
        await producer.flush()
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                columnar_next(producer)
                for _ in range(600):
                    await producer.send("t", b"v" * 50)
                await producer.flush()
            assert gc.collect() == 0
        finally:
            gc.enable()


async def test_on_delivery_is_called_once_per_row_with_its_metadata_or_error(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Rows sent with the same on_delivery stay one columnar burst (a bound
    method made per call compares equal); the ledger calls it once per row when
    the row's run settles: metadata in send order, or (retries=0, the first
    batch answered NOT_ENOUGH_REPLICAS) the error naming the row's value. A
    callback that raises is logged and counted, and the next row still hears."""
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.errors import ErrorCode

    heard: list[tuple[Any, Any]] = []

    class Sink:
        def hear(self, meta: Any, error: Any) -> None:
            heard.append((meta, error))
            if len(heard) == 3:
                raise RuntimeError("a user's bug")

    sink = Sink()
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, idempotent=False, retries=0, batch_bytes=4096) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        columnar_next(producer)
        rows = [await producer.send("t", b"v%d:" % i + b"x" * 100, on_delivery=sink.hear)
                for i in range(300)]
        await producer.flush()
        errors = producer.statistics().callback_errors
    assert set(_kinds(rows)) == {"row"} and len(heard) == 300
    failed = [e for m, e in heard if e is not None]
    assert 0 < len(failed) < 300, len(failed)
    assert all(m is None for m, e in heard[:len(failed)])
    assert [e.message.value for e in failed] == [b"v%d:" % i + b"x" * 100
                                                 for i in range(len(failed))]
    assert {type(e.cause).__name__ for e in failed} == {"BrokerResponseError"}
    delivered = [m for m, e in heard[len(failed):]]
    assert [m.offset for m in delivered] == list(range(300 - len(failed)))
    assert all(m.offset_known for m in delivered) and all(e.message.done() for e in failed)
    assert {(m.topic, m.partition, m.timestamp) for m in delivered} == {("t", 0, T)}
    assert errors == 1


async def test_rows_with_other_callbacks_or_none_share_the_burst_each_hearing_its_own(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Each row keeps its own on_delivery (a lambda made per call, another
    function, or none): one columnar burst, each callback called once for its
    own row. A callback that is not callable is refused (TypeError, nothing
    accepted) and the burst goes on."""
    fake.create_topic("t", 1)
    heard: list[tuple[str, int]] = []
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        first = [await producer.send("t", b"a%d" % i,
                                     on_delivery=lambda m, e, i=i: heard.append(("a", i)))
                 for i in range(3)]
        other = await producer.send("t", b"b", on_delivery=lambda m, e: heard.append(("b", 0)))
        plain = await producer.send("t", b"c")
        with pytest.raises(TypeError, match="on_delivery"):
            await producer.send("t", b"x", on_delivery=42)  # type: ignore[arg-type]
        last = await producer.send("t", b"d", on_delivery=lambda m, e: heard.append(("d", 0)))
        await producer.flush()
    assert set(_kinds([*first, other, plain, last])) == {"row"}
    assert heard == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("d", 0)]
    assert values_in_log(fake, "t", 0) == [b"a0", b"a1", b"a2", b"b", b"c", b"d"]


async def test_rows_written_with_acks_0_report_no_offset(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """acks=0: the broker gives no offset, so each row reports offset -1 and
    offset_known False, awaited or through its callback."""
    fake.create_topic("t", 1)
    heard: list[Any] = []
    async with open_fake_producer(fake, idempotent=False, acks=0) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"v", on_delivery=lambda m, e: heard.append(m))
                for _ in range(100)]
        results = [await d for d in rows]
    assert set(_kinds(rows)) == {"row"} and len(heard) == 100
    assert {(r.offset, r.offset_known) for r in [*results, *heard]} == {(-1, False)}
    assert {d.offset for d in rows} == {-1}
    assert values_in_log(fake, "t", 0) == [b"v"] * 100


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


async def test_a_topics_first_row_reports_offset_0_and_its_message_its_state(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"v%d" % i) for i in range(3)]
        pending = rows[0].message
        await producer.flush()
    assert _kinds(rows) == ["row"] * 3 and not pending.done()
    meta = await rows[0]
    assert (meta.offset, meta.offset_known, rows[0].offset) == (0, True, 0)
    assert rows[0].message.done() and rows[0].message.offset == 0
    assert rows[0].record_metadata() == meta


async def test_awaiting_settled_rows_schedules_about_never(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """As for messages (test_delivery_results): one schedule point per 512
    awaits of settled rows, not one per await."""
    from .test_delivery_results import _Steps

    fake.create_topic("t", 3)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"v%d" % i) for i in range(5000)]
        await producer.flush()
        steps = _Steps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(steps)
        try:
            metas = [await d for d in rows]
        finally:
            trio.lowlevel.remove_instrument(steps)
    assert set(_kinds(rows)) == {"row"} and len(metas) == 5000
    assert 9 <= steps.steps <= 12, steps.steps


async def test_a_row_await_falls_back_to_trio_public_api(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Without trio's internals (no Task._cancel_status) a settled row's await
    still works and is still a cancellation point."""
    import types

    from pipeline.producer import message

    old = message._set_run_context(types.SimpleNamespace(task=object()))
    try:
        await _fallback_check(fake)
    finally:
        message._set_run_context(old)


async def _fallback_check(fake: FakeCluster) -> None:
    from .test_delivery_results import _Steps

    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        d = await producer.send("t", b"x")
        assert (await d).offset == 0
        steps = _Steps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(steps)
        try:
            for _ in range(100):  # settled: the fallback path, still no schedule pass
                assert (await d).offset == 0
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert steps.steps <= 2, steps.steps
        with trio.CancelScope() as scope:
            scope.cancel()
            await d
            pytest.fail("not a cancellation point")  # pragma: no cover
        assert scope.cancelled_caught


async def test_row_deliveries_cost_the_cyclic_gc_nothing_and_leak_no_cycle(
    fake: FakeCluster, autojump_clock: Any, await_path: str
) -> None:
    """On the C path a row's delivery is untracked by the cyclic GC (a loop
    that keeps 200k of them pays no collection for them); the Python twin
    cannot untrack. Either way no cycle is left once the burst settled, even
    when a row's callback refers to its own delivery: the settling drops the
    callbacks, so reference counting frees the delivery, the callback and what
    it holds, with the cyclic GC off."""
    import gc
    import weakref

    class Canary:
        pass

    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        canary = Canary()
        alive = weakref.ref(canary)
        holder: list[Any] = []
        gc.collect()
        gc.disable()
        try:
            rows = [await producer.send("t", b"v") for _ in range(10)]
            holder.append(await producer.send(
                "t", b"w", on_delivery=lambda m, e, c=canary, h=holder: (c, h)))
            assert {gc.is_tracked(d) for d in [*rows, holder[0]]} == {await_path == "python"}
            del canary, rows
            await producer.flush()
            assert holder[0].done()
            del holder  # the callback holds it too, until the settling drops the callback
            assert alive() is None
        finally:
            gc.enable()


async def test_a_row_delivery_given_back_to_send_many_or_input_is_refused_clearly(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A row's delivery is no ProducerMessage: send_many and producer.input
    refuse it (and anything else that is not one) with a TypeError saying
    what to build instead; nothing of the call is sent, and the pipeline
    goes on."""
    from pipeline.producer.message import ProducerMessage

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


async def test_rows_of_one_burst_spread_over_partitions_and_batches_each_find_their_record(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """1000 rows of one loop, cut into runs of a 1 KiB batch on the sticky
    partitioner's choices over 3 partitions, settled in whatever order the
    brokers answer: every row's delivery (awaited, read, and its callback)
    names the partition and offset where its own value is in the log."""
    fake.create_topic("t", 3)
    heard: dict[bytes, Any] = {}

    def hear(value: bytes) -> Any:
        return lambda meta, error: heard.__setitem__(value, meta)

    async with open_fake_producer(fake, batch_bytes=1024) as producer:
        columnar_next(producer)
        values = [b"%04d:" % i + b"z" * 45 for i in range(1000)]
        rows = [await producer.send("t", v, on_delivery=hear(v)) for v in values]
        results = [await d for d in rows]
    assert set(_kinds(rows)) == {"row"} and len(heard) == 1000
    logs = {p: values_in_log(fake, "t", p) for p in range(3)}
    assert sorted(v for log in logs.values() for v in log) == values
    assert len({r.partition for r in results}) >= 2  # (the sticky choices: seeded)
    for d, r, v in zip(rows, results, values, strict=True):
        assert logs[r.partition][r.offset] == v
        assert (d.partition, d.offset) == (r.partition, r.offset) == (
            heard[v].partition, heard[v].offset)


async def test_callbacks_that_raise_mid_run_are_counted_and_the_rest_still_hear(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Every row delivered with a callback (the C-level map of calls): the
    10th and 11th and the last row's callbacks raise; each is logged and
    counted once, and every row's callback is called exactly once, in order."""
    fake.create_topic("t", 1)
    heard: list[int] = []

    def hear(meta: Any, error: Any) -> None:
        heard.append(meta.offset)
        if meta.offset in (9, 10, 99):
            raise RuntimeError(f"a user's bug at {meta.offset}")

    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"v", on_delivery=hear) for _ in range(100)]
        await producer.flush()
        errors = producer.statistics().callback_errors
    assert set(_kinds(rows)) == {"row"}
    assert heard == list(range(100)) and errors == 3
    logged = [r.getMessage() for r in caplog.records if "on_delivery callback" in r.getMessage()]
    assert len(logged) == 3 and all("offset=" in m or "RecordMetadata" in m for m in logged)


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
    from pipeline.producer.errors import MessageTooLargeError

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
    from pipeline.producer import intake

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


async def test_awaiting_a_failed_row_is_a_cancellation_point(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.errors import ErrorCode

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, idempotent=False, retries=0) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        columnar_next(producer)
        row = await producer.send("t", b"v")
        await producer.flush()
        assert row.done() and row._state == 2
        with trio.CancelScope() as scope:
            scope.cancel()
            await row
            pytest.fail("a failed row's await ignored a cancellation")  # pragma: no cover
        assert scope.cancelled_caught


async def test_rows_fill_the_buffer_to_the_byte_and_the_next_send_waits(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """buffer_memory holds exactly four rows (Produce held, nothing released):
    the four are accepted as rows at once, no time passing; the fifth finds no
    room and waits (cancelled here after 1 s: it was never accepted), and so
    does a send that would open a new columnar burst, until Produce answers."""
    from .test_bad_input import PATIENT, stall_produce

    fake.create_topic("t", 1)
    value = b"q" * 100
    from pipeline.producer.normalize import SIZE_BASE

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
        # No room to open a new columnar burst either: the send waits on the
        # per-message path, and gets a message's delivery once room is made.
        columnar_next(producer)
        later: list[Any] = []

        async def send_later() -> None:
            later.append(await producer.send("t", value))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_later)
            await trio.sleep(1)
            assert later == []
            gate.set()
        assert type(later[0]) is MessageDelivery and (await later[0]).offset == 4


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
    from pipeline.producer.message import ProducerMessage

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
