"""The probes and the guard table follow the code: every method a probe wraps
exists, every guard's marker line is in its function, every guard names a test
that exists, and every name a probe marks is a guard (or a state kept for the
reach report)."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from pipeline.testing.explore import probes
from pipeline.testing.explore.guards import GUARDS, Guard

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("target", probes.targets(), ids=lambda t: f"{t[0].split(':')[1]}.{t[1]}")
def test_every_probed_method_exists(target: tuple[str, str]) -> None:
    cls, method = target
    assert method in vars(probes._resolve(cls)), f"{cls}.{method} is gone: update probes.py"


@pytest.mark.parametrize("guard", GUARDS, ids=lambda g: g.name)
def test_every_guard_is_where_the_table_says(guard: Guard) -> None:
    module = importlib.import_module(guard.file.removesuffix(".py").replace("/", "."))
    obj: object = module
    for part in guard.function.split("."):
        obj = getattr(obj, part)
    lines = [line.strip() for line in inspect.getsource(obj).splitlines()]  # type: ignore[arg-type]
    assert any(guard.marker in line for line in lines), (
        f"{guard.name}: {guard.marker!r} is not in {guard.file}::{guard.function} any more: "
        "update guards.py")
    path, _, test = guard.test.partition("::")
    assert (ROOT / path).exists(), guard.test
    if test:
        name = test.split("[")[0]
        assert re.search(rf"def {name}\(", (ROOT / path).read_text()), guard.test


def test_every_guard_has_a_probe_that_marks_it() -> None:
    source = "".join(p.read_text() for p in Path(probes.__file__).parent.glob("probes*.py"))
    marked = set(re.findall(r'w\.reach\("([a-z0-9-]+)"\)', source))
    marked |= set(re.findall(r'"([a-z0-9-]+)" if ', source))
    marked |= set(re.findall(r' else "([a-z0-9-]+)"\)', source))
    missing = {g.name for g in GUARDS} - marked
    assert not missing, f"guards no probe marks: {sorted(missing)}"


def test_the_buffer_admits_exactly_what_fits_or_anything_into_an_empty_buffer() -> None:
    """B1 (probes_buffer.py) on the ledger itself, then on planted admission rules."""
    from pipeline.producer._outcomes.ledger import Ledger
    from pipeline.testing.explore.probes import Watch, watching
    from pipeline.testing.explore.probes_buffer import _admission

    w = Watch()
    with watching(w):
        ledger = Ledger(100, 1.0)
        assert ledger.try_reserve(150)  # alone in an empty buffer
        assert not ledger.try_reserve(1)
        ledger.release(150)
        assert ledger.admit_row(60) and ledger.admit_row(40) and not ledger.admit_row(1)
    assert w.violations == {}

    def takes_all(self: Ledger, size: int) -> bool:
        self.buffered_bytes += size
        return True

    def refuses_all(self: Ledger, size: int) -> bool:
        return False

    for planted, call in ((takes_all, 61), (refuses_all, 40)):
        w = Watch()
        ledger = Ledger(100, 1.0)
        ledger.buffered_bytes = 60
        _admission("try_reserve", 0)(w, planted)(ledger, call)
        assert list(w.violations) == ["B1 admission"], planted
