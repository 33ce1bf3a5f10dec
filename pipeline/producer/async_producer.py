"""asyncProducer (the dispatcher): intake -> one topic producer per topic.

The intake channel carries lists (bursts of ``send`` calls, ``send_many``
chunks), ``RowRun`` chunks of ``send_batch`` calls, and raw ``ProducerMessage`` objects a user put on ``producer.input``.
Lists were validated and accepted by the caller; raw messages are validated,
sized and accepted here, and a bad one is failed onto ``producer.errors``
(it has no other way to report). The dispatcher drains whatever is ready
with ``receive_nowait`` and hands each topic one list, so a burst costs one
scheduler pass per hop instead of one per message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import trio

from pipeline.producer.message import ProducerMessage
from pipeline.producer.rows import RowRun

if TYPE_CHECKING:
    from pipeline.producer.core import ProducerCore



class FlushMark:
    """Control item ``flush()`` puts on the intake: once the dispatcher reaches
    it, everything a user put on ``producer.input`` before it is accepted (has
    an id), so flush can wait for those too. Never leaves the dispatcher."""

    __slots__ = ("reached",)

    def __init__(self) -> None:
        self.reached = trio.Event()


IntakeItem = ProducerMessage | list[ProducerMessage] | FlushMark | RowRun


class IntakeOwner(Protocol):
    """What the intake's two ends use of the ``Producer`` (api.py implements
    it): the send-side burst state, the input reservation, acceptance of a raw
    input message, the partitioner and the core. Named here so this module
    does not import api.py (which imports it)."""

    _core: ProducerCore
    _partitioner: Any
    _open_batch: list[ProducerMessage] | None

    def _close_open_batch(self, batch: list[ProducerMessage]) -> str | None: ...

    def _accept_from_channel(self, msg: ProducerMessage) -> bool: ...

    def _reserve_input_nowait(self, msg: ProducerMessage) -> bool | None: ...

    async def _reserve_input(self, msg: ProducerMessage) -> bool: ...

    def _unreserve_input(self, msg: ProducerMessage) -> None: ...


class InputChannel(trio.abc.SendChannel[ProducerMessage]):
    """``producer.input``: the intake's send side, for sarama-style use.

    A message put here holds its buffer bytes before it enters the intake (see
    ``Producer._reserve_input``), so the dispatcher never waits for memory.

    Invariant: one task's calls are written in the order it made them. A
    ``send()`` burst is a list already queued in the intake that later
    ``send()`` calls join until the dispatcher takes it, so a message put
    here first closes that burst: a ``send()`` after it must not join a list
    queued ahead of it. (Found by the schedule explorer, like the same hole in
    ``send_many``.)
    """

    __slots__ = ("_channel", "_producer")

    def __init__(
        self, producer: IntakeOwner, channel: trio.MemorySendChannel[IntakeItem]
    ) -> None:
        self._producer = producer
        self._channel = channel

    def send_nowait(self, value: ProducerMessage) -> None:
        """Raises ``trio.WouldBlock`` when the intake or the buffer memory is full."""
        producer = self._producer
        if not producer._reserve_input_nowait(value):
            raise trio.WouldBlock
        try:
            self._channel.send_nowait(value)
        except BaseException:
            producer._unreserve_input(value)
            raise
        producer._open_batch = None

    async def send(self, value: ProducerMessage) -> None:
        """Waits for buffer memory (up to ``max_block``; then the message fails
        with BufferFullError on ``producer.errors``) and room in the intake."""
        producer = self._producer
        if not await producer._reserve_input(value):
            return  # settled already: its outcome is on producer.errors
        try:
            await self._channel.send(value)
        except BaseException:
            producer._unreserve_input(value)
            raise
        producer._open_batch = None

    def clone(self) -> InputChannel:
        return InputChannel(self._producer, self._channel.clone())

    def close(self) -> None:
        self._channel.close()

    async def aclose(self) -> None:
        await self._channel.aclose()

    def statistics(self) -> trio.MemoryChannelStatistics:
        return self._channel.statistics()

    def __enter__(self) -> InputChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Dispatcher:
    def __init__(
        self, producer: IntakeOwner, intake: trio.MemoryReceiveChannel[IntakeItem]
    ) -> None:
        self.producer = producer
        self.core = producer._core
        self._intake = intake
        self._topics: dict[str, trio.MemorySendChannel[list[ProducerMessage]]] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        intake = self._intake
        producer = self.producer
        async with trio.open_nursery() as nursery:
            try:
                async for item in intake:
                    by_topic: dict[str, list[ProducerMessage]] = {}
                    while True:
                        if isinstance(item, list):
                            self._sort_list(item, by_topic, producer._close_open_batch(item))
                        elif isinstance(item, FlushMark):
                            item.reached.set()
                        elif isinstance(item, RowRun):  # a send_batch chunk, accepted already
                            by_topic.setdefault(item.topic, []).append(item)  # type: ignore[arg-type]
                        elif self.producer._accept_from_channel(item):
                            by_topic.setdefault(item.topic, []).append(item)
                        try:
                            item = intake.receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    for topic, msgs in by_topic.items():
                        send = self._topics.get(topic)
                        if send is None:
                            send = await self._start_topic(nursery, topic)
                        try:
                            send.send_nowait(msgs)
                        except trio.WouldBlock:
                            await send.send(msgs)
            finally:
                # Closing the topic channels cascades shutdown down the forward path.
                for send in self._topics.values():
                    send.close()

    @staticmethod
    def _sort_list(
        msgs: list[ProducerMessage],
        by_topic: dict[str, list[ProducerMessage]],
        known_topic: str | None = None,
    ) -> None:
        topic = msgs[0].topic
        if known_topic is not None or all(m.topic == topic for m in msgs):
            group = by_topic.get(topic)
            if group is None:
                by_topic[topic] = msgs
            else:
                group.extend(msgs)
            return
        for msg in msgs:
            group = by_topic.get(msg.topic)
            if group is None:
                by_topic[msg.topic] = [msg]
            else:
                group.append(msg)

    async def _start_topic(
        self, nursery: trio.Nursery, topic: str
    ) -> trio.MemorySendChannel[list[ProducerMessage]]:
        send, receive = trio.open_memory_channel[list[ProducerMessage]](
            self.core.config.channel_capacity
        )
        tp = self.core.topic_producer(topic, receive, self.producer._partitioner)
        await nursery.start(tp.run)
        self._topics[topic] = send
        return send
