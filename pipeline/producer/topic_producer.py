"""topicProducer: one task per topic; runs the partitioner.

It learns the topic's partition count (waiting for metadata the first time,
bounded by the messages' delivery deadlines), assigns each message a
partition, and hands one list per partition to that partition's producer.
Messages for an unknown topic, or with an explicit partition out of range,
fail here with a specific error; later messages are looked up again, so a
topic created meanwhile starts working.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer.envelopes import TopicPartition
from pipeline.producer.errors import DeliveryTimeoutError
from pipeline.producer.message import ProducerMessage

if TYPE_CHECKING:
    from pipeline.producer.core import ProducerCore

log = logging.getLogger("pipeline.producer")


class PartitionOutOfRangeError(KafkaError, ValueError):
    """An explicit partition that the topic does not have."""


class TopicProducer:
    def __init__(
        self,
        core: ProducerCore,
        topic: str,
        inbox: trio.MemoryReceiveChannel[list[ProducerMessage]],
        partitioner: Any,
    ) -> None:
        self.core = core
        self.topic = topic
        self._inbox = inbox
        self._partitioner = partitioner
        # KIP-480/794 sticky partitioning for null keys: switch partitions after
        # a batch's worth of bytes went to the current one.
        self._sticky_bytes = 0
        self._sticky_partition = -1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        inbox = self._inbox
        async for msgs in inbox:
            pending = [msgs]
            while True:
                try:
                    pending.append(inbox.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            batch = pending[0] if len(pending) == 1 else [m for ms in pending for m in ms]
            await self._route(batch)

    async def _partition_count(self, msgs: list[ProducerMessage]) -> int | None:
        cluster = self.core.cluster
        n = cluster.partition_count_nowait(self.topic)
        if n is not None:
            return n
        deadline = min(m._deadline for m in msgs)
        try:
            with trio.fail_at(deadline):
                return await cluster.partitions_for(self.topic)
        except trio.TooSlowError:
            self.core.ledger.fail(msgs, DeliveryTimeoutError(
                f"no metadata for topic {self.topic!r} within delivery_timeout="
                f"{self.core.config.delivery_timeout}s"
            ))
        except KafkaError as exc:
            self.core.ledger.fail(msgs, exc)
        return None

    async def _route(self, msgs: list[ProducerMessage]) -> None:
        n = await self._partition_count(msgs)
        if n is None:
            return
        topic = self.topic
        partition_of = self._partitioner.partition
        by_partition: dict[int, list[ProducerMessage]] = {}
        bad: list[ProducerMessage] = []
        batch_bytes = self.core.config.batch_bytes
        for msg in msgs:
            p = msg.partition
            if p is None:
                try:
                    p = partition_of(topic, msg.key, msg.value, n)
                except Exception as exc:  # a user partitioner's bug fails its message only
                    self.core.ledger.fail([msg], exc)
                    continue
                if msg.key is None:
                    if p != self._sticky_partition:
                        self._sticky_partition = p
                        self._sticky_bytes = 0
                    self._sticky_bytes += msg._size
                    if self._sticky_bytes >= batch_bytes:
                        self._partitioner.on_new_batch(topic, n, p)
                        self._sticky_bytes = 0
                msg.partition = p
            elif not 0 <= p < n:
                bad.append(msg)
                continue
            group = by_partition.get(p)
            if group is None:
                by_partition[p] = [msg]
            else:
                group.append(msg)
        if bad:
            for msg in bad:
                self.core.ledger.fail([msg], PartitionOutOfRangeError(
                    f"partition {msg.partition} does not exist: topic {topic!r} has {n} "
                    f"partitions (0..{n - 1})"
                ))
        core = self.core
        for p, group in by_partition.items():
            send = await core.partition_input(TopicPartition(topic, p))
            try:
                send.send_nowait(group)
            except trio.WouldBlock:
                await send.send(group)
