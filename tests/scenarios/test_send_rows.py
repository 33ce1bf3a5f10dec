"""Issue 15 goal 2: a loop of common ``send()`` calls travels as columns.

After a burst of ``COLUMNS_MIN`` or more messages was taken, the next burst of
common calls (bytes value, no key, headers, partition, timestamp, metadata or
on_delivery) appends to the columns of one ``RowBurst`` and returns
``RowDelivery`` objects (``pipeline/producer/_columnar/burst.py``). These schedules
check that every such row gets exactly the outcome the per-message path would
give it: its offset in send order, its partition, its timestamp, its error,
and its place among messages sent around it."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline.producer._columnar.burst import RowDelivery, RowOutcomes
from pipeline.producer._errors import ProducerClosed, ProducerError
from pipeline.producer._intake import intake as intake_module
from pipeline.producer._outcomes import delivery as _delivery
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log

T = 1_700_000_000_000  # the conftest's injected CreateTime

# A send() loop checkpoints every _YIELD_EVERY (EVERY, 4096) rows or 512 messages,
# where the dispatcher may take the burst (trio orders a batch's tasks at random): the
# loop's first bursts are messages (not known to be a high-rate loop yet), later ones rows.
EVERY = intake_module._YIELD_EVERY
LOOP = 4 * EVERY - 48  # a few bursts, the last one short
# A burst of messages: the one that opens it, and each later one costs _MESSAGE_COST.
MESSAGE_BURST = EVERY // intake_module._MESSAGE_COST + 1


def _kinds(deliveries: list[Any]) -> list[str]:
    return ["row" if type(d) is RowDelivery else "msg" for d in deliveries]


def columnar_next(producer: Any) -> None:
    """The next common send() opens a columnar burst, as after a taken burst of
    COLUMNS_MIN messages or more (without depending on where trio lets the
    dispatcher take one; test_a_paced_sender... checks that rule). The bursts
    of a loop after it are then all columnar: each is taken at a checkpoint,
    EVERY sends after the last."""
    producer._intake._columns_next = True


@pytest.fixture(autouse=True)
def _modes(both_modes: bool, await_path: str, send_path: str) -> bool:
    """Every schedule runs plain and idempotent, on both await paths (the C
    ``_delivery.RowAwait`` and ``new_row``, and their Python twins) and both
    send paths (``_send.c``'s row branch, and ``Intake.send`` alone)."""
    return both_modes


async def test_a_tight_loop_of_rows_is_a_checkpoint_every_yield_every_rows(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Rows count 1 each against ``_YIELD_EVERY`` (E; a message counts
    ``_MESSAGE_COST``: test_intake_rules' loop), and the call that finds the
    budget spent is the schedule and cancellation point, before it accepts.

    Schedule: a columnar loop of sends inside an already cancelled scope: calls
    1..E-1 accept their row, the E-th raises Cancelled (E-1 accepted, all in
    the log after a flush)."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        await producer._core.cluster.partitions_for("t")
        columnar_next(producer)
        deliveries = []
        with trio.CancelScope() as scope:
            scope.cancel()
            for _ in range(EVERY + 100):
                deliveries.append(await producer.send("t", b"r"))
        assert len(deliveries) == EVERY - 1
        assert _kinds(deliveries) == ["row"] * (EVERY - 1)
        await producer.flush()
    assert len(values_in_log(fake, "t", 0)) == EVERY - 1


async def test_a_send_loop_becomes_columnar_and_keeps_every_outcome(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Schedule (one partition): LOOP sends in a loop, no await between them.
    The first MESSAGE_BURST or more are messages, the rest rows; awaiting the last one first
    parks it until its burst is sealed and settled. Every delivery then reports
    offset i for the i-th send, in the log in send order, CreateTime T."""
    fake.create_topic("t", 1)
    values = [b"v%d" % i for i in range(LOOP)]
    async with open_fake_producer(fake) as producer:
        deliveries = [await producer.send("t", v) for v in values]
        kinds = _kinds(deliveries)
        messages = kinds.count("msg")
        assert MESSAGE_BURST <= messages <= 2 * MESSAGE_BURST
        assert kinds == ["msg"] * messages + ["row"] * (LOOP - messages)
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
    header (a row too: headers ride the burst) and every 250th goes to another
    topic (a message: the open columnar burst ends, and the next sends are
    messages behind it until a burst of them was taken). The log holds every
    value of "t" in send order, the 100th ones with their header."""
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
            headers = [("h", b"1")] if i % 100 == 99 else None
            deliveries.append(await producer.send("t", value, headers=headers))
            sent.append(value)
        kinds = _kinds(deliveries)
        await producer.flush()
    assert kinds[:249] == ["row"] * 249 and kinds[249] == "msg"
    assert all(d.done() for d in deliveries)
    assert values_in_log(fake, "t", 0) == sent
    assert [p.record.value for p in fake.log("t", 0) if p.record.headers] == [
        b"v%d" % i for i in range(LOOP) if i % 100 == 99 and i % 250 != 249]
    assert {tuple(p.record.headers) for p in fake.log("t", 0) if p.record.headers} == {
        (("h", b"1"),)}
    assert [(await d).offset for d in deliveries if d.topic == "t"] == list(range(len(sent)))


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


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_close_fails_a_burst_the_dispatcher_never_took(
    fake: FakeCluster, autojump_clock: Any, keyed: bool
) -> None:
    """A producer left by an error while a columnar burst is still in the
    intake (never taken, so never sealed): the close seals it and fails each of
    its rows with ProducerClosed, once, its error naming its own value and key
    (keyed: most rows have one of 3 keys; the unsplit run's rows map to
    themselves); every byte is released."""
    fake.create_topic("t", 6 if keyed else 1)

    def key(i: int) -> bytes | None:
        return b"k%d" % (i % 3) if keyed and i % 4 else None

    rows: list[Any] = []
    with pytest.raises(RuntimeError, match="leave"):  # noqa: PT012
        async with open_fake_producer(fake) as producer:
            [await producer.send("t", b"m") for _ in range(12)]
            await producer.flush()
            columnar_next(producer)
            rows = [await producer.send("t", b"r%d" % i, key=key(i)) for i in range(100)]
            raise RuntimeError("leave")
    assert set(_kinds(rows)) == {"row"}
    for i, d in enumerate(rows):
        with pytest.raises(ProducerError) as info:
            d.result()
        assert isinstance(info.value.cause, ProducerClosed)
        assert (info.value.message.value, info.value.message.key) == (b"r%d" % i, key(i))
        assert d.key == key(i) and d.offset == -1
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


async def test_each_task_awaiting_settled_rows_hears_its_own_cancellation(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The C await remembers the current task while trio's run context is
    unchanged (a loop that never yields); a task step changes it. Tasks a (in
    a cancelled scope) and b (not cancelled) await settled rows, b yielding
    after its first: whichever runs first, a's first await raises Cancelled
    (a's own cancel status, not b's) and b awaits every row (b's, not a's)."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"v") for _ in range(100)]
        await producer.flush()
        heard = {"a": 0, "b": 0}

        async def b() -> None:
            await rows[0]
            await trio.lowlevel.checkpoint()  # (a task step: a may run now)
            for d in rows:
                await d
                heard["b"] += 1

        async def a() -> None:
            with trio.CancelScope() as scope:
                scope.cancel()
                for d in rows:
                    await d
                    heard["a"] += 1
            assert scope.cancelled_caught

        async with trio.open_nursery() as nursery:
            nursery.start_soon(b)
            nursery.start_soon(a)
    assert heard == {"a": 0, "b": 100}


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
    assert {r.partition for r in results} == {0} == {d.partition for d in rows}


async def test_wait_all_counts_rows_and_their_errors(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The bulk wait over row deliveries (one failed batch of retries=0)."""
    from pipeline.producer._outcomes.delivery import wait_all
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


@pytest.mark.parametrize("keep", [False, True], ids=["dropped", "kept"])
async def test_a_settled_burst_leaves_no_reference_cycle(
    fake: FakeCluster, autojump_clock: Any, keep: bool
) -> None:
    """A flush() caller drops its row deliveries: the burst's values, columns and
    outcomes are then freed by reference counting, not left to the cyclic GC
    (runs point at their chunk, the chunk at its outcomes and runs).

    ``kept``: the caller keeps every delivery until all settled, then drops
    them. A burst's outcomes hold its settled runs (``RowOutcomes.runs``), so
    the chunk must drop its outcomes with its last row: the cycle chunk ->
    outcomes -> runs -> chunk was left to the cyclic GC otherwise: no
    ``RowOutcomes`` may outlive its burst."""
    import gc

    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        for _ in range(600):
            await producer.send("t", b"w")
        await producer.flush()
        gc.collect()
        gc.disable()
        older = {id(o) for o in gc.get_objects() if type(o) is RowOutcomes}  # (other tests')
        try:
            for _ in range(3):
                columnar_next(producer)
                kept = []
                for _ in range(600):
                    delivery = await producer.send("t", b"v" * 50)
                    if keep:
                        kept.append(delivery)
                del delivery
                await producer.flush()
                assert not keep or (all(d.done() for d in kept)
                                    and sum(type(d) is RowDelivery for d in kept) >= 88)
                del kept
            assert not [o for o in gc.get_objects() if type(o) is RowOutcomes and id(o) not in older]
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


async def test_a_bursts_first_callback_may_come_after_rows_without_one(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A columnar burst opened by rows without on_delivery takes a later row's
    callback (the burst's callback list is made then, None for the rows
    before): it is called once, for its own row, with its row's metadata."""
    fake.create_topic("t", 1)
    heard: list[Any] = []
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        plain = [await producer.send("t", b"p%d" % i) for i in range(3)]
        late = await producer.send("t", b"late", on_delivery=lambda m, e: heard.append((m, e)))
        await producer.flush()
    assert set(_kinds([*plain, late])) == {"row"}
    assert heard == [(await late, None)]
    assert heard[0][0].offset == 3


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
    """As for messages (test_delivery_results): one schedule point per
    _SCHEDULE_EVERY (4096) awaits of settled rows, not one per await."""
    from .test_delivery_results import counting_steps

    n = 10_000
    fake.create_topic("t", 3)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"v%d" % i) for i in range(n)]
        await producer.flush()
        with counting_steps() as steps:
            metas = [await d for d in rows]
    assert set(_kinds(rows)) == {"row"} and len(metas) == n
    every = _delivery._SCHEDULE_EVERY
    assert n // every <= steps.steps <= n // every + 1, steps.steps


async def test_a_loop_of_send_and_await_yields_only_where_send_does(
    fake: FakeCluster, autojump_clock: Any, await_path: str
) -> None:
    """send()'s schedule point restarts the settled awaits' budget: a loop of send()
    and an await of a settled delivery yields once per _YIELD_EVERY sends, as a loop of
    sends alone does, not once more per _SCHEDULE_EVERY awaits (each such point hands
    the open burst to the dispatcher: smaller bursts, more requests)."""
    from .test_delivery_results import counting_steps

    fake.create_topic("t", 3)
    n = 3 * EVERY
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        settled = await producer.send("t", b"first")
        await producer.flush()
        await settled
        with counting_steps() as steps:
            for i in range(n):
                await producer.send("t", b"v%d" % i)
                await settled
        await producer.flush()
        written = sorted(v for p in range(3) for v in values_in_log(fake, "t", p) if v)
        assert written == sorted([b"first", *(b"v%d" % i for i in range(n))])
    assert n // EVERY <= steps.steps <= n // EVERY + 1, steps.steps


async def test_a_row_await_falls_back_to_trio_public_api(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Without trio's internals (no Task._cancel_status) a settled row's await
    still works and is still a cancellation point."""
    from .test_delivery_results import without_trio_internals

    with without_trio_internals():
        await _fallback_check(fake)


async def _fallback_check(fake: FakeCluster) -> None:
    from .test_delivery_results import counting_steps

    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        d = await producer.send("t", b"x")
        assert (await d).offset == 0
        with counting_steps() as steps:
            for _ in range(100):  # settled: the fallback path, still no schedule pass
                assert (await d).offset == 0
        assert steps.steps <= 2, steps.steps
        with trio.CancelScope() as scope:
            scope.cancel()
            await d
            pytest.fail("not a cancellation point")  # pragma: no cover
        assert scope.cancelled_caught


async def test_row_deliveries_cost_the_cyclic_gc_nothing_and_leak_no_cycle(
    fake: FakeCluster, autojump_clock: Any, await_path: str
) -> None:
    """Where the C extension is built, a row's delivery is no GC object (on
    both await paths: its class is made GC-free at import, so a loop that
    keeps 200k of them pays no collection for them); without it, it is a
    tracked object. Either way no cycle is left once the burst settled, even
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
            assert {gc.is_tracked(d) for d in [*rows, holder[0]]} == {_delivery._c is None}
            del canary, rows
            await producer.flush()
            assert holder[0].done()
            del holder  # the callback holds it too, until the settling drops the callback
            assert alive() is None
        finally:
            gc.enable()


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


async def test_kept_deliveries_do_not_keep_their_bursts_packed_columns(
    fake: FakeCluster, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst's rows are packed into one copy when it is sealed. Once every row
    of the burst settled nothing reads that copy: deliveries read their value
    and timestamp from the burst's lists and their offsets from the settled runs.

    Schedule (one partition): LOOP sends in a loop, every delivery kept and
    awaited, each sealed burst's packed values watched (a weak reference); then
    one more send. With all LOOP deliveries still alive, every packed copy is gone.
    They stayed alive as long as any delivery of their burst did, reached through
    the burst (``RowBurst.run``) and through the runs a delivery reads its
    offset from (``RowOutcomes.runs``): measured, a loop keeping 1M
    deliveries held ~110 MB of packed copies, and ran 2.3x the collections."""
    import gc
    import weakref

    from pipeline.producer._columnar.burst import RowBurst

    packed: list[weakref.ref[Any]] = []
    seal = RowBurst.seal

    def watched_seal(self: RowBurst) -> int:
        run = self.run
        nbytes = seal(self)
        assert run is not None
        packed.append(weakref.ref(run.columns.values.data))
        return nbytes

    monkeypatch.setattr(RowBurst, "seal", watched_seal)
    fake.create_topic("t", 1)
    values = [b"v%d" % i for i in range(LOOP)]
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        t0 = trio.current_time()
        deliveries = [await producer.send("t", v) for v in values]
        await producer.flush()
        results = [await d for d in deliveries]
        # The rows' deadline outlives the run (the schedule explorer reads it).
        assert {d._rows.deadline for d in deliveries if type(d) is RowDelivery} == {
            t0 + producer._config.delivery_timeout}
        # (A stage waiting for its next item still holds its last one: one more.)
        producer._intake._columns_next = False  # (the next send is a message, not a burst)
        await producer.send_and_wait("t", b"next")
        gc.collect()
        assert len(packed) >= 2 and _kinds(deliveries).count("row") >= LOOP - EVERY
        assert [ref() for ref in packed] == [None] * len(packed)
    assert [r.offset for r in results] == list(range(LOOP))
    assert [d.value for d in deliveries] == values
