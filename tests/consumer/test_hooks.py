"""The consumer's deserializers and interceptors (``pipeline/consumer/_hooks.py``), on
the fake cluster's virtual time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.consumer import DeserializationError
from pipeline.consumer._api import Consumer
from pipeline.consumer._open import HookedConsumer
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_consumer, produce


async def take(consumer: Any, n: int) -> list[Any]:
    out = []
    async for record in consumer:
        out.append(record)
        if len(out) == n:
            return out
    return out


class Counting:
    def __init__(self) -> None:
        self.consumed: list[int] = []
        self.commits: list[dict[Any, Any]] = []

    def on_consume(self, records: list[Any]) -> list[Any]:
        self.consumed.append(len(records))
        return [r for r in records if r.value != {"drop": True}]

    def on_commit(self, offsets: dict[Any, Any]) -> None:
        self.commits.append(offsets)


async def test_deserializers_and_interceptors_run_on_every_iteration_form(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    docs = [{"n": 1}, {"drop": True}, {"n": 2}, {"n": 3}]
    await produce(fake, "t", [json.dumps(d).encode() for d in docs], partition=0, key=b"k")
    seen = Counting()
    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=False,
                                  key_deserializer="str", value_deserializer="json",
                                  interceptors=[seen]) as consumer:
        assert isinstance(consumer, HookedConsumer)
        got = await take(consumer, 3)
        assert [r.value for r in got] == [{"n": 1}, {"n": 2}, {"n": 3}]
        assert {r.key for r in got} == {"k"}
        await consumer.commit()
    assert sum(seen.consumed) == 4
    assert [{(tp.topic, tp.partition): o.offset for tp, o in c.items()}
            for c in seen.commits] == [{("t", 0): 4}]


async def test_a_record_that_fails_to_deserialize_fails_alone(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b'{"n": 1}', b"not json", b'{"n": 3}'], partition=0)
    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=False,
                                  value_deserializer="json") as consumer:
        first = await consumer.__anext__()
        with pytest.raises(DeserializationError, match=r"t\[0\] at offset 1") as caught:
            await consumer.__anext__()
        assert caught.value.record.value == b"not json"
        third = await consumer.__anext__()  # the iteration goes on past it
    assert (first.value, third.value) == ({"n": 1}, {"n": 3})


async def test_without_hooks_the_plain_consumer_is_used(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    async with open_fake_consumer(fake, group_id="g", topics=["t"]) as consumer:
        assert type(consumer) is Consumer
