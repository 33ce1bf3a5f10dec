"""Ordering under failure on the 3-node Apache Kafka (issue 11): the quick subset of
``make chaos``, run by ``make test``.

Three of ``make chaos``'s schedules (``chaoslab.plan``), with the project's producer only
(the peers run in ``make chaos``): SIGKILL of partition leaders with restarts and
connection kills (seed 1); SIGTERM, a leader move, a leader SIGKILL and lost Produce
responses (seed 14); and, with tight timeouts (request 3 s, delivery 8 s), lost responses
and two blackholed nodes, one past ``delivery_timeout`` (seed 20; the batches of the
partitions it leads fail and the producer recovers with a client-side epoch bump). Every node advertises a FaultProxy's port, so the
producer's every connection crosses one; the verdict comes from confluent-kafka's
consumer on the never-proxied INTERNAL listeners (``chaoslab.judge``).

And two transactional schedules (``pipeline-txn``), judged by confluent-kafka's
``read_committed`` reader (``chaoslab.txn_judge``): seed 101, the transaction coordinator's
node SIGKILLed mid-transaction and lost AddPartitionsToTxn answers; seed 104, lost EndTxn
answers, so commits are retried against a coordinator that may already have completed them.

Each idempotent run must show: 0 acknowledged messages lost, 0 duplicated, every partition's log
strictly increasing in send order, exactly one outcome per accepted message (nothing
stuck, nothing reported twice), close within ``close_timeout``, and a message sent after
the faults were healed acknowledged within ``RECOVER_BOUND`` seconds. Replay one with
``python -m chaoslab --seeds <seed> --clients pipeline``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.testing.kafka import KafkaCluster

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from chaoslab.plan import make_plan  # noqa: E402
from chaoslab.runner import open_lab, run_schedule  # noqa: E402

pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

QUICK_SEEDS = [1, 14, 20]


@pytest.mark.parametrize("seed", QUICK_SEEDS)
async def test_pipeline_keeps_order_and_one_outcome_under_faults(
    kafka_cluster: KafkaCluster, seed: int, tmp_path: Path
) -> None:
    plan = make_plan(seed)
    lines: list[str] = []
    async with open_lab(kafka_cluster) as lab:
        verdict = await run_schedule(lab, plan, "pipeline", logs_dir=tmp_path, log=lines.append)
    story = "\n".join([*plan.lines(), *verdict.events, *lines,
                       f"errors: {verdict.errors} {verdict.first_error}",
                       f"extra: {verdict.extra}"])
    print(story)
    assert verdict.violations == [], story
    assert verdict.accepted > 1000, story  # it really sent for the whole schedule
    assert verdict.delivered + verdict.failed == verdict.accepted
    # The faults fired: every planned step left its mark in the event log.
    assert not any("STEP FAILED" in e for e in verdict.events), story
    for action, mark in (("kill-leader", "SIGKILL node"), ("sigterm", "SIGTERM node"),
                         ("move-leader", "led by"), ("stall", "blackhole"),
                         ("lost-responses", "Produce response")):
        if any(s.action == action for s in plan.steps):
            assert any(mark in e for e in verdict.events), (action, story)


#: The transactional schedules ``make test`` runs, each with the fault it must show:
#: 101, SIGKILL of the transaction coordinator's node mid-transaction (restarted 7.5 s
#: later) and AddPartitionsToTxn answers lost; 104, EndTxn answers lost twice.
TXN_QUICK_SEEDS = {101: ("kill-coordinator", r"SIGKILL node"),
                   104: ("lost-responses", r"lost [1-9]\d* END_TXN response")}


@pytest.mark.parametrize("seed", sorted(TXN_QUICK_SEEDS))
async def test_pipeline_transactions_survive_coordinator_faults(
    kafka_cluster: KafkaCluster, seed: int, tmp_path: Path
) -> None:
    """Transactions of 200 messages at 1,000 msgs/s while the coordinator fails (its node
    SIGKILLed, or its EndTxn answers lost): judged by confluent-kafka's ``read_committed``
    reader, every committed transaction is in the log whole and once, no aborted one is
    visible, every partition is in send order, and a transaction begun after the heal
    commits within ``RECOVER_BOUND`` (``chaoslab.txn_judge``)."""
    import re

    from chaoslab.txn_judge import TxnVerdict

    action, mark = TXN_QUICK_SEEDS[seed]
    plan = make_plan(seed)
    assert plan.transactional and any(s.action == action for s in plan.steps)
    lines: list[str] = []
    async with open_lab(kafka_cluster) as lab:
        verdict = await run_schedule(lab, plan, "pipeline-txn", logs_dir=tmp_path,
                                     log=lines.append)
    assert isinstance(verdict, TxnVerdict)
    story = "\n".join([*plan.lines(), *verdict.events, *lines,
                       f"errors: {verdict.errors} {verdict.first_error}",
                       f"extra: {verdict.extra}"])
    print(story)
    assert verdict.violations == [], story
    # It really ran transactions for the whole schedule, and the fault hit its coordinator.
    assert verdict.committed >= 50 and verdict.msgs_committed >= 50 * plan.txn_size, story
    assert not any("STEP FAILED" in e for e in verdict.events), story
    assert any(re.search(mark, e) for e in verdict.events), story
    if action == "kill-coordinator":
        assert any("(the transaction coordinator)" in e for e in verdict.events), story
