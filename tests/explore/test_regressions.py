"""Every schedule the explorer found a bug with, shrunk, kept as JSON in
``regressions/`` and replayed here (`python -m pipeline.testing.explore --file
<path>` replays one by hand). Each file's ``note`` names the bug and its fix;
each failed before that fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.testing.explore import check, from_json, run_schedule

REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("*.json"))


def test_the_corpus_is_there() -> None:
    assert REGRESSIONS
    assert all(from_json(p.read_text()).note for p in REGRESSIONS)


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_regression(path: Path) -> None:
    schedule = from_json(path.read_text())
    violations = check(run_schedule(schedule, real_time_limit=30.0))
    assert not violations, schedule.note + "\n" + "\n".join(map(str, violations))
