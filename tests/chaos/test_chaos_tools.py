"""The chaos harness itself (``chaos/``): plans are a function of the seed, the judge
catches every kind of violation it claims to, the table and the CLI's seed lists work.
No broker: these run in a second."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from chaoslab.__main__ import format_table, parse_clients, parse_seeds  # noqa: E402
from chaoslab.judge import Verdict, check, judge  # noqa: E402
from chaoslab.plan import (  # noqa: E402
    ACTIONS,
    CLUSTER_ACTIONS,
    FAMILIES,
    NORMAL_TIMEOUTS,
    make_plan,
)
from chaoslab.txn_judge import TxnVerdict, check_txn, judge_txn  # noqa: E402
from chaoslab.worker import FAILED, OK, PENDING, REFUSED, value_of  # noqa: E402

RUN = 42


def test_a_plan_is_a_function_of_its_seed() -> None:
    assert make_plan(5) == make_plan(5)
    assert make_plan(5).lines() == make_plan(5).lines()
    assert make_plan(5) != make_plan(6)
    with pytest.raises(ValueError, match="int >= 1"):
        make_plan(0)


def test_the_default_schedules_cover_every_fault_and_both_timeout_regimes() -> None:
    plans = [make_plan(seed) for seed in range(1, 22)]
    assert {p.family for p in plans} == set(FAMILIES)
    assert {s.action for p in plans for s in p.steps} == ACTIONS
    assert {p.tight for p in plans} == {True, False}
    for plan in plans:
        assert plan.steps, plan
        assert [s.at for s in plan.steps] == sorted(s.at for s in plan.steps)
        for step in plan.steps:
            if step.action == "stall":  # longer than the request timeout, always
                assert step.seconds > plan.request_timeout
            if step.action in ("kill-leader", "sigterm"):
                assert step.seconds > 0
        if not plan.tight:
            assert (plan.request_timeout, plan.delivery_timeout) == NORMAL_TIMEOUTS[:2]
        else:  # a stall that outlasts delivery_timeout: batches fail, the producer recovers
            assert any(s.action == "stall" and s.node is not None
                       and s.seconds > plan.delivery_timeout for s in plan.steps), plan
    # Every plan mixes at least one network fault in.
    assert all(any(s.action not in CLUSTER_ACTIONS for s in p.steps) for p in plans)


def test_parse_seeds() -> None:
    assert parse_seeds("1-3,7,2") == [1, 2, 3, 7]
    with pytest.raises(Exception, match="bad seed"):
        parse_seeds("3-1")
    with pytest.raises(Exception, match="bad seed"):
        parse_seeds("x")


def _report(status: list[int], partition: list[int], offset: list[int],
            **extra: object) -> dict[str, object]:
    return {"status": bytes(status).hex(), "partition": partition, "offset": offset,
            "errors": {}, "multi": 0, "heal_seq": 0, "recover_s": 0.5, "close_s": 0.2,
            **extra}


def _log(*partitions: list[int]) -> dict[int, list[tuple[int, bytes]]]:
    return {p: [(off, value_of(RUN, seq)) for off, seq in enumerate(seqs)]
            for p, seqs in enumerate(partitions)}


def _judge(report: dict[str, object], log: dict[int, list[tuple[int, bytes]]]) -> Verdict:
    v = judge(Verdict("pipeline", 1, "kill-leader"), report, log, RUN)
    check(v, close_bound=16.0, recover_bound=20.0)
    return v


def test_judge_clean_run() -> None:
    # seqs 0, 2 on partition 0 and 1, 3 on partition 1; seq 3 failed but was written.
    report = _report([OK, OK, OK, FAILED], [0, 1, 0, -1], [0, 0, 1, -1])
    v = _judge(report, _log([0, 2], [1, 3]))
    assert (v.delivered, v.failed, v.failed_written, v.in_log) == (3, 1, 1, 4)
    assert v.violations == []


def test_judge_catches_loss_duplicates_reordering_and_misplacement() -> None:
    report = _report([OK, OK, OK, OK], [0, 0, 0, 1], [1, 5, 0, 5])
    # seq 1 lost, seq 2 twice, seq 0 after seq 2 (reordered), seq 3 at offset 0 not 5.
    v = _judge(report, _log([2, 0, 2], [3]))
    assert (v.lost, v.duplicated, v.reordered, v.misplaced) == (1, 1, 1, 1)
    assert {x.split("=")[0] for x in v.violations} == {"lost", "duplicated", "reordered",
                                                     "misplaced"}


def test_judge_catches_stuck_multi_foreign_slow_close_and_no_recovery() -> None:
    report = _report([OK, PENDING, REFUSED], [0, -1, -1], [-1, -1, -1], multi=2,
                     close_s=30.0, recover_s=None)
    log = _log([0, 2])  # seq 2 was refused (never accepted), yet it is in the log
    log[0].append((2, b"7:0:"))  # another run's record
    v = _judge(report, log)
    assert (v.accepted, v.refused, v.stuck, v.multi, v.foreign) == (2, 1, 1, 2, 2)
    assert any(x.startswith("close took 30.0s") for x in v.violations)
    assert "no message sent after the heal was acknowledged" in v.violations
    assert "stuck=1" in v.violations and "multi=2" in v.violations


def test_table_has_a_row_per_run_and_a_total_per_client() -> None:
    plans = {1: make_plan(1), 15: make_plan(15)}
    runs = [Verdict("pipeline", 1, "kill-leader", delivered=10, close_s=0.1, recover_s=0.2),
            Verdict("aiokafka", 15, "kill-leader", delivered=7, stuck=3, violations=["stuck=3"])]
    table = format_table(runs, plans)
    assert "| pipeline | 1 kill-leader | 10 |" in table
    assert "| aiokafka | 15 kill-leader (tight) | 7 |" in table
    assert "**stuck=3**" in table
    assert "| aiokafka | 1 | 1 | 7 |" in table


def test_without_idempotence_duplicates_are_reported_but_order_and_loss_still_judged() -> None:
    # seq 0 written twice (a retry after a lost response), acknowledged at the second copy
    report = _report([OK, OK, OK], [0, 0, 0], [1, 2, 3])
    log = _log([0, 0, 1, 2])
    v = judge(Verdict("pipeline-nonidem", 1, "lost-responses"), report, log, RUN)
    assert check(v, close_bound=16.0, recover_bound=20.0, idempotent=False) == []
    assert v.duplicated == 1
    assert check(v, close_bound=16.0, recover_bound=20.0) == ["duplicated=1"]
    v = judge(Verdict("pipeline-nonidem", 1, "lost-responses"),
              _report([OK, OK, OK], [0, 0, 0], [1, 0, 2]), _log([1, 0, 2]), RUN)
    assert check(v, close_bound=16.0, recover_bound=20.0, idempotent=False) == ["reordered=1"]


def test_parse_clients_knows_the_control() -> None:
    assert parse_clients("pipeline,pipeline-nonidem") == ["pipeline", "pipeline-nonidem"]
    with pytest.raises(Exception, match="unknown client"):
        parse_clients("pipeline,kafka-python")


# --------------------------------------------------------------------------- transactional

def test_transactional_plans_aim_at_transactions() -> None:
    from chaoslab.__main__ import clients_for
    from chaoslab.plan import TXN_ACTIONS, TXN_FAMILIES, TXN_FIRST_SEED

    plans = [make_plan(seed) for seed in range(TXN_FIRST_SEED, TXN_FIRST_SEED + 8)]
    assert all(p.transactional and p.txn_size > 0 for p in plans)
    assert all(p.delivery_timeout < p.transaction_timeout for p in plans)  # librdkafka's rule
    assert {p.family for p in plans} == set(TXN_FAMILIES)
    actions = {s.action for p in plans for s in p.steps}
    assert {"kill-coordinator", "move-coordinator", "kill-leader", "move-leader",
            "lost-responses", "stall"} <= actions <= TXN_ACTIONS
    lost_commits = [s for p in plans for s in p.steps
                    if s.action == "lost-responses" and s.api == "END_TXN"]
    assert lost_commits and all(s.target == "coordinator" for s in lost_commits)
    assert any(s.action == "stall" and s.target == "coordinator"
               and s.seconds > plans[0].request_timeout for p in plans for s in p.steps)
    assert make_plan(TXN_FIRST_SEED) == make_plan(TXN_FIRST_SEED)
    assert not make_plan(1).transactional  # the idempotent schedules are unchanged
    both = ["pipeline", "confluent", "aiokafka"]
    assert clients_for(plans[0], both) == ["pipeline-txn", "confluent-txn"]
    assert clients_for(make_plan(1), [*both, "pipeline-txn"]) == both


def test_java_string_hash_places_a_transactional_id_as_kafka_does() -> None:
    from chaoslab.coordinator import java_string_hash, txn_state_partition

    assert java_string_hash("hello") == 99162322  # Java's "hello".hashCode()
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert txn_state_partition("polygenelubricants", 3) == 0  # Utils.abs(MIN_VALUE) == 0
    assert txn_state_partition("hello", 3) == 99162322 % 3


def _txn_log(*partitions: list[tuple[int, int]]) -> dict[int, list[tuple[int, bytes]]]:
    from chaoslab.txn_worker import txn_value

    return {p: [(off, txn_value(RUN, seq, attempt)) for off, (seq, attempt) in enumerate(rows)]
            for p, rows in enumerate(partitions)}


def _txn_judge(txns: list[list[object]], committed: dict[int, list[tuple[int, bytes]]],
               everything: dict[int, list[tuple[int, bytes]]] | None = None) -> TxnVerdict:
    report = {"txns": txns, "close_s": 0.1, "recover_s": 0.5}
    v = judge_txn(TxnVerdict("pipeline-txn", 101, "txn-mixed"), report, committed,
                  everything if everything is not None else committed, RUN)
    check_txn(v, close_bound=16.0, recover_bound=10.0)
    return v


def test_txn_judge_clean_run_with_an_abort_and_its_redo() -> None:
    # batch 0 (seqs 0-3) committed by attempt 0; batch 1 aborted (attempt 1, written and
    # hidden), redone by attempt 2; batch 2 of unknown outcome, absent
    txns = [[0, 0, 0, 4, "committed", ""], [1, 1, 4, 4, "aborted", "X"],
            [2, 1, 4, 4, "committed", ""], [3, 2, 8, 4, "unknown", "Fatal"]]
    committed = _txn_log([(0, 0), (2, 0), (4, 2), (6, 2)], [(1, 0), (3, 0), (5, 2), (7, 2)])
    everything = _txn_log([(0, 0), (2, 0), (4, 1), (4, 2), (6, 2)],
                          [(1, 0), (3, 0), (5, 1), (5, 2), (7, 2)])
    v = _txn_judge(txns, committed, everything)
    assert v.violations == [], v.violations
    assert (v.committed, v.aborted, v.unknown, v.written_aborted) == (2, 1, 1, 2)


def test_txn_judge_catches_partial_twice_missing_aborted_visible_and_reordering() -> None:
    txns = [[0, 0, 0, 2, "committed", ""], [1, 1, 2, 2, "aborted", "X"],
            [2, 1, 2, 2, "committed", ""], [3, 2, 4, 2, "committed", ""]]
    # attempt 0 whole; the aborted attempt 1 visible beside its redo 2 (twice); attempt 3
    # visible in part (seq 4 only: partial, committed not whole), and before seq 3
    committed = _txn_log([(0, 0), (1, 0), (2, 1), (3, 1), (4, 3), (2, 2), (3, 2)])
    v = _txn_judge(txns, committed)
    assert (v.partial, v.twice, v.committed_missing, v.aborted_visible,
            v.reordered) == (1, 2, 1, 1, 2)
    names = {x.split("=")[0] for x in v.violations}
    assert names == {"partial", "twice", "committed_missing", "aborted_visible", "reordered"}


def test_txn_judge_catches_a_committed_transaction_written_twice() -> None:
    # attempt 1's records appear again later (a retried write that was not deduplicated):
    # each partition's seqs are in order, every attempt is whole, only "twice" is wrong
    txns = [[0, 0, 0, 2, "committed", ""], [1, 1, 2, 2, "committed", ""]]
    v = _txn_judge(txns, _txn_log([(0, 0), (2, 1), (2, 1)], [(1, 0), (3, 1)]))
    assert v.violations == ["twice=1"], v.violations


def test_txn_judge_needs_progress_a_recovery_and_a_whole_unknown() -> None:
    txns = [[0, 0, 0, 2, "unknown", "Fatal"], [1, 1, 2, 2, "open", ""]]
    v = judge_txn(TxnVerdict("c", 101, "f"), {"txns": txns, "close_s": 20.0},
                  _txn_log([(0, 0)]), _txn_log([(0, 0)]), RUN)
    out = check_txn(v, close_bound=16.0, recover_bound=10.0)
    assert "partial=1" in out and "open=1" in out and "no transaction committed" in out
    assert "close took 20.0s > 16s" in out
    assert "no transaction begun after the heal committed" in out
    # an unknown outcome found whole is allowed (it may have committed)
    v = _txn_judge([[0, 0, 0, 2, "unknown", "F"], [1, 1, 2, 2, "committed", ""]],
                   _txn_log([(0, 0), (1, 0), (2, 1), (3, 1)]))
    assert v.violations == [] and v.unknown_visible == 1


def test_txn_table_has_a_row_per_run_and_totals() -> None:
    runs = [TxnVerdict("pipeline-txn", 101, "txn-kill-coordinator", attempts=5, committed=4,
                       aborted=1, close_s=0.1, recover_s=0.2),
            TxnVerdict("confluent-txn", 101, "txn-kill-coordinator", attempts=3, committed=3,
                       twice=2, violations=["twice=2"])]
    table = format_table(runs, {101: make_plan(101)})
    assert "| pipeline-txn | 101 txn-kill-coordinator | 5 | 4 | 1 | 0 |" in table
    assert "**twice=2**" in table
    assert "| confluent-txn | 1 | 1 | 3 | 3 |" in table
