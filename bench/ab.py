"""Before / after: the producer bench of two checkouts, alternating, in one session.

``python -m bench.ab BEFORE AFTER [--clients C1,C2] [--rounds 3] [--n 1000000]``

``BEFORE`` and ``AFTER`` are checkouts of this repository (``git worktree add --detach
DIR COMMIT``), each with its own ``.venv`` (``make venv`` there: the C extensions are
built in place). Each round runs ``bench/producer_bench.py`` of one checkout, then of the
other (the order alternating), one run per client, each with its own interpreter and its
own embedded broker, as ``make bench`` runs them: the machine's state drifts between
rounds, not between the two sides of one. The verdict per client is the median over the
rounds of each round's after / before ratio; a client counts as a regression when that
median is below ``--threshold`` (0.95: the run-to-run spread of one client on this
machine is ~5-10%). The report (JSON: both checkouts' commits, every run, the ratios)
goes to ``--json``; the table to stdout.

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
    return {name: r.get("msgs_per_s") for name, r in results.items()}


def run(before: Path, after: Path, clients: str, rounds: int, n: int,
        threshold: float) -> dict[str, Any]:
    sides = {"before": before, "after": after}
    rates: dict[str, dict[str, list[float | None]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        for rnd in range(rounds):
            order = ("before", "after") if rnd % 2 == 0 else ("after", "before")
            for side in order:
                got = _run_side(sides[side], clients, n, Path(tmp), f"{side}-{rnd}")
                for name, rate in got.items():
                    rates[side].setdefault(name, []).append(rate)
                print(f"round {rnd + 1}/{rounds} {side}: " + ", ".join(
                    f"{k} {v:,.0f}" if v else f"{k} failed" for k, v in got.items()),
                    flush=True)
    verdicts = {}
    for name, runs in rates["after"].items():
        pairs = [a / b for a, b in zip(runs, rates["before"].get(name, []), strict=False)
                 if a and b]
        median = statistics.median(pairs) if pairs else None
        verdicts[name] = {
            "before": rates["before"].get(name), "after": runs,
            "ratios": [round(p, 3) for p in pairs],
            "median_ratio": None if median is None else round(median, 3),
            "verdict": "n/a" if median is None else
            ("regression" if median < threshold else "no regression"),
        }
    return {"before": _commit(before), "after": _commit(after), "n": n, "rounds": rounds,
            "threshold": threshold, "clients": verdicts}


def format_table(report: dict[str, Any]) -> str:
    lines = [f"before: {report['before']}", f"after:  {report['after']}",
             f"{report['n']:,} messages per run, {report['rounds']} rounds, alternating",
             f"{'client':<24} {'before (median)':>16} {'after (median)':>15} "
             f"{'after/before per round':<28} verdict"]
    for name, v in report["clients"].items():
        b = statistics.median([x for x in v["before"] or [] if x] or [0])
        a = statistics.median([x for x in v["after"] if x] or [0])
        ratios = ", ".join(f"{r:.2f}" for r in v["ratios"])
        med = "" if v["median_ratio"] is None else f" (median {v['median_ratio']:.2f})"
        lines.append(f"{name:<24} {b:>16,.0f} {a:>15,.0f} {ratios:<28} {v['verdict']}{med}")
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
