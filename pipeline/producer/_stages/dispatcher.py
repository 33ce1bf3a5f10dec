"""asyncProducer (the dispatcher): intake -> one topic producer per topic.

The intake channel (owned by ``Intake``, ``intake.py``; the dispatcher holds
its receive side) carries lists (bursts of ``send`` calls, ``send_many``
chunks), ``RowRun`` chunks of ``send_batch`` calls, flush marks, and raw
``ProducerMessage`` objects a user put on ``producer.input``. Lists and runs
were validated and accepted by their sender; raw messages are accepted here
(``InputAcceptance.accept``, ``_intake/input.py``), and a bad one is failed
onto ``producer.errors`` (it has no other way to report). The dispatcher
drains whatever is ready with ``receive_nowait`` and hands each topic one
list, so a burst costs one scheduler pass per hop instead of one per message.
``InputChannel`` (``producer.input``) is the intake's other send side.

It owns the topic channels (one per topic, bounded) and starts each topic
producer in its own nursery. It runs until cancelled: the producer's close
flushes, then cancels the pipeline, every stage at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from pipeline.producer._columnar.rows import RowRun
from pipeline.producer._intake.intake import IntakeItem
from pipeline.producer._message import ProducerMessage
from pipeline.producer._stages.envelopes import FlushMark


class Bursts(Protocol):
    """The send side's open burst, as the dispatcher sees it (``Intake``)."""

    def close_burst(self, batch: list[ProducerMessage]) -> str | None:
        """Close ``batch`` if it is the open burst; its topic if known uniform."""

    def close_rows(self, run: RowRun) -> None:
        """Seal ``run`` if it is a columnar ``send()`` burst (``burst.py``)."""


class InputAcceptor(Protocol):
    """Acceptance of a raw ``producer.input`` message (``InputAcceptance``)."""

    def accept(self, msg: ProducerMessage) -> bool:
        """True: accepted, route it; False: failed at once, drop it."""


class TopicStage(Protocol):
    """A topic producer as the dispatcher sees it (``topic_producer.py``)."""

    @property
    def inbox(self) -> trio.MemorySendChannel[list[ProducerMessage]]: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


#: topic -> that topic's producer (its ``run`` not started)
TopicFactory = Callable[[str], TopicStage]


class Dispatcher:
    """The intake channel is the dispatcher's inbox: the intake (``send()`` and the
    bulk calls) and ``producer.input`` send to ``inbox``; ``run`` reads ``_inbox``."""

    def __init__(self, topic_producer: TopicFactory, channel_capacity: int) -> None:
        self.inbox: trio.MemorySendChannel[IntakeItem]
        self.inbox, self._inbox = trio.open_memory_channel[IntakeItem](channel_capacity)
        self._topic_producer = topic_producer
        # Each started topic producer's inbox (the pipeline ends by cancellation: see
        # the module docstring).
        self._topics: dict[str, trio.MemorySendChannel[list[ProducerMessage]]] = {}

    async def run(
        self,
        bursts: Bursts,
        inputs: InputAcceptor,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Route the inbox's items to the topic producers until cancelled. ``bursts``:
        the intake's open burst; ``inputs``: acceptance of ``producer.input``'s messages."""
        task_status.started()
        intake = self._inbox
        close_burst = bursts.close_burst
        close_rows = bursts.close_rows
        accept_input = inputs.accept
        async with trio.open_nursery() as nursery:
            async for item in intake:
                by_topic: dict[str, list[ProducerMessage]] = {}
                while True:
                    if isinstance(item, list):
                        self._sort_list(item, by_topic, close_burst(item))
                    elif isinstance(item, FlushMark):
                        item.reached.set()
                    elif isinstance(item, RowRun):  # accepted already
                        close_rows(item)  # (a columnar send() burst: sealed now)
                        by_topic.setdefault(item.topic, []).append(item)  # type: ignore[arg-type]
                    elif accept_input(item):
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
        tp = self._topic_producer(topic)
        await nursery.start(tp.run)
        self._topics[topic] = tp.inbox
        return tp.inbox

    def leftovers(self) -> list[ProducerMessage]:
        """At shutdown (after ``run`` was cancelled): what is still in the inbox.
        Flush marks are released; lists and ``send_batch`` chunks were accepted by
        their senders (the ledger holds them); the raw messages from
        ``producer.input`` are returned, never accepted yet."""
        raw: list[ProducerMessage] = []
        while True:
            try:
                item = self._inbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return raw
            if type(item) is FlushMark:
                item.reached.set()
            elif isinstance(item, ProducerMessage):
                raw.append(item)
