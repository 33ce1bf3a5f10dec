"""read_committed: transaction markers, and the filter that drops aborted and control batches."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.protocol.batch_format import ATTR_CONTROL, ATTR_TRANSACTIONAL
from pipeline.protocol.messages.fetch import AbortedTransaction
from pipeline.protocol.read_committed import (
    IsolationLevel,
    ReadCommittedFilter,
    committed_batches,
    is_abort_marker,
    isolation_level,
)
from pipeline.protocol.records import (
    ControlRecordType,
    CorruptRecordError,
    Record,
    RecordBatch,
    control_record_key,
    control_record_type,
    decode_record_batches,
    encode_end_txn_marker,
    end_txn_marker_coordinator_epoch,
    end_txn_marker_value,
)

from .test_records import CONTROL_WIRE

# ----------------------------------------------------------------------------- markers


def test_commit_marker_is_the_bytes_a_broker_writes() -> None:
    # CONTROL_WIRE was assembled by hand from the protocol spec (test_records.py)
    assert encode_end_txn_marker(
        commit=True, producer_id=1000, producer_epoch=3, coordinator_epoch=5,
        timestamp=1700000000123, base_offset=57, partition_leader_epoch=4) == CONTROL_WIRE


def test_abort_marker_round_trip() -> None:
    data = encode_end_txn_marker(commit=False, producer_id=7, producer_epoch=2,
                                 coordinator_epoch=9, timestamp=5, base_offset=3)
    (batch,) = decode_record_batches(data)
    assert (batch.is_control, batch.is_transactional) == (True, True)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 2, -1)
    assert (batch.base_offset, batch.last_offset) == (3, 3)
    (record,) = batch.records
    assert control_record_type(record) == ControlRecordType.ABORT
    assert end_txn_marker_coordinator_epoch(record) == 9
    assert is_abort_marker(batch)
    commit = decode_record_batches(encode_end_txn_marker(
        commit=True, producer_id=7, producer_epoch=2, coordinator_epoch=9, timestamp=5))[0]
    assert not is_abort_marker(commit)


@pytest.mark.parametrize("value", [None, b"", b"\x00\x00\x00\x00\x00", b"\xff\xff\x00\x00\x00\x01"])
def test_marker_value_is_checked(value: bytes | None) -> None:
    with pytest.raises(CorruptRecordError, match="transaction marker"):
        end_txn_marker_coordinator_epoch(Record(key=control_record_key(0), value=value))


def test_marker_value_layout() -> None:
    assert end_txn_marker_value(5) == b"\x00\x00" b"\x00\x00\x00\x05"


def test_empty_control_batch_is_no_abort_marker() -> None:
    assert not is_abort_marker(RecordBatch(attributes=ATTR_CONTROL | ATTR_TRANSACTIONAL,
                                           producer_id=1))
    assert not is_abort_marker(RecordBatch(producer_id=1, records=(
        Record(key=control_record_key(ControlRecordType.ABORT)),)))  # not a control batch


@pytest.mark.parametrize(("name", "level"), [
    ("read_uncommitted", IsolationLevel.READ_UNCOMMITTED),
    ("read_committed", IsolationLevel.READ_COMMITTED),
    ("READ_COMMITTED", IsolationLevel.READ_COMMITTED),
    ("read-committed", IsolationLevel.READ_COMMITTED),
])
def test_isolation_level_names(name: str, level: IsolationLevel) -> None:
    assert isolation_level(name) is level


@pytest.mark.parametrize("bad", ["committed", "", 1, None])
def test_isolation_level_rejects_anything_else(bad: object) -> None:
    with pytest.raises(ValueError, match="'read_uncommitted' or 'read_committed'"):
        isolation_level(bad)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the filter


def data(offset: int, pid: int = -1, *, txn: bool = True, count: int = 1) -> RecordBatch:
    """A data batch at ``offset`` (``count`` records) of producer ``pid``."""
    attrs = ATTR_TRANSACTIONAL if txn and pid >= 0 else 0
    return RecordBatch(base_offset=offset, last_offset_delta=count - 1, attributes=attrs,
                       producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                       records=tuple(Record(offset_delta=i, value=b"%d" % (offset + i))
                                     for i in range(count)))


def marker(offset: int, pid: int, *, commit: bool) -> RecordBatch:
    (batch,) = decode_record_batches(encode_end_txn_marker(
        commit=commit, producer_id=pid, producer_epoch=0, coordinator_epoch=0, timestamp=0,
        base_offset=offset))
    return batch


def kept(batches: list[RecordBatch], aborted: list[tuple[int, int]]) -> list[int]:
    """Base offsets of the delivered batches."""
    return [b.base_offset for b in committed_batches(batches, aborted)]


def test_plain_batches_pass_and_control_batches_never_do() -> None:
    log = [data(0), data(1, 5, txn=False), data(2, 6), marker(3, 6, commit=True)]
    assert kept(log, []) == [0, 1, 2]


def test_an_aborted_transaction_is_dropped_a_committed_one_kept() -> None:
    log = [data(0, 1), data(1, 1), marker(2, 1, commit=False),
           data(3, 2), data(4, 2), marker(5, 2, commit=True)]
    assert kept(log, [(1, 0)]) == [3, 4]


def test_interleaved_producers() -> None:
    log = [data(0, 1), data(1, 2), data(2, 1), marker(3, 1, commit=False),
           data(4, 2), marker(5, 2, commit=True), data(6)]
    assert kept(log, [(1, 0)]) == [1, 4, 6]


def test_the_abort_marker_closes_the_producer_for_its_next_transaction() -> None:
    log = [data(0, 1), marker(1, 1, commit=False), data(2, 1), marker(3, 1, commit=True)]
    assert kept(log, [(1, 0)]) == [2]


@pytest.mark.parametrize("aborted", [[(1, 0), (1, 2), (2, 5)], [(2, 5), (1, 2), (1, 0)],
                                     [(1, 2), (2, 5), (1, 0)]])
def test_aborted_list_in_any_order(aborted: list[tuple[int, int]]) -> None:
    """The broker's list is not promised sorted: taken in the given order, (1, 2) before
    (1, 0) would leave offset 0 undropped."""
    log = [data(0, 1), marker(1, 1, commit=False), data(2, 1), marker(3, 1, commit=False),
           data(4, 3), data(5, 2), data(6, 3), marker(7, 2, commit=False),
           marker(8, 3, commit=True)]
    assert kept(log, aborted) == [4, 6]


def test_an_aborted_transaction_starting_inside_a_batch_drops_the_batch() -> None:
    # first_offset 11 lies inside the batch 10..12: the transaction is open for it
    log = [data(10, 4, count=3), marker(13, 4, commit=False)]
    assert kept(log, [(4, 11)]) == []


def test_a_fetch_starting_inside_an_aborted_transaction() -> None:
    # the transaction began at 3, before the first fetched batch
    assert kept([data(8, 1), marker(9, 1, commit=False), data(10, 2)], [(1, 3)]) == [10]


def test_a_non_transactional_batch_of_an_aborted_producer_is_kept() -> None:
    # (an idempotent, non-transactional batch is never part of a transaction)
    assert kept([data(0, 1), data(1, 1, txn=False), marker(2, 1, commit=False)],
                [(1, 0)]) == [1]


def test_fetch_aborted_transaction_objects_and_none() -> None:
    log = [data(0, 1), marker(1, 1, commit=False), data(2)]
    assert kept(log, [AbortedTransaction(producer_id=1, first_offset=0)]) == [2]  # type: ignore[list-item]
    assert [b.base_offset for b in committed_batches(log, None)] == [0, 2]


def test_the_filter_is_per_partition_state() -> None:
    keep = ReadCommittedFilter([(1, 0)])
    assert [keep(b) for b in (data(0, 1), marker(1, 1, commit=False), data(2, 1))] == [
        False, False, True]


# A model: transactions of several producers interleaved in one partition's log, each
# ending in a COMMIT or ABORT marker (or still open), with plain batches between them. The
# broker's aborted list names each aborted transaction's producer and first offset; it is
# shuffled. Delivered must be exactly the plain batches and the committed transactions'.


@dataclass
class Step:
    kind: str  # "plain" | "write" | "commit" | "abort"
    pid: int


steps = st.lists(
    st.one_of(
        st.builds(Step, st.just("plain"), st.just(-1)),
        st.builds(Step, st.sampled_from(["write", "write", "commit", "abort"]),
                  st.integers(0, 2)),
    ),
    min_size=4,
    max_size=60,
)


@settings(max_examples=300, deadline=None, database=None)
@given(steps, st.randoms(use_true_random=False))
def test_model(script: list[Step], rnd: random.Random) -> None:
    log: list[RecordBatch] = []
    open_txn: dict[int, list[int]] = {}  # pid -> offsets of its open transaction's batches
    aborted: list[tuple[int, int]] = []
    expected: list[int] = []
    offset = 0
    for step in script:
        if step.kind == "plain":
            log.append(data(offset))
            expected.append(offset)
        elif step.kind == "write":
            log.append(data(offset, step.pid, count=2))
            open_txn.setdefault(step.pid, []).append(offset)
            offset += 1
        elif step.pid in open_txn:  # a marker ends a transaction that wrote here
            batch_offsets = open_txn.pop(step.pid)
            log.append(marker(offset, step.pid, commit=step.kind == "commit"))
            if step.kind == "commit":
                expected.extend(batch_offsets)
            else:
                aborted.append((step.pid, batch_offsets[0]))
        else:
            continue
        offset += 1
    # a read_committed fetch stops at the LSO: the first batch of a still-open transaction
    lso = min((offs[0] for offs in open_txn.values()), default=offset)
    fetched = [b for b in log if b.base_offset < lso]
    rnd.shuffle(aborted)
    assert kept(fetched, aborted) == sorted(o for o in expected if o < lso)
