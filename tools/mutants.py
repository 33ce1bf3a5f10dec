"""Mutation testing of the ordering-critical producer code and of the group
consumer: ``make mutants``.

A small AST mutation runner (mutmut-style, built for this repository): it
changes one thing at a time in the target code, runs the deterministic tests
that execute the changed function, and counts the mutant *killed* when a test
fails (or the run times out: a mutant that makes the pipeline spin or hang is
caught too), *survived* when they all pass.

Why our own and not mutmut: mutmut 3 rewrites every function into a
trampoline that dispatches on an environment variable at each call, which
puts a lookup on the producer's per-message hot path and on every trio task
step, and runs its own copy of the tree; here each mutant is a plain source
edit in a scratch copy, so the tests run the same code they run in CI.

Suites (``SUITES``): the producer's targets are judged by ``tests/scenarios``
and ``tests/producer``, the consumer's by ``tests/consumer`` (fake cluster,
virtual time), the connection writer's by ``tests/cluster`` (its own tests use
real sockets and real time). Each suite has its own map and its own content
hash: editing a consumer test reruns no producer mutant.

How it runs (2 cores):

1. ``map``: a suite's tests run once under ``sys.setprofile`` (a pytest
   plugin in this file); for each test it records which target functions ran.
   Cached by the hash of the suite's sources and tests.
2. For each mutant, only the tests that ran its function (all tests touching
   the module, for module-level code), ``-x`` (stop at the first failure),
   with a wall-clock timeout of 3x their unmutated time + 20 s. Workers run
   in parallel, each in its own scratch copy of the tree. Each worker is a
   ``ForkServer``: it imports pytest, trio and hypothesis once and forks a
   child per mutant that runs ``pytest.main`` in the scratch copy (so
   ``pipeline`` is imported from the mutated file, nothing is patched in
   memory); ``--no-fork`` starts a fresh interpreter per mutant instead, and
   ``--compare N`` runs N sampled mutants both ways and checks the verdicts
   agree (docs/testing.md, "Mutation testing").
3. Results are cached per mutant, keyed on content (``Mutant.ident``: the text
   of the function or class the mutant is in, and the change), never on a path
   or a line: a moved file's results carry over. A result stands while its
   suite's targets' and tests' contents are unchanged; a survivor listed as
   equivalent stands while its function's text is. So a rerun only runs
   mutants whose code or tests changed (a killed one with its last killer
   first).

Keys: a mutant is named ``file::scope: kind: before -> after [n]``, where
scope is the qualname of the innermost enclosing function or class
(``<module>`` outside both) and ``[n]`` (n >= 2) counts the same change
earlier in that scope, in source order. No line number: the key stays when
code above it moves; ``--list`` and the reports show the line beside it.

Mutations: comparison operators (< <= > >= == != is/is not, in/not in),
and/or, dropping ``not``, +/- and an int constant +/- 1, True/False, an if or
while condition forced to True/False, and deleting a statement (an
assignment, augmented assignment or call statement). Not mutated: docstrings,
logging calls, ``assert`` statements (they check invariants, they are not
guards: see docs/architecture.md), type annotations and TYPE_CHECKING blocks.

Equivalent mutants (no test can kill them) are listed, with the reason, in
``tools/mutants_equivalent.txt`` (``key | reason``); the score is reported
with and without them, and entries that match no mutant are reported. docs/testing.md has the current table.

Usage::

    python tools/mutants.py [--jobs 2] [--only FILE] [--functions A,B] [--list] [--rerun]
                            [--no-fork] [--compare N] [--try KEY TEST...]
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".mutants"
EQUIVALENT = ROOT / "tools" / "mutants_equivalent.txt"

# file -> functions to mutate (None: the whole module)
PRODUCER_TARGETS: dict[str, set[str] | None] = {
    "pipeline/producer/_stages/partition_producer.py": None,
    "pipeline/producer/_stages/broker_producer.py": None,
    "pipeline/producer/_stages/accumulator.py": None,
    "pipeline/producer/_stages/topic_producer.py": None,
    "pipeline/producer/_stages/idempotence.py": None,
    # orders each burst by topic and starts the topic producers (it makes their inboxes)
    "pipeline/producer/_stages/dispatcher.py": None,
    # where partition producers and broker producers are made, once each
    "pipeline/producer/_stages/core.py": {
        "ProducerCore.partition_inbox",
        "ProducerCore.broker_producer",
    },
    "pipeline/producer/_outcomes/ledger.py": None,
    # the send() hot path
    "pipeline/producer/_intake/normalize.py": {
        "prefix_size",
        "normalize",
    },
    "pipeline/producer/_intake/intake.py": {
        "Intake.send",
        "Intake._enqueue_nowait",
        "Intake._accept_alone",
        "Intake.close_burst",
        "Intake._open_rows",
        "Intake.close_rows",
    },
    # the settled awaits' schedule budget, restarted by send()'s schedule point
    "pipeline/producer/_outcomes/delivery.py": {"_restart_schedule_py"},
    # send() bursts as columns
    "pipeline/producer/_columnar/burst.py": None,
    "pipeline/producer/_columnar/row_outcomes.py": None,
    # where a burst's runs take their rows and wire positions (keyed send() rows)
    "pipeline/producer/_columnar/rows.py": {"assign_rows", "split_run_batch"},
    # send_many's messages as rows (take, accept, settle: the twins of _send.c's)
    "pipeline/producer/_columnar/messages.py": None,
    "pipeline/producer/_intake/bulk.py": {"Bulk.send_many", "Bulk._send_rows"},
    # which send() a producer gets: Intake.send or the C Sender (_send.c, mutated by
    # hand: tools/mutants_c.py). Its import-time loader maps to no test (it runs
    # before any): deleting its setup() or registrations fails every C-path test.
    "pipeline/producer/_intake/send_path.py": {"use", "entry"},
    # the transaction state machine and the coordinator it talks to
    "pipeline/producer/_stages/transactions.py": None,
    "pipeline/producer/_stages/coordinator.py": None,
}
# The group consumer: fetch sessions, positions, commits, the coordinator and
# heartbeats, both group protocols (classic and KIP-848) and the assignors.
CONSUMER_TARGETS: dict[str, set[str] | None] = {
    "pipeline/consumer/_fetcher.py": None,
    "pipeline/consumer/_commits.py": None,
    "pipeline/consumer/_coordinator.py": None,
    "pipeline/consumer/_liveness.py": None,
    "pipeline/consumer/_member.py": None,
    "pipeline/consumer/_member848.py": None,
    "pipeline/consumer/_assignors.py": None,
    "pipeline/consumer/_sticky.py": None,
    "pipeline/consumer/_positions.py": None,
    "pipeline/consumer/_state.py": None,
}


# A connection's writes: the native writer's Python side (the C side: tools/mutants_c.py)
# and trio's write, its twin.
CLUSTER_TARGETS: dict[str, set[str] | None] = {
    "pipeline/cluster/transport.py": {
        "send_parts", "_broken", "FrameWriter.__init__", "FrameWriter.threaded",
        "FrameWriter.write", "FrameWriter._until_written", "FrameWriter.close", "_Closed.reap",
    },
}


@dataclass(frozen=True)
class Suite:
    """Targets and the deterministic tests that judge their mutants. Each suite
    has its own coverage map and its own content hash (``_tree_files``), so a
    change to the consumer's code or tests reruns none of the producer's
    mutants, and the other way round."""

    name: str
    targets: dict[str, set[str] | None]
    tests: list[str]


SUITES = [
    Suite("producer", PRODUCER_TARGETS, ["tests/scenarios", "tests/producer"]),
    Suite("consumer", CONSUMER_TARGETS, ["tests/consumer"]),
    Suite("cluster", CLUSTER_TARGETS, ["tests/cluster"]),
]
TARGETS: dict[str, set[str] | None] = {
    file: only for suite in SUITES for file, only in suite.targets.items()
}


def suite_of(file: str) -> Suite:
    return next(suite for suite in SUITES if file in suite.targets)


PYTEST = [
    "-q", "-x", "-p", "no:cacheprovider", "--hypothesis-seed=1",
    "-W", "ignore::pytest.PytestUnraisableExceptionWarning",
]
# The fork runner only (see serve): hypothesis is imported before pytest starts.
FORK_PYTEST = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
COPY = ["pipeline", "tests/conftest.py", "tests/scenarios", "tests/protocol",
        "tests/producer", "tests/consumer", "tests/cluster", "pyproject.toml"]


@dataclass(frozen=True)
class Mutant:
    file: str
    line: int  # for display only: not part of the key, nor of the cache's ident
    function: str  # qualname of the enclosing function, "" at module level
    # qualname of the innermost enclosing function or class, "<module>" outside
    # both: the key's anchor (it moves with the code, a line number does not)
    scope: str
    kind: str
    before: str
    after: str
    start: tuple[int, int]  # (line, col) of the replaced span, 1-based line
    end: tuple[int, int]
    replacement: str
    # The source the mutant lives in: its scope's whole definition (decorators
    # included), or the top-level statement for module-level code, and the
    # line that text starts on. The cache's ident hashes it, not the path.
    unit: str = ""
    unit_line: int = 1
    # 2, 3...: the same change again later in the same scope (e.g. both -1s of
    # ``f(-1, -1)``, or two ``x = None`` in one function), in source order, so
    # that every mutant has its own key.
    nth: int = 1

    @property
    def key(self) -> str:
        """``file::scope: kind: before -> after [nth]``: no line number, so the
        key survives code moving within its file, and follows a moved file once
        its path is changed."""
        suffix = f" [{self.nth}]" if self.nth > 1 else ""
        return f"{self.file}::{self.scope}: {self.kind}: {self.before} -> {self.after}{suffix}"

    @property
    def label(self) -> str:
        """The key with the line the mutant is on now (for people, not for lookups)."""
        return f"{self.key}  (line {self.line})"

    @property
    def ident(self) -> str:
        """The cache's key: what the mutant changes, in which source. Neither the
        path nor the line: a moved file's (or function's) results carry over
        while its scope's text is the same; any edit of that text reruns them."""
        h = hashlib.sha256()
        for part in (
            self.scope, self.unit, self.kind, self.replacement,
            f"{self.start[0] - self.unit_line}:{self.start[1]}",
            f"{self.end[0] - self.unit_line}:{self.end[1]}",
        ):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:24]


# -- generating mutants -----------------------------------------------------

_CMP_SWAP: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_CMP_FLIP: dict[type, type] = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt}
_BIN_SWAP: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add}


def _is_log_call(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return False
    func = stmt.value.func
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and (
        func.value.id in ("log", "logger", "logging")
    )


class _Collector(ast.NodeVisitor):
    def __init__(self, file: str, source: str, only: set[str] | None) -> None:
        self.file = file
        self.lines = source.splitlines(keepends=True)
        self.only = only
        self.scope: list[str] = []
        self.functions: list[str] = []
        # (qualname, first line, last line) of each enclosing def or class; at
        # module level the top-level statement being visited
        self.units: list[tuple[str, int, int]] = []
        self.mutants: list[Mutant] = []

    # scope tracking
    def visit_Module(self, node: ast.Module) -> None:
        for stmt in node.body:
            self.units.append(("<module>", *_extent(stmt)))
            self.visit(stmt)
            self.units.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.units.append((".".join(self.scope), *_extent(node)))
        self.generic_visit(node)
        self.units.pop()
        self.scope.pop()

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # As co_qualname spells it: a function inside a function is "f.<locals>.g".
        self.scope.append(f"<locals>.{node.name}" if self.functions else node.name)
        self.functions.append(".".join(self.scope))
        self.units.append((self.functions[-1], *_extent(node)))
        for stmt in node.body:
            self.visit(stmt)
        self.units.pop()
        self.scope.pop()
        self.functions.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
            return
        self._condition(test)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        self._condition(node.test)
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        return  # invariant checks, not guards

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            if self._function():
                self._delete(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # docstring
        if _is_log_call(node):
            return
        self.generic_visit(node)
        if isinstance(node.value, ast.Call | ast.Await) and self._function():
            self._delete(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        if self._function():
            self._delete(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.generic_visit(node)
        if isinstance(node.op, ast.Add | ast.Sub):
            swapped = ast.AugAssign(node.target, _BIN_SWAP[type(node.op)](), node.value)
            self._add(node, "augassign", ast.unparse(swapped), statement=True)
        if self._function():
            self._delete(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        self.generic_visit(node)
        for i, op in enumerate(node.ops):
            for table, kind in ((_CMP_SWAP, "compare"), (_CMP_FLIP, "compare-flip")):
                new = table.get(type(op))
                if new is None:
                    continue
                ops = list(node.ops)
                ops[i] = new()
                self._add(node, kind, ast.unparse(ast.Compare(node.left, ops, node.comparators)))

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        self.generic_visit(node)
        new = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self._add(node, "boolop", ast.unparse(ast.BoolOp(new, node.values)))

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            self._add(node, "drop-not", ast.unparse(node.operand))

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self.generic_visit(node)
        new = _BIN_SWAP.get(type(node.op))
        if new is not None:
            self._add(node, "binop", ast.unparse(ast.BinOp(node.left, new(), node.right)))

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bool):
            self._add(node, "bool", repr(not value))
        elif isinstance(value, int):
            self._add(node, "int+1", repr(value + 1))
            if value != 0:
                self._add(node, "int-1", repr(value - 1))

    def visit_arguments(self, node: ast.arguments) -> None:
        return  # defaults and annotations

    def visit_arg(self, node: ast.arg) -> None:
        return

    # helpers
    def _function(self) -> str:
        return self.functions[-1] if self.functions else ""

    def _selected(self) -> bool:
        if self.only is None:
            return True
        return bool(self.functions) and self.functions[-1] in self.only

    def _condition(self, test: ast.expr) -> None:
        self._add(test, "condition-true", "True")
        self._add(test, "condition-false", "False")

    def _delete(self, node: ast.stmt) -> None:
        self._add(node, "delete", "pass", statement=True)

    def _add(self, node: ast.AST, kind: str, replacement: str, statement: bool = False) -> None:
        if not self._selected():
            return
        start = (node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = (node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        before = _span(self.lines, start, end)
        text = replacement if statement else f"({replacement})"
        if " ".join(before.split()) == " ".join(replacement.split()):
            return
        scope, first, last = self.units[-1]
        self.mutants.append(Mutant(
            self.file, node.lineno, self._function(), scope, kind,  # type: ignore[attr-defined]
            _short(before), _short(replacement), start, end, text,
            unit="".join(self.lines[first - 1:last]), unit_line=first,
        ))


def _extent(node: ast.stmt) -> tuple[int, int]:
    """First and last line of a statement, a definition's decorators included."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return first, node.end_lineno or node.lineno


def _span(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    (l1, c1), (l2, c2) = start, end
    if l1 == l2:
        return lines[l1 - 1][c1:c2]
    return lines[l1 - 1][c1:] + "".join(lines[l1:l2 - 1]) + lines[l2 - 1][:c2]


def _short(text: str, width: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def mutate_source(source: str, mutant: Mutant) -> str:
    lines = source.splitlines(keepends=True)
    (l1, c1), (l2, c2) = mutant.start, mutant.end
    head = "".join(lines[: l1 - 1]) + lines[l1 - 1][:c1]
    tail = lines[l2 - 1][c2:] + "".join(lines[l2:])
    return head + mutant.replacement + tail


def collect(only_file: str | None = None, functions: set[str] | None = None) -> list[Mutant]:
    mutants: list[Mutant] = []
    for file, only in TARGETS.items():
        if only_file and file != only_file:
            continue
        if functions:
            only = functions if only is None else only & functions
        source = (ROOT / file).read_text()
        collector = _Collector(file, source, only)
        collector.visit(ast.parse(source))
        seen: dict[str, int] = {}
        for m in collector.mutants:
            compile(mutate_source(source, m), file, "exec")  # every mutant must compile
            seen[m.key] = n = seen.get(m.key, 0) + 1
            mutants.append(m if n == 1 else replace(m, nth=n))
    idents: dict[str, Mutant] = {}
    for m in mutants:
        # Two targets with a scope of the same name and text would share results.
        other = idents.setdefault(m.ident, m)
        if other is not m:
            raise SystemExit(f"two mutants with one ident: {other.label} and {m.label}")
    return mutants


# -- the coverage map (which tests run which functions) -------------------------

class MapPlugin:
    """pytest plugin: per test, the target functions that ran (sys.setprofile)."""

    def __init__(self, out: str, targets: list[str]) -> None:
        self.out = out
        self.base = os.getcwd()  # the scratch copy the tests run in
        self.files = {os.path.join(self.base, f) for f in targets}
        self.current: set[str] | None = None
        self.result: dict[str, list[str]] = {}
        self.durations: dict[str, float] = {}
        self._t0 = 0.0

    def _profile(self, frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and self.current is not None:
            code = frame.f_code
            if code.co_filename in self.files:
                self.current.add(f"{os.path.relpath(code.co_filename, self.base)}::{code.co_qualname}")

    def pytest_runtest_setup(self, item):  # type: ignore[no-untyped-def]
        self.current = set()
        self._t0 = time.perf_counter()
        sys.setprofile(self._profile)

    def pytest_runtest_teardown(self, item, nextitem):  # type: ignore[no-untyped-def]
        # Teardown (closing producers) counts: it runs the code too.
        pass

    def pytest_runtest_logfinish(self, nodeid, location):  # type: ignore[no-untyped-def]
        sys.setprofile(None)
        if self.current is not None:
            self.result[nodeid] = sorted(self.current)
            self.durations[nodeid] = time.perf_counter() - self._t0
        self.current = None

    def pytest_sessionfinish(self, session, exitstatus):  # type: ignore[no-untyped-def]
        Path(self.out).write_text(json.dumps(
            {"functions": self.result, "durations": self.durations}, indent=0
        ))


class TimeoutPlugin:
    """pytest plugin for mutant runs: a test that runs past 3x its unmutated time
    + 10 s ends the process (faulthandler, exit status 1: the mutant is killed),
    so a mutant that hangs the first test costs seconds, not the whole budget."""

    def __init__(self, durations: str, killer: str | None = None) -> None:
        self.durations: dict[str, float] = json.loads(Path(durations).read_text())
        self.killer = killer  # where to write the id of the first failing test

    def pytest_runtest_logreport(self, report):  # type: ignore[no-untyped-def]
        if report.failed and self.killer and not os.path.exists(self.killer):
            Path(self.killer).write_text(report.nodeid)

    def pytest_runtest_setup(self, item):  # type: ignore[no-untyped-def]
        import faulthandler

        limit = 3 * self.durations.get(item.nodeid, 5.0) + 10
        faulthandler.dump_traceback_later(limit, exit=True, file=sys.__stderr__ or 2)

    def pytest_runtest_logfinish(self, nodeid, location):  # type: ignore[no-untyped-def]
        import faulthandler

        faulthandler.cancel_dump_traceback_later()


def _tree_files(suite: Suite) -> list[Path]:
    """A suite's targets and tests (in this order: the producer's hashes are
    what they were before the consumer suite, so its cached results hold)."""
    patterns = [*suite.targets, *(f"{t}/**/*.py" for t in suite.tests), "tests/conftest.py"]
    return [path for pattern in patterns for path in sorted(ROOT.glob(pattern))]


def _tree_hash(suite: Suite) -> str:
    """The coverage map's key: the suite's targets and tests, paths included
    (the map names tests and functions by path)."""
    h = hashlib.sha256()
    for path in _tree_files(suite):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _content_hash(suite: Suite) -> str:
    """What a killed mutant's result depends on: its suite's targets' and tests'
    contents, not their paths (a moved file with the same text keeps it)."""
    digests = sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in _tree_files(suite))
    return hashlib.sha256("".join(digests).encode()).hexdigest()[:16]


def _scratch(n: int, prefix: str = "work") -> Path:
    path = STATE / f"{prefix}{n}"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    for item in COPY:
        src = ROOT / item
        dst = path / item
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    return path


def build_map(suite: Suite) -> dict[str, object]:
    cached = STATE / f"map-{_tree_hash(suite)}.json"
    if cached.exists():
        return json.loads(cached.read_text())  # type: ignore[no-any-return]
    print(f"mapping which {suite.name} tests run which functions (one run of {' '.join(suite.tests)})...",
          flush=True)
    work = _scratch(0)
    out = STATE / "map-partial.json"
    tools, args = str(ROOT / "tools"), [*PYTEST[2:], "-q", *suite.tests]
    targets = list(suite.targets)
    code = (
        f"import sys, pytest; sys.path.insert(0, {tools!r}); import mutants; "
        f"sys.exit(pytest.main({args!r}, plugins=[mutants.MapPlugin({str(out)!r}, {targets!r})]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=_env(work))
    if proc.returncode != 0:
        raise SystemExit("the unmutated tests fail: fix them first")
    out.replace(cached)
    return json.loads(cached.read_text())  # type: ignore[no-any-return]


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(work)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    return env


def select_tests(mutant: Mutant, cmap: dict[str, object]) -> list[str]:
    """The tests a mutant runs: those that executed its function; for module-level
    code, those that executed any function of its module, and every test of a test
    file that imports the module (a test that only reads a module constant, as the
    memory estimates' tracemalloc tests do, runs none of its functions)."""
    functions: dict[str, list[str]] = cmap["functions"]  # type: ignore[assignment]
    if mutant.function:
        want = f"{mutant.file}::{mutant.function}"
        return [t for t, fs in functions.items() if want in fs]
    prefix = f"{mutant.file}::"
    module = mutant.file.removesuffix(".py").replace("/", ".")
    return [t for t, fs in functions.items()
            if any(f.startswith(prefix) for f in fs)
            or module in _imported_by(t.split("::", 1)[0])]


@functools.cache
def _imported_by(test_file: str) -> frozenset[str]:
    """The modules ``test_file`` imports by name (``import a.b``, ``from a.b import
    c``: both ``a.b`` and ``a.b.c``), read once."""
    names: set[str] = set()
    path = ROOT / test_file
    tree = ast.parse(path.read_text()) if path.is_file() else ast.Module([], [])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


# -- running mutants ---------------------------------------------------------

def run_one(
    mutant: Mutant, original: str, work: Path, tests: list[str], timeout: float,
    server: ForkServer | None = None, killers: dict[str, int] | None = None,
    first_failure: list[str] | None = None,
) -> tuple[str, float]:
    """Run ``tests`` against ``mutant``. ``killers`` counts, per test, the
    mutants it was the first to fail on: ``main`` runs those tests first (with
    ``-x`` a killed mutant stops at its first failure, and whether any test
    fails does not depend on the order). ``first_failure`` receives the id of
    the test that killed this mutant, when one did."""
    if not tests:
        return "no-tests", 0.0
    target = work / mutant.file
    target.write_text(mutate_source(original, mutant))
    killer = str(work / ".killer")
    if os.path.exists(killer):
        os.unlink(killer)
    t0 = time.perf_counter()
    try:
        if server is not None:
            forked = server.run(tests, timeout, killer)
            if forked is None:
                return "timeout", time.perf_counter() - t0
            return _status(forked), time.perf_counter() - t0
        tools, durations = str(ROOT / "tools"), str(STATE / "durations.json")
        script = (
            f"import sys, pytest; sys.path.insert(0, {tools!r}); import mutants; "
            f"sys.exit(pytest.main({[*PYTEST, *tests]!r}, "
            f"plugins=[mutants.TimeoutPlugin({durations!r}, {killer!r})]))"
        )
        code = _run_bounded([sys.executable, "-c", script], work, timeout, quiet=True)
        if code is None:
            return "timeout", time.perf_counter() - t0
    finally:
        target.write_text(original)
        if os.path.exists(killer):
            first = Path(killer).read_text()
            if killers is not None:
                killers[first] = killers.get(first, 0) + 1
            if first_failure is not None:
                first_failure.append(first)
    return _status(code), time.perf_counter() - t0


def _status(code: int) -> str:
    # 1: a test failed (or the per-test timeout ended the run); < 0: the run
    # crashed on a signal (a mutant can break the interpreter's invariants,
    # e.g. recurse until the C stack overflows): both detect the mutant.
    return (
        "survived" if code == 0 else "killed" if code == 1 else "crashed" if code < 0
        else f"error{code}"
    )


class ForkServer:
    """A worker process that imports pytest, its plugins, trio and hypothesis
    once, then forks one child per mutant; the child runs ``pytest.main`` in
    the scratch copy, so it imports ``pipeline`` (and the tests) afresh from
    the mutated tree, exactly like a new interpreter would. Same command line,
    same plugins, same timeouts as ``run_one``: only the ~2-3 s of interpreter
    and import start-up per mutant go. ``--compare N`` checks on a sample that
    both runners give the same verdicts."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            tools = str(ROOT / "tools")
            self.proc = subprocess.Popen(
                [sys.executable, "-c",
                 f"import sys; sys.path.insert(0, {tools!r}); import mutants; mutants.serve()"],
                cwd=self.work, env=_env(self.work), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                start_new_session=True,
            )
        return self.proc

    def run(self, tests: list[str], timeout: float, killer: str | None = None) -> int | None:
        """The child's exit status (as Popen.returncode spells it), None on timeout."""
        proc = self._start()
        assert proc.stdin is not None
        assert proc.stdout is not None
        durations = str(STATE / "durations.json")
        proc.stdin.write(json.dumps({"tests": tests, "timeout": timeout,
                                     "durations": durations, "killer": killer}) + "\n")
        proc.stdin.flush()
        # The server bounds the child itself; this bounds the server.
        ready, _, _ = select.select([proc.stdout], [], [], timeout + 30)
        line = proc.stdout.readline() if ready else ""
        if not line:
            self.close(kill=True)
            return None
        reply = json.loads(line)
        return None if reply["code"] is None else int(reply["code"])

    def close(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            os.killpg(self.proc.pid, signal.SIGKILL)
        else:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


def serve() -> None:
    """The fork server's loop (stdin: one JSON request a line; stdout: replies)."""
    import gc

    # The heavy imports (hypothesis alone is ~2 s of a ~3 s start-up). Not the
    # plugin modules themselves: pytest marks them for assertion rewriting.
    # hypothesis is in the same distribution as its plugin, so pytest warns
    # that it cannot rewrite it (FORK_PYTEST silences that): its own asserts
    # then fail with plain messages, which changes no verdict.
    import hypothesis  # noqa: F401
    import outcome  # noqa: F401
    import pytest
    import trio.testing  # noqa: F401

    # The children must import the code under test themselves.
    assert not any(m == "pipeline" or m.startswith(("pipeline.", "tests")) for m in sys.modules)
    gc.collect()
    gc.freeze()  # keep the children's copy-on-write pages shared
    for raw in sys.stdin:
        request = json.loads(raw)
        pid = os.fork()
        if pid == 0:  # the child: one pytest run, then out
            code = 1
            try:
                os.setpgid(0, 0)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                code = int(pytest.main(
                    [*PYTEST, *FORK_PYTEST, *request["tests"]],
                    plugins=[TimeoutPlugin(request["durations"], request.get("killer"))],
                ))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                code = 1  # what an uncaught exception exits with
            finally:
                os._exit(code)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # the child did it first (or is gone already)
        deadline = time.monotonic() + request["timeout"]
        result: int | None = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                result = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        sys.stdout.write(json.dumps({"code": result}) + "\n")
        sys.stdout.flush()


def load_equivalents() -> dict[str, str]:
    out: dict[str, str] = {}
    if EQUIVALENT.exists():
        for raw in EQUIVALENT.read_text().splitlines():
            line = raw.strip()
            if line and not line.startswith("#"):
                key, _, reason = line.rpartition(" | ")
                out[key.strip()] = reason.strip()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", help="one target file")
    parser.add_argument("--functions", help="comma-separated qualnames (e.g. BrokerProducer._accept)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--rerun", action="store_true", help="ignore cached results")
    parser.add_argument("--fork", action=argparse.BooleanOptionalAction, default=True,
                        help="run each mutant in a child forked from a warm worker (ForkServer;"
                             " --no-fork: a fresh interpreter per mutant)")
    parser.add_argument("--compare", type=int, metavar="N",
                        help="run N sampled mutants both ways (subprocess, fork) and compare")
    parser.add_argument("--try", dest="try_key", metavar="KEY",
                        help="apply one mutant (its key, as listed) and run the TEST ids given")
    parser.add_argument("--try-timeout", type=float, default=300.0, metavar="S",
                        help="with --try: a run longer than this is a hang, so KILLED (default 300)")
    parser.add_argument("tests", nargs="*", help="with --try: the test ids to run")
    args = parser.parse_args()

    if args.try_key:
        try_mutant(args.try_key, args.tests, args.try_timeout)
        return
    mutants = collect(args.only, set(args.functions.split(",")) if args.functions else None)
    if args.list:
        for m in mutants:
            print(m.label)
        print(f"{len(mutants)} mutants")
        return
    STATE.mkdir(exist_ok=True)
    # Each suite with a selected mutant: its coverage map and its content hash.
    suites = [suite for suite in SUITES if any(m.file in suite.targets for m in mutants)]
    maps = {suite.name: build_map(suite) for suite in suites}
    trees = {suite.name: _content_hash(suite) for suite in suites}
    durations: dict[str, float] = {}
    for cmap in maps.values():
        suite_durations: dict[str, float] = cmap["durations"]  # type: ignore[assignment]
        durations.update(suite_durations)
    (STATE / "durations.json").write_text(json.dumps(durations))
    # ident (Mutant.ident) -> the last result of the mutant with that ident
    cache_path = STATE / "results.json"
    cache: dict[str, dict[str, object]] = {} if args.rerun or not cache_path.exists() else (
        json.loads(cache_path.read_text())
    )
    killers_path = STATE / "killers.json"
    killers: dict[str, int] = (
        json.loads(killers_path.read_text()) if killers_path.exists() else {}
    )
    # Read once: the sources may be edited while the run goes on.
    sources = {f: (ROOT / f).read_text() for f in TARGETS}
    if args.compare:
        compare(mutants, cache, maps, durations, sources, args.compare)
        return

    equivalents = load_equivalents()
    todo: list[tuple[Mutant, list[str], float]] = []
    results: dict[str, dict[str, object]] = {}  # ident -> result
    for m in mutants:
        suite = suite_of(m.file).name
        tree = trees[suite]
        # Fastest first: with -x a killed mutant stops at its first failing test.
        tests = sorted(select_tests(m, maps[suite]), key=lambda t: durations.get(t, 1.0))
        # Results are found by the mutant's ident: its scope's text and the
        # change, not its path or line. A result stands while the targets and
        # the tests of its suite are unchanged (their contents: ``tree``); a survivor listed
        # as equivalent (no test can kill it: that is what the list says, with
        # the reason) stands while its scope's text is unchanged. A killed
        # mutant is rerun when any of them changes, its last killer first: with
        # -x that costs one test while the killer still kills, and the whole
        # selection when it no longer does (keeping kills while the tests
        # changed let six survivors of broker_producer.py go unseen).
        hit = cache.get(m.ident)
        if hit is not None and (
            hit.get("tree") == tree or (hit["status"] == "survived" and m.key in equivalents)
        ):
            results[m.ident] = {**hit, **_where(m)}
            continue
        last_killer = hit.get("killer") if hit is not None else None
        if isinstance(last_killer, str) and last_killer in tests:
            tests = [last_killer] + [t for t in tests if t != last_killer]
        timeout = 3 * sum(durations.get(t, 1.0) for t in tests) + 20
        todo.append((m, tests, timeout))
    print(f"{len(mutants)} mutants, {len(mutants) - len(todo)} cached, {len(todo)} to run "
          f"with {args.jobs} workers", flush=True)

    workers = [(path, ForkServer(path) if args.fork else None)
               for path in (_scratch(n) for n in range(args.jobs))]
    free = list(workers)
    started = time.perf_counter()
    done = 0

    def job(item: tuple[Mutant, list[str], float]) -> None:
        nonlocal done
        m, tests, timeout = item
        work, server = free.pop()
        # The mutant's last killer first (see above), then the tests that killed
        # many mutants, then the fastest.
        last = cache.get(m.ident, {}).get("killer")
        tests = sorted(tests, key=lambda t: (t != last, -killers.get(t, 0),
                                             durations.get(t, 1.0)))
        first_failure: list[str] = []
        try:
            status, seconds = run_one(
                m, sources[m.file], work, tests, timeout, server, killers, first_failure
            )
        finally:
            free.append((work, server))
        results[m.ident] = {"status": status, "seconds": round(seconds, 2),
                            "tree": trees[suite_of(m.file).name],
                            "tests": len(tests), **_where(m)}
        if first_failure:
            results[m.ident]["killer"] = first_failure[0]
        done += 1
        if status != "killed" or done % 25 == 0:
            print(f"[{done}/{len(todo)} {time.perf_counter() - started:.0f}s] {status}: {m.label}",
                  flush=True)
        if done % 10 == 0:
            cache_path.write_text(json.dumps({**cache, **results}, indent=0))
            killers_path.write_text(json.dumps(dict(killers)))

    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(job, todo))
    finally:
        for _, server in workers:
            if server is not None:
                server.close()
    cache_path.write_text(json.dumps({**cache, **results}, indent=0))
    killers_path.write_text(json.dumps(dict(killers)))
    report(mutants, results, time.perf_counter() - started)


def _where(m: Mutant) -> dict[str, object]:
    """What a result records of its mutant, for people reading results.json."""
    return {"key": m.key, "file": m.file, "line": m.line}


def _run_bounded(cmd: list[str], work: Path, timeout: float, *, quiet: bool = False
                 ) -> int | None:
    """Run ``cmd`` in ``work`` in its own process group: its exit code, or None when it
    ran past ``timeout`` (then the whole group is killed: pytest's children too)."""
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(cmd, cwd=work, env=_env(work), stdout=out, stderr=out,
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def try_mutant(key: str, tests: list[str], timeout: float = 300.0) -> None:
    """Run the given tests (verbose) against one mutant in a scratch copy: how a
    new test is checked against the survivor it was written for. ``key`` as
    ``--list`` prints it (the ``(line N)`` after it may be left on). A run past
    ``timeout`` seconds is a hang (a mutant looping at one virtual instant): its
    process group is killed and the mutant counts as killed, as in a full run."""
    key = key.split("  (line ", 1)[0].strip()
    file = key.split("::", 1)[0]
    found = [m for m in collect(file) if m.key == key]
    if len(found) != 1:
        raise SystemExit(f"no mutant has the key {key!r} (python tools/mutants.py --list)")
    (mutant,) = found
    work = _scratch(0, "try")
    source = (ROOT / file).read_text()
    (work / file).write_text(mutate_source(source, mutant))
    code = _run_bounded([sys.executable, "-m", "pytest", *PYTEST[1:], "-q", *tests], work,
                        timeout)
    if code is None:
        print(f"with the mutant applied: KILLED (no result after {timeout:g} s: a hang)")
        sys.exit(0)
    print(f"with the mutant applied: {'KILLED' if code else 'SURVIVES'} (pytest exit {code})")
    sys.exit(0 if code else 1)


def compare(
    mutants: list[Mutant], cache: dict[str, dict[str, object]],
    maps: dict[str, dict[str, object]], durations: dict[str, float],
    sources: dict[str, str], n: int,
) -> None:
    """Run n mutants with both runners, one after the other in one scratch copy,
    and check that they agree. The sample: up to n/2 mutants the cache has as not
    killed, the rest drawn at random (seeded), so both verdicts are exercised."""
    import random

    rng = random.Random(n)
    alive = [m for m in mutants if cache.get(m.ident, {}).get("status") == "survived"]
    sample = rng.sample(alive, min(len(alive), n // 2))
    rest = [m for m in mutants if m not in sample]
    sample += rng.sample(rest, min(len(rest), n - len(sample)))
    work = _scratch(0, "compare")
    server = ForkServer(work)
    totals = [0.0, 0.0]
    mismatches = 0
    try:
        for i, m in enumerate(sample, 1):
            cmap = maps[suite_of(m.file).name]
            tests = sorted(select_tests(m, cmap), key=lambda t: durations.get(t, 1.0))
            timeout = 3 * sum(durations.get(t, 1.0) for t in tests) + 20
            a, ta = run_one(m, sources[m.file], work, tests, timeout)
            b, tb = run_one(m, sources[m.file], work, tests, timeout, server)
            totals[0] += ta
            totals[1] += tb
            mismatches += a != b
            print(f"[{i}/{len(sample)}] subprocess {a} {ta:.1f}s | fork {b} {tb:.1f}s"
                  f"{'  MISMATCH' if a != b else ''} | {m.label}", flush=True)
    finally:
        server.close()
    print(f"{len(sample)} mutants: {mismatches} mismatches; subprocess {totals[0]:.0f}s, "
          f"fork {totals[1]:.0f}s")
    if mismatches:
        sys.exit(1)


def report(mutants: list[Mutant], results: dict[str, dict[str, object]], seconds: float) -> None:
    equivalents = load_equivalents()
    per_file: dict[str, list[int]] = {}
    survivors: list[str] = []
    for m in mutants:
        status = results[m.ident]["status"]
        killed = status in ("killed", "timeout", "crashed")
        equivalent = m.key in equivalents
        counts = per_file.setdefault(m.file, [0, 0, 0])  # total, killed, equivalent
        counts[0] += 1
        counts[1] += killed
        counts[2] += (not killed) and equivalent
        if not killed and not equivalent:
            survivors.append(f"{status}: {m.label}")
    lines = ["file | mutants | killed | equivalent | score | score without equivalents",
             "---|---|---|---|---|---"]
    tot = [0, 0, 0]
    for file, (n, k, e) in per_file.items():
        tot = [tot[0] + n, tot[1] + k, tot[2] + e]
        lines.append(f"{file} | {n} | {k} | {e} | {100 * k / n:.1f}% | {100 * k / max(1, n - e):.1f}%")
    n, k, e = tot
    lines.append(f"total | {n} | {k} | {e} | {100 * k / max(1, n):.1f}% | {100 * k / max(1, n - e):.1f}%")
    text = "\n".join(lines)
    print(text)
    files = {m.file for m in mutants}  # with --only, entries of other files are not stale
    # (with --functions, nor are entries of the file's other functions: compare with all)
    every = {m.key for file in files for m in collect(file)}
    stale = sorted(k for k in set(equivalents) - every if k.split("::", 1)[0] in files)
    if stale:
        print(f"\n{len(stale)} entries of {EQUIVALENT.name} match no mutant any more:")
        print("\n".join(stale))
    if survivors:
        print(f"\n{len(survivors)} surviving mutants (not listed as equivalent):")
        print("\n".join(survivors))
    print(f"\nran in {seconds:.0f}s")
    (STATE / "report.txt").write_text(text + "\n\n" + "\n".join(survivors) + "\n")
    if survivors:
        sys.exit(1)


if __name__ == "__main__":
    main()
