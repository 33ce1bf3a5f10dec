"""Fixtures for connection and cluster tests: an in-memory network with a scripted broker."""

from __future__ import annotations

import random
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import trio

from pipeline.cluster.connection import BrokerConnection
from pipeline.cluster.transport import MemoryNetwork

from .scripted_broker import ScriptedBroker

HOST, PORT = "broker-a", 9092


class MidpointRandom(random.Random):
    """``random()`` is always 0.5, so jittered backoff equals the nominal delay."""

    def random(self) -> float:
        return 0.5


@pytest.fixture
def rng() -> random.Random:
    return MidpointRandom()


@pytest.fixture
def net() -> MemoryNetwork:
    return MemoryNetwork()


@pytest.fixture
async def broker(net: MemoryNetwork, nursery: trio.Nursery) -> ScriptedBroker:
    b = ScriptedBroker()
    await nursery.start(b.serve, net.listen(HOST, PORT))
    return b


Connect = Callable[..., Coroutine[Any, Any, BrokerConnection]]


@pytest.fixture
def connect(net: MemoryNetwork, nursery: trio.Nursery, broker: ScriptedBroker) -> Connect:
    async def connect(**kwargs: Any) -> BrokerConnection:
        return await BrokerConnection.connect(nursery, net.connect, HOST, PORT, **kwargs)

    return connect
