"""SyncConsumer: the blocking consumer, against a fake cluster served over TCP."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import trio

from pipeline import SyncConsumer, SyncProducer
from pipeline.consumer import (
    ConsumedRecord,
    ConsumerClosedError,
    OffsetAndMetadata,
    TopicPartition,
)
from pipeline.testing.fake_cluster import FakeCluster


@pytest.fixture
def tcp_fake() -> Iterator[FakeCluster]:
    """A FakeCluster on 127.0.0.1 ports, run by trio in a thread of its own."""
    fake = FakeCluster(brokers=2, tcp=True, auto_create_topics=False, seed=3)
    fake.create_topic("t", 2)
    ready = threading.Event()
    token: list[trio.lowlevel.TrioToken] = []
    stop: list[trio.Event] = []

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(fake.run)
            token.append(trio.lowlevel.current_trio_token())
            stop.append(trio.Event())
            ready.set()
            await stop[0].wait()
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    ready.wait(10)
    yield fake
    trio.from_thread.run_sync(stop[0].set, trio_token=token[0])
    thread.join(10)


def test_consume_commit_and_resume(tcp_fake: FakeCluster) -> None:
    with SyncProducer(tcp_fake.bootstrap, linger=0.0) as producer:
        for i in range(6):
            producer.send("t", f"v{i}".encode(), partition=i % 2)
    options = dict(group_id="g", topics=["t"], auto_offset_reset="earliest",
                   enable_auto_commit=False, session_timeout=10.0, heartbeat_interval=1.0)
    with SyncConsumer(tcp_fake.bootstrap, **options) as consumer:
        got: list[ConsumedRecord] = []
        while len(got) < 6:
            got.extend(consumer.consume(10, timeout=10))
        assert sorted(r.value or b"" for r in got) == [f"v{i}".encode() for i in range(6)]
        assert consumer.assignment() == {TopicPartition("t", 0), TopicPartition("t", 1)}
        assert consumer.position(("t", 0)) == 3 and consumer.state == "stable"
        consumer.commit()
        # the positions after the records returned, with their leader epoch
        assert consumer.committed([("t", 0), ("t", 1)]) == {
            TopicPartition("t", 0): OffsetAndMetadata(3, "", 0),
            TopicPartition("t", 1): OffsetAndMetadata(3, "", 0),
        }
        assert consumer.poll(timeout=0.5) is None
    with pytest.raises(ConsumerClosedError):
        consumer.poll(timeout=0.1)
    with SyncProducer(tcp_fake.bootstrap, linger=0.0) as producer:
        producer.send("t", b"later", partition=0)
    with SyncConsumer(tcp_fake.bootstrap, **options) as again:
        record = again.poll(timeout=10)
        assert record is not None and (record.value, record.offset) == (b"later", 3)


def test_consume_columns_reads_runs_and_commits_past_them(tcp_fake: FakeCluster) -> None:
    with SyncProducer(tcp_fake.bootstrap, linger=0.0) as producer:
        for i in range(6):
            producer.send("t", f"v{i}".encode(), partition=i % 2)
    options = dict(group_id="gc", topics=["t"], auto_offset_reset="earliest",
                   enable_auto_commit=False, session_timeout=10.0, heartbeat_interval=1.0)
    with SyncConsumer(tcp_fake.bootstrap, **options) as consumer:
        values: list[bytes | None] = []
        while len(values) < 6:
            run = consumer.consume_columns(2, timeout=10)
            assert run is not None and 1 <= len(run) <= 2
            values.extend(run.values.to_pylist())
        assert sorted(v or b"" for v in values) == [f"v{i}".encode() for i in range(6)]
        consumer.commit()
        assert consumer.committed([("t", 0), ("t", 1)]) == {
            TopicPartition("t", 0): OffsetAndMetadata(3, "", 0),
            TopicPartition("t", 1): OffsetAndMetadata(3, "", 0),
        }
        assert consumer.consume_columns(timeout=0.5) is None
