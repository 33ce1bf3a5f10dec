"""Before / after: the producer bench of two checkouts, alternating, in one session.

``python -m bench.ab BEFORE AFTER [--clients C1,C2] [--rounds 3] [--n 1000000]``

``BEFORE`` and ``AFTER`` are checkouts of this repository (``git worktree add --detach
DIR COMMIT``), each with its own ``.venv`` (``make venv`` there: the C extensions are
built in place). Each round runs ``bench/producer_bench.py`` of one checkout, then of the
other (the order alternating), one run per client, each with its own interpreter and its
own embedded broker, as ``make bench`` runs them: the machine's state drifts between
rounds, not between the two sides of one. Two ratios per client, each the median over
the rounds of one round's after / before: throughput (msgs/s), and the client's CPU
seconds per run (before / after, so that above 1 is cheaper too), the steadier of the two
on a 2-core machine whose run-to-run throughput spreads by 20-30% at 1M messages. A client
counts as a regression when its CPU ratio is below ``--threshold`` (0.95): it does more
work per message. The report (JSON: both checkouts' commits, every run, the ratios) goes
to ``--json``; the table to stdout.

What it answers: did a change (a refactoring, a feature that should cost nothing when
unused) slow the send paths? It is not a comparison with other clients (``make bench``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_CLIENTS = "pipeline-send,pipeline-send-keyed,pipeline-send_many,pipeline-send_batch"


def _commit(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h %s"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()[:100]


def _run_side(checkout: Path, clients: str, n: int, scratch: Path, tag: str) -> dict[str, Any]:
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{checkout}: no .venv (run `make venv` there first)")
    report = scratch / f"{tag}.json"
    subprocess.run([str(python), "-m", "bench.producer_bench", "--clients", clients,
                    "--repeats", "1", "--n", str(n), "--quiet-wait", "5", "--json", str(report)],
                   cwd=checkout, check=True, stdout=subprocess.DEVNULL)
    results: dict[str, Any] = json.loads(report.read_text())["results"]
    return {name: (r.get("msgs_per_s"), r.get("cpu_s")) for name, r in results.items()}


def run(before: Path, after: Path, clients: str, rounds: int, n: int,
        threshold: float) -> dict[str, Any]:
    sides = {"before": before, "after": after}
    runs: dict[str, dict[str, list[tuple[float | None, float | None]]]] = {
        "before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        for rnd in range(rounds):
            order = ("before", "after") if rnd % 2 == 0 else ("after", "before")
            for side in order:
                got = _run_side(sides[side], clients, n, Path(tmp), f"{side}-{rnd}")
                for name, run in got.items():
                    runs[side].setdefault(name, []).append(run)
                print(f"round {rnd + 1}/{rounds} {side}: " + ", ".join(
                    f"{k} {v[0]:,.0f}/s {v[1]:.2f} cpu s" if v[0] and v[1] else f"{k} failed"
                    for k, v in got.items()), flush=True)
    verdicts = {}
    for name, after_runs in runs["after"].items():
        pairs = list(zip(runs["before"].get(name, []), after_runs, strict=False))
        rate = [a[0] / b[0] for b, a in pairs if a[0] and b[0]]
        cpu = [b[1] / a[1] for b, a in pairs if a[1] and b[1]]
        rate_median = statistics.median(rate) if rate else None
        cpu_median = statistics.median(cpu) if cpu else None
        verdicts[name] = {
            "before": runs["before"].get(name), "after": after_runs,
            "rate_ratios": [round(r, 3) for r in rate],
            "cpu_ratios": [round(c, 3) for c in cpu],
            "median_rate_ratio": None if rate_median is None else round(rate_median, 3),
            "median_cpu_ratio": None if cpu_median is None else round(cpu_median, 3),
            "verdict": "n/a" if cpu_median is None else
            ("regression" if cpu_median < threshold else "no regression"),
        }
    return {"before": _commit(before), "after": _commit(after), "n": n, "rounds": rounds,
            "threshold": threshold, "clients": verdicts}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def format_table(report: dict[str, Any]) -> str:
    lines = [f"before: {report['before']}", f"after:  {report['after']}",
             f"{report['n']:,} messages per run, {report['rounds']} rounds, alternating; "
             "ratios per round, after vs before (CPU: before / after)",
             f"{'client':<22} {'msgs/s before':>13} {'after':>10} {'rate x':>7} "
             f"{'CPU s before':>12} {'after':>6} {'CPU x':>6}  verdict"]
    for name, v in report["clients"].items():
        b_rate = _median([r[0] for r in v["before"] or [] if r[0]])
        a_rate = _median([r[0] for r in v["after"] if r[0]])
        b_cpu = _median([r[1] for r in v["before"] or [] if r[1]])
        a_cpu = _median([r[1] for r in v["after"] if r[1]])
        rx = "" if v["median_rate_ratio"] is None else f"{v['median_rate_ratio']:.2f}"
        cx = "" if v["median_cpu_ratio"] is None else f"{v['median_cpu_ratio']:.2f}"
        lines.append(f"{name:<22} {b_rate:>13,.0f} {a_rate:>10,.0f} {rx:>7} {b_cpu:>12.2f} "
                     f"{a_cpu:>6.2f} {cx:>6}  {v['verdict']}")
        lines.append(f"{'':<22} per round: rate {', '.join(f'{r:.2f}' for r in v['rate_ratios'])}"
                     f"; CPU {', '.join(f'{c:.2f}' for c in v['cpu_ratios'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--clients", default=DEFAULT_CLIENTS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.before.resolve(), args.after.resolve(), args.clients, args.rounds,
                 args.n, args.threshold)
    print(format_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if any(v["verdict"] == "regression" for v in report["clients"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
