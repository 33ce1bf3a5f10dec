"""Schedules whose runs once looked like violations and are what Kafka and the
producer promise (each file's ``note`` says why): kept in ``accepted/`` and
replayed here, so a checker that grows stricter does not start flagging them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.testing.explore import check, from_json, run_schedule

ACCEPTED = sorted((Path(__file__).parent / "accepted").glob("*.json"))


@pytest.mark.parametrize("path", ACCEPTED, ids=[p.stem for p in ACCEPTED])
def test_accepted(path: Path) -> None:
    schedule = from_json(path.read_text())
    assert schedule.note
    violations = check(run_schedule(schedule, real_time_limit=30.0))
    assert not violations, schedule.note + "\n" + "\n".join(map(str, violations))
