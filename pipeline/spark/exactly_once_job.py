"""The driver's part of an exactly-once export (the tasks': :mod:`pipeline.spark.exactly_once`).

Before the job, :func:`prepare`:

* checks the options (an export id Kafka can use in transactional ids, no failed rows
  tolerated, ``acks="all"``, no ``transactional_id`` of the user's own); without an
  ``export_id`` makes a fresh one for this call;
* creates the ledger topic if it is missing (:func:`pipeline.spark.ledger.ensure_ledger`);
* reads this export id's markers from the ledger once (:func:`pipeline.spark.ledger.snapshot`),
  so that a task whose partition an earlier run committed can skip it without fencing,
  and the others read only the ledger's tail.

After a failed job, :func:`after_failure`:

* waits (briefly, bounded) until Spark has stopped the job's tasks;
* fences every transactional id of the job whose partition is not complete: an
  InitProducerId per id aborts whatever transaction an attempt left open, so
  ``read_committed`` readers of the topic are not held back until its timeout;
* reads the ledger again and says, per partition, what is committed: a failed job
  leaves its committed partitions visible (partitions commit independently: there is no
  job-wide transaction in any released Kafka; KIP-939's two-phase commit would allow one).
"""

from __future__ import annotations

import functools
import logging
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

import trio

from pipeline.spark.ledger import EXPORT_ID, Done, Marker, ensure_ledger, mark_done, snapshot
from pipeline.spark.status import ExactlyOnce, PartitionStatus

__all__ = ["after_failure", "check_options", "new_export_id", "prepare"]

log = logging.getLogger("pipeline.spark")

#: How many leftover transactional ids the driver fences at once.
_FENCE_CONCURRENCY = 8


def new_export_id() -> str:
    """A fresh export id: the UTC time and 8 random hex digits."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def check_options(export_id: str | None, max_failed_rows: int,
                  producer_options: Mapping[str, Any], transactional_id_prefix: str) -> str:
    """Refuse what an exactly-once export cannot honour (ValueError naming it, before
    anything runs); return the export id to use."""
    from pipeline.producer._config import make_config

    if export_id is None:
        export_id = new_export_id()
    elif not isinstance(export_id, str) or not EXPORT_ID.fullmatch(export_id):
        raise ValueError(
            f"export_id={export_id!r}: use 1-200 characters of letters, digits and . _ : - "
            "(starting with a letter or digit); it is part of Kafka transactional ids")
    if not re.fullmatch(r"[A-Za-z0-9._:-]*", transactional_id_prefix):
        raise ValueError(f"transactional_id_prefix={transactional_id_prefix!r}: use letters, "
                         "digits and . _ : -")
    if max_failed_rows:
        raise ValueError(
            f"max_failed_rows={max_failed_rows} cannot be combined with exactly_once=True: "
            "a transaction with an undelivered row cannot commit")
    if "transactional_id" in producer_options:
        raise ValueError(
            "exactly_once=True chooses the transactional ids itself (one per Spark partition, "
            "from the export id): drop transactional_id (transactional_id_prefix= sets "
            "their prefix)")
    if producer_options.get("acks", "all") not in ("all", -1):
        raise ValueError(f"acks={producer_options['acks']!r} cannot be combined with "
                         "exactly_once=True: transactions need acks='all'")
    # Every other option, checked as a transactional producer would be.
    make_config(None, {**producer_options, "transactional_id": f"{export_id}.0"})
    return export_id


def prepare(
    *, bootstrap: str, topic: str | None, export_id: str, ledger_topic: str,
    producer_options: Mapping[str, Any], commit_interval: float | None,
    commit_rows: int | None, transactional_id_prefix: str, verify_done: bool = False,
) -> tuple[ExactlyOnce, Done | None]:
    """The tasks' exactly-once config (ledger created if missing, markers read), and
    the ledger's record of a finished job of the export, if any."""
    from pipeline.producer._config import make_config
    from pipeline.util.groups import unwrap_single_errors

    pcfg = make_config(None, dict(producer_options))
    cluster = pcfg.cluster
    timeout = max(pcfg.request_timeout, 10.0)

    async def run() -> Any:
        with trio.fail_after(4 * timeout):
            await ensure_ledger(bootstrap, ledger_topic, like=topic, cluster=cluster,
                                admin_timeout=timeout)
            return await snapshot(bootstrap, ledger_topic, export_id, cluster=cluster)

    with unwrap_single_errors():
        view = trio.run(run)
    different = sorted({m.topic or "" for m in view.markers.values()} - {topic or ""})
    if different:
        raise ValueError(
            f"export_id={export_id!r} was used for topic {different[0] or '(topic column)'!r}; "
            f"this export writes to {topic or '(topic column)'!r}: use another export_id")
    eo = ExactlyOnce(
        export_id=export_id,
        run_id=secrets.token_hex(8),
        ledger_topic=ledger_topic,
        ledger_partition=view.partition,
        ledger_start=view.start,
        markers={p: m.encode().decode() for p, m in view.markers.items()},
        commit_interval=(commit_interval if commit_interval is not None
                         else pcfg.transaction_timeout / 3),
        commit_rows=commit_rows,
        transactional_id_prefix=transactional_id_prefix,
        done=view.done is not None,
        verify_done=verify_done,
    )
    return eo, view.done


def skipped_statuses(eo: ExactlyOnce, done: Done) -> list[PartitionStatus]:
    """The report of a rerun of a finished export: every partition skipped."""
    out = []
    for p in range(done.partitions):
        raw = eo.markers.get(p)
        rows = Marker.decode(raw).rows if raw is not None else 0
        out.append(PartitionStatus(partition=p, attempt=-1, outcome="skipped", rows=rows,
                                   committed_rows=rows, resumed_rows=rows))
    return out


def finish(*, bootstrap: str, eo: ExactlyOnce, partitions: int, rows: int,
           producer_options: Mapping[str, Any]) -> None:
    """Record in the ledger that the job finished (every task succeeded)."""
    from pipeline.util.groups import unwrap_single_errors

    done = Done(export_id=eo.export_id, run_id=eo.run_id, partitions=partitions, rows=rows,
                at=time.time())
    with unwrap_single_errors():
        trio.run(functools.partial(mark_done, bootstrap, eo.ledger_topic, eo.ledger_partition,
                                   done, producer_options=producer_options))


def job_partitions(spark: Any, group: str) -> int | None:
    """How many tasks the export job's stage has (None: Spark does not know the job)."""
    tracker = spark.sparkContext.statusTracker()
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in (job.stageIds if job is not None else ()):
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                return int(stage.numTasks)
    return None


def wait_for_tasks(spark: Any, group: str, limit: float) -> None:
    """Until no task of the export job runs any more (up to ``limit`` seconds): Spark
    stops a failed job's other tasks asynchronously."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        active = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in (job.stageIds if job is not None else ()):
                stage = tracker.getStageInfo(stage_id)
                active += stage.numActiveTasks if stage is not None else 0
        if not active:
            return
        time.sleep(0.2)


def succeeded_tasks(spark: Any, group: str) -> set[int] | None:
    """The partitions whose task Spark finished successfully in the export job (its
    status store, through the JVM; None where that cannot be read, e.g. Spark Connect)."""
    try:
        sc = spark.sparkContext
        tracker = sc.statusTracker()
        store = sc._jsc.sc().statusStore()
        done: set[int] = set()
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in (job.stageIds if job is not None else ()):
                stage = tracker.getStageInfo(stage_id)
                for attempt in range(stage.currentAttemptId + 1 if stage is not None else 0):
                    tasks = store.taskList(stage_id, attempt, 1 << 30)
                    for i in range(tasks.size()):
                        task = tasks.apply(i)
                        if task.status() == "SUCCESS":
                            done.add(int(task.index()))
        return done
    except Exception as exc:
        log.info("cannot read the export job's task outcomes from Spark: %s", exc)
        return None


def after_failure(*, bootstrap: str, eo: ExactlyOnce, partitions: int | None,
                  succeeded: set[int] | None,
                  producer_options: Mapping[str, Any]) -> list[PartitionStatus]:
    """Fence the failed job's leftovers, then say per partition what is committed.

    A partition is ``committed`` (or ``skipped``, when an earlier run had committed all
    of it) when Spark finished its task (``succeeded``); else ``failed``, with whatever
    rows its attempts committed (``committed_rows``, visible to read_committed
    readers). Without ``succeeded``, a partition counts as committed when its last
    marker says its input ended (which a task whose upstream failed also says)."""
    from pipeline.producer._config import make_config
    from pipeline.util.groups import unwrap_single_errors

    pcfg = make_config(None, dict(producer_options))
    cluster = pcfg.cluster
    bound = pcfg.transaction_timeout + pcfg.request_timeout + 10.0
    before = {p: Marker.decode(m) for p, m in eo.markers.items()}
    count = partitions if partitions is not None else max([*before, -1]) + 1

    async def run() -> dict[int, Marker]:
        limiter = trio.CapacityLimiter(_FENCE_CONCURRENCY)
        with trio.move_on_after(bound):
            async with trio.open_nursery() as nursery:
                for p in range(count):
                    if succeeded is None or p not in succeeded:
                        nursery.start_soon(_fence, bootstrap, eo.transactional_id(p),
                                           producer_options, limiter)
        return (await snapshot(bootstrap, eo.ledger_topic, eo.export_id,
                               cluster=cluster)).markers

    try:
        with unwrap_single_errors():
            markers = trio.run(run)
    except Exception as exc:  # the report must not hide the job's own error
        log.warning("export %r: could not fence the failed job's transactions or read its "
                    "ledger: %s", eo.export_id, exc)
        return []
    out = []
    for p in range(max(count, max([*markers, -1]) + 1)):
        marker, earlier = markers.get(p), before.get(p)
        status = PartitionStatus(partition=p, outcome="failed", attempt=-1)
        ok = (p in succeeded) if succeeded is not None else (
            marker is not None and marker.complete)
        if marker is not None:
            status.committed_rows = status.rows = marker.rows
            status.delivered = marker.rows - (earlier.rows if earlier is not None else 0)
            status.writer_attempt = marker.attempt if marker.run_id == eo.run_id else -1
        if ok:
            status.outcome = ("skipped" if earlier is not None and marker is not None
                              and marker.rows == earlier.rows else "committed")
        out.append(status)
    return out


async def _fence(bootstrap: str, transactional_id: str, options: Mapping[str, Any],
                 limiter: trio.CapacityLimiter) -> None:
    """InitProducerId for ``transactional_id``: aborts its open transaction, if any."""
    from pipeline.producer._api import open_producer

    async with limiter:
        try:
            async with open_producer(bootstrap, **{**options,
                                                   "transactional_id": transactional_id}):
                pass
        except Exception as exc:
            log.warning("could not fence %r: %s (its open transaction, if any, is aborted "
                        "when its transaction_timeout passes)", transactional_id, exc)
