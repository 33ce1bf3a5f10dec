"""Idempotent recovery on tansu, which refuses an epoch the producer bumped itself.

tansu only ever accepts the epoch its InitProducerId handed out: a client-side bump (the
path the producer takes on Kafka, tests/apache_kafka/test_kafka_semantics.py) is answered
PRODUCER_FENCED (90). The producer then takes a new producer id, re-sends the refused
batches under it, and takes new ids for every later recovery. Its statistics say so:
one bump, one new id, ``local_bumps`` off. Read back with librdkafka.

tansu cannot fence the old id, so a request of it held somewhere could still land after
later messages (docs/architecture.md); here the held request is released before anything
else is sent, so the log's order is checked exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from pipeline import DeliveryTimeoutError, ProducerError, open_producer
from pipeline.testing.broker import EmbeddedBroker, create_topics, free_port
from pipeline.testing.proxy import FaultProxy

pytestmark = pytest.mark.integration

BrokerFactory = Callable[..., EmbeddedBroker]
Consume = Callable[..., list[Any]]


async def test_refused_bump_then_new_ids_on_tansu(
    broker_factory: BrokerFactory, consume: Consume
) -> None:
    proxy_port = free_port()
    broker = broker_factory(port=free_port(), advertised_port=proxy_port)
    create_topics(broker.bootstrap, {"recovery": 1})
    proxy = FaultProxy("127.0.0.1", broker.port, listen_port=proxy_port, seed=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        async with open_producer(broker.advertised_bootstrap, request_timeout=2.0,
                                 delivery_timeout=4.0, retry_backoff=0.05,
                                 retry_backoff_max=0.2) as producer:
            warm = [await producer.send("recovery", b"w%d" % i, partition=0) for i in range(3)]
            await producer.flush()
            state = producer._core.idempotence
            assert state is not None
            first_id = state.producer_id
            proxy.blackhole(6.0)  # the request is held, then forwarded after the producer gave up
            stall_ends = trio.current_time() + 6.0
            late = await producer.send("recovery", b"late", partition=0)
            with pytest.raises(ProducerError) as info:
                await late
            await trio.sleep_until(stall_ends + 0.5)
            after = [await producer.send("recovery", b"z%d" % i, partition=0) for i in range(3)]
            await producer.flush()
            results = [await d for d in warm + after]
            stats = (state.bumps, state.new_ids, state.local_bumps,
                     state.producer_id != first_id, state.producer_epoch)
        # read through the proxy (tansu advertises its port), faults cleared
        expected = 6 + (results[3].offset - 3)
        got = await trio.to_thread.run_sync(
            lambda: consume(broker.bootstrap, "recovery", 1, expected))
        nursery.cancel_scope.cancel()
    assert isinstance(info.value.cause, DeliveryTimeoutError)
    assert stats == (1, 1, False, True, 0)
    values = [m.value() for m in got]
    assert values in ([b"w0", b"w1", b"w2", b"z0", b"z1", b"z2"],
                      [b"w0", b"w1", b"w2", b"late", b"z0", b"z1", b"z2"]), values
    assert [m.offset() for m in got] == list(range(len(values)))
