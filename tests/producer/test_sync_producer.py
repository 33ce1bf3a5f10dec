"""SyncProducer: blocking calls over the trio producer, a fake cluster served over TCP.

``send`` queues the call and returns a ``SyncDelivery`` without a thread hop; a pump in
the producer's thread sends the queued calls in order; the other calls hop and wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from pipeline import MessageTooLargeError, ProducerError, ProducerMessage, SyncProducer
from pipeline.producer._sync import SyncDelivery
from pipeline.testing.fake_cluster import FakeCluster


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    """A fake cluster on real sockets, run by trio in a thread of its own."""
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        async with FakeCluster.serve(brokers=1, tcp=True, auto_create_topics=False) as fake:
            fake.create_topic("t", 2)
            holder.update(fake=fake, token=trio.lowlevel.current_trio_token(),
                          stop=trio.Event())
            ready.set()
            await holder["stop"].wait()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield holder["fake"]
    finally:
        trio.from_thread.run_sync(holder["stop"].set, trio_token=holder["token"])
        thread.join(10)


def values(fake: FakeCluster, partition: int) -> list[bytes | None]:
    return [e.record.value for e in fake.log("t", partition)]


def test_sends_return_at_once_and_keep_their_order(fake: FakeCluster) -> None:
    with SyncProducer(fake.bootstrap, linger=0.05) as producer:
        handles = [producer.send("t", b"%d" % i, partition=0) for i in range(2000)]
        assert all(isinstance(h, SyncDelivery) for h in handles)
        assert not handles[-1].done()  # queued or pending: send() did not wait
        result = producer.send_many([ProducerMessage("t", b"many", partition=0)])
        assert result.delivered == 1
        producer.flush()
        assert all(h.done() for h in handles)
        metas = [h.get() for h in handles]
        assert [m.offset for m in metas] == list(range(2000))
        assert producer.statistics().succeeded == 2001
    assert values(fake, 0) == [b"%d" % i for i in range(2000)] + [b"many"]


def test_what_the_producer_refuses_is_the_handles_outcome(fake: FakeCluster) -> None:
    with SyncProducer(fake.bootstrap, max_message_bytes=1000) as producer:
        big = producer.send("t", b"x" * 2000)
        with pytest.raises(MessageTooLargeError):
            big.get(timeout=10)
        assert big.done()
        nosuch = producer.send("nosuch", b"x", partition=3)
        with pytest.raises(ProducerError):
            nosuch.get(timeout=30)
        with pytest.raises(TypeError, match="value bytes, str or None"):
            producer.send("t", 42)  # type: ignore[arg-type]


def test_get_with_a_timeout_raises_and_the_record_keeps_its_outcome(fake: FakeCluster) -> None:
    with SyncProducer(fake.bootstrap, linger=2.0) as producer:
        handle = producer.send("t", b"slow", partition=1)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="keeps its own"):
            handle.get(timeout=0.2)
        assert time.monotonic() - started < 1.5
        assert handle.get(timeout=10).offset == 0


def test_send_batch_and_close_send_what_is_queued(fake: FakeCluster) -> None:
    producer = SyncProducer(fake.bootstrap)
    result = producer.send_batch("t", [b"a", b"b", b"c"], partitions=[1, 1, 1])
    assert (result.delivered, result.failed) == (3, 0)
    last = producer.send("t", b"queued at close", partition=1)
    producer.close()
    assert last.get().offset == 3
    with pytest.raises(Exception, match="closed"):
        producer.send("t", b"after")
    assert values(fake, 1) == [b"a", b"b", b"c", b"queued at close"]
