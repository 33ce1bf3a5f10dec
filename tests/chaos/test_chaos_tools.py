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
