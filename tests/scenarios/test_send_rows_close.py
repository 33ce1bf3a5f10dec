"""A close that fails a columnar ``send()`` burst on its way through the
stages (found by the schedule explorer: ``tests/explore/regressions/
abort-close-routes-a-failed-burst.json`` is the schedule, shrunk).

A close without flush (the producer's block left by an error) fails whatever
is outstanding at once (``Ledger.fail_all_outstanding``), releasing its
buffer bytes, while the stages are only cancelled at their next checkpoint. A
burst's run the dispatcher had just forwarded, or still holds, reaches the
topic producer failed. The topic producer split it anyway and released the
difference between the burst's reserved bound and its runs' exact sizes a
second time: ``buffered_bytes`` ended negative, and the split runs went on to
the partition producers, to be written although they had failed."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from pipeline.producer._columnar.burst import RowDelivery
from pipeline.producer._errors import ProducerClosed
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log


@pytest.fixture(autouse=True)
def _modes(both_modes: bool) -> bool:
    return both_modes


async def test_a_burst_failed_by_a_close_on_its_way_is_neither_routed_nor_released_twice(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Schedule: 100 rows of one columnar burst, still in the intake; then what
    the close does to it (sealed and failed with ProducerClosed, its bytes
    released) before the dispatcher passes it on; then the stages run. The
    topic producer must drop the failed run: no byte released twice, nothing
    written, every row failed once with ProducerClosed."""
    fake.create_topic("t", 3)
    async with open_fake_producer(fake) as producer:
        await producer._core.cluster.partitions_for("t")
        producer._intake._columns_next = True
        rows = [await producer.send("t", b"r%d" % i) for i in range(100)]
        assert {type(d) for d in rows} == {RowDelivery}
        ledger = producer._ledger
        assert ledger.buffered_bytes > 0
        # The close's fail_all_outstanding, for the burst alone (the pipeline
        # keeps running here, as the stages do until their next checkpoint).
        ledger.fail_all_outstanding(ProducerClosed("closed under the burst"))
        assert ledger.buffered_bytes == 0
        await trio.testing.wait_all_tasks_blocked()  # dispatcher -> topic producer -> ...
        assert ledger.buffered_bytes == 0
        assert [values_in_log(fake, "t", p) for p in range(3)] == [[], [], []]
        stats = producer.statistics()
        assert (stats.double_settles, stats.outstanding, stats.failed) == (0, 0, 100)
    for d in rows:
        assert d.done() and isinstance(d._outcome, ProducerClosed)
