"""An export's progress on the driver: tasks from Spark's status tracker, rows and bytes
from a Spark accumulator that each export task adds its totals to.

``export_dataframe(df, ..., progress=callback)`` calls ``callback(ExportProgress(...))``
from a driver thread every ``progress_interval`` seconds while the job runs, and once
more when it has ended.

**Granularity: a finished task.** Each task adds its partition's counts (rows delivered,
key+value bytes, rows failed) to the accumulator once, when it has exported its
partition; Spark merges a task's accumulator update on the driver when the task's result
arrives, so ``rows`` and ``bytes`` move in steps, one per finished task. No finer honest
source exists: a Python accumulator's value leaves its worker only with the task's
result (executor heartbeats carry JVM metrics, which count rows handed to the Python
worker, not rows the broker acknowledged), and a side channel from every executor to the
driver would be a new port to open on every cluster.

**Under retries every row is counted once.** Spark merges the accumulator updates of a
successful task only (a failed attempt's are dropped by its executor), and of a result
task's first success only (a speculative copy that also finishes adds nothing): so the
counts are those of the attempt whose status row is in the report, and after the job
they equal the report's ``delivered``, ``bytes`` and ``failed``. At-least-once, rows a
failed attempt delivered before it failed are in Kafka (the retry re-sends them) but
not in ``rows``. Exactly-once, a partition's ``rows`` are the rows this run committed
for it, whichever attempts committed them (a retry resumes after its predecessors'
committed chunks, and its count includes theirs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ExportProgress", "ProgressCounts", "ProgressPoller", "TaskCounts"]

log = logging.getLogger("pipeline.spark")


@dataclass(frozen=True, slots=True)
class ExportProgress:
    """Where a running export is (the argument of ``export_dataframe``'s ``progress``).

    ``rows``, ``bytes`` and ``failed`` are of the export tasks that have finished (see
    :mod:`pipeline.spark.progress`: each row once, through retries); after the job they
    equal the report's ``delivered``, ``bytes`` and ``failed``. ``tasks_total`` is the
    task count of the newest stage of the export's job(s): the export's own stage (one
    task per Spark partition) once its job is planned; before, while an adaptive query
    runs an upstream shuffle as a job of its own, that shuffle's; 0 before any.
    """

    tasks_done: int  # export tasks (Spark partitions) finished, each once
    tasks_total: int  # tasks of the export's stage (see above; 0: not known yet)
    rows: int  # rows delivered (exactly-once: committed by this run)
    bytes: int  # key + value bytes of those partitions, as in the report
    failed: int  # rows that failed (tolerated by max_failed_rows)
    elapsed: float  # seconds since the job started
    final: bool = False  # the last report, after the job ended (succeeded or failed)

    @property
    def share(self) -> float | None:
        """The share of the export's tasks done (None: their number is not known yet)."""
        return self.tasks_done / self.tasks_total if self.tasks_total else None


#: (rows delivered, bytes, rows failed, tasks): what each task adds to the accumulator
TaskCounts = tuple[int, int, int, int]


class ProgressCounts:
    """The accumulator's ``AccumulatorParam``: element-wise sums of :data:`TaskCounts`.

    Module-level and stateless: Spark pickles it (by reference) into every task."""

    def zero(self, value: TaskCounts) -> TaskCounts:
        return (0, 0, 0, 0)

    def addInPlace(self, value1: TaskCounts, value2: TaskCounts) -> TaskCounts:
        a, b = value1, value2
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


class ProgressPoller:
    """Reports an export job's progress from a driver thread.

    ``group``: the job group the export's job runs in; the poller follows the jobs of the
    group that start after it was made, and the newest stage among them (the stage that
    runs the export tasks, which comes after any stage it depends on)."""

    def __init__(self, spark: Any, callback: Callable[[ExportProgress], None], *,
                 group: str, interval: float) -> None:
        sc = spark.sparkContext
        self.counts = sc.accumulator((0, 0, 0, 0), ProgressCounts())
        self._tracker = sc.statusTracker()
        self._group = group
        self._before = set(self._tracker.getJobIdsForGroup(group))
        self._callback = callback
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="export-progress", daemon=True)
        self._started = time.perf_counter()
        self._total = 0  # the export stage's tasks, once seen

    def start(self) -> None:
        self._started = time.perf_counter()
        self._thread.start()

    def stop(self, tasks: int | None) -> None:
        """End the polling; report once more (``tasks``: the job's tasks when it
        succeeded, all of them done)."""
        self._stop.set()
        self._thread.join(timeout=2)
        if tasks is not None:
            self._total = tasks
        self._report(final_tasks=tasks, final=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._report(final_tasks=None)

    def _report(self, final_tasks: int | None, final: bool = False) -> None:
        try:
            rows, nbytes, failed, tasks = self.counts.value
            if final_tasks is None:
                self._total = self._stage_tasks() or self._total
            done = final_tasks if final_tasks is not None else tasks
            self._callback(ExportProgress(
                tasks_done=done, tasks_total=max(self._total, done), rows=rows, bytes=nbytes,
                failed=failed, elapsed=time.perf_counter() - self._started, final=final))
        except Exception:  # progress must never break the export
            log.debug("export progress: the report failed", exc_info=True)

    def _stage_tasks(self) -> int:
        """The tasks of the newest stage of the export's jobs (0: none started yet)."""
        stages: list[int] = []
        for job in set(self._tracker.getJobIdsForGroup(self._group)) - self._before:
            info = self._tracker.getJobInfo(job)
            if info is not None:
                stages.extend(info.stageIds)
        for stage in sorted(stages, reverse=True):
            info = self._tracker.getStageInfo(stage)
            if info is not None:
                return int(info.numTasks)
        return 0
