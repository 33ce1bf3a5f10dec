"""producer/rows.py: the columnar helpers the stages use (pure, no trio)."""

from __future__ import annotations

import random

import pytest

from pipeline.producer._columnar import rows as rows_mod
from pipeline.producer._columnar.rows import (
    RowChunk,
    RowRun,
    assign_rows,
    encode_messages,
    slice_columns,
    take_until_run,
)
from pipeline.producer._message import ProducerMessage
from pipeline.producer._outcomes.delivery import DeliveryGroup
from pipeline.producer._stages.partitioner import DefaultPartitioner, murmur2
from pipeline.protocol.columnar import KERNEL, build_columns, encode_batch
from pipeline.protocol.records import BatchBuilder


def _messages(seed: int, n: int) -> list[ProducerMessage]:
    rng = random.Random(seed)
    return [
        ProducerMessage("t", rng.choice([None, rng.randbytes(rng.randrange(0, 300))]),
                        rng.choice([None, b"", rng.randbytes(rng.randrange(1, 20))]), (), None,
                        1_700_000_000_000 + rng.randrange(-5, 2000))
        for _ in range(n)
    ]


@pytest.mark.skipif(KERNEL != "c", reason="the columnar path for messages needs the C kernel")
@pytest.mark.parametrize("seed", range(5))
def test_encode_messages_is_byte_identical_to_batch_builder(seed: int) -> None:
    msgs = _messages(seed, 1 + seed * 97)
    builder = BatchBuilder()
    builder.extend(msgs)
    ids = {"producer_id": 7, "producer_epoch": 3, "base_sequence": 2**31 - 2}
    assert encode_messages(msgs, **ids) == builder.build(**ids)
    assert encode_messages(msgs) == builder.build()


def test_encode_messages_leaves_headers_to_the_builder() -> None:
    msgs = _messages(1, 10)
    msgs[3].headers = (("h", b"v"),)
    assert encode_messages(msgs) is None


def test_encode_messages_without_the_c_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows_mod, "KERNEL", "python")
    assert encode_messages(_messages(2, 5)) is None


def _run(columns: object, n: int) -> RowRun:
    chunk = RowChunk(DeliveryGroup(n), n)
    return RowRun("t", columns, None, n, 0, chunk, 0)  # type: ignore[arg-type]


def test_assign_rows_keys_on_murmur2_partitions_in_row_order() -> None:
    keys = [b"k%d" % (i % 11) for i in range(500)] + [None] * 20
    cols = build_columns([b"v%d" % i for i in range(520)], keys, default_timestamp=1)
    out, bad = assign_rows(_run(cols, 520), 7, DefaultPartitioner(random.Random(1)),
                           cap=1 << 20, max_records=1 << 30)
    assert bad is None
    seen = []
    for p, run in out:
        picked = list(run.rows)
        assert picked == sorted(picked)
        for i in picked:
            if keys[i] is not None:
                assert p == (murmur2(keys[i]) & 0x7FFFFFFF) % 7
        seen += picked
    assert sorted(seen) == list(range(520))
    nulls = {p for p, run in out for i in run.rows if keys[i] is None}
    assert len(nulls) == 1  # sticky: one batch's worth of null-key rows on one partition


def test_assign_rows_cuts_batches_by_exact_size_and_count() -> None:
    cols = build_columns([b"x" * 100] * 1000, default_timestamp=1)
    out, _ = assign_rows(_run(cols, 1000), 3, DefaultPartitioner(random.Random(1)),
                         cap=4096, max_records=30)
    assert sum(run.count for _, run in out) == 1000
    for _, run in out:
        assert run.count <= 30
        assert run._size == len(encode_batch(cols, run.rows)) <= 4096


def test_slice_columns_shares_buffers_and_keeps_rows() -> None:
    cols = build_columns([b"a", None, b"c", b"d"], [None, b"k", b"k2", None],
                         headers=[None, {"h": b"1"}, None, {"x": None}],
                         timestamps=[1, 2, 3, 4], default_timestamp=9)
    part = slice_columns(cols, 1, 4)
    assert [part.row(i) for i in range(3)] == [cols.row(i) for i in range(1, 4)]
    assert encode_batch(part) == encode_batch(cols, range(1, 4))


def test_take_until_run() -> None:
    msgs = _messages(3, 3)
    run = _run(build_columns([b"a"], default_timestamp=1), 1)
    assert take_until_run([*msgs, run, msgs[0]]) == msgs
    assert take_until_run([run, *msgs]) == [run]
    assert take_until_run(msgs) is None
