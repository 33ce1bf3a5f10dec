"""The schedule explorer itself: deterministic replays, the command line, and
the CI sweep (`make test` runs 1,000 schedules from fixed seeds)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pipeline.testing.explore import Violation, check, from_json, generate, run_schedule, to_json
from pipeline.testing.explore import __main__ as cli
from pipeline.testing.explore.guards import GUARDS
from pipeline.testing.explore.sweep import schedule_for

# The CI sweep: schedules CI_SEED .. CI_SEED + CI_CHUNKS * CI_CHUNK - 1
# (sweep.schedule_for), both idempotence modes drawn per schedule. Replay one with
# `python -m pipeline.testing.explore --replay <seed> --idempotent both`.
CI_SEED = 20_000
CI_CHUNKS = 10
CI_CHUNK = 100


def digest(seed: int) -> str:
    trace = run_schedule(schedule_for(seed))
    return hashlib.sha256(repr((trace.fingerprint(), sorted(trace.reached.items()))).encode()
                          ).hexdigest()


# plain (python send path), swarm, targeted: pipelined (python), epoch, chaser
@pytest.mark.parametrize("seed", [22, 16, 36, 33, 34])
def test_a_schedule_replays_identically(seed: int) -> None:
    """Same schedule, same run: outcomes, settle times, logs, flushes, close, and
    the guards reached."""
    assert digest(seed) == digest(seed)


def test_a_replay_in_another_process_is_identical() -> None:
    """Nothing depends on str hashing or object addresses (another process,
    another PYTHONHASHSEED): the interleaving comes from the seed alone."""
    code = ("from tests.explore.test_explorer import digest; print(digest(36))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2], timeout=120)
    assert out.stdout.strip() == digest(36)


def test_schedules_round_trip_through_json() -> None:
    for seed in range(40):
        for s in (generate(seed), schedule_for(seed)):
            assert from_json(to_json(s)) == s


def test_cli_clean_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--schedules", "4", "--seed", "7"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "seed 7: 4 schedules (seeds 7..10), idempotent=both"
    assert out[-1] == "explored 4 schedules: 0 violations"


def test_cli_reports_a_violation_with_its_replay(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A violating schedule: non-zero exit, its seed, a one-line replay command,
    and (with --emit) its shrunk form as JSON that --file replays."""

    def fake_check(trace: object) -> list[Violation]:
        s = trace.schedule  # type: ignore[attr-defined]
        return [Violation("X test", "planted")] if s.seed == 9 and s.events else []

    monkeypatch.setattr(cli, "check", fake_check)
    monkeypatch.setattr("pipeline.testing.explore.shrink.check", fake_check)
    code = cli.main(["--schedules", "3", "--seed", "8", "--idempotent", "off",
                     "--emit", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "VIOLATION in schedule seed=9 (idempotent=False):" in out
    assert "  X test: planted" in out
    assert "replay: python -m pipeline.testing.explore --replay 9 --idempotent off" in out
    assert out.strip().splitlines()[-1] == "explored 3 schedules: 1 violations"
    [written] = tmp_path.glob("*.json")
    small = from_json(written.read_text())
    assert len(small.events) == 1 and small.sends == ()  # shrunk: one event is needed
    assert json.loads(written.read_text())["seed"] == 9
    assert cli.main(["--file", str(written)]) == 1
    assert cli.main(["--replay", "9", "--idempotent", "off", "--no-shrink"]) == 1


# Per chunk of the CI sweep: how many of its schedules reached each guard.
REACHED: dict[int, Counter[str]] = {}


def sweep_chunk(chunk: int) -> list[str]:
    first = CI_SEED + chunk * CI_CHUNK
    found = []
    reached: Counter[str] = Counter()
    for seed in range(first, first + CI_CHUNK):
        trace = run_schedule(schedule_for(seed))
        reached.update(set(trace.reached))
        violations = check(trace)
        if violations:
            found.append(f"seed {seed}: {violations[0]} (replay: python -m "
                         f"pipeline.testing.explore --replay {seed} --idempotent both)")
    REACHED[chunk] = reached
    return found


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(CI_CHUNKS))
def test_sweep(chunk: int) -> None:
    """1,000 seeded schedules (this chunk: 100; sweep.py mixes plain, swarm and
    targeted ones) keep every invariant."""
    found = sweep_chunk(chunk)
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_the_sweep_reaches_every_guard() -> None:
    """Every guard a deterministic test pins (guards.py, required) is reached by
    some schedule of the CI sweep: the sweep puts the protocol in the state each
    guard exists for, so a broken guard can show. (Runs after the chunks and
    reuses what they saw; alone, it runs the sweep.)"""
    reached: Counter[str] = Counter()
    for chunk in range(CI_CHUNKS):
        if chunk not in REACHED:
            sweep_chunk(chunk)
        reached += REACHED[chunk]
    never = [g.name for g in GUARDS if g.required and not reached[g.name]]
    assert not never, f"guards the CI sweep never reached: {never}"


def _resettle_seed() -> int:
    """The first seed whose schedule resettles batches of two or more messages."""
    for seed in range(50_000, 51_000):
        s = schedule_for(seed)
        if s.resettle and s.option("max_batch_messages") > 1 and len(s.sends) > 20:
            return seed
    raise AssertionError("no resettle schedule in 1,000 seeds")


def test_the_resettle_probe_holds_the_ledger_to_its_double_settle_guard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Schedule.resettle settles the first half of each batch a second time: the
    unmutated ledger counts exactly those repeats and gives every message the outcome
    one settle gives; a ledger that stops counting them, or settles them again, is
    caught (O1, A1)."""
    from pipeline.producer._outcomes.ledger import Ledger

    s = schedule_for(_resettle_seed())
    trace = run_schedule(s)
    assert trace.resettled > 0 and trace.double_settles == trace.resettled
    assert check(trace) == []
    monkeypatch.setattr(Ledger, "_double_settle", lambda self, msg: None)
    assert "O1 double settle" in {v.kind for v in check(run_schedule(s))}


def test_an_answer_leaving_a_partition_out_is_a_fault_the_sweep_draws() -> None:
    """sweep.incomplete: some schedules have leaders answer Produce requests without
    one of their partitions, and the producer keeps every promise through it."""
    seeds = [seed for seed in range(50_000, 50_400)
             if any(e.kind == "incomplete" for e in schedule_for(seed).events)]
    assert seeds
    for seed in seeds[:3]:
        trace = run_schedule(schedule_for(seed))
        assert check(trace) == [], seed
