"""Serializers and interceptors (``pipeline/producer/_intake/hooks.py``) on the fake cluster.

The producer-flow seed's order: ``on_send`` (each interceptor, in order) -> serializers
-> partitioner ... -> ``on_acknowledgement`` once per record. A failing serializer
refuses its record with ``SerializationError``; a failing interceptor is logged and
counted, never fatal. With none set, the plain send path is used.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing

from pipeline import ConfigError, ProducerMessage
from pipeline.producer._errors import SerializationError
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    async with FakeCluster.serve(brokers=1, seed=1, auto_create_topics=False) as fake:
        fake.create_topic("orders", 1)
        yield fake


def written(fake: FakeCluster) -> list[tuple[bytes | None, bytes | None, Any]]:
    return [(e.record.key, e.record.value, e.record.headers) for e in fake.log("orders", 0)]


class Recorder:
    """An interceptor that adds a header and records what it saw."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[Any] = []
        self.acks: list[tuple[Any, Any]] = []

    def on_send(self, message: ProducerMessage) -> ProducerMessage:
        self.sent.append(message.value)
        message.headers = [*message.headers, ("seen-by", self.name.encode())]
        return message

    def on_acknowledgement(self, metadata: Any, error: Any) -> None:
        self.acks.append((None if metadata is None else metadata.offset,
                          None if error is None else type(error).__name__))


async def test_named_serializers_encode_keys_and_values(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, key_serializer="str",
                                  value_serializer="json") as producer:
        await producer.send("orders", {"id": 1, "total": 9.5}, key="c1")
        producer.send_nowait("orders", [1, 2], key="c2")
        group = await producer.send_many([ProducerMessage("orders", {"id": 3}, key="c3")])
        batch = await producer.send_batch("orders", [{"id": 4}, None], keys=["c4", "c5"])
        await producer.flush()
        assert (await group).delivered == 1 and (await batch).delivered == 2
    got = [(k, v) for k, v, _ in written(fake)]
    assert got == [(b"c1", b'{"id":1,"total":9.5}'), (b"c2", b"[1,2]"), (b"c3", b'{"id":3}'),
                   (b"c4", b'{"id":4}'), (b"c5", None)]
    assert json.loads(got[0][1]) == {"id": 1, "total": 9.5}


async def test_a_failing_serializer_refuses_that_record_and_nothing_else(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, value_serializer="json") as producer:
        await producer.send("orders", {"ok": 1})
        with pytest.raises(SerializationError, match=r"value_serializer failed for a record "
                           r"to 'orders': TypeError: .*set"):
            await producer.send("orders", {1, 2})  # a set: not JSON
        with pytest.raises(SerializationError, match="message 1: "):
            await producer.send_many([ProducerMessage("orders", 1),
                                      ProducerMessage("orders", {3})])
        await producer.send("orders", {"ok": 2})
        stats = producer.statistics()
    assert (stats.accepted, stats.failed) == (2, 0)
    assert [v for _, v, _ in written(fake)] == [b'{"ok":1}', b'{"ok":2}']


async def test_a_serializer_must_return_bytes(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, value_serializer=lambda v: v.upper()) as producer:
        with pytest.raises(SerializationError, match=r"returned str .* bytes or None"):
            await producer.send("orders", "abc")


async def test_interceptors_run_in_order_before_serialization_and_ack_once(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    first, second = Recorder("first"), Recorder("second")
    async with open_fake_producer(fake, interceptors=[first, second],
                                  value_serializer="str") as producer:
        d = await producer.send("orders", "one")
        await producer.send("nosuch", "lost", partition=0)
        group = await producer.send_many([ProducerMessage("orders", "two")])
        await producer.send_batch("orders", ["three"])
        await producer.flush()
        await d
        await group
        await trio.sleep(0.1)  # (a send_many group's acks run in a task)
    assert first.sent == second.sent == ["one", "lost", "two", "three"]  # before serializing
    headers = [h for _, _, h in written(fake)]
    assert list(headers[0]) == [("seen-by", b"first"), ("seen-by", b"second")]
    assert sorted(first.acks, key=str) == sorted(
        [(0, None), (None, "UnknownTopicError"), (1, None), (2, None)], key=str)
    assert first.acks == second.acks


async def test_a_failing_interceptor_is_logged_and_counted_never_fatal(
        fake: FakeCluster, caplog: pytest.LogCaptureFixture,
        autojump_clock: trio.testing.MockClock) -> None:
    class Broken:
        def on_send(self, message: ProducerMessage) -> ProducerMessage:
            raise RuntimeError("boom")

        def on_acknowledgement(self, metadata: Any, error: Any) -> None:
            raise RuntimeError("bang")

    async with open_fake_producer(fake, interceptors=[Broken()]) as producer:
        d = await producer.send("orders", b"still sent")
        assert (await d).offset == 0
        assert producer._hooks is not None and producer._hooks.errors == 2
        assert producer.statistics().interceptor_errors == 2
    assert "raised in on_send" in caplog.text and "raised in on_acknowledgement" in caplog.text
    assert [v for _, v, _ in written(fake)] == [b"still sent"]


async def test_no_hooks_means_the_plain_send_path(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake) as producer:
        assert producer._hooks is None
        assert "send_with_hooks" not in getattr(producer.send, "__qualname__", "")


def test_bad_hook_options_are_refused_at_once() -> None:
    from pipeline import ProducerConfig

    with pytest.raises(ConfigError, match="value_serializer"):
        ProducerConfig(value_serializer="yaml")
    with pytest.raises(ConfigError, match="interceptors"):
        ProducerConfig(interceptors=[object()])
