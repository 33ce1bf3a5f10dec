"""``python -m chaoslab`` (``make chaos``): ordering-under-failure schedules on a 3-node Kafka.

    python -m chaoslab                               # seeds 1-21 and 101-108, every client
    python -m chaoslab --seeds 7 --clients pipeline  # replay one schedule
    python -m chaoslab --seeds 3,8-10 --plan-only    # print the plans, run nothing
    python -m chaoslab --seeds 101-108 --clients pipeline-txn  # the transactional ones

Seeds 1-21 run the idempotent clients (pipeline, confluent, aiokafka); seeds from 101 are
transactional schedules (``chaoslab.plan``), run by the transactional clients
(pipeline-txn, confluent-txn; ``--clients pipeline`` means pipeline-txn there, and
confluent confluent-txn; aiokafka has no transactional client in the lab) and judged by a
``read_committed`` reader (``chaoslab.txn_judge``).

Starts a 3-node Apache Kafka (``pipeline.testing.kafka``) with a FaultProxy in front of
every node, runs each schedule (:mod:`chaoslab.plan`) with each client (:mod:`chaoslab.worker`)
in turn, judges each run (:mod:`chaoslab.judge`), prints one table (client x schedule) and
writes everything, plans and event logs included, to ``--json``. Exit status 1 when a
pipeline run violated an invariant (the peers are reported as measured, never failed).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from chaoslab.judge import Verdict
from chaoslab.plan import TXN_FIRST_SEED, Plan, make_plan
from chaoslab.runner import CLOSE_SLACK, RECOVER_BOUND, open_lab, run_schedule
from chaoslab.txn_judge import TxnVerdict
from chaoslab.txn_worker import TXN_CLIENTS
from chaoslab.worker import CLIENTS, CONTROLS

DEFAULT_SEEDS = list(range(1, 22)) + list(range(TXN_FIRST_SEED, TXN_FIRST_SEED + 8))
#: The transactional client standing for a client named on a transactional plan.
TXN_PEER = {"pipeline": "pipeline-txn", "confluent": "confluent-txn"}
DEFAULT_JSON = Path(__file__).resolve().parents[1] / "bench" / "results" / "chaos.json"


def parse_seeds(text: str) -> list[int]:
    """``"1-5,9"`` -> ``[1, 2, 3, 4, 5, 9]``."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad seed list {text!r}: use numbers and ranges, e.g. 1-5,9") from None
        if first < 1 or last < first:
            raise argparse.ArgumentTypeError(f"bad seed range {part!r}: seeds start at 1")
        seeds.extend(range(first, last + 1))
    return list(dict.fromkeys(seeds))


def parse_clients(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CLIENTS + CONTROLS + TXN_CLIENTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown client(s) {unknown}; choose from {CLIENTS + CONTROLS + TXN_CLIENTS}")
    return names


def clients_for(plan: Plan, clients: list[str]) -> list[str]:
    """Which of ``clients`` run ``plan``: the transactional ones (or their stand-ins) on
    a transactional plan, the others on the rest."""
    if plan.transactional:
        picked = [c if c in TXN_CLIENTS else TXN_PEER.get(c) for c in clients]
        return list(dict.fromkeys(c for c in picked if c is not None))
    return [c for c in clients if c not in TXN_CLIENTS]


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(verdicts: Sequence[Verdict | TxnVerdict], plans: dict[int, Plan]) -> str:
    """One table per kind of run (idempotent, transactional), each with its totals."""
    plain = [v for v in verdicts if isinstance(v, Verdict)]
    txn = [v for v in verdicts if isinstance(v, TxnVerdict)]
    parts = []
    if plain or not txn:
        parts.append(_plain_table(plain, plans))
    if txn:
        parts.append(format_txn_table(txn))
    return "\n\n".join(parts)


def format_txn_table(verdicts: list[TxnVerdict]) -> str:
    cols = ("txns", "committed", "aborted", "unknown", "msgs_committed", "partial", "twice",
            "committed_missing", "aborted_visible", "reordered", "written_aborted")
    head = ("| client | schedule | txns | committed | aborted | unknown | msgs committed "
            "| partial | twice | committed not whole | aborted visible | reordered "
            "| hidden by aborts | close s | recover s | verdict |")
    lines = [head, "|" + "---|" * 16]
    for v in verdicts:
        verdict = "ok" if not v.violations else "**" + "; ".join(v.violations) + "**"
        values = [v.attempts if c == "txns" else getattr(v, c) for c in cols]
        lines.append(f"| {v.client} | {v.seed} {v.family} | "
                     + " | ".join(str(x) for x in values)
                     + f" | {_cell(v.close_s)} | {_cell(v.recover_s)} | {verdict} |")
    lines.append("")
    lines.append("| client | schedules | violated | txns | committed | aborted | unknown "
                 "| msgs committed | partial | twice | committed not whole | aborted visible "
                 "| reordered | hidden by aborts | max close s | max recover s |")
    lines.append("|" + "---|" * 16)
    for client in dict.fromkeys(v.client for v in verdicts):
        mine = [v for v in verdicts if v.client == client]
        closes = [v.close_s for v in mine if v.close_s is not None]
        recovers = [v.recover_s for v in mine if v.recover_s is not None]
        totals = [sum(v.attempts if c == "txns" else getattr(v, c) for v in mine)
                  for c in cols]
        lines.append(f"| {client} | {len(mine)} | {sum(1 for v in mine if v.violations)} | "
                     + " | ".join(str(x) for x in totals)
                     + f" | {_cell(max(closes) if closes else None)} "
                     f"| {_cell(max(recovers) if recovers else None)} |")
    return "\n".join(lines)


def _plain_table(verdicts: list[Verdict], plans: dict[int, Plan]) -> str:
    head = ("| client | schedule | delivered | failed | lost | duplicated | reordered | stuck "
            "| close s | recover s | verdict |")
    lines = [head, "|" + "---|" * 11]
    for v in verdicts:
        plan = plans[v.seed]
        sched = f"{v.seed} {v.family}{' (tight)' if plan.tight else ''}"
        verdict = "ok" if not v.violations else "**" + "; ".join(v.violations) + "**"
        lines.append(
            f"| {v.client} | {sched} | {v.delivered} | {v.failed} | {v.lost} | {v.duplicated} "
            f"| {v.reordered} | {v.stuck} | {_cell(v.close_s)} | {_cell(v.recover_s)} "
            f"| {verdict} |")
    lines.append("")
    lines.append("| client | schedules | violated | delivered | failed | lost | duplicated "
                 "| reordered | stuck | max close s | max recover s |")
    lines.append("|" + "---|" * 11)
    for client in dict.fromkeys(v.client for v in verdicts):
        mine = [v for v in verdicts if v.client == client]
        closes = [v.close_s for v in mine if v.close_s is not None]
        recovers = [v.recover_s for v in mine if v.recover_s is not None]
        lines.append(
            f"| {client} | {len(mine)} | {sum(1 for v in mine if v.violations)} "
            f"| {sum(v.delivered for v in mine)} | {sum(v.failed for v in mine)} "
            f"| {sum(v.lost for v in mine)} | {sum(v.duplicated for v in mine)} "
            f"| {sum(v.reordered for v in mine)} | {sum(max(v.stuck, 0) for v in mine)} "
            f"| {_cell(max(closes) if closes else None)} "
            f"| {_cell(max(recovers) if recovers else None)} |")
    return "\n".join(lines)


async def run_all(seeds: list[int], clients: list[str], logs_dir: Path,
                  cluster_kwargs: dict[str, Any]
                  ) -> tuple[list[Verdict | TxnVerdict], dict[str, Any]]:
    from pipeline.testing.broker import free_port
    from pipeline.testing.kafka import KafkaCluster

    plans = {seed: make_plan(seed) for seed in seeds}
    verdicts: list[Verdict | TxnVerdict] = []
    cluster = KafkaCluster(nodes=3, advertised_ports={n: free_port() for n in (1, 2, 3)},
                           **cluster_kwargs)
    print("starting a 3-node Kafka cluster ...", flush=True)
    await trio.to_thread.run_sync(cluster.start)
    meta: dict[str, Any] = {"cluster_start_s": cluster.start_seconds,
                            "kafka": cluster.version, "plans": plans}
    try:
        async with open_lab(cluster) as lab:
            for seed in seeds:
                plan = plans[seed]
                print("\n".join(plan.lines()), flush=True)
                for client in clients_for(plan, clients):
                    verdict = await run_schedule(lab, plan, client, logs_dir=logs_dir)
                    verdicts.append(verdict)
                    if verdict.violations:
                        for line in verdict.events:
                            print(f"      {line}")
    finally:
        await trio.to_thread.run_sync(cluster.close)
    return verdicts, meta


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("trio", "aiokafka", "confluent-kafka"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        import confluent_kafka

        out["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaoslab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=parse_seeds, default=DEFAULT_SEEDS,
                        help="schedules to run, e.g. 1-21 or 3,7 (default 1-21 and "
                             f"{TXN_FIRST_SEED}-{TXN_FIRST_SEED + 7}, the transactional ones)")
    parser.add_argument("--clients", type=parse_clients, default=list(CLIENTS + TXN_CLIENTS),
                        help=f"comma-separated, from {', '.join(CLIENTS + CONTROLS + TXN_CLIENTS)} "
                             f"(default: {', '.join(CLIENTS + TXN_CLIENTS)}; {CONTROLS[0]} is "
                             "the control whose duplicates show the faults bite)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help=f"where the report goes (default {DEFAULT_JSON})")
    parser.add_argument("--logs", type=Path, default=None,
                        help="keep the workers' logs and reports here (default: a temp dir)")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the plans of --seeds and exit")
    args = parser.parse_args(argv)
    if args.plan_only:
        for seed in args.seeds:
            print("\n".join(make_plan(seed).lines()))
        return 0
    started = _dt.datetime.now(_dt.UTC)
    t0 = time.monotonic()
    logs_dir = args.logs or Path(tempfile.mkdtemp(prefix="pipeline-chaos-"))
    verdicts, meta = trio.run(run_all, args.seeds, args.clients, logs_dir, {})
    verdicts.sort(key=lambda v: v.seed)  # the table in seed order, whatever order ran
    plans: dict[int, Plan] = meta.pop("plans")  # the plans that ran
    table = format_table(verdicts, plans)
    print()
    print(table)
    pipeline_bad = [v for v in verdicts if v.client.startswith("pipeline") and v.violations]
    report = {
        "meta": {
            **meta, "date": started.isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - t0, 1), "seeds": args.seeds,
            "clients": args.clients, "recover_bound_s": RECOVER_BOUND,
            "close_slack_s": CLOSE_SLACK, "versions": _versions(),
            "platform": platform.platform(), "logs": str(logs_dir),
            "replay": "python -m chaoslab --seeds <seed> --clients <client>",
        },
        "plans": {str(seed): plan.to_json() for seed, plan in plans.items()},
        "table": table,
        "runs": [v.to_json() for v in verdicts],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}; worker logs in {logs_dir}")
    if pipeline_bad:
        print(f"pipeline violated an invariant in {len(pipeline_bad)} run(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
