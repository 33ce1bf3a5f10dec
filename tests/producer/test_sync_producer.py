"""SyncProducer: blocking calls over the trio producer, a fake cluster served over TCP.

``send`` queues the call and returns a ``SyncDelivery`` without a thread hop; a pump in
the producer's thread sends the queued calls in order; the other calls hop and wait.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from pipeline import MessageTooLargeError, ProducerError, ProducerMessage, SyncProducer
from pipeline.producer import _sync
from pipeline.producer._columnar.burst import RowDelivery
from pipeline.producer._errors import ProducerClosed
from pipeline.producer._speedups import fields
from pipeline.producer._sync import SyncDelivery
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    """A fake cluster on real sockets, run by trio in a thread of its own."""
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        async with FakeCluster.serve(brokers=1, tcp=True, auto_create_topics=False) as fake:
            fake.create_topic("t", 2)
            fake.create_topic("one", 1)
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


def values(fake: FakeCluster, partition: int, topic: str = "t") -> list[bytes | None]:
    return [e.record.value for e in fake.log(topic, partition)]


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
            producer.send("t", 42)


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


def test_serializers_take_any_object_and_a_wrong_type_is_still_refused(
        fake: FakeCluster) -> None:
    with SyncProducer(fake.bootstrap, value_serializer="json", key_serializer="str") as producer:
        meta = producer.send("t", {"id": 1, "tags": ["a"]}, key="c1", partition=0).get()
        assert meta.offset == 0
    assert values(fake, 0) == [b'{"id":1,"tags":["a"]}']
    with SyncProducer(fake.bootstrap) as producer, pytest.raises(TypeError, match="value bytes"):
        producer.send("t", {"id": 2})  # no serializer: a dict is a mistake


def test_plain_sends_keep_their_order_and_outcomes_on_each_send_path(
        fake: FakeCluster, send_path: str) -> None:
    """Plain calls (the pump's C branch takes them in bulk on the C path), calls with
    keywords and a refused call, interleaved: the log holds the accepted ones in call
    order and every handle has its own outcome, on either path."""
    sent: list[bytes | None] = []
    with SyncProducer(fake.bootstrap, max_message_bytes=1000) as producer:
        handles = []
        for i in range(6000):
            value: bytes | str | None = b"%d" % i if i % 3 else f"s{i}"
            if i % 1000 == 999:
                handles.append(producer.send("one", value, key=b"k"))
            elif i == 3001:
                value = b"x" * 2000  # refused: too large
                refused = producer.send("one", value)
                continue
            elif i == 4500:
                value = None
                handles.append(producer.send("one", value))
            else:
                handles.append(producer.send("one", value))
            sent.append(value.encode() if isinstance(value, str) else value)
        producer.flush()
        assert [h.get().offset for h in handles] == list(range(len(sent)))
        with pytest.raises(MessageTooLargeError):
            refused.get()
        assert producer.statistics().succeeded == len(sent)
    assert values(fake, 0, "one") == sent
    keyed = [e.record.value for e in fake.log("one", 0) if e.record.key == b"k"]
    assert keyed == [b"%d" % i if i % 3 else b"s%d" % i for i in range(999, 6000, 1000)]


async def test_the_c_pump_takes_plain_calls_of_the_open_burst_and_stops_at_any_other(
        nursery: trio.Nursery) -> None:
    """``Sender.pump``: the deque's head calls, while plain and taken by the row branch;
    the first other call (keywords, another topic than the burst's, a non-atomic value)
    stays first in the deque for the awaited send."""
    if _sync._send_c is None:
        pytest.skip("the _send extension is not built (or PIPELINE_PURE_PYTHON is set)")
    fake = FakeCluster(brokers=1, seed=1, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("one", 1)
    fake.create_topic("other", 1)
    async with open_fake_producer(fake) as producer:
        send = producer.send
        assert type(send) is _sync._send_c.Sender
        producer._intake._columns_next = True
        first = await send("one", b"first")  # opens the columnar burst of "one"
        assert type(first) is RowDelivery

        def handle(topic: str, value: object, kwargs: dict[str, object] | None = None,
                   ) -> SyncDelivery:
            return SyncDelivery(None, topic, value, kwargs)  # type: ignore[arg-type]

        plain = [handle("one", b"v%d" % i) for i in range(5)] + [handle("one", "s"),
                                                                  handle("one", None)]
        for stopper in (handle("one", b"k", {"key": b"k"}), handle("other", b"o"),
                        handle("one", {"not": "atomic"})):
            queue = deque([*plain, stopper, handle("one", b"after")])
            assert send.pump(queue) == len(plain)
            assert queue[0] is stopper and len(queue) == 2
            assert all(type(h._delivery) is RowDelivery and h._value is None
                       and h._error is None for h in plain)
            assert stopper._delivery is None and stopper._value is not None
            for h in (*plain, stopper):  # what fields.SYNC_HANDLE declares C may find
                for field in fields.SYNC_HANDLE:
                    if field.name == "_sync":
                        continue  # (these handles have no producer)
                    kind = type(getattr(h, field.name)).__name__
                    assert kind in field.types or (field.name == "_value" and h is stopper)
            plain = [handle("one", b"w%d" % i) for i in range(3)]
        await producer.flush()
    got = values(fake, 0, "one")
    assert got[:8] == [b"first", *(b"v%d" % i for i in range(5)), b"s", None]


def test_a_plain_handle_leaves_the_cyclic_gc_and_others_stay(fake: FakeCluster) -> None:
    """Queued plain calls are not GC objects on the C path (they refer to nothing that
    refers back); a call with keywords (a callback may refer to its handle) or a
    serializer's object stays tracked."""
    with SyncProducer(fake.bootstrap) as producer:
        plain = producer.send("t", b"raw")
        keyed = producer.send("t", b"raw", key=b"k", on_delivery=lambda m, e: None)
        assert gc.is_tracked(plain) is (_sync._send_c is None)
        assert gc.is_tracked(keyed)
        producer.flush()
        assert plain.get().partition in (0, 1) and keyed.get().partition in (0, 1)
    with SyncProducer(fake.bootstrap, value_serializer="json") as producer:
        obj = producer.send("t", {"a": [1]})
        assert gc.is_tracked(obj)
        assert obj.get().partition in (0, 1)


class _CountingCondition(threading.Condition):
    """A Condition that counts its waits and those its timeout ended."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = self.timeouts = 0

    def wait(self, timeout: float | None = None) -> bool:
        woken = super().wait(timeout)
        self.waits += 1
        self.timeouts += not woken
        return woken


def test_a_caller_ahead_of_a_small_queue_waits_and_loses_nothing(
        fake: FakeCluster, send_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue of 64 calls at most: the caller waits for room (until it is half empty)
    again and again; every call is sent once, in order, with its own outcome."""
    monkeypatch.setattr(_sync, "_PENDING_MAX", 64)
    monkeypatch.setattr(_sync, "_PENDING_LOW", 32)
    monkeypatch.setattr(_sync, "_HAND_OVER_MASK", (1 << 30) - 1)  # (the caller runs ahead)
    with SyncProducer(fake.bootstrap) as producer:
        assert (producer._queue is not None) is (send_path == "c" and _sync._send_c is not None)
        room = producer._room = _CountingCondition()
        handles, peak = [], 0
        for i in range(6000):
            handles.append(producer.send("one", b"%d" % i))
            peak = max(peak, len(producer._pending))  # (only this thread appends)
        assert 64 >= peak > 32  # bounded, and the caller did run ahead
        producer.flush()
        assert [h.get().offset for h in handles] == list(range(6000))
    assert values(fake, 0, "one") == [b"%d" % i for i in range(6000)]
    # ~190 waits for room, each ended by the pump's wake-up at half: a caller not woken
    # would wait out its 0.1 s poll every time. (A pump that empties the queue between the
    # caller's check and its wait leaves that one wait to its poll: rare, so a few.)
    assert room.waits > 50 and room.timeouts <= max(3, room.waits // 10), vars(room)


def test_the_c_queue_makes_the_twins_handle_and_leaves_every_other_call_to_it(
        fake: FakeCluster) -> None:
    """``SyncQueue``: a plain call's handle is the one ``SyncDelivery.__init__`` makes
    (untracked); keywords, a non-str topic, another value type and a closed producer are
    the Python method's (its errors, its handles)."""
    if _sync._send_c is None:
        pytest.skip("the _send extension is not built (or PIPELINE_PURE_PYTHON is set)")
    producer = SyncProducer(fake.bootstrap, linger=1.0)
    try:
        assert type(producer.send) is _sync._send_c.SyncQueue
        plain = producer.send("one", "text")
        assert type(plain) is SyncDelivery and not gc.is_tracked(plain)
        assert (plain._sync, plain._topic, plain._kwargs) == (producer, "one", None)
        keyed = producer.send("one", b"v", key=b"k")
        assert keyed._kwargs == {"key": b"k"} and gc.is_tracked(keyed)
        with pytest.raises(TypeError, match="topic must be a str"):
            producer.send(b"one", b"v")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="value bytes, str or None"):
            producer.send("one", 42)
        # the pump was woken by the first call queued: no flush needed for an outcome
        assert producer.send("one", b"w").get(timeout=10).offset == 2
        assert plain.get().offset == 0 and keyed.get().offset == 1
        refused = SyncDelivery(producer, "one", b"v", None)
        assert _sync._send_c.untracked(refused) is refused and not gc.is_tracked(refused)
    finally:
        producer.close()
    with pytest.raises(ProducerClosed):
        producer.send("one", b"after")
