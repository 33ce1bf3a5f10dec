"""The exactly-once partition export without Spark, on Apache Kafka (1 node): each
task attempt is ``export_partition`` on Arrow batches with the config the driver's
``prepare`` makes, run in threads where attempts overlap. What the topic holds is read
by confluent-kafka, ``read_committed`` (and ``read_uncommitted`` where it shows what the
aborted attempts wrote)."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from pipeline.spark.exactly_once_job import prepare  # noqa: E402
from pipeline.spark.ledger import Marker, ledger_key  # noqa: E402
from pipeline.spark.partition import export_partition  # noqa: E402
from pipeline.spark.status import ExportConfig, ExportTaskError, PartitionStatus  # noqa: E402

from .conftest import read_all  # noqa: E402

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

if False:  # typing only
    from pipeline.testing.kafka import KafkaCluster


def _batches(start: int, stop: int, size: int = 64, *, tag: str = "r") -> Iterator[Any]:
    for lo in range(start, stop, size):
        hi = min(lo + size, stop)
        yield pa.RecordBatch.from_pydict({
            "key": pa.array([f"k{i % 7}" for i in range(lo, hi)]),
            "value": pa.array([f"{tag}{i}".encode() for i in range(lo, hi)], pa.binary()),
        })


OPTIONS = {"linger": 0.002, "transaction_timeout": 20.0}


@dataclasses.dataclass
class Setup:
    bootstrap: str
    topic: str
    ledger: str
    export_id: str

    def config(self, *, commit_rows: int | None = 100, fault: int | None = None,
               options: dict[str, Any] | None = None, **eo: Any) -> ExportConfig:
        """The tasks' config, as export_dataframe makes it (the ledger read anew)."""
        opts = {**OPTIONS, **(options or {})}
        exactly, _ = prepare(bootstrap=self.bootstrap, topic=self.topic,
                             export_id=self.export_id, ledger_topic=self.ledger,
                             producer_options=opts,
                             commit_interval=eo.pop("commit_interval", None),
                             commit_rows=commit_rows, transactional_id_prefix="test-eo-",
                             verify_done=eo.pop("verify_done", False))
        return ExportConfig(bootstrap=self.bootstrap, topic=self.topic, producer_options=opts,
                            chunk_rows=50, fail_first_attempt_after_rows=fault,
                            exactly_once=exactly)

    def values(self, isolation: str = "read_committed") -> list[bytes]:
        return sorted(m.value() for m in read_all(self.bootstrap, self.topic, isolation))

    def markers(self) -> list[Marker]:
        return [Marker.decode(m.value()) for m in read_all(self.bootstrap, self.ledger,
                                                           "read_committed")]


@pytest.fixture
def setup(kafka_single: KafkaCluster, kafka_topic: Callable[[str], str]) -> Setup:
    topic = kafka_topic("eo")
    kafka_single.create_topic(topic, 3, replication_factor=1)
    return Setup(kafka_single.bootstrap, topic, kafka_topic("ledger"),
                 f"eo-{uuid.uuid4().hex[:8]}")


def _want(n: int, tag: str = "r") -> list[bytes]:
    return sorted(f"{tag}{i}".encode() for i in range(n))


def test_a_retry_resumes_after_the_committed_chunks(setup: Setup) -> None:
    cfg = setup.config(fault=250)
    with pytest.raises(ExportTaskError, match="injected fault"):
        export_partition(_batches(0, 500), cfg, partition=2, attempt=0)
    # attempt 0 committed two transactions of 100 rows; its third (50 rows) is aborted
    assert setup.values() == sorted(f"r{i}".encode() for i in range(200))
    assert len(setup.values("read_uncommitted")) == 250
    [m] = [m for m in setup.markers() if m.rows == 200]
    assert (m.partition, m.complete, m.chunks, m.attempt) == (2, False, 2, 0)

    status = export_partition(_batches(0, 500), cfg, partition=2, attempt=1)
    assert (status.outcome, status.resumed_rows, status.committed_rows) == ("committed", 200, 500)
    assert status.delivered == 500  # what this run (both attempts) committed
    assert status.transactions == 3
    assert status.writer_attempt == 1
    assert setup.values() == _want(500)  # every row exactly once
    assert len(setup.values("read_uncommitted")) == 550  # + the aborted 50
    latest = max(setup.markers(), key=lambda m: m.rows)
    assert (latest.rows, latest.complete, latest.chunks) == (500, True, 5)


def test_a_rerun_writes_only_what_follows_the_committed_rows(setup: Setup) -> None:
    first = export_partition(_batches(0, 300), setup.config(), partition=0)
    assert (first.outcome, first.delivered, first.transactions) == ("committed", 300, 3)

    # Another run (a new driver read of the ledger, a new run id) re-reads the partition,
    # finds the same 300 rows and nothing after them: nothing is written.
    again = export_partition(_batches(0, 300), setup.config(), partition=0)
    assert (again.outcome, again.delivered, again.committed_rows) == ("skipped", 0, 300)
    assert (again.resumed_rows, again.transactions) == (300, 0)
    assert setup.values() == _want(300)

    # A marker's "complete" only says that its attempt's input ended: PySpark ends a
    # worker's input quietly when the computation upstream fails. So a partition with
    # more rows than were committed gets the rest, once.
    more = export_partition(_batches(0, 301), setup.config(), partition=0)
    assert (more.outcome, more.delivered, more.resumed_rows) == ("committed", 1, 300)
    assert setup.values() == _want(301)

    # Other rows under the same export id are refused, never written.
    with pytest.raises(ExportTaskError, match="cannot resume"):
        export_partition(_batches(0, 301, tag="x"), setup.config(), partition=0)
    assert setup.values() == _want(301)


def test_a_finished_export_is_skipped_unread_or_checked(setup: Setup) -> None:
    from pipeline.spark.exactly_once_job import finish

    cfg = setup.config()
    export_partition(_batches(0, 200), cfg, partition=0)
    assert cfg.exactly_once is not None and not cfg.exactly_once.done
    finish(bootstrap=setup.bootstrap, eo=cfg.exactly_once, partitions=1, rows=200,
           producer_options=OPTIONS)

    def unread() -> Iterator[Any]:
        raise AssertionError("a finished export's partition was read")
        yield

    skipped = export_partition(unread(), setup.config(), partition=0)
    assert (skipped.outcome, skipped.committed_rows, skipped.delivered) == ("skipped", 200, 0)
    checked = export_partition(_batches(0, 200), setup.config(verify_done=True), partition=0)
    assert checked.outcome == "skipped"
    with pytest.raises(ExportTaskError, match="committed whole by a finished run"):
        export_partition(_batches(0, 200, tag="x"), setup.config(verify_done=True),
                         partition=0)
    with pytest.raises(ExportTaskError, match="has more rows"):
        export_partition(_batches(0, 201), setup.config(verify_done=True), partition=0)
    with pytest.raises(ExportTaskError, match="fewer Spark partitions"):
        export_partition(_batches(0, 5), setup.config(), partition=1)
    assert setup.values() == _want(200)


def test_a_retry_over_other_rows_refuses_to_resume(setup: Setup) -> None:
    cfg = setup.config(fault=150)
    with pytest.raises(ExportTaskError, match="injected fault"):
        export_partition(_batches(0, 400), cfg, partition=1, attempt=0)
    assert len(setup.values()) == 100
    # the partition's order changed between attempts (a non-deterministic shuffle)
    shuffled = [b for b in _batches(0, 400)][::-1]
    with pytest.raises(ExportTaskError, match="cannot resume") as info:
        export_partition(iter(shuffled), cfg, partition=1, attempt=1)
    assert "deterministic" in str(info.value)
    assert len(setup.values()) == 100  # nothing more written
    assert len(setup.values("read_uncommitted")) == 150


def test_an_empty_partition_is_committed_and_then_skipped(setup: Setup) -> None:
    status = export_partition(iter([]), setup.config(), partition=5)
    assert (status.outcome, status.committed_rows, status.transactions) == ("committed", 0, 1)
    again = export_partition(iter([]), setup.config(), partition=5)
    assert again.outcome == "skipped"
    [m] = setup.markers()
    assert (m.partition, m.rows, m.complete) == (5, 0, True)


def test_a_later_attempt_fences_an_earlier_one_which_then_waits_for_it(setup: Setup) -> None:
    """Speculation: attempt 0 stalls with a transaction open; attempt 1 starts, fences it
    (aborting that transaction), writes the partition. Attempt 0, let go, is refused as
    fenced and reports the partition once attempt 1 completed it, never writing again."""
    # attempt 0's transaction stays open while the test waits (a loaded machine included):
    # the broker must not time it out first
    cfg = setup.config(commit_rows=None, commit_interval=60.0,
                       options={"transaction_timeout": 120.0})
    stall, stalled = threading.Event(), threading.Event()

    def slow() -> Iterator[Any]:
        yield from _batches(0, 200)
        stalled.set()
        stall.wait(60)
        yield from _batches(200, 400)

    results: dict[str, Any] = {}

    def first() -> None:
        try:
            results["a0"] = export_partition(slow(), cfg, partition=3, attempt=0)
        except BaseException as exc:
            results["a0"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert stalled.wait(60)
        wait_for_rows(setup, 200)  # attempt 0's first rows are written, not committed
        assert setup.values() == []
        second: PartitionStatus = export_partition(_batches(0, 400), cfg, partition=3,
                                                   attempt=1)
        assert (second.outcome, second.delivered, second.writer_attempt) == ("committed", 400, 1)
    finally:
        stall.set()
        thread.join(120)
    a0 = results["a0"]
    assert isinstance(a0, PartitionStatus), a0
    assert (a0.outcome, a0.writer_attempt, a0.committed_rows) == ("committed", 1, 400)
    assert a0.transactions == 0
    assert setup.values() == _want(400)
    assert len(setup.values("read_uncommitted")) >= 600  # attempt 0's 200, aborted


def wait_for_rows(setup: Setup, n: int) -> None:
    import time

    deadline = time.monotonic() + 30
    while len(setup.values("read_uncommitted")) < n:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_markers_are_keyed_by_export_and_partition(setup: Setup) -> None:
    export_partition(_batches(0, 10), setup.config(), partition=7)
    [msg] = read_all(setup.bootstrap, setup.ledger, "read_committed")
    assert msg.key() == ledger_key(setup.export_id, 7)
