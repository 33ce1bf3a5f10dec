"""export_dataframe(exactly_once=True) on a Spark standalone cluster (a master and two
workers from PySpark's own jars: separate executor JVMs with their own Python workers),
with every task's first attempt failing midway and speculation on, into a 3-node Apache
Kafka; read back by confluent-kafka with isolation.level=read_committed.

The schedule (tests/spark/standalone_driver.py's ``frame``): 4 partitions of 5,000 rows;
on attempt 0 a UDF raises at row 3,000 of its partition, and partition 3's attempt 0 is
a straggler (full speed to row 1,500, then crawling), which Spark speculates: a copy
starts on the other worker's host, fences the straggler's transactional id, resumes
after the chunks the straggler committed, finishes, and Spark kills the straggler.
Spark's own event log says which attempts ran, where, speculative or not, and how each
ended; the test checks that the failures and the speculative copies really happened.
(An attempt may fail once more than planned: the Python worker of a failed attempt can
outlive its task and fence the retry, which then fails and the next one resumes;
docs/spark-export.md, "On a Spark standalone cluster".)

``chunk_rows=500``: a task pulls rows in chunks of ``chunk_rows``, so with the default
(10,000) the straggler would commit nothing before it crawls.

The driver runs in a process of its own (standalone_driver.py): this process's
SparkContext is the session's ``local[1,2]`` one, and a process holds only one.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest

from .conftest import _java_available, read_all

if TYPE_CHECKING:
    from pipeline.testing.kafka import KafkaCluster
    from pipeline.testing.spark_standalone import SparkStandalone

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.integration]

DRIVER = Path(__file__).with_name("standalone_driver.py")
ROWS, PARTITIONS, FAIL_AT = 20_000, 4, 3_000  # 4 partitions of 5,000 rows
SLOW_PARTITION, SLOW_FROM, SLOW_SECONDS = 3, 1_500, 60.0

#: Eager speculation: once one task of the stage succeeded, a task running longer than
#: the median successful one (and 6 s, so that the straggler has committed chunks before
#: its copy fences it, even on a loaded machine) gets a copy on a free executor of
#: another host. The efficiency filter (Spark 3.4+) is off: it would also
#: judge by input-record rates, which spark.range does not report.
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1",
    "spark.speculation.quantile": "0.25",
    "spark.speculation.minTaskRuntime": "6s",
    "spark.speculation.efficiency.enabled": "false",
}


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[SparkStandalone]:
    """A master and two 1-core workers; after the test, no process of theirs is left."""
    pytest.importorskip("pyspark")
    if not _java_available():
        pytest.skip("no java on PATH / JAVA_HOME (Spark needs Java 17+)")
    from pipeline.testing.spark_standalone import SparkStandalone

    root = tmp_path / "spark"
    with SparkStandalone(workers=2, directory=root) as cluster:
        yield cluster
    assert cluster.leftovers(root) == []
    left = subprocess.run(["pgrep", "-f", f"deploy.worker.Worker.*{cluster.master_url}"],
                          capture_output=True, text=True).stdout.split()
    assert left == [], f"Spark workers still running: {left}"


class Driver:
    """standalone_driver.py in its own process (working inside the cluster's directory,
    so the cluster's stop ends it and its JVM too if anything went wrong)."""

    def __init__(self, cluster: SparkStandalone, settings: dict[str, str]) -> None:
        assert cluster.root is not None
        cwd = cluster.root / "driver"
        cwd.mkdir()
        self.log = cluster.root / "driver.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(DRIVER), json.dumps(settings)], cwd=cwd,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self._lines: queue.Queue[bytes] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(b"")

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the driver did not answer within {timeout:.0f}s; "
                                 f"{self.log}:\n{self._tail()}") from None
        if not line:
            raise AssertionError(f"the driver exited ({self.proc.wait()}); {self.log}:\n"
                                 f"{self._tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def request(self, message: dict[str, Any], timeout: float = 240.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        return self.receive(timeout)

    def export(self, frame: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
        answer = self.request({"op": "export", "frame": frame, "options": options})
        assert "error" not in answer, answer.get("traceback")
        return answer

    def _tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request({"op": "stop"}, timeout=60)
            finally:
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()


@dataclass(frozen=True)
class Attempt:
    """A task attempt, as Spark's event log records it."""

    partition: int
    attempt: int
    speculative: bool
    host: str
    end: str  # "Success", "ExceptionFailure", "TaskKilled", ...


def export_jobs(event_log: Path) -> list[list[Attempt]]:
    """The task attempts of each export job (its group ``pipeline-export-...``), in order."""
    group_of_stage: dict[int, str] = {}
    groups: list[str] = []
    started: dict[int, dict[str, Any]] = {}
    ended: dict[int, str] = {}
    stage_of_task: dict[int, int] = {}
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            group = event.get("Properties", {}).get("spark.jobGroup.id") or ""
            if group.startswith("pipeline-export-"):
                groups.append(group)
                for stage in event["Stage IDs"]:
                    group_of_stage[stage] = group
        elif kind == "SparkListenerTaskStart":
            info = event["Task Info"]
            started[info["Task ID"]] = info
            stage_of_task[info["Task ID"]] = event["Stage ID"]
        elif kind == "SparkListenerTaskEnd":
            ended[event["Task Info"]["Task ID"]] = event["Task End Reason"]["Reason"]
    jobs: dict[str, list[Attempt]] = {group: [] for group in groups}
    for task, info in started.items():
        group = group_of_stage.get(stage_of_task[task])
        if group is not None:
            jobs[group].append(Attempt(info["Partition ID"], info["Attempt"],
                                       info["Speculative"], info["Host"],
                                       ended.get(task, "(no end)")))
    return [sorted(jobs[g], key=lambda a: (a.partition, a.attempt)) for g in groups]


def values(bootstrap: str, topic: str) -> Counter[int]:
    return Counter(int(m.value()[:10]) for m in read_all(bootstrap, topic, "read_committed",
                                                         timeout=60))


def check_failures_and_speculation(attempts: list[Attempt]) -> Attempt:
    """Every partition's attempt 0 failed (or, the straggler, was killed) and a later
    attempt succeeded; the straggler's partition got a speculative copy on the other
    host, which succeeded. Returns that copy."""
    assert {a.partition for a in attempts} == set(range(PARTITIONS))
    for p in range(PARTITIONS):
        mine = [a for a in attempts if a.partition == p]
        first = [a for a in mine if a.attempt == 0]
        assert first and first[0].end in ("ExceptionFailure", "TaskKilled"), mine
        assert any(a.end == "Success" for a in mine), mine
    straggler = [a for a in attempts if a.partition == SLOW_PARTITION]
    assert any(a.speculative for a in straggler), (
        f"no speculative attempt of partition {SLOW_PARTITION}: {straggler}")
    [winner] = [a for a in straggler if a.end == "Success"]
    assert winner.speculative, straggler
    # Spark never runs a copy on a host that ran an attempt of the task already
    assert winner.host != straggler[0].host
    return winner


def test_exactly_once_on_a_standalone_cluster_with_failures_and_speculation(
    standalone: SparkStandalone, kafka_cluster: KafkaCluster,
    kafka_topic: Callable[[str], str], tmp_path: Path,
) -> None:
    from pipeline.testing.spark_standalone import JVM_FLAGS

    bootstrap = kafka_cluster.bootstrap
    topic, ledger = kafka_topic("eosa"), kafka_topic("ledgersa")
    kafka_cluster.create_topic(topic, 6, replication_factor=3)
    events = tmp_path / "events"
    events.mkdir()
    settings = {
        **standalone.session_conf(),
        **SPECULATION,
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.rolling.enabled": "false",  # one plain JSON-lines file
        "spark.eventLog.compress": "false",
        "spark.task.maxFailures": "4",
        "spark.driver.memory": "512m",
        "spark.driver.extraJavaOptions": JVM_FLAGS,
        "spark.sql.adaptive.enabled": "false",
        # batches of 200 rows: rows reach the export, and it commits chunks of them,
        # before a UDF fails in a partition of 5,000 rows
        "spark.sql.execution.arrow.maxRecordsPerBatch": "200",
    }
    frame = dict(rows=ROWS, partitions=PARTITIONS, fail_at=FAIL_AT,
                 slow_partition=SLOW_PARTITION, slow_from=SLOW_FROM,
                 slow_seconds=SLOW_SECONDS)
    export_id = f"standalone-{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = dict(bootstrap=bootstrap, topic=topic, exactly_once=True,
                                   export_id=export_id, ledger_topic=ledger,
                                   commit_rows=500, chunk_rows=500, linger=0.005)
    driver = Driver(standalone, settings)
    try:
        hello = driver.receive(timeout=180)
        # two executors, one per worker, known by the workers' two host names
        assert sorted(h.rsplit(":", 1)[0] for h in hello["executors"]) == [
            "127.0.0.1", "localhost"]

        started = time.monotonic()
        first = driver.export(frame, options)
        report = first["report"]
        assert report["complete"] and report["committed_partitions"] == [0, 1, 2, 3]
        assert report["retried_partitions"] == [0, 1, 2, 3]  # no attempt 0 succeeded
        assert report["delivered"] == report["committed_rows"] == ROWS
        [slow] = [p for p in report["partitions"] if p["partition"] == SLOW_PARTITION]
        # the copy fenced the straggler and resumed after the chunks it had committed
        # (it ran at full speed to row 1,500: at least one chunk of 500)
        assert 500 <= slow["resumed_rows"] < FAIL_AT, first["format"]
        assert slow["writer_attempt"] == slow["attempt"] > 0
        got = values(bootstrap, topic)
        assert len(got) == ROWS and set(got.values()) == {1}  # every row exactly once
        first_seconds = time.monotonic() - started

        # A rerun with the same export id writes nothing and says so.
        again = driver.export(frame, options)["report"]
        assert again["skipped_partitions"] == [0, 1, 2, 3] and again["complete"]
        assert again["delivered"] == 0 and again["committed_rows"] == ROWS
        assert values(bootstrap, topic) == got

        # A new export id writes every row once more.
        plain = dict(rows=ROWS, partitions=PARTITIONS, fail_at=None)
        other = driver.export(plain, {**options, "export_id": f"{export_id}-b"})["report"]
        assert other["committed_partitions"] == [0, 1, 2, 3] and other["delivered"] == ROWS
        twice = values(bootstrap, topic)
        assert len(twice) == ROWS and set(twice.values()) == {2}
    finally:
        driver.stop()

    # Spark's own account of the two export jobs (the rerun ran none: the ledger said
    # the export had finished).
    [log] = list(events.iterdir())
    jobs = export_jobs(log)
    assert len(jobs) == 2, jobs
    check_failures_and_speculation(jobs[0])
    print(f"first export {first_seconds:.1f} s; attempts: {jobs[0]}")
