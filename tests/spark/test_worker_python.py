"""Spark's Python workers must find pipeline: export_dataframe checks the workers'
Python, and chooses the driver's for a local session whose user chose none.

On the session's local Spark: its context's worker Python (``pythonExec``) is switched
for one test and restored after. The system Python (``/usr/bin/python3``, no pipeline,
no pyarrow) stands for a plain venv run's ``python3`` from the PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.spark import ExportError, export_dataframe

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _system_python() -> str:
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if candidate and subprocess.run(
            [candidate, "-c", "import pipeline"], capture_output=True, cwd="/",
        ).returncode != 0:
            return candidate
    pytest.skip("no Python without pipeline on this machine")


@pytest.fixture
def worker_python(spark: Any) -> Iterator[Any]:
    """The session's SparkContext; its worker Python is put back after the test."""
    sc = spark.sparkContext
    before = sc.pythonExec
    yield sc
    sc.pythonExec = before


def test_workers_without_pipeline_fail_the_export_at_once_in_one_line(
    spark: Any, worker_python: Any, kafka_bootstrap: str, new_topic: Any,
    capfd: pytest.CaptureFixture[str],
) -> None:
    system = _system_python()
    worker_python.pythonExec = system  # the user chose it: kept, and checked
    df = spark.range(10, numPartitions=2).selectExpr("cast(id as string) as value")
    capfd.readouterr()
    started = time.monotonic()
    with pytest.raises(ExportError) as info:
        export_dataframe(df, bootstrap=kafka_bootstrap, topic=new_topic())
    assert time.monotonic() - started < 60  # one probe task, not the job's retries
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"Spark's Python workers ({system}, Python ")
    assert "cannot import pipeline.spark.partition (ModuleNotFoundError: No module " in text
    assert f"set spark.pyspark.python (or PYSPARK_PYTHON before the session starts) to a " \
           f"Python that has pipeline installed (this driver runs {sys.executable})" in text
    # Spark printed no stack trace: the probe reports, it does not fail a task.
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in task" not in err, err


def test_a_local_session_that_chose_no_python_gets_the_drivers(
    spark: Any, worker_python: Any, kafka_bootstrap: str, new_topic: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``python3`` from the PATH is what PySpark starts when nobody chose: the export
    replaces it with this interpreter (and the session keeps it)."""
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    if spark.sparkContext.getConf().get("spark.pyspark.python"):
        pytest.skip("the session chose spark.pyspark.python")
    worker_python.pythonExec = "python3"
    df = spark.range(20, numPartitions=2).selectExpr("cast(id as string) as value")
    report = export_dataframe(df, bootstrap=kafka_bootstrap, topic=new_topic())
    assert report.delivered == 20
    assert worker_python.pythonExec == sys.executable


def test_a_job_failing_on_a_missing_module_says_what_to_set() -> None:
    """The probe runs on one worker; another executor may still lack pipeline: Spark's
    wrapped worker traceback becomes one line with the same advice."""
    from pipeline.spark.export import _task_failure_text

    spark_text = (
        "An error occurred while calling o123.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in "
        "stage 3.0 failed 4 times\nTraceback (most recent call last):\n"
        '  File "/opt/spark/python/lib/pyspark.zip/pyspark/worker.py", line 1, in main\n'
        "ModuleNotFoundError: No module named 'pipeline'\n\tat org.apache.spark.api..."
    )
    text = _task_failure_text(RuntimeError(spark_text))
    assert text == (
        "Spark's Python workers cannot import pipeline: set spark.pyspark.python (or "
        "PYSPARK_PYTHON before the session starts) to a Python that has pipeline installed "
        f"(this driver runs {sys.executable}), or install pipeline[spark] into the workers' "
        "Python")
