"""``python -m pipeline.testing.explore``: run seeded fault schedules, check, shrink.

    python -m pipeline.testing.explore --schedules 1000 --seed 7
    python -m pipeline.testing.explore --replay 1234 --idempotent both -v
    python -m pipeline.testing.explore --file tests/explore/regressions/x.json

Schedule i of a run with ``--seed S`` has seed S+i, so a violation is
replayed with ``--replay S+i`` (and the same ``--idempotent``). The last line
is always ``explored N schedules: K violations``; the exit status is 1 when
K > 0. The lines before it say how many accepted messages were rows of
columnar ``send()`` bursts (``burst.py``), in how many schedules, and which
protocol guards (``guards.py``) no schedule reached (``--reach``: how many
schedules reached each).

Seed S is ``sweep.schedule_for(S)``: a plain, swarm or targeted schedule
(``sweep.py``); ``--plain`` and ``--profile`` narrow that.
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

from .checker import Violation, check
from .guards import GUARDS
from .profiles import EXTRA, PROFILES, targeted
from .runner import Trace, run_schedule
from .schedule import Schedule, from_json, generate, to_json
from .shrink import shrink
from .sweep import schedule_for
from .txn_schedule import txn_schedule_for


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.testing.explore",
        description="Seeded random fault schedules against the FakeCluster, with an "
        "invariant checker (docs/architecture.md, Testing).",
    )
    p.add_argument("--schedules", type=int, default=100, help="how many (default 100)")
    p.add_argument("--seed", type=int, default=None,
                   help="first schedule's seed (default: random, printed first)")
    p.add_argument("--idempotent", choices=("on", "off", "both"), default="both",
                   help="idempotence of the producer (both: drawn per schedule)")
    p.add_argument("--replay", type=int, action="append", default=[], metavar="SEED",
                   help="run just this schedule seed (repeatable)")
    p.add_argument("--file", action="append", default=[], metavar="JSON",
                   help="run a schedule saved as JSON (e.g. a shrunk regression)")
    p.add_argument("--no-shrink", action="store_true", help="report violations unshrunk")
    p.add_argument("--shrink-budget", type=int, default=300, metavar="RUNS")
    p.add_argument("--shrink-max", type=int, default=3, metavar="K",
                   help="shrink at most K violating schedules (default 3)")
    p.add_argument("--emit", metavar="DIR",
                   help="write each shrunk schedule to DIR as a regression JSON")
    p.add_argument("--stop-after", type=int, default=0, metavar="K",
                   help="stop after K violating schedules (default: never)")
    p.add_argument("--plain", action="store_true",
                   help="only the plain generator (schedule.generate: the seeds of the "
                        "explorer's first sweeps replay as they did)")
    p.add_argument("--profile", choices=sorted([*PROFILES, *EXTRA]),
                   help="only targeted schedules of this profile (profiles.py)")
    p.add_argument("--workload", choices=("producer", "transactions"), default="producer",
                   help="what the schedules drive: the producer, or a transactional "
                        "producer (txn_schedule.py; --idempotent, --plain and --profile "
                        "do not apply)")
    p.add_argument("--reach", action="store_true",
                   help="print how many schedules reached each guard (guards.py)")
    p.add_argument("-v", "--verbose", action="store_true", help="print what happened")
    return p


def _schedule(args: argparse.Namespace, seed: int) -> Schedule:
    if args.workload == "transactions":
        return txn_schedule_for(seed)
    if args.plain:
        return generate(seed, args.idempotent)
    if args.profile:
        return targeted(seed, args.idempotent, args.profile)
    return schedule_for(seed, args.idempotent)


def _replay_flags(args: argparse.Namespace) -> str:
    if args.workload == "transactions":
        return " --workload transactions"
    return " --plain" if args.plain else f" --profile {args.profile}" if args.profile else ""


def _print_reach(reached: Counter[str], n: int, verbose: bool) -> None:
    never = [g.name for g in GUARDS if not reached[g.name]]
    if verbose:
        width = max(len(g.name) for g in GUARDS)
        for g in GUARDS:
            print(f"  {g.name:<{width}} {reached[g.name]:6d} of {n}")
    print(f"guards reached: {len(GUARDS) - len(never)} of {len(GUARDS)}"
          + (f"; never: {', '.join(never)}" if never else ""))


def _replay_command(schedule: Schedule, mode: str, flags: str = "") -> str:
    return (f"python -m pipeline.testing.explore --replay {schedule.seed} --idempotent {mode}"
            f"{flags}")


def _print_trace(trace: Trace) -> None:
    s = trace.schedule
    print(f"  schedule: {s.describe()}")
    for e in s.events:
        print(f"    t={e.at:<8} {e.kind} node={e.node} partition={e.partition} code={e.code} "
              f"count={e.count} seconds={e.seconds} duration={e.duration} flag={e.flag}")
    print(f"  close {trace.close_start:.4f} -> {trace.close_end:.4f}, "
          f"{len(trace.messages)} accepted, {sum(m.ok for m in trace.messages)} acknowledged")
    for p, values in sorted(trace.logs.items()):
        print(f"  log[{p}]: " + " ".join(v.split(b"|")[0].decode() for v in values))
    book = trace.extra.get("txn")
    for txn in getattr(book, "txns", ()):
        print(f"  {txn.producer} transaction {txn.seq} (generation {txn.generation}) "
              f"{txn.begun_at:.4f}..{txn.end_called:.4f} {txn.wanted or 'open'} -> "
              f"{txn.outcome}: {len(txn.records)} records "
              f"{'; '.join(txn.errors)[:200]}")


def _report(violations: list[Violation]) -> None:
    for v in violations[:5]:
        print(f"  {v}")
    if len(violations) > 5:
        print(f"  ... and {len(violations) - 5} more")


def _slug(schedule: Schedule, violation: Violation) -> str:
    kind = re.sub(r"[^a-z0-9]+", "-", violation.kind.lower()).strip("-")
    return f"{kind}-seed{schedule.seed}"


def _shrink_and_emit(args: argparse.Namespace, schedule: Schedule,
                     violations: list[Violation]) -> None:
    t0 = time.monotonic()
    small, runs = shrink(schedule, violations, budget=args.shrink_budget)
    left = check(run_schedule(small))
    print(f"  shrunk in {runs} runs ({time.monotonic() - t0:.1f}s): "
          f"events {len(schedule.events)}->{len(small.events)}, "
          f"messages {len(schedule.sends)}->{len(small.sends)}, "
          f"partitions {schedule.partitions}->{small.partitions}, "
          f"brokers {schedule.brokers}->{small.brokers}")
    _report(left)
    if args.emit and left:
        path = Path(args.emit) / f"{_slug(small, left[0])}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(to_json(small) + "\n")
        print(f"  written: {path}  (replay: python -m pipeline.testing.explore --file {path})")
    elif not args.emit:
        print(f"  shrunk schedule (JSON, --emit DIR writes it): {to_json(small)}"
              if args.verbose else "  (pass --emit DIR to keep the shrunk schedule)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.getLogger("pipeline").setLevel(logging.CRITICAL)  # the producer's own warnings
    jobs: list[tuple[Schedule, str]] = []
    if args.replay or args.file:
        jobs += [(_schedule(args, seed), args.idempotent) for seed in args.replay]
        jobs += [(from_json(Path(f).read_text()), "file") for f in args.file]
    else:
        seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
        print(f"seed {seed}: {args.schedules} schedules (seeds {seed}..{seed + args.schedules - 1}),"
              f" idempotent={args.idempotent}", flush=True)
        jobs = [(_schedule(args, seed + i), args.idempotent) for i in range(args.schedules)]
    bad = shrunk = rows = with_rows = 0
    reached: Counter[str] = Counter()
    t0 = time.monotonic()
    for n, (schedule, mode) in enumerate(jobs, 1):
        trace = run_schedule(schedule)
        violations = check(trace)
        rows += trace.rows
        with_rows += trace.rows > 0
        reached.update(set(trace.reached))
        if args.verbose or (violations and (args.replay or args.file)):
            _print_trace(trace)
        if violations:
            bad += 1
            print(f"VIOLATION in schedule seed={schedule.seed} "
                  f"(idempotent={schedule.idempotent}):", flush=True)
            _report(violations)
            if mode != "file":
                print(f"  replay: {_replay_command(schedule, mode, _replay_flags(args))}")
            if not args.no_shrink and shrunk < args.shrink_max:
                shrunk += 1
                _shrink_and_emit(args, schedule, violations)
            if args.stop_after and bad >= args.stop_after:
                jobs = jobs[:n]
                break
        if n % 500 == 0:
            print(f"  ... {n} schedules, {bad} violations, {time.monotonic() - t0:.0f}s",
                  file=sys.stderr, flush=True)
    print(f"columnar send() rows: {rows} accepted, in {with_rows} schedules")
    _print_reach(reached, len(jobs), args.reach)
    print(f"explored {len(jobs)} schedules: {bad} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
