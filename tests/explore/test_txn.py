"""The explorer's transactions workload: its read_committed view, its invariants on
planted traces, deterministic replays, and the CI sweep (`make test`)."""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.producer._stages.broker_producer import BrokerProducer
from pipeline.producer._stages.context import RetryErrors
from pipeline.protocol.batch_format import ATTR_TRANSACTIONAL, Record, RecordBatch
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.records import encode_end_txn_marker, encode_record_batch
from pipeline.testing.explore import check, from_json, run_schedule, to_json
from pipeline.testing.explore.schedule import Event
from pipeline.testing.explore.trace import Trace
from pipeline.testing.explore.txn_runner import Generation, TxnBook, TxnRecord, committed_view
from pipeline.testing.explore.txn_schedule import txn_generate, txn_schedule_for
from pipeline.testing.fake.state import StoredBatch

# The CI sweep of the transactions workload: seeds TXN_SEED .. TXN_SEED + TXN_N - 1 of
# txn_schedule_for. Replay one with
# `python -m pipeline.testing.explore --workload transactions --replay <seed>`.
TXN_SEED = 40_000
TXN_N = 45
REGRESSIONS = Path(__file__).parent / "regressions"


def digest(seed: int) -> str:
    trace = run_schedule(txn_schedule_for(seed))
    book = trace.extra["txn"]
    seen = (trace.crash, [(t.producer, t.seq, t.outcome, t.records, t.errors) for t in book.txns],
            sorted(book.visible.items()), book.committed_offset, trace.end_time)
    return hashlib.sha256(repr(seen).encode()).hexdigest()


@pytest.mark.parametrize("seed", [3, 16])
def test_a_transactional_schedule_replays_identically(seed: int) -> None:
    assert digest(seed) == digest(seed)


def test_transactional_schedules_round_trip_through_json() -> None:
    for seed in range(30):
        s = txn_schedule_for(seed)
        assert from_json(to_json(s)) == s
    assert {txn_generate(seed).transaction_version for seed in range(30)} == {1, 2}


def _stored(data: bytes, base: int) -> StoredBatch:
    return StoredBatch(base_offset=base, last_offset=base, data=data, max_timestamp=0,
                       append_time=0.0)


def _batch(values: list[bytes], base: int, pid: int, transactional: bool) -> StoredBatch:
    batch = RecordBatch(base_offset=base, records=tuple(Record(value=v, offset_delta=i)
                                                        for i, v in enumerate(values)),
                        last_offset_delta=len(values) - 1, producer_id=pid, producer_epoch=0,
                        base_sequence=0, attributes=ATTR_TRANSACTIONAL if transactional else 0)
    return StoredBatch(base_offset=base, last_offset=base + len(values) - 1,
                       data=encode_record_batch(batch), max_timestamp=0, append_time=0.0)


def _marker(pid: int, base: int, commit: bool) -> StoredBatch:
    return _stored(encode_end_txn_marker(commit=commit, producer_id=pid, producer_epoch=0,
                                         coordinator_epoch=0, timestamp=0, base_offset=base,
                                         partition_leader_epoch=0), base)


def test_the_committed_view_is_what_a_read_committed_reader_sees() -> None:
    """Committed records are visible, aborted ones never, plain ones at once, and nothing
    from the first offset of a transaction still open (the last stable offset)."""
    batches = [
        _batch([b"a0", b"a1"], 0, 7, True),
        _batch([b"b0"], 2, 8, True),
        _marker(7, 3, commit=False),
        _batch([b"plain"], 4, -1, False),
        _marker(8, 5, commit=True),
        _batch([b"c0"], 6, 7, True),
        _batch([b"late"], 7, -1, False),
    ]
    assert committed_view(batches) == [(2, b"b0"), (4, b"plain")]


def _trace(txns: list[TxnRecord], visible: dict[int, list[tuple[int, bytes]]],
           generations: list[Generation] | None = None) -> Trace:
    schedule = txn_generate(1)
    trace = Trace(schedule)
    book = TxnBook(txns=txns, visible=visible,
                   generations=generations or [Generation("main", 0.0, ready_at=0.0)])
    trace.extra["txn"] = book
    return trace


def _txn(outcome: str, values: list[bytes], seq: int = 0, ok: bool = True) -> TxnRecord:
    t = TxnRecord("main", seq, 0, 0.0, wanted="commit", end_called=1.0, outcome=outcome)
    t.records = [(v, 0, ok, i, "") for i, v in enumerate(values)]
    return t


def kinds(trace: Trace) -> list[str]:
    return [v.kind for v in check(trace)]


def test_a_committed_transaction_must_be_whole_and_an_aborted_one_invisible() -> None:
    assert kinds(_trace([_txn("committed", [b"x", b"y"])], {0: [(0, b"x"), (1, b"y")]})) == []
    assert kinds(_trace([_txn("committed", [b"x", b"y"])], {0: [(0, b"x")]})) == ["X1 lost"]
    assert kinds(_trace([_txn("aborted", [b"x"])], {0: [(0, b"x")]})) == ["X2 aborted visible"]
    assert kinds(_trace([_txn("unknown", [b"x", b"y"])], {0: [(0, b"x")]})) == ["X3 atomic"]
    assert kinds(_trace([_txn("unknown", [b"x", b"y"])], {0: []})) == []
    assert kinds(_trace([_txn("committed", [b"x"])], {0: [(0, b"x"), (1, b"x")]})) == [
        "X4 duplicate"]
    assert kinds(_trace([], {0: [(0, b"who")]})) == ["X2 phantom"]


def test_nothing_of_a_transaction_may_succeed_after_its_abort_was_called() -> None:
    aborted = _txn("aborted", [b"x", b"y"])
    aborted.wanted, aborted.abort_called = "abort", 1.0
    assert kinds(_trace([aborted], {0: []})) == []
    aborted.succeeded_after_abort = 1
    assert kinds(_trace([aborted], {0: []})) == ["X12 success after abort"]


def test_the_runner_counts_what_succeeded_after_an_abort(monkeypatch: pytest.MonkeyPatch,
                                                        ) -> None:
    """With the broker producer's wait for a request slot left running by the abort, and
    what it then writes not failed in flight by the flusher, the regression schedule's
    batch succeeds after the abort began, and the run reports X12."""
    schedule = from_json((REGRESSIONS / "txn-abort-while-a-produce-waits-for-a-slot.json")
                         .read_text())
    assert kinds(run_schedule(schedule)) == []

    def expire_all_but_the_wait(self: BrokerProducer) -> None:
        self._expire(math.inf)

    monkeypatch.setattr(BrokerProducer, "expire_all", expire_all_but_the_wait)
    monkeypatch.setattr(RetryErrors, "expiry_horizon", lambda self, now: now)
    assert kinds(run_schedule(schedule)) == ["X12 success after abort"]


def test_committed_records_in_send_order() -> None:
    first, second = _txn("committed", [b"a", b"b"]), _txn("committed", [b"c"], seq=1)
    second.records = [(b"c", 0, True, 0, "")]
    first.records = [(b"a", 0, True, 1, ""), (b"b", 0, True, 2, "")]
    got = kinds(_trace([first, second], {0: [(0, b"c"), (1, b"a"), (2, b"b")]}))
    assert "X5 order" in got


def test_a_producer_ending_a_transaction_after_its_successor_initialised_must_be_fenced() -> None:
    main = Generation("main", 0.0, ready_at=0.0)
    main.calls = [(2.0, "commit", True)]
    main.epochs = {(7, 0)}
    successor = Generation("successor-0", 1.0, ready_at=1.0)
    trace = _trace([], {0: []}, [main, successor])
    book = trace.extra["txn"]
    book.txn_requests = [(0.5, 7, 0), (1.5, 7, 1)]  # before the takeover; the successor's
    assert kinds(trace) == []  # nothing of main's transaction reached a broker after it
    book.txn_requests.append((1.8, 7, 0))  # main's EndTxn, say: refused as fenced
    assert kinds(trace) == ["X7 not fenced"]
    main.fenced = True
    assert kinds(trace) == []
    successor.fenced = True  # nothing initialised after it
    assert trace.schedule.transaction_version == 2  # (v1 with a short timeout may fence)
    assert kinds(trace) == ["X7 spurious fence"]


def test_a_fenced_commit_is_invisible_unless_it_began_before_the_fence() -> None:
    main = Generation("main", 0.0, ready_at=0.0, fenced=True)
    successor = Generation("successor-0", 1.0, ready_at=1.5)
    late = _txn("fenced", [b"x"])
    late.end_called = 2.0  # after the successor initialised: cannot have been applied
    assert "X2 aborted visible" in kinds(_trace([late], {0: [(0, b"x")]}, [main, successor]))
    early = _txn("fenced", [b"x"])
    early.end_called = 1.2  # before: its answer may have been lost after it was applied
    assert kinds(_trace([early], {0: [(0, b"x")]}, [main, successor])) == []


def test_a_fatal_error_needs_a_fence_a_timeout_or_an_outage_it_outlasted() -> None:
    """X11: a fatal error from a fault the producer outlasts (here a lost answer long
    after the cluster healed) is a violation; a successor's fence, a transaction past
    its timeout, or EndTxn unanswered while the cluster was still down are causes."""
    trace = _trace([], {0: []})
    schedule = trace.schedule
    o = dict(schedule.options)
    main = trace.extra["txn"].generations[0]
    at = schedule.heal_at + 100.0
    main.fatal = [(at, at - 0.01, "commit_transaction(): TransactionFatalError")]
    assert kinds(trace) == ["X11 fatal"]
    main.fatal = [(at, at - o["transaction_timeout"], "commit: INVALID_TXN_STATE")]
    assert kinds(trace) == []  # outlived its timeout
    bound = o["transaction_timeout"] + o["request_timeout"]
    main.fatal = [(schedule.heal_at + bound, schedule.heal_at + bound - 0.01,
                   "EndTxn (commit) got no answer within ...")]
    assert kinds(trace) == []  # the outage was still on when EndTxn's bound began
    main.fatal = [(schedule.heal_at + bound + 1.0, schedule.heal_at + bound + 0.99,
                   "EndTxn (commit) got no answer within ...")]
    assert kinds(trace) == ["X11 fatal"]
    successor = Generation("successor-0", schedule.heal_at, ready_at=schedule.heal_at + 0.5)
    trace.extra["txn"].generations.append(successor)
    main.calls = [(schedule.heal_at + bound + 1.0, "commit", True)]
    main.fenced = True
    assert kinds(trace) == []  # a successor opened before it: a fence


def test_a_fatal_refusal_the_producer_could_have_outlasted_is_reported() -> None:
    """End to end: EndTxn refused with an authorization error (fatal, and no fence,
    timeout or outage explains it) makes the runner record the fatal error and X11
    report it."""
    base = txn_generate(5, frozenset())  # (transaction_timeout 60 s; it commits)
    code = int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    schedule = replace(base, events=(Event(0.0, "end_txn_error", code=code, count=50),))
    assert any(send.via == "commit" for send in schedule.sends)
    trace = run_schedule(schedule)
    assert any(g.fatal for g in trace.extra["txn"].generations)
    assert "X11 fatal" in kinds(trace)


# Per chunk of the sweep: how the transactions ended (the sweep must see each outcome).
OUTCOMES: Counter[str] = Counter()


@pytest.mark.parametrize("chunk", range(3))
def test_txn_sweep(chunk: int) -> None:
    """TXN_N seeded transactional schedules (both transaction versions, every fault kind
    of txn_schedule.py) keep every transactional invariant."""
    found = []
    size = TXN_N // 3
    for seed in range(TXN_SEED + chunk * size, TXN_SEED + (chunk + 1) * size):
        trace = run_schedule(txn_schedule_for(seed))
        OUTCOMES.update(t.outcome for t in trace.extra["txn"].txns)
        violations = check(trace)
        if violations:
            found.append(f"seed {seed}: {violations[0]} (replay: python -m "
                         f"pipeline.testing.explore --workload transactions --replay {seed})")
    assert not found, "\n".join(found)


def test_the_txn_sweep_sees_every_outcome() -> None:
    """The sweep's schedules end transactions every way the checker judges."""
    if not OUTCOMES:
        for chunk in range(3):
            test_txn_sweep(chunk)
    assert {"committed", "aborted", "failed", "fenced"} <= set(OUTCOMES), OUTCOMES
