"""ProducerCore: what every stage shares, and where stages are started.

The core owns the pipeline nursery. Topic, partition and broker producers are
started lazily with ``nursery.start`` the first time they are needed, and live
until the producer closes; nothing is fire-and-forget.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import trio

from pipeline.producer.broker_producer import BrokerProducer
from pipeline.producer.config import ProducerConfig
from pipeline.producer.envelopes import TopicPartition
from pipeline.producer.errors import DeliveryTimeoutError
from pipeline.producer.idempotence import Idempotence
from pipeline.producer.ledger import Ledger
from pipeline.producer.partition_producer import Inbound, PartitionProducer
from pipeline.util.backoff import Backoff

if TYPE_CHECKING:
    from pipeline.cluster.connection import BrokerConnection
    from pipeline.cluster.pool import Cluster


class ProducerCore:
    def __init__(self, config: ProducerConfig, cluster: Cluster, ledger: Ledger) -> None:
        self.config = config
        self.cluster = cluster
        self.ledger = ledger
        self.rng = config.rng if config.rng is not None else random.Random()
        self._backoff = Backoff(
            config.retry_backoff,
            config.retry_backoff_max,
            jitter=config.retry_backoff_jitter,
            rng=self.rng,
        )
        # > 0 while flush() or close() waits: linger is ignored, so everything
        # accumulated is sent now (the Java client's flush semantics).
        self.flushing = 0
        self.nursery: trio.Nursery | None = None
        self._pps: dict[TopicPartition, PartitionProducer] = {}
        self._pp_inputs: dict[TopicPartition, trio.MemorySendChannel[Inbound]] = {}
        self._bps: dict[int, BrokerProducer] = {}
        self.idempotence: Idempotence | None = Idempotence(self) if config.idempotent else None
        # The error that last sent each partition's messages back for a retry, until a
        # batch of it succeeds: a delivery timeout names it ("last error: ...").
        self.last_error: dict[TopicPartition, BaseException] = {}

    # -- stage registry ----------------------------------------------------
    async def partition_input(self, tp: TopicPartition) -> trio.MemorySendChannel[Inbound]:
        send = self._pp_inputs.get(tp)
        if send is None:
            assert self.nursery is not None
            send, receive = trio.open_memory_channel[Inbound](self.config.channel_capacity)
            pp = PartitionProducer(self, tp, receive, send.clone())
            self._pps[tp] = pp
            self._pp_inputs[tp] = send
            await self.nursery.start(pp.run)
        return send

    def partition_producer(self, tp: TopicPartition) -> PartitionProducer:
        return self._pps[tp]

    async def broker_producer(self, node_id: int) -> BrokerProducer:
        bp = self._bps.get(node_id)
        if bp is None:
            assert self.nursery is not None
            bp = self._bps[node_id] = BrokerProducer(self, node_id)
            await self.nursery.start(bp.run)
        return bp

    def broker_producers(self) -> list[BrokerProducer]:
        return list(self._bps.values())

    def start_flushing(self) -> None:
        self.flushing += 1
        for bp in self._bps.values():
            bp.wake()

    def stop_flushing(self) -> None:
        self.flushing -= 1

    # -- cluster helpers ---------------------------------------------------
    def leader_nowait(self, tp: TopicPartition) -> int | None:
        leader = self.cluster.metadata.leader_for(tp.topic, tp.partition)
        return leader if leader is not None and leader >= 0 else None

    def request_refresh(self, topic: str) -> None:
        self.cluster.request_refresh([topic])

    async def connection(self, node_id: int) -> BrokerConnection:
        return await self.cluster.connection(node_id)

    def backoff(self, level: int) -> float:
        if self.config.retry_backoff == 0:
            return 0.0
        return self._backoff.delay(max(level, 1))

    def delivery_timeout_error(
        self, tp: TopicPartition, cause: BaseException | None, *, in_flight: bool = False
    ) -> DeliveryTimeoutError:
        """``cause`` None: the partition's last retry error, if any."""
        what = (
            "its request was still in flight, so it may or may not have been written"
            if in_flight
            else "it was never acknowledged"
        )
        if cause is None:
            cause = self.last_error.get(tp)
        last = f"; last error: {cause}" if cause is not None else ""
        return DeliveryTimeoutError(
            f"delivery_timeout={self.config.delivery_timeout}s expired for "
            f"{tp.topic}[{tp.partition}]: {what}{last}"
        )
