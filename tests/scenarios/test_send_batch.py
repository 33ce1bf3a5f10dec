"""Issue 15 goal 3: ``send_batch``, the columnar unit through the four stages.

Every scenario checks the exact log (each row once, in row order per partition),
the group's counts (exactly one outcome per row) and, under faults, what went over
the wire (producer ids, epochs, base sequences). The autouse fixture of conftest
checks the ledger (no double settle, every byte released) for each producer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import trio

from pipeline import MessageTooLargeError, ProducerClosed
from pipeline.producer._columnar.rows import RowsError
from pipeline.producer._stages.partitioner import murmur2
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_idempotence import idem_options, sent_batches


def rows(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def java_partition(key: bytes, n: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % n


async def test_keyed_rows_land_on_the_murmur2_partition_in_row_order(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 5)
    values = rows("v", 3000)
    keys = [b"key-%d" % (i % 37) for i in range(3000)]
    async with open_fake_producer(fake) as producer:
        group = await producer.send_batch("t", values, keys=keys)
        result = await group
    assert (result.delivered, result.failed) == (3000, 0)
    for p in range(5):
        expected = [(k, v) for k, v in zip(keys, values, strict=True) if java_partition(k, 5) == p]
        got = [(e.record.key, e.record.value) for e in fake.log("t", p)]
        assert got == expected


async def test_arrow_numpy_and_list_inputs_with_headers_and_timestamps(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        g1 = await producer.send_batch(
            "t", pa.array([b"a0", b"a1"]), keys=pa.array(["k0", None]),
            headers=pa.array([[{"key": "h", "value": b"x"}], []],
                             type=pa.list_(pa.struct([("key", pa.string()),
                                                      ("value", pa.binary())]))),
            timestamps=pa.array([5, 6], pa.int64()),
        )
        g2 = await producer.send_batch("t", np.array([b"n0", b"n1"], dtype="S2"),
                                       partitions=np.array([0, 0], dtype=np.int32))
        g3 = await producer.send_batch("t", ["s0", None], headers=[{"a": b"1"}, None])
        results = [await g for g in (g1, g2, g3)]
    assert [(r.delivered, r.failed) for r in results] == [(2, 0)] * 3
    log = fake.log("t", 0)
    assert [e.record.value for e in log] == [b"a0", b"a1", b"n0", b"n1", b"s0", None]
    assert [e.record.key for e in log][:2] == [b"k0", None]
    assert tuple(log[0].record.headers) == (("h", b"x"),)
    assert [tuple(e.record.headers) for e in log][4] == (("a", b"1"),)
    assert [e.batch.base_timestamp + e.record.timestamp_delta for e in log][:2] == [5, 6]
    assert log[2].batch.base_timestamp == 1_700_000_000_000  # the producer clock for rows without one


async def test_send_and_send_batch_keep_one_order_per_partition(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, linger=0.01) as producer:
        await producer.send("t", b"first")
        group = await producer.send_batch("t", rows("b", 3))
        await producer.send("t", b"last")
        await producer.flush()
        assert group.done()
    assert values_in_log(fake, "t", 0) == [b"first", b"b0", b"b1", b"b2", b"last"]


async def test_null_key_rows_fill_a_batch_then_switch_partition(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 4)
    async with open_fake_producer(fake, batch_bytes=4096) as producer:
        result = await (await producer.send_batch("t", [b"x" * 100] * 400))
    assert result.delivered == 400
    sizes = [len(fake.log("t", p)) for p in range(4)]
    assert sum(sizes) == 400 and sum(1 for s in sizes if s) >= 2  # sticky, then switched
    batches = [b for p in range(4) for b in sent_batches(fake, "t", p)]
    assert max(b[4] for b in batches) <= 4096 // 100  # no batch over batch_bytes


async def test_bad_input_raises_naming_what_and_where_and_sends_nothing(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 2)
    async with open_fake_producer(fake, max_message_bytes=1000) as producer:
        accepted = await producer.send_batch("t", rows("ok", 10))
        with pytest.raises(ValueError, match=r"keys.*3 rows.*values has 2"):
            await producer.send_batch("t", [b"a", b"b"], keys=[b"1", b"2", b"3"])
        with pytest.raises(TypeError, match=r"values.*row 1"):
            await producer.send_batch("t", [b"a", 42])
        with pytest.raises(MessageTooLargeError, match=r"row 2 is .* max_message_bytes=1000"):
            await producer.send_batch("t", [b"a", b"b", b"x" * 2000])
        with pytest.raises(TypeError, match="topic"):
            await producer.send_batch("", [b"a"])
        assert producer.statistics().accepted == 10
        result = await accepted
    assert result.delivered == 10
    assert sum(len(fake.log("t", p)) for p in range(2)) == 10


async def test_rows_pinned_out_of_range_fail_alone(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 2)
    async with open_fake_producer(fake) as producer:
        result = await (await producer.send_batch("t", rows("v", 4), partitions=[0, 5, 1, 9]))
    assert (result.delivered, result.failed) == (2, 2)
    assert isinstance(result.first_error, RowsError)
    assert "2 row(s)" in str(result.first_error) and "the first at row 1" in str(result.first_error)
    assert values_in_log(fake, "t", 0) == [b"v0"] and values_in_log(fake, "t", 1) == [b"v2"]


async def test_chunks_within_buffer_memory(fake: FakeCluster, autojump_clock: Any) -> None:
    """A call larger than buffer_memory is accepted chunk by chunk, waiting for space."""
    fake.create_topic("t", 3)
    async with open_fake_producer(fake, buffer_memory=64 * 1024, max_message_bytes=16 * 1024,
                                  batch_bytes=8 * 1024) as producer:
        result = await (await producer.send_batch("t", [b"y" * 200] * 5000,
                                                  keys=[b"%d" % i for i in range(5000)]))
        assert producer.statistics().buffered_bytes == 0
    assert result.delivered == 5000
    assert sum(len(fake.log("t", p)) for p in range(3)) == 5000


async def test_list_calls_hold_no_packed_copy_beyond_what_they_reserved(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Schedule: the only broker is down, so nothing drains; a call of 4,000 list
    rows (about 1 MB packed) waits for buffer space after its first chunks. While
    it waits, the memory the producer holds stays within buffer_memory (plus the
    call's list snapshot): chunks of one packing of the whole call would keep the
    whole copy alive (found measuring peak RSS at 1M rows: five calls' copies)."""
    import tracemalloc

    fake.create_topic("t", 1, leaders=[0])
    buffer_memory = 256 * 1024
    values = [b"p" * 200] * 4000
    async with open_fake_producer(fake, buffer_memory=buffer_memory, max_block=100.0,
                                  max_message_bytes=16 * 1024) as producer:
        fake.stop_broker(0, elect=False)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            with trio.move_on_after(1.0):
                await producer.send_batch("t", values)
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        accepted = producer.statistics().accepted
        assert 0 < accepted < 4000
        assert held < buffer_memory + 64 * 1024, held
        fake.restart_broker(0)
        await producer.flush()
        assert producer.statistics().succeeded == accepted
    assert values_in_log(fake, "t", 0) == values[:accepted]


async def test_bad_row_in_a_later_window_names_the_call_row_and_sends_nothing(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A list call larger than a chunk is checked a window at a time; an error
    still names the row of the call, and no row of the call is sent."""
    fake.create_topic("t", 2)
    async with open_fake_producer(fake, buffer_memory=64 * 1024,
                                  max_message_bytes=4 * 1024) as producer:
        with pytest.raises(TypeError, match=r"values.*row 5000"):
            await producer.send_batch("t", [b"a" * 100] * 5000 + [42])
        with pytest.raises(ValueError, match=r"partitions.*row 4500"):
            await producer.send_batch("t", [b"a" * 100] * 5000,
                                      partitions=[0] * 4500 + [-7] + [0] * 499)
        with pytest.raises(MessageTooLargeError, match=r"row 4000 is .* max_message_bytes"):
            await producer.send_batch("t", [b"b" * 100] * 4000 + [b"x" * 8000])
        assert producer.statistics().accepted == 0
    assert sum(len(fake.log("t", p)) for p in range(2)) == 0


async def test_cancelled_while_waiting_for_space_keeps_accepted_chunks(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, buffer_memory=64 * 1024, max_message_bytes=16 * 1024,
                                  max_block=100.0) as producer:
        fake.stop_broker(0, elect=False)  # nothing drains: the buffer fills up
        with trio.move_on_after(1.0):
            await producer.send_batch("t", [b"z" * 200] * 2000)
        accepted = producer.statistics().accepted
        assert 0 < accepted < 2000
        fake.restart_broker(0)
        await producer.flush()
        stats = producer.statistics()
        assert stats.succeeded == accepted and stats.failed == 0
    assert values_in_log(fake, "t", 0) == [b"z" * 200] * accepted


# ---------------------------------------------------------------- faults


async def test_leader_move_with_runs_in_flight_resends_identical(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **idem_options(batch_bytes=2048)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.delay_responses(0.5, api_key=ApiKey.PRODUCE, count=1, node_id=0, before_apply=True)
        group = await producer.send_batch("t", rows("m", 200), partitions=[0] * 200)
        await trio.sleep(0.1)
        fake.move_leader("t", 0, to=2)
        result = await group
    assert (result.delivered, result.failed) == (200, 0)
    assert values_in_log(fake, "t", 0) == [b"warm", *rows("m", 200)]
    on_old = [b[1:] for b in sent_batches(fake, "t", 0) if b[0] == 0][1:]
    on_new = [b[1:] for b in sent_batches(fake, "t", 0) if b[0] == 2]
    assert on_old and on_new[:len(on_old)] == on_old  # same pid, epoch, base sequence, count
    seqs = [b[3] for b in sent_batches(fake, "t", 0) if b[0] == 2]
    counts = [b[4] for b in sent_batches(fake, "t", 0) if b[0] == 2]
    assert seqs == [1 + sum(counts[:i]) for i in range(len(seqs))]  # contiguous sequences


async def test_retriable_error_retries_the_run_once_each_row(
    fake: FakeCluster, autojump_clock: Any, both_modes: bool
) -> None:
    fake.create_topic("t", 1, leaders=[0])
    options = idem_options() if both_modes else {}
    async with open_fake_producer(fake, **options) as producer:
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        result = await (await producer.send_batch("t", rows("r", 50)))
        assert producer.statistics().succeeded == 50
    assert (result.delivered, result.failed) == (50, 0)
    assert values_in_log(fake, "t", 0) == rows("r", 50)
    assert len(fake.requests_of(ApiKey.PRODUCE)) >= 2


async def test_lost_ack_is_a_duplicate_not_a_second_copy(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1, leaders=[0])
    fake.drop_response_after_apply(ApiKey.PRODUCE, node_id=0)
    async with open_fake_producer(fake, **idem_options()) as producer:
        result = await (await producer.send_batch("t", rows("d", 30)))
    assert (result.delivered, result.failed) == (30, 0)
    assert values_in_log(fake, "t", 0) == rows("d", 30)
    batches = sent_batches(fake, "t", 0)
    assert len(batches) == 2 and batches[0][1:] == batches[1][1:]


async def test_idempotent_recovery_fails_that_run_and_delivers_later_rows(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **idem_options()) as producer:
        first = await (await producer.send_batch("t", rows("a", 5)))
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        gap = await (await producer.send_batch("t", rows("b", 5)))
        later = await (await producer.send_batch("t", rows("c", 5)))
        idem = producer._core.idempotence
        assert idem is not None and idem.bumps == 1
    assert (first.delivered, gap.failed, later.delivered) == (5, 5, 5)
    assert gap.errors[0].cause.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # type: ignore[attr-defined]
    assert values_in_log(fake, "t", 0) == rows("a", 5) + rows("c", 5)
    assert [(b[2], b[3]) for b in sent_batches(fake, "t", 0)][-1] == (1, 0)


async def test_broker_restart_losing_producer_state(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    fake = FakeCluster(brokers=3, seed=7, auto_create_topics=False, strict_unknown_producer=True)
    await nursery.start(fake.run)
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **idem_options()) as producer:
        first = await (await producer.send_batch("t", rows("a", 5)))
        fake.stop_broker(0, elect=False)
        fake.restart_broker(0, lose_producer_state=True)
        later = await (await producer.send_batch("t", rows("b", 5)))
    assert (first.delivered, later.delivered) == (5, 5)
    assert values_in_log(fake, "t", 0) == rows("a", 5) + rows("b", 5)


async def test_close_fails_every_undelivered_row_once(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 2, leaders=[0, 1])
    async with open_fake_producer(fake, close_timeout=1.0) as producer:
        fake.stop_broker(0, elect=False)  # partition 0 has no leader until the close
        group = await producer.send_batch("t", rows("c", 100), partitions=[0, 1] * 50)
    result = await group
    assert (result.delivered, result.failed) == (50, 50)
    assert isinstance(result.errors[0].cause, ProducerClosed)
    assert values_in_log(fake, "t", 1) == rows("c", 100)[1::2]


@pytest.mark.parametrize("retries", [None, 1])
@pytest.mark.parametrize("limit", ["max.message.bytes", "segment.bytes"])
async def test_too_large_run_is_split_and_delivered(
    nursery: trio.Nursery, autojump_clock: Any, both_modes: bool, limit: str,
    retries: int | None
) -> None:
    """KIP-126 for a run: a 40-row batch over the topic's limit is halved until each
    half fits; every row once, in order, sequences without a gap. A split spends no
    retry: with retries=1 the two splits in a row still deliver everything."""
    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 1, configs={limit: "1200"})
    values = [b"%03d:" % i + b"x" * 100 for i in range(40)]
    options: dict[str, Any] = idem_options() if both_modes else {}
    if retries is not None:
        options["retries"] = retries
    async with open_fake_producer(fake, **options) as producer:
        result = await (await producer.send_batch("t", values))
    assert (result.delivered, result.failed) == (40, 0)
    assert values_in_log(fake, "t", 0) == values
    wire = sent_batches(fake, "t", 0)
    assert [b[4] for b in wire] == [40, 20, 10, 10, 20, 10, 10]
    if both_modes:
        assert [b[2:4] for b in wire] == [(0, 0), (0, 0), (0, 0), (0, 10), (0, 20), (0, 20),
                                          (0, 30)]


async def test_send_batch_leaves_no_reference_cycles(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A settled chunk drops its runs (they point back at it): otherwise every call's
    columns wait for the cyclic GC, and the process holds several calls' copies at
    once (found measuring peak RSS at 1M rows)."""
    import gc

    fake.create_topic("t", 3)
    async with open_fake_producer(fake) as producer:
        await (await producer.send_batch("t", rows("w", 10)))
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                await (await producer.send_batch("t", rows("v", 2000),
                                                 keys=[b"%d" % i for i in range(2000)]))
            assert gc.collect() == 0
        finally:
            gc.enable()
