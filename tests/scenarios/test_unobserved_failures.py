"""No silent loss: a failure nobody reads is logged, aggregated, once per window.

``pipeline/producer/_outcomes/unobserved.py``: the ledger keeps every failure whose
outcome reaches no one; one WARNING reports those still unread after 5 s (per topic and
partition, with the first error), and leaving the block reports the rest; with
``raise_on_unobserved_failure=True`` leaving the block raises them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from pipeline import ProducerError, ProducerMessage, wait_all
from pipeline.producer._api import UNOBSERVED_WINDOW
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer

MARK = "nobody read their outcome"


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    async with FakeCluster.serve(brokers=1, seed=1, auto_create_topics=False) as fake:
        fake.create_topic("t", 1)
        yield fake


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and MARK in r.getMessage()]


async def test_ten_thousand_failures_nobody_reads_warn_once_per_window(
        fake: FakeCluster, caplog: pytest.LogCaptureFixture,
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, delivery_timeout=20.0) as producer:
        for i in range(10_000):
            await producer.send("nosuch", b"%d" % i)  # a typo in the topic name
        await producer.flush()
        assert producer.statistics().failed == 10_000
        await trio.sleep(3 * UNOBSERVED_WINDOW)
        assert len(warnings(caplog)) == 1
    [message] = warnings(caplog)  # nothing left for the close to report
    assert message.startswith("10000 record(s) failed")
    assert "10000 to nosuch" in message and "UnknownTopicError" in message


async def test_a_steady_stream_of_failures_warns_once_per_window(
        fake: FakeCluster, caplog: pytest.LogCaptureFixture,
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, delivery_timeout=20.0) as producer:
        for _ in range(3):
            for i in range(10):
                await producer.send("nosuch", b"%d" % i)
            await producer.flush()
            await trio.sleep(UNOBSERVED_WINDOW + 1)
        assert len(warnings(caplog)) == 3


async def test_failures_that_are_read_are_not_reported(
        fake: FakeCluster, caplog: pytest.LogCaptureFixture,
        autojump_clock: trio.testing.MockClock) -> None:
    called = []
    async with open_fake_producer(fake, delivery_timeout=20.0) as producer:
        deliveries = [await producer.send("nosuch", b"%d" % i) for i in range(1000)]
        for _ in range(100):
            await producer.send("nosuch", b"cb", on_delivery=lambda m, e: called.append(e))
        group = await producer.send_many([ProducerMessage("nosuch", b"m") for _ in range(10)])
        await producer.flush()
        await trio.sleep(1.0)  # within the window, the caller reads every outcome
        result = await wait_all(deliveries)
        assert result.failed == 1000
        assert (await group).failed == 10
        await trio.sleep(3 * UNOBSERVED_WINDOW)
    assert len(called) == 100
    assert warnings(caplog) == []


async def test_awaiting_each_delivery_reads_its_failure(
        fake: FakeCluster, caplog: pytest.LogCaptureFixture,
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, delivery_timeout=20.0) as producer:
        deliveries = [await producer.send("nosuch", b"%d" % i) for i in range(50)]
        for d in deliveries:
            with pytest.raises(Exception, match="nosuch"):
                await d
        await trio.sleep(2 * UNOBSERVED_WINDOW)
    assert warnings(caplog) == []


async def test_what_is_unread_at_close_is_reported_then(
        fake: FakeCluster, caplog: pytest.LogCaptureFixture,
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, delivery_timeout=20.0) as producer:
        for i in range(7):
            await producer.send("nosuch", b"%d" % i)
        await producer.flush()
    [message] = warnings(caplog)
    assert "7 record(s)" in message and "when the producer closed" in message


async def test_raise_on_unobserved_failure_raises_them_when_the_block_ends(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async def send_and_leave() -> None:
        async with open_fake_producer(fake, delivery_timeout=20.0,
                                      raise_on_unobserved_failure=True) as producer:
            for i in range(3):
                await producer.send("nosuch", b"%d" % i)
            await producer.send("t", b"fine")
            await producer.flush()

    with pytest.raises(ExceptionGroup, match="3 record") as caught:
        await send_and_leave()
    assert [type(e.cause).__name__ for e in caught.value.exceptions] == [
        "UnknownTopicError"] * 3


async def test_a_failed_row_without_a_callback_is_reported_beside_rows_with_one(
        fake: FakeCluster, caplog: pytest.LogCaptureFixture,
        autojump_clock: trio.testing.MockClock) -> None:
    # One columnar send() burst (burst.py) whose rows all fail: a third of them carry an
    # on_delivery, which hears; the others reach no one and are reported.
    heard: list[BaseException | None] = []
    async with open_fake_producer(fake) as producer:
        producer._intake._columns_next = True  # (the white-box switch of test_send_rows.py)
        deliveries = []
        for i in range(20):
            callback = (lambda md, err: heard.append(err)) if i % 3 == 0 else None
            deliveries.append(await producer.send("t", b"%d" % i, partition=5,
                                                  on_delivery=callback))
        await producer.flush()
        assert {type(d).__name__ for d in deliveries} == {"RowDelivery"}
        del deliveries
    assert len(heard) == 7 and all(e is not None for e in heard)
    [message] = warnings(caplog)
    assert message.startswith("13 record(s) failed"), message


async def test_reading_some_failed_rows_of_a_burst_leaves_the_others_reported(
        fake: FakeCluster, caplog: pytest.LogCaptureFixture,
        autojump_clock: trio.testing.MockClock) -> None:
    # One columnar send() burst whose rows all fail: the caller reads the failures of
    # 12 rows (awaiting four, the others through wait_all); those of the other 8, which
    # nobody reads, are still reported: reading one row's failure does not make its
    # burst's other rows observed.
    async with open_fake_producer(fake) as producer:
        producer._intake._columns_next = True  # (the white-box switch of test_send_rows.py)
        deliveries = [await producer.send("t", b"%d" % i, partition=5) for i in range(20)]
        assert {type(d).__name__ for d in deliveries} == {"RowDelivery"}
        for d in deliveries[0:8:2]:
            with pytest.raises(ProducerError):
                await d
        result = await wait_all(deliveries[8::2] + deliveries[13:16])  # (14 twice)
        assert result.failed == 9
        del deliveries
    [message] = warnings(caplog)
    assert message.startswith("8 record(s) failed"), message


async def test_a_send_batch_nobody_awaits_has_its_failures_reported(
        fake: FakeCluster, caplog: pytest.LogCaptureFixture,
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake) as producer:
        await producer.send_batch("t", [b"%d" % i for i in range(10)], partitions=[5] * 10)
        await producer.flush()
    [message] = warnings(caplog)
    assert message.startswith("10 record(s) failed") and "PartitionOutOfRangeError" in message
