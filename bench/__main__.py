"""``python -m bench [NAME ...]`` (``make bench``): run the benchmark modules.

A benchmark is a module ``bench/<name>_bench.py`` with ``run(**kwargs) -> dict`` (a
JSON-serialisable report) and optionally ``format_table(report) -> str``. ``--quick``
(``make bench-quick``) passes ``quick=True`` to the ``run()`` functions that take a
``quick`` argument (the producer bench: 100k messages, 1 run; latency and export: 1 short
round) and runs the others as usual. ``--broker kafka`` (``make bench BROKER=kafka``) passes
``broker="kafka"`` to the ``run()`` functions that take a ``broker`` argument (producer,
latency, export: a 1-node Apache Kafka instead of the embedded tansu broker, see
``bench/brokers.py``); benchmarks without a broker (the codec) run as usual. Each report is
printed and written to ``bench/results/<name>.json`` (``<name>-kafka.json`` for a Kafka
run, so both sit side by side; these are not committed: a run worth keeping is copied to
``bench/history/`` under a date-first name, with a CHANGELOG entry); a module that is
missing (not written yet) or lacks ``run`` is reported and skipped, so this runner works
while the suite grows. At the end the PNG charts (``bench/charts.py``) are drawn beside the
reports.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import pkgutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
# Run first, in this order; any other bench/*_bench.py found is run after them.
PREFERRED = ["codec", "producer", "latency", "export"]


def discover() -> list[str]:
    found = sorted(
        info.name.removesuffix("_bench")
        for info in pkgutil.iter_modules([str(BENCH_DIR)])
        if info.name.endswith("_bench")
    )
    return [n for n in PREFERRED if n in found] + [n for n in found if n not in PREFERRED]


def _accepts(func: Any, param: str) -> bool:
    try:
        return param in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def run_one(name: str, results_dir: Path, *, quick: bool = False, broker: str = "tansu") -> str:
    """Run ``bench.<name>_bench``; returns "ok", "skipped" or "failed"."""
    module_name = f"bench.{name}_bench"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in (module_name, "bench"):
            print(f"[{name}] skipped: {module_name} does not exist yet")
            return "skipped"
        print(f"[{name}] skipped: missing dependency {exc.name!r} (pip install -e '.[bench]')")
        return "skipped"
    run = getattr(module, "run", None)
    if not callable(run):
        print(f"[{name}] skipped: {module_name} has no run()")
        return "skipped"
    kwargs: dict[str, Any] = {}
    if quick and _accepts(run, "quick"):
        kwargs["quick"] = True
    takes_broker = _accepts(run, "broker")
    if takes_broker:
        kwargs["broker"] = broker
    print(f"[{name}] running {module_name}.run({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
          " ...", flush=True)
    started = time.perf_counter()
    try:
        report: Any = run(**kwargs)
    except Exception:
        traceback.print_exc()
        print(f"[{name}] FAILED")
        return "failed"
    elapsed = time.perf_counter() - started
    formatter = getattr(module, "format_table", None)
    if callable(formatter):
        print(formatter(report))
    else:
        print(json.dumps(report, indent=2, default=str))
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / (f"{name}-{broker}.json" if takes_broker and broker != "tansu"
                         else f"{name}.json")
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"[{name}] done in {elapsed:.1f}s, wrote {out}\n", flush=True)
    return "ok"


def draw_charts(results_dir: Path) -> list[Path]:
    """The PNG charts of whatever reports are in ``results_dir`` (bench/charts.py)."""
    try:
        from bench.charts import draw_all

        written = draw_all(results_dir)
    except ModuleNotFoundError as exc:
        print(f"[charts] skipped: missing dependency {exc.name!r} (pip install -e '.[bench]')")
        return []
    for path in written:
        print(f"[charts] wrote {path}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names", nargs="*", help="benchmarks to run, e.g. codec (default: all found)"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--quick", action="store_true",
                        help="smaller runs where a benchmark supports it (run(quick=True))")
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                        help="the broker of the benchmarks that use one: the embedded tansu "
                             "(default) or a 1-node Apache Kafka (needs java; mvn once)")
    args = parser.parse_args(argv)
    available = discover()
    if args.list:
        print("\n".join(available) or "(none yet)")
        return 0
    names = args.names or available
    if not names:
        print("no benchmark modules yet (bench/*_bench.py)")
        return 0
    started = time.perf_counter()
    outcomes = {name: run_one(name, args.results_dir, quick=args.quick, broker=args.broker)
                for name in names}
    draw_charts(args.results_dir)
    print("summary: " + ", ".join(f"{n}={o}" for n, o in outcomes.items())
          + f" ({time.perf_counter() - started:.0f} s)")
    return 1 if "failed" in outcomes.values() else 0


if __name__ == "__main__":
    sys.exit(main())
