"""Ledger rules found unpinned by ``make mutants`` (docs/mutation.md).

Deterministic (FakeCluster, autojump_clock); each docstring walks through the
schedule it needs.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline import BufferFullError
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer
from .test_bad_input import PATIENT, stall_produce


@pytest.mark.parametrize("entry", ["send", "send_nowait"])
async def test_a_buffer_filled_to_the_byte_accepts_its_last_message(
    fake: FakeCluster, autojump_clock: Any, entry: str
) -> None:
    """``buffer_memory`` is a bound, not a strict one: messages whose sizes add
    up to exactly ``buffer_memory`` are all accepted (``Ledger.admit`` for
    ``send()``, ``try_reserve`` for ``send_nowait()``); one byte more is not.

    Schedule (Produce stalled, so nothing is released): the size s of m is
    measured; with buffer_memory = 2 s, m0 and m1 are accepted and m2 is
    refused at once (send_nowait) or after max_block (send)."""
    fake.create_topic("t", 1)
    gate = stall_produce(fake)
    value = b"m" * 100
    async with open_fake_producer(fake, **PATIENT) as probe:
        await probe._core.cluster.partitions_for("t")
        probe.send_nowait("t", value, partition=0)
        size = probe.statistics().buffered_bytes
        gate.set()
    gate = stall_produce(fake)
    async with open_fake_producer(fake, buffer_memory=2 * size, max_message_bytes=2 * size,
                                  max_block=1.0, **PATIENT) as producer:
        await producer._core.cluster.partitions_for("t")

        async def one() -> None:
            if entry == "send":
                await producer.send("t", value, partition=0)
            else:
                producer.send_nowait("t", value, partition=0)

        await one()
        await one()
        assert producer.statistics().buffered_bytes == 2 * size
        with pytest.raises(BufferFullError):
            await one()
        assert producer.statistics().accepted == 2
        gate.set()
