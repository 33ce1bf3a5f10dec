"""``python -m bench`` (``make bench``): the runner hands ``--broker`` to the benchmarks
that take one and files their reports per broker."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from bench.__main__ import main as bench_main  # noqa: E402


def test_bench_runner_passes_the_broker_to_benchmarks_that_take_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m bench --broker kafka``: the benchmark gets ``broker="kafka"`` and its
    report goes to ``<name>-kafka.json``; no Kafka is started here (a stub benchmark)."""
    seen: list[str] = []

    def run(broker: str = "tansu") -> dict[str, str]:
        seen.append(broker)
        return {"broker": broker}

    stub = types.ModuleType("bench.stub_bench")
    stub.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.stub_bench", stub)
    assert bench_main(["stub", "--broker", "kafka", "--results-dir", str(tmp_path)]) == 0
    assert bench_main(["stub", "--results-dir", str(tmp_path)]) == 0
    assert seen == ["kafka", "tansu"]
    assert json.loads((tmp_path / "stub-kafka.json").read_text()) == {"broker": "kafka"}
    assert json.loads((tmp_path / "stub.json").read_text()) == {"broker": "tansu"}
    assert "run(broker='kafka')" in capsys.readouterr().out


def test_unknown_broker_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_main(["codec", "--broker", "redpanda"])
    assert "invalid choice: 'redpanda'" in capsys.readouterr().err
