"""Leaving ``read_topic`` early: ``break`` or an exception in the loop body.

The generator is then closed later, by trio's finalizer in another task; whatever it
held across a yield must survive that (a nursery held there corrupts the caller's
cancel-scope stack: trio raises ``TrioInternalError``). The fake cluster's connections
show the reader's cluster is closed afterwards.
"""

from __future__ import annotations

import gc

import pytest
import trio
import trio.testing

from pipeline.consumer import read_topic
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer


async def fill(fake: FakeCluster, n: int = 10) -> None:
    fake.create_topic("t", partitions=1)
    async with open_fake_producer(fake) as producer:
        for i in range(n):
            await producer.send("t", b"v%d" % i)


async def test_break_out_of_the_loop_then_go_on(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    await fill(fake)
    seen = []
    async for rec in read_topic(fake.bootstrap, "t", connector=fake.connector):
        seen.append(rec.value)
        if len(seen) == 3:
            break
    gc.collect()
    await trio.sleep(1)
    assert seen == [b"v0", b"v1", b"v2"]
    # and a second reader works the same (nothing of the first is left in the way)
    again = [r.value async for r in read_topic(fake.bootstrap, "t", stop_at_end=True,
                                                connector=fake.connector)]
    assert len(again) == 10


async def test_an_exception_in_the_loop_body_propagates_as_itself(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    await fill(fake)

    async def loop() -> None:
        async for _rec in read_topic(fake.bootstrap, "t", connector=fake.connector):
            raise ValueError("the caller's own")

    with pytest.raises(ValueError, match="the caller's own"):
        await loop()
    gc.collect()
    await trio.sleep(1)


async def test_cancelled_while_reading(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    await fill(fake, 2)
    seen = []
    with trio.move_on_after(5):  # no stop_at_end: the reader waits for more, then is cancelled
        async for rec in read_topic(fake.bootstrap, "t", connector=fake.connector):
            seen.append(rec.value)
    assert seen == [b"v0", b"v1"]
    gc.collect()
    await trio.sleep(1)
