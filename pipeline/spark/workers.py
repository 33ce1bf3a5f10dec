"""The Python that Spark's workers run: checked, or chosen, before an export.

PySpark starts its Python workers with the SparkContext's ``pythonExec``:
``PYSPARK_PYTHON`` as it was when the context was created, else ``python3`` from the
PATH. On a plain venv run that is the system Python, which has neither pipeline nor
pyarrow or pandas, and the export's first task would die with ``ModuleNotFoundError`` inside a
hundred lines of Spark's stderr. So, before the job, :func:`worker_python_problem`:

* gives a **local** session (master ``local...``) whose user chose nothing (no
  ``PYSPARK_PYTHON``, no ``spark.pyspark.python``, ``pythonExec`` still ``python3``)
  this driver's own interpreter (``sys.executable``): the workers run on this machine,
  and this interpreter has pipeline. It stays set for the session's later jobs;
* applies ``spark.pyspark.python`` when it is set but was not applied (a pip-installed
  PySpark reads only the environment variable; spark-submit applies the setting);
* runs one probe task that imports what the export's tasks need and reports back. When
  a worker cannot, the export fails at once with one line naming that Python, what it
  lacks and what to set. The probe reports rather than raises, so a worker that only
  lacks packages makes Spark log nothing.

A context whose workers passed is not probed again for the same ``pythonExec``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

__all__ = ["worker_python_advice", "worker_python_problem"]

log = logging.getLogger("pipeline.spark")

#: What an export task imports on a worker: the task function's module, and what
#: PySpark's mapInArrow needs.
NEEDED = ("pipeline.spark.partition", "pyarrow", "pandas")

#: Defined apart from every importable module, so that PySpark's cloudpickle ships the
#: probe by value: a worker without pipeline can still run it and say so.
_PROBE_SOURCE = '''
def probe(_rows):
    import sys
    missing = []
    for name in NEEDED:
        try:
            __import__(name)
        except Exception as exc:
            missing.append("%s (%s: %s)" % (name, type(exc).__name__, exc))
    return [(sys.executable, "%d.%d.%d" % sys.version_info[:3], missing)]
'''

# (application id, pythonExec) pairs whose workers passed the probe.
_passed: set[tuple[str, str]] = set()


def worker_python_advice(python: str) -> str:
    """What to do when the workers' Python (``python``) lacks pipeline."""
    return (f"set spark.pyspark.python (or PYSPARK_PYTHON before the session starts) to a "
            f"Python that has pipeline installed (this driver runs {sys.executable}), or "
            f"install pipeline[spark] into {python}")


def _probe() -> Any:
    namespace: dict[str, Any] = {"__name__": "pipeline_worker_probe", "NEEDED": NEEDED}
    exec(compile(_PROBE_SOURCE, "<pipeline worker probe>", "exec"), namespace)
    return namespace["probe"]


def worker_python_problem(spark: Any) -> str | None:
    """Make sure ``spark``'s Python workers can run an export (module docstring): None
    when they can, else one line saying which Python fails, why, and what to set."""
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: no context here; the workers are the server's
        return None
    chosen = os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python")
    if sc.pythonExec == "python3" and chosen and chosen != sc.pythonExec:
        log.info("workers' Python: %s (spark.pyspark.python)", chosen)
        sc.pythonExec = chosen
    elif sc.pythonExec == "python3" and not chosen and str(sc.master).startswith("local"):
        log.info("workers' Python: %s (this driver's; a local session chose none)",
                 sys.executable)
        sc.pythonExec = sys.executable
    key = (str(sc.applicationId), str(sc.pythonExec))
    if key in _passed:
        return None
    try:
        [(python, version, missing)] = sc.parallelize([0], 1).mapPartitions(_probe()).collect()
    except Exception as exc:
        return _start_failure(str(sc.pythonExec), exc)
    if missing:
        return (f"Spark's Python workers ({python}, Python {version}) cannot import "
                f"{', '.join(missing)}: {worker_python_advice(python)}")
    _passed.add(key)
    return None


def _start_failure(python: str, exc: BaseException) -> str:
    """One line for a probe task that failed: the worker's Python did not start, or
    runs another version than the driver."""
    text = str(exc)
    if "PYTHON_VERSION_MISMATCH" in text or "different version" in text:
        what = (f"runs another Python version than the driver "
                f"({sys.version_info[0]}.{sys.version_info[1]})")
    elif "Cannot run program" in text or "No such file" in text:
        what = "cannot be started"
    else:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        what = f"failed a probe task ({lines[0] if lines else type(exc).__name__})"
    return (f"Spark's Python workers ({python}) {what}: set spark.pyspark.python (or "
            f"PYSPARK_PYTHON before the session starts) to a Python with pipeline installed "
            f"(this driver runs {sys.executable})")
