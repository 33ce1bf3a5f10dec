"""A partition's fetched bytes to records: what is skipped, where the position goes."""

from __future__ import annotations

import struct

from pipeline.consumer._decode import decode_chunk
from pipeline.protocol.compression import Compression
from pipeline.protocol.messages.fetch import AbortedTransaction
from pipeline.protocol.records import (
    BatchBuilder,
    Record,
    RecordBatch,
    encode_end_txn_marker,
    encode_record_batch,
)

T = 1_700_000_000_000


def at(base_offset: int, data: bytes) -> bytes:
    """The batch with its base offset set (outside the CRC, as a leader writes it)."""
    return struct.pack(">q", base_offset) + data[8:]


def batch(base: int, *values: bytes, pid: int = -1, txn: bool = False, epoch: int = 3,
          compression: Compression = Compression.NONE) -> bytes:
    b = BatchBuilder(compression=compression)
    for i, v in enumerate(values):
        b.append(T + i, None, v)
    return at(base, b.build(producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                            base_sequence=0 if pid >= 0 else -1, is_transactional=txn,
                            partition_leader_epoch=epoch))


def test_records_before_the_fetch_offset_are_skipped_even_inside_a_compressed_batch() -> None:
    data = batch(10, b"a", b"b", b"c", compression=Compression.GZIP) + batch(13, b"d")
    chunk = decode_chunk(data, "t", 2, 11)
    assert [(r.offset, r.value) for r in chunk.decoded()] == [(11, b"b"), (12, b"c"), (13, b"d")]
    assert chunk.next_offset == 14 and chunk.nbytes == len(data)
    first = chunk.decoded()[0]
    assert (first.topic, first.partition, first.timestamp, first.leader_epoch) == ("t", 2, T + 1, 3)


def test_a_truncated_last_batch_is_left_for_the_next_fetch() -> None:
    data = batch(0, b"a") + batch(1, b"b")[:-3]
    chunk = decode_chunk(data, "t", 0, 0)
    assert [r.offset for r in chunk.decoded()] == [0] and chunk.next_offset == 1


def test_control_batches_are_passed_over() -> None:
    marker = encode_end_txn_marker(commit=True, producer_id=5, producer_epoch=0,
                                   coordinator_epoch=0, timestamp=T, base_offset=2)
    data = batch(0, b"a", b"b", pid=5, txn=True) + marker
    chunk = decode_chunk(data, "t", 0, 0)
    assert [r.value for r in chunk.decoded()] == [b"a", b"b"] and chunk.next_offset == 3
    only = decode_chunk(marker, "t", 0, 2)
    assert only.decoded() == [] and only.next_offset == 3


def test_read_committed_drops_aborted_transactions_and_moves_past_them() -> None:
    abort = encode_end_txn_marker(commit=False, producer_id=5, producer_epoch=0,
                                  coordinator_epoch=0, timestamp=T, base_offset=3)
    data = batch(0, b"x", b"y", pid=5, txn=True) + batch(2, b"plain") + abort + batch(4, b"z", pid=5, txn=True)
    aborted = [AbortedTransaction(producer_id=5, first_offset=0)]
    chunk = decode_chunk(data, "t", 0, 0, aborted=aborted)
    assert [r.value for r in chunk.decoded()] == [b"plain", b"z"] and chunk.next_offset == 5
    everything = decode_chunk(data, "t", 0, 0)  # read_uncommitted: the aborted ones too
    assert [r.value for r in everything.decoded()] == [b"x", b"y", b"plain", b"z"]
    nothing = decode_chunk(batch(0, b"x", pid=5, txn=True), "t", 0, 0, aborted=aborted)
    assert nothing.decoded() == [] and nothing.next_offset == 1


def test_log_append_time_stamps_every_record_with_the_batch_time() -> None:
    data = encode_record_batch(RecordBatch(
        base_offset=7, partition_leader_epoch=1, magic=2, crc=0, attributes=0x08,
        last_offset_delta=1, base_timestamp=T, max_timestamp=T + 500, producer_id=-1,
        producer_epoch=-1, base_sequence=-1,
        records=(Record(offset_delta=0, value=b"a"),
                 Record(offset_delta=1, timestamp_delta=9, value=b"b", headers=(("h", b"v"),)))))
    chunk = decode_chunk(data, "t", 0, 7)
    assert [(r.offset, r.timestamp) for r in chunk.decoded()] == [(7, T + 500), (8, T + 500)]
    assert chunk.decoded()[1].headers == (("h", b"v"),)


def test_nothing_fetched() -> None:
    for empty in (None, b""):
        chunk = decode_chunk(empty, "t", 0, 4)
        assert chunk.decoded() == [] and chunk.next_offset == 4 and chunk.nbytes == 0


def test_the_columnar_form_decodes_the_same_records_with_the_same_skips() -> None:
    """Compressed batches started before the fetch offset, control batches, aborted
    transactions at read_committed, LogAppendTime: the columns hold exactly the rows,
    and every slice of them the rows' slice."""
    from pipeline.consumer._decode import decode_columns, lazy_chunk

    abort = encode_end_txn_marker(commit=False, producer_id=5, producer_epoch=0,
                                  coordinator_epoch=0, timestamp=T, base_offset=6)
    data = (batch(0, b"a", b"b", b"c", compression=Compression.GZIP)
            + batch(3, b"x", b"y", pid=5, txn=True) + batch(5, b"plain") + abort
            + batch(7, b"z", compression=Compression.ZSTD))
    aborted = [AbortedTransaction(producer_id=5, first_offset=3)]
    for kwargs in ({}, {"aborted": aborted}):
        rows = decode_chunk(data, "t", 2, 1, **kwargs)  # type: ignore[arg-type]
        columns, next_offset = decode_columns(data, "t", 2, 1, **kwargs)  # type: ignore[arg-type]
        assert columns.records() == rows.decoded() and next_offset == rows.next_offset == 8
        for start in range(len(columns) + 1):
            for stop in range(start, len(columns) + 1):
                assert columns.slice(start, stop).records() == rows.decoded()[start:stop]
        lazy = lazy_chunk(data, "t", 2, 1, **kwargs)  # type: ignore[arg-type]
        assert lazy.count(columns=True) == len(rows.decoded()) and lazy.records is None
        assert lazy.decoded() == rows.decoded()  # converted from the columns
    values = [r.value for r in decode_columns(data, "t", 2, 1, aborted=aborted)[0].records()]
    assert values == [b"b", b"c", b"plain", b"z"]


def test_a_corrupt_batch_in_a_lazy_chunk_fails_either_form_naming_the_partition() -> None:
    import pytest

    from pipeline.consumer._decode import lazy_chunk
    from pipeline.consumer._errors import ConsumerError

    data = bytearray(batch(0, b"a"))
    data[-1] ^= 0xFF  # the CRC no longer matches
    for columns in (True, False):
        chunk = lazy_chunk(bytes(data), "t", 4, 0)
        with pytest.raises(ConsumerError, match=r"t\[4\] at offset 0: corrupt record batch "
                                                r"\(batch at offset 0: CRC mismatch"):
            chunk.count(columns=columns)
