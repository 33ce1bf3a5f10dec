"""The explorer's teeth as a number: ``make mutants-explore``.

For every mutant of the retry-ordering protocol's modules (tools/mutants.py's
mutants of the partition, broker and topic stages, the accumulator,
idempotence and the ledger) that the deterministic suite kills (every one not
listed in tools/mutants_equivalent.txt; with a ``.mutants/results.json`` from a
``make mutants`` run, only those it records killed), run the schedule explorer
on the mutated code, schedule after schedule from a fixed seed, until a schedule
violates an invariant or the budget (1,000 schedules) is spent, and record
*found* (after how many schedules, which violation) or *missed*. The table per
module and the explorer's score (found / measured) go to docs/testing.md.

How it runs: ``--jobs`` workers, each a fork server that imports trio and the
fake cluster's dependencies once and forks one child per mutant. The child
imports ``pipeline`` with the one mutated module served from memory (an import
hook: nothing is written, no scratch copy), then runs the explorer's schedules
(``pipeline.testing.explore.sweep``: the same sequence ``make explore`` and the
CI sweep generate). A schedule's real-time limit ends a hang (a violation); a
child that runs past its whole budget is reported as ``slow``.

Each mutant runs only the sweep's schedules that execute a line of its change
(a line map of the unmutated sweep, traced once per version of the code): the
others would run exactly as they do unmutated.

Results are cached in ``.mutants/explore.json``, keyed by the mutant's content
(tools/mutants.py's ident), the explorer's and the fake cluster's sources, the
seed and the budget: a rerun measures only what changed. After the explorer
changes, a mutant found before is first run on the one schedule that found it (a
violation there is a finding within the budget; its position then an upper bound
of the first), and explored in full only if that no longer finds it.

Usage::

    python tools/mutants_explore.py [--jobs 2] [--budget 1000] [--seed S]
        [--only FILE] [--sample N] [--keys FILE] [--list] [--try KEY] [--rerun]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.util
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutants

ROOT = mutants.ROOT
# This tree's pipeline, also in this process (--try): the virtual environment's editable
# install may point at another checkout, which edits there would change mid-run.
sys.path.insert(0, str(ROOT))
STATE = ROOT / ".mutants"
CACHE = STATE / "explore.json"
# The protocol's modules: what the explorer must see broken (issue: the
# retry-ordering protocol's state machines and where outcomes settle).
PROTOCOL = (
    "pipeline/producer/_stages/partition_producer.py",
    "pipeline/producer/_stages/broker_producer.py",
    "pipeline/producer/_stages/topic_producer.py",
    "pipeline/producer/_stages/accumulator.py",
    "pipeline/producer/_stages/idempotence.py",
    "pipeline/producer/_outcomes/ledger.py",
)
BUDGET = 1000
SEED = 50_000
# A schedule runs in ~0.1 s of CPU; one of a mutant that hangs ends here (a
# HangError: a violation, as it is in `make explore`).
SCHEDULE_LIMIT = 10.0
# Sources whose change changes every verdict.
EXPLORER = ("pipeline/testing/explore", "pipeline/testing/fake")


def _module_name(file: str) -> str:
    return file.removesuffix(".py").replace("/", ".")


class _Served(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves one module's (mutated) source from memory."""

    def __init__(self, name: str, path: Path, source: str) -> None:
        self.name, self.path, self.source = name, path, source

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(compile(self.source, str(self.path), "exec"), module.__dict__)


def explore_mutant(file: str, source: str, seed: int, budget: int,
                   only: list[int] | None = None) -> dict[str, Any]:
    """In this process (a fresh child): import pipeline with ``file`` served as
    ``source``, run the sweep's schedules seed, seed+1, ... (of them, ``only``
    these positions, when given) until one violates an invariant."""
    assert not any(m == "pipeline" or m.startswith("pipeline.") for m in sys.modules)
    sys.meta_path.insert(0, _Served(_module_name(file), ROOT / file, source))
    import logging

    from pipeline.testing.explore import check, run_schedule
    from pipeline.testing.explore.sweep import teeth_schedule

    logging.getLogger("pipeline").setLevel(logging.CRITICAL)
    t0 = time.perf_counter()
    positions = range(budget) if only is None else only
    for ran, i in enumerate(positions, 1):
        schedule = teeth_schedule(seed, i)
        violations = check(run_schedule(schedule, real_time_limit=SCHEDULE_LIMIT))
        if violations:
            return {"status": "found", "schedules": i + 1, "ran": ran, "seed": schedule.seed,
                    "violation": str(violations[0])[:300],
                    "seconds": round(time.perf_counter() - t0, 2)}
    return {"status": "missed", "schedules": budget, "ran": len(positions),
            "seconds": round(time.perf_counter() - t0, 2)}


# -- which schedules run which lines --------------------------------------------------
# A mutant can change a schedule's run only if the run executes the mutated code:
# otherwise the two runs are the same, step for step (a schedule is one
# interleaving). So each mutant runs only the sweep's schedules that execute a
# line of its change, in sweep order; a schedule it skips could not have found it.
# The map comes from one run of the unmutated sweep with a line tracer on the
# protocol's files (sys.settrace, in the mapping process only).

def trace_lines(seed: int, positions: list[int]) -> dict[str, dict[int, list[int]]]:
    """{file: {line: [positions of the schedules that ran it]}} (in this process)."""
    import logging

    from pipeline.testing.explore import run_schedule
    from pipeline.testing.explore.sweep import teeth_schedule

    logging.getLogger("pipeline").setLevel(logging.CRITICAL)
    files = {str(ROOT / f): f for f in PROTOCOL}
    seen: set[tuple[str, int]] = set()

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            seen.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def hook(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename in files else None

    lines: dict[str, dict[int, list[int]]] = {f: {} for f in PROTOCOL}
    for i in positions:
        schedule = teeth_schedule(seed, i)
        seen.clear()
        sys.settrace(hook)
        try:
            run_schedule(schedule, real_time_limit=SCHEDULE_LIMIT * 3)
        finally:
            sys.settrace(None)
        for path, line in seen:
            lines[files[path]].setdefault(line, []).append(i)
    return lines


def line_map(seed: int, budget: int, jobs: int, explorer: str,
             sources: dict[str, str]) -> dict[str, dict[int, list[int]]]:
    """The sweep's line map, from .mutants/ or made now (``jobs`` processes)."""
    h = hashlib.sha256(f"{seed}|{budget}|{explorer}".encode())
    for f in PROTOCOL:
        h.update(sources[f].encode())
    path = STATE / f"explore-lines-{h.hexdigest()[:16]}.json"
    if path.exists():
        return {f: {int(k): v for k, v in d.items()} for f, d in
                json.loads(path.read_text()).items()}
    print(f"mapping which protocol lines each of the {budget} schedules runs "
          f"({jobs} processes, once per version of the code)...", flush=True)
    t0 = time.perf_counter()
    tools = str(ROOT / "tools")
    procs = []
    for j in range(jobs):
        part = STATE / f"explore-lines-part{j}.json"
        code = (f"import sys, json; sys.path.insert(0, {tools!r}); import mutants_explore as m; "
                f"open({str(part)!r}, 'w').write(json.dumps(m.trace_lines({seed}, "
                f"list(range({j}, {budget}, {jobs})))))")
        procs.append((part, subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)))
    merged: dict[str, dict[int, list[int]]] = {f: {} for f in PROTOCOL}
    for part, proc in procs:
        if proc.wait() != 0:
            raise SystemExit("mapping the sweep's lines failed")
        for f, d in json.loads(part.read_text()).items():
            for line, where in d.items():
                merged[f].setdefault(int(line), []).extend(where)
        part.unlink()
    for d in merged.values():
        for where in d.values():
            where.sort()
    path.write_text(json.dumps(merged))
    print(f"mapped in {time.perf_counter() - t0:.0f}s", flush=True)
    return merged


def relevant(m: mutants.Mutant, lines: dict[str, dict[int, list[int]]]) -> list[int] | None:
    """The sweep positions whose runs execute a line of ``m`` (None: every one, for
    code that runs at import: module and class bodies)."""
    if not m.function:
        return None
    where: set[int] = set()
    for line in range(m.start[0], m.end[0] + 1):
        where.update(lines[m.file].get(line, ()))
    return sorted(where)


# -- the fork server ------------------------------------------------------------

def serve() -> None:
    """A worker: reads one JSON request a line, forks a child per mutant, replies."""
    import gc

    import trio
    import trio.testing  # noqa: F401

    gc.collect()
    gc.freeze()
    for raw in sys.stdin:
        request = json.loads(raw)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read)
                os.setpgid(0, 0)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                result = explore_mutant(request["file"], request["source"], request["seed"],
                                        request["budget"], request.get("only"))
                os.write(write, json.dumps(result).encode())
                code = 0
            except BaseException as exc:
                os.write(write, json.dumps({"status": "error", "error": repr(exc)[:300]}).encode())
            finally:
                os._exit(code)
        os.close(write)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        deadline = time.monotonic() + request["timeout"]
        chunks: list[bytes] = []
        status: dict[str, Any] | None = None
        while True:
            ready, _, _ = select.select([read], [], [], 0.2)
            if ready:
                chunk = os.read(read, 65536)
                if chunk:
                    chunks.append(chunk)
                    continue
                os.waitpid(pid, 0)
                break
            if time.monotonic() > deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                status = {"status": "slow", "seconds": request["timeout"]}
                break
        os.close(read)
        if status is None:
            text = b"".join(chunks).decode()
            status = json.loads(text) if text else {"status": "error", "error": "no reply"}
        sys.stdout.write(json.dumps(status) + "\n")
        sys.stdout.flush()


class Worker:
    def __init__(self) -> None:
        tools = str(ROOT / "tools")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             f"import sys; sys.path.insert(0, {tools!r}); import mutants_explore; "
             "mutants_explore.serve()"],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True,
        )

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"status": "error", "error": "worker died"}

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


# -- which mutants ----------------------------------------------------------------

def killed_by_suite() -> dict[str, str] | None:
    """The deterministic run's verdicts ({ident: status}), when ``make mutants`` left them."""
    path = STATE / "results.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {ident: str(entry.get("status")) for ident, entry in data.items()}


def select_mutants(only: str | None) -> tuple[list[mutants.Mutant], int]:
    """The protocol's mutants the deterministic suite kills, and how many were
    left out as equivalent (or not killed)."""
    equivalents = mutants.load_equivalents()
    verdicts = killed_by_suite()
    chosen: list[mutants.Mutant] = []
    left_out = 0
    for file in PROTOCOL:
        if only and file != only:
            continue
        for m in mutants.collect(file):
            if m.key in equivalents:
                left_out += 1
            elif verdicts is not None and verdicts.get(m.ident) not in (
                    None, "killed", "timeout", "crashed"):
                left_out += 1
            else:
                chosen.append(m)
    return chosen, left_out


def earlier_finding(cache: dict[str, dict[str, Any]], m: mutants.Mutant, seed: int,
                    budget: int) -> int | None:
    """The sweep position (0-based) of a schedule that found ``m`` with another version
    of the explorer (same seed and budget), if any."""
    for ident, entry in cache.items():
        if (ident.startswith(f"{m.ident}|") and ident.endswith(f"|{seed}|{budget}")
                and entry.get("status") == "found"):
            return int(entry["schedules"]) - 1
    return None


def _explorer_hash() -> str:
    h = hashlib.sha256()
    for top in EXPLORER:
        for path in sorted((ROOT / top).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


# -- the run -------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--budget", type=int, default=BUDGET)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--only", help="one protocol file")
    parser.add_argument("--sample", type=int, help="a seeded random sample of N mutants")
    parser.add_argument("--keys", metavar="FILE", help="only the mutants whose keys FILE lists")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--rerun", action="store_true", help="ignore cached results")
    parser.add_argument("--try", dest="try_key", metavar="KEY",
                        help="explore one mutant here, verbosely")
    args = parser.parse_args()

    chosen, left_out = select_mutants(args.only)
    if args.keys:
        wanted = set(Path(args.keys).read_text().splitlines())
        chosen = [m for m in chosen if m.key in wanted]
    if args.sample:
        chosen = sorted(random.Random(args.sample).sample(chosen, min(args.sample, len(chosen))),
                        key=lambda m: (PROTOCOL.index(m.file), m.line))
    if args.list:
        for m in chosen:
            print(m.label)
        print(f"{len(chosen)} mutants ({left_out} equivalent or not killed left out)")
        return
    sources = {f: (ROOT / f).read_text() for f in PROTOCOL}
    if args.try_key:
        (m,) = [m for m in chosen if m.key == args.try_key]
        print(json.dumps(explore_mutant(m.file, mutants.mutate_source(sources[m.file], m),
                                        args.seed, args.budget)))
        return
    STATE.mkdir(exist_ok=True)
    cache: dict[str, dict[str, Any]] = (
        {} if args.rerun or not CACHE.exists() else json.loads(CACHE.read_text()))
    explorer = _explorer_hash()
    results: dict[str, dict[str, Any]] = {}  # by key, this run's selection
    fresh: dict[str, dict[str, Any]] = {}  # by ident, measured now
    todo: list[tuple[mutants.Mutant, str]] = []
    for m in chosen:
        # The mutant's own content ident (tools/mutants.py) and everything else a
        # verdict depends on: the explorer's and the fake's code, the seed, the budget.
        ident = f"{m.ident}|{explorer}|{args.seed}|{args.budget}"
        hit = cache.get(ident)
        if hit is not None:
            results[m.key] = hit
        else:
            todo.append((m, ident))
    print(f"{len(chosen)} mutants ({left_out} equivalent or not killed left out), "
          f"{len(chosen) - len(todo)} cached, {len(todo)} to explore with {args.jobs} "
          f"workers, budget {args.budget} schedules from seed {args.seed}", flush=True)
    lines = line_map(args.seed, args.budget, args.jobs, explorer, sources) if todo else {}
    workers = [Worker() for _ in range(args.jobs)]
    free = list(workers)
    started = time.perf_counter()
    done = 0

    def explore(m: mutants.Mutant, only: list[int] | None) -> dict[str, Any]:
        worker = free.pop()
        try:
            return worker.run({
                "file": m.file, "source": mutants.mutate_source(sources[m.file], m),
                "seed": args.seed, "budget": args.budget, "only": only,
                "timeout": (args.budget if only is None else len(only)) * 2.0 + 120,
            })
        finally:
            free.append(worker)

    def job(item: tuple[mutants.Mutant, str]) -> None:
        nonlocal done
        m, ident = item
        only = relevant(m, lines)
        before = earlier_finding(cache, m, args.seed, args.budget)
        result: dict[str, Any] | None = None
        if only == []:  # no schedule of the sweep runs its code
            result = {"status": "missed", "schedules": args.budget, "ran": 0,
                      "seconds": 0.0, "unreached": True}
        elif before is not None and (only is None or before in only):
            # Found before (another version of the explorer) by schedule `before`:
            # that schedule alone first; a violation there is a finding within the
            # budget (its position an upper bound of the first).
            result = explore(m, [before])
            if result["status"] == "found":
                result["confirmed"] = True
            else:
                result = None
        if result is None:
            result = explore(m, only)
        result["key"] = m.key
        result["file"] = m.file
        results[m.key] = result
        fresh[ident] = result
        done += 1
        what = (f"found by schedule {result['schedules']} ({result.get('ran')} run): "
                f"{result.get('violation', '')[:90]}" if result["status"] == "found"
                else f"{result['status']} ({result.get('ran')} of its schedules run)")
        print(f"[{done}/{len(todo)} {time.perf_counter() - started:.0f}s] {m.label} -> {what}",
              flush=True)
        if done % 10 == 0:
            CACHE.write_text(json.dumps({**cache, **fresh}, indent=0))

    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(job, todo))
    finally:
        for w in workers:
            w.close()
        CACHE.write_text(json.dumps({**cache, **fresh}, indent=0))
    print(report(chosen, results))


def report(chosen: list[mutants.Mutant], results: dict[str, dict[str, Any]]) -> str:
    rows: dict[str, list[int]] = {}
    found_after: list[int] = []
    missed: list[str] = []
    for m in chosen:
        r = results[m.key]
        counts = rows.setdefault(m.file, [0, 0])
        counts[0] += 1
        if r["status"] == "found":
            counts[1] += 1
            found_after.append(int(r["schedules"]))
        else:
            missed.append(f"{r['status']}: {m.label}")
    lines = ["| module | mutants | found | missed | score |", "|---|---|---|---|---|"]
    total = [0, 0]
    for file, (n, f) in rows.items():
        total = [total[0] + n, total[1] + f]
        lines.append(f"| `{file}` | {n} | {f} | {n - f} | {100 * f / n:.1f}% |")
    n, f = total
    lines.append(f"| total | {n} | {f} | {n - f} | {100 * f / max(n, 1):.1f}% |")
    found_after.sort()
    if found_after:
        median = found_after[len(found_after) // 2]
        lines.append(f"\nfound after a median of {median} schedules "
                     f"(90th percentile {found_after[int(len(found_after) * 0.9)]})")
    if missed:
        lines.append(f"\n{len(missed)} missed:\n" + "\n".join(missed))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
