"""SparkStandalone's bounded start: a cluster that is not up in time fails with the
daemon's log and leaves no process behind (the whole cluster, with a driver, runs in
tests/spark/test_exactly_once_standalone.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark]


def test_a_start_past_its_timeout_fails_with_the_log_and_leaves_nothing(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("no java on PATH (Spark needs Java 17+)")
    from pipeline.testing.spark_standalone import SparkStandalone, SparkStandaloneError

    root = tmp_path / "spark"
    cluster = SparkStandalone(workers=2, start_timeout=0.5, directory=root)
    with pytest.raises(SparkStandaloneError, match=r"Spark master was not up within 0s") as info:
        cluster.start()
    assert f"{root / 'master.log'}:" in str(info.value)
    assert cluster.processes == []
    assert cluster.leftovers(root) == []
    assert (root / "master.log").exists()  # kept: it says why
    with pytest.raises(ValueError, match="workers and cores must be >= 1"):
        SparkStandalone(workers=0)
