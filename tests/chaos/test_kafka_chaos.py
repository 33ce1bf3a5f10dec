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

And one transactional schedule (seed 101, ``pipeline-txn``: the transaction coordinator's
node SIGKILLed mid-transaction, lost AddPartitionsToTxn answers), judged by
confluent-kafka's ``read_committed`` reader (``chaoslab.txn_judge``).

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


#: The transactional schedule ``make test`` runs: SIGKILL of the transaction coordinator's
#: node mid-transaction (restarted 7.5 s later), AddPartitionsToTxn answers lost.
TXN_QUICK_SEED = 101


async def test_pipeline_transactions_survive_a_killed_coordinator(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """Transactions of 200 messages at 1,000 msgs/s while the coordinator's node is
    SIGKILLed: judged by confluent-kafka's ``read_committed`` reader, every committed
    transaction is in the log whole and once, no aborted one is visible, every partition
    is in send order, and a transaction begun after the heal commits within
    ``RECOVER_BOUND`` (``chaoslab.txn_judge``)."""
    from chaoslab.txn_judge import TxnVerdict

    plan = make_plan(TXN_QUICK_SEED)
    assert plan.transactional and any(s.action == "kill-coordinator" for s in plan.steps)
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
    # It really ran transactions for the whole schedule, and the kill hit its coordinator.
    assert verdict.committed >= 50 and verdict.msgs_committed >= 50 * plan.txn_size, story
    assert not any("STEP FAILED" in e for e in verdict.events), story
    assert any("(the transaction coordinator)" in e for e in verdict.events), story
