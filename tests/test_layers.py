"""The shape of pipeline/: layer rules and no import cycles.

Read from the source with ``ast`` (nothing is imported). Every import counts:
module level, inside functions, and under ``if TYPE_CHECKING:``, because a
cycle that only the type checker sees is still two modules that cannot be
understood (or split) apart.

The layers (docs/architecture.md)::

    cli                                  (top: may use everything)
    spark                                export_dataframe, the data source
    producer      consumer               the clients
    cluster                              connections, metadata, ClusterConfig
    protocol                             sans-I/O codec
    util                                 backoff, exception groups, statistics fields
    metrics                              statistics as Prometheus text (uses util)
    otel                                 OpenTelemetry interceptors and metrics (above
                                         the clients; nothing in pipeline/ imports it)
    testing                              beside them: uses cluster, protocol, util
    testing.explore                      the schedule explorer: drives the producer
                                         against the fake (above producer and testing;
                                         nothing in pipeline/ imports it)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"

#: layer -> the layers it may import (besides itself)
ALLOWED: dict[str, frozenset[str]] = {
    "util": frozenset(),
    # Avro serializers and the schema-registry client: pure callables users hand to the
    # producer and consumer (which never import it)
    "serde": frozenset(),
    # sans-I/O: not even util (util.groups imports trio); tests/protocol/test_sans_io.py
    "protocol": frozenset(),
    "cluster": frozenset({"protocol", "util"}),
    "producer": frozenset({"cluster", "protocol", "util"}),
    "consumer": frozenset({"cluster", "protocol", "util"}),
    "spark": frozenset({"producer", "consumer", "cluster", "protocol", "util"}),
    "testing": frozenset({"cluster", "protocol", "util"}),
    # exporters of statistics snapshots: they read the fields' own descriptions (util)
    "metrics": frozenset({"util"}),
    # OpenTelemetry: interceptors handed to the clients, their statistics as metrics
    # (imported by nothing in pipeline/)
    "otel": frozenset({"producer", "consumer", "util"}),
    # the schedule explorer (python -m pipeline.testing.explore) runs the producer
    # against the fake cluster: a test harness above both, imported by nothing
    "testing.explore": frozenset({"producer", "testing", "cluster", "protocol", "util"}),
    "cli": frozenset({"spark", "producer", "consumer", "cluster", "protocol", "testing", "util"}),
    # pipeline/__init__.py: the public facade; pipeline/__main__.py: the CLI's entry
    "pipeline": frozenset({"producer", "consumer", "cluster", "protocol", "util"}),
    "__main__": frozenset({"cli"}),
}


#: The public producer is a facade over the intake stage.
FACADE = "producer/_api.py"
FACADE_MAX_LINES = 400
GENERATED = "protocol/messages/"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The pipeline modules ``name`` imports (a name imported from a package
    resolves to its submodule when there is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
    return {m for m in found if m == "pipeline" or m.startswith("pipeline.")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[1:3] == ["testing", "explore"]:
        return "testing.explore"
    return parts[1] if len(parts) > 1 else "pipeline"


def test_every_layer_is_known() -> None:
    assert {_layer(m) for m in MODULES} == set(ALLOWED)


def test_layers_import_only_layers_below_them() -> None:
    bad = sorted(
        f"{module} imports {target} ({_layer(module)} may use "
        f"{sorted(ALLOWED[_layer(module)]) or 'no other layer'})"
        for module, targets in GRAPH.items()
        for target in targets
        if _layer(target) != _layer(module) and _layer(target) not in ALLOWED[_layer(module)]
    )
    assert bad == []


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(component: frozenset[str]) -> str:
    edges = sorted(f"{a} -> {b}" for a in component for b in GRAPH[a] if b in component)
    return "; ".join(edges)


def test_no_import_cycles() -> None:
    """None at all: stages reach their neighbours through the protocols in
    producer/ports.py, and only producer/core.py imports the stages."""
    cycles = [_describe(c) for c in _cycles(GRAPH)]
    assert cycles == [], "import cycle(s), TYPE_CHECKING imports included"


def test_the_checks_see_what_they_must() -> None:
    """The detectors themselves: a TYPE_CHECKING import and a function-level one
    are edges, and a made-up cycle and layer breach are caught."""
    core = GRAPH["pipeline.producer._stages.core"]
    assert "pipeline.cluster.pool" in core  # imported under TYPE_CHECKING only
    assert "pipeline.producer._config" in GRAPH["pipeline.spark.export"]  # inside a function
    fake = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert _cycles(fake) == [frozenset({"a.x", "a.y", "a.z"})]
    assert _layer("pipeline.testing.fake.cluster") == "testing"
    assert _layer("pipeline.testing.explore.runner") == "testing.explore"
    assert not any(_layer(t) == "testing.explore"
                   for m, ts in GRAPH.items() if _layer(m) != "testing.explore" for t in ts)
    assert "testing" not in ALLOWED["spark"] and "cli" not in ALLOWED["producer"]


def test_the_producer_api_is_a_facade() -> None:
    """_api.py delegates (intake, bulk, input acceptance, dispatcher live in their own modules)."""
    lines = len((PACKAGE / FACADE).read_text(encoding="utf-8").splitlines())
    assert lines <= FACADE_MAX_LINES, f"{FACADE} is {lines} lines: move work into a stage"


def test_generated_messages_are_the_only_exception() -> None:
    generated = [m for m in MODULES.values() if str(m.relative_to(PACKAGE)).startswith(GENERATED)]
    assert generated
    assert all("generated by tools/gen_messages.py" in p.read_text()[:200] for p in generated)

