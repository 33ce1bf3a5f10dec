"""What a columnar ``send()`` burst keeps alive while its rows wait (issue 15's
peak-RSS bound, ``docs/architecture.md``, "send() bursts as columns").

Measured at the peak of the 1M ``send()`` + ``flush()`` bench: the buffer full
of sealed bursts, each holding its packed columns and, besides, lists of 8
bytes a row that nobody read. A burst now keeps a per-row list only for a
reader (its timestamps for the rows' callbacks), and records where its rows
ended up per run, not per row (``RowOutcomes.bounds``: one span per settled
run, 8 bytes a kept row less than a per-row list)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import trio

from pipeline.producer._columnar.burst import RowDelivery, RowOutcomes
from pipeline.producer._columnar.rows import RowChunk
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer
from .test_bad_input import PATIENT, stall_produce
from .test_send_rows import columnar_next

ROWS = 300


@pytest.fixture(autouse=True)
def _modes(both_modes: bool, await_path: str) -> bool:
    return both_modes


def _spans(outcomes: RowOutcomes) -> list[tuple[int, int]]:
    """The settled spans, ``[start, stop)`` each, one per settled run."""
    spans = [span for span in struct.iter_unpack("=qq", outcomes.bounds)]
    assert len(spans) == len(outcomes.runs)
    return spans


def _sealed_bursts(producer: Any) -> list[RowOutcomes]:
    """The outcomes of every sealed send() burst the ledger holds."""
    return [c.outcomes for c in producer._ledger.outstanding.values()
            if type(c) is RowChunk and c.outcomes is not None]


async def _held_burst(fake: FakeCluster, producer: Any, keep: int | None,
                      on_delivery: Any = None,
                      key: Any = lambda i: None) -> tuple[RowOutcomes, list[Any], trio.Event]:
    """ROWS rows sent as one columnar burst while Produce is held; the burst is
    sealed (the dispatcher took it). ``keep``: the index of the one delivery the
    caller keeps (None: all dropped, as a flush() caller does); ``key(i)``: row
    i's key."""
    gate = stall_produce(fake)
    await producer._core.cluster.partitions_for("t")
    columnar_next(producer)
    kept = []
    for i in range(ROWS):
        d = await producer.send("t", b"v%d" % i, key=key(i), on_delivery=on_delivery)
        assert type(d) is RowDelivery
        if i == keep:
            kept.append(d)
        del d
    await trio.sleep(0.01)  # the dispatcher takes (seals) the burst
    [outcomes] = _sealed_bursts(producer)
    return outcomes, kept, gate


async def test_a_burst_whose_deliveries_were_dropped_keeps_no_per_row_list(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A flush() caller's burst: once sealed it holds its packed columns and
    nothing per row besides (no timestamps list; one span per run), before and
    after its run settles; every row is still written."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, **PATIENT) as producer:
        outcomes, kept, gate = await _held_burst(fake, producer, keep=None)
        assert kept == [] and outcomes.values is None
        assert outcomes.timestamps == [] and _spans(outcomes) == []
        gate.set()
        await producer.flush()
        assert _spans(outcomes) == [(0, ROWS)]  # one run: one span, 16 bytes
        assert producer.statistics().succeeded == ROWS
    assert [e.record.value for e in fake.log("t", 0)] == [b"v%d" % i for i in range(ROWS)]


async def test_a_kept_row_delivery_reads_its_outcome_from_its_runs_span(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """One delivery of the burst kept: its run's span is recorded when the run
    settles (the delivery waits on it before: pending, then its offset), and
    the delivery reads its value and timestamp from its burst."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, **PATIENT) as producer:
        outcomes, [kept], gate = await _held_burst(fake, producer, keep=ROWS - 1)
        assert _spans(outcomes) == [] and not kept.done() and kept.offset == -1
        assert kept.value == b"v%d" % (ROWS - 1) and kept.timestamp > 0
        gate.set()
        assert (await kept).offset == ROWS - 1
        assert _spans(outcomes) == [(0, ROWS)] and outcomes.runs[0].offset == 0
        await producer.flush()


async def test_a_burst_with_callbacks_keeps_the_values_and_timestamps_they_need(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Callbacks need every row's value (errors name it) and timestamp (metadata):
    those lists stay until the last row heard its callback; where the rows
    ended up is one span per run."""
    fake.create_topic("t", 1)
    heard: list[tuple[int, int]] = []

    def note(meta: Any, error: Any) -> None:
        heard.append((meta.offset, meta.timestamp))

    async with open_fake_producer(fake, **PATIENT) as producer:
        outcomes, _, gate = await _held_burst(fake, producer, keep=None, on_delivery=note)
        assert outcomes.values is not None and len(outcomes.values) == ROWS
        assert len(outcomes.timestamps) == ROWS
        gate.set()
        await producer.flush()
        assert _spans(outcomes) == [(0, ROWS)]
    assert [offset for offset, _ in heard] == list(range(ROWS))
    assert all(ts > 0 for _, ts in heard)


async def test_a_sealed_burst_holds_its_packed_copy_in_the_buffer_until_it_settles(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The packed columns (values, their offsets, the timestamps) are counted in
    ``buffered_bytes`` from the seal to the burst's last row, as a send_batch
    list's copy is: what waits is what is reserved (runs: their exact encoded
    sizes once split; the chunk: its copy). A sender then finds the buffer full
    sooner, not the process bigger than buffer_memory says."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, **PATIENT) as producer:
        _, _, gate = await _held_burst(fake, producer, keep=None)
        [chunk] = [c for c in producer._ledger.outstanding.values() if type(c) is RowChunk]
        values = b"".join(b"v%d" % i for i in range(ROWS))
        assert chunk.extra == len(values) + 8 * (ROWS + 1) + 8 * ROWS
        [run] = chunk.runs
        assert bytes(run.columns.values.data) == values
        assert producer.statistics().buffered_bytes == run._size + chunk.extra
        gate.set()
        await producer.flush()
        assert producer.statistics().buffered_bytes == 0


@pytest.mark.parametrize("keyless_every", [3, 0])
async def test_a_keyed_bursts_packed_keys_are_held_in_the_buffer_too(
    fake: FakeCluster, autojump_clock: Any, keyless_every: int
) -> None:
    """A keyed burst's copy also holds its packed keys: their bytes, offsets and
    validity bitmap (when a third of the rows have no key; none when all have
    one), until its last row."""
    fake.create_topic("t", 1)

    def key(i: int) -> bytes | None:
        return None if keyless_every and i % keyless_every == 0 else b"key%d" % i

    async with open_fake_producer(fake, **PATIENT) as producer:
        _, _, gate = await _held_burst(fake, producer, keep=None, key=key)
        [chunk] = [c for c in producer._ledger.outstanding.values() if type(c) is RowChunk]
        values = b"".join(b"v%d" % i for i in range(ROWS))
        keys = b"".join(key(i) or b"" for i in range(ROWS))
        [run] = chunk.runs
        validity = run.columns.keys.validity or b""
        assert bytes(run.columns.keys.data) == keys
        assert len(validity) == ((ROWS + 7) // 8 if keyless_every else 0)
        assert chunk.extra == (len(values) + 8 * (ROWS + 1) + len(keys) + 8 * (ROWS + 1)
                               + len(validity) + 8 * ROWS)
        assert producer.statistics().buffered_bytes == run._size + chunk.extra
        gate.set()
        await producer.flush()
        assert producer.statistics().buffered_bytes == 0
