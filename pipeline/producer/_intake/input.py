"""``producer.input``: the intake's channel for sarama-style raw messages.

A user puts ``ProducerMessage`` objects on ``producer.input`` (an
``InputChannel``, below); their outcomes arrive on ``producer.successes`` (when
``return_successes``) and ``producer.errors``. Such a message is *reserved*
in the sender's task and *accepted* by the dispatcher when it takes it from
the intake (``InputAcceptance.accept``); a bad or reused one is accepted and
failed there, so its outcome reaches ``producer.errors`` (it has no other way
to report).

Invariant: every item in the intake holds its buffer bytes already, so the
dispatcher never waits for space: ``producer.input.send()`` reserves in the
sender's task, as ``send()`` does, and applies the same backpressure. (A
dispatcher that reserved in intake order could wait for the very bytes a message
queued behind it holds: the whole intake would stall for ``max_block``.)
"""

from __future__ import annotations

import trio

from pipeline.producer._errors import BufferFullError, ProducerClosed
from pipeline.producer._intake.intake import Intake, IntakeItem
from pipeline.producer._intake.normalize import not_a_message_error, reused_error
from pipeline.producer._message import TO_CHANNELS, ProducerMessage
from pipeline.producer._outcomes.ledger import Ledger


class InputAcceptance:
    """Reservation (sender's task) and acceptance (dispatcher) of the
    messages put on ``producer.input``, and their fate at shutdown."""

    def __init__(self, intake: Intake, ledger: Ledger) -> None:
        self._intake = intake
        self._ledger = ledger
        # Messages whose producer.input.send() waits for buffer space: shutdown
        # accepts and fails them (ProducerClosed) with the rest.
        self._waiting: set[ProducerMessage] = set()
        self._shut_down = False  # set once the close has failed everything outstanding

    @staticmethod
    def _reserved(msg: ProducerMessage) -> bool:
        return msg._sink is TO_CHANNELS and msg._size > 0 and not msg._id

    def _accept(self, msg: ProducerMessage) -> None:
        # A message that entered the intake keeps the deadline it was stamped
        # with there (``stamp``), not the dispatcher's clock: the intake is a
        # queue, and a send() behind it in the queue must not expire first.
        self._ledger.accept(msg, msg._deadline or self._intake.deadline())

    def stamp(self, msg: ProducerMessage) -> None:
        """The sender's task, as the message enters the intake: its delivery
        deadline starts now, as a ``send()`` made at this instant would
        (Java's delivery timeout starts when ``send`` returns). So a
        partition's queue stays in deadline order however long the dispatcher
        takes to reach the message."""
        if not msg._id:
            msg._deadline = self._intake.deadline()

    # -- the sender's task ------------------------------------------------------
    def reserve_nowait(self, msg: ProducerMessage) -> bool | None:
        """Reserve for a message put on ``producer.input``: True (enqueue it),
        False (no space now), None (wait for space). A reused or invalid
        message is enqueued unreserved: the dispatcher accepts and fails it, so
        its outcome reaches ``producer.errors``."""
        if msg._id or self._intake.closing or self._reserved(msg):
            return True  # (closing: the intake closes soon and refuses it itself)
        try:
            size = self._intake.prepare(msg)
        except (TypeError, ValueError):
            msg._size = 0
            return True
        if self._ledger.try_reserve(size):
            msg._sink = TO_CHANNELS
            return True
        return None

    async def reserve(self, msg: ProducerMessage) -> bool:
        """As ``reserve_nowait``, waiting up to max_block. False: the message
        is settled already (it waited past max_block: accepted and failed with
        BufferFullError; or the producer closed meanwhile)."""
        ready = self.reserve_nowait(msg)
        if ready is not None:
            return ready
        size, ledger = msg._size, self._ledger
        self._waiting.add(msg)
        try:
            await ledger.reserve(size)
        except BufferFullError as exc:
            if not msg._id:  # (else shutdown took it meanwhile)
                msg._sink, msg._size = TO_CHANNELS, 0
                self._accept(msg)
                ledger.fail([msg], exc)
            return False
        except BaseException:
            msg._size = 0  # cancelled: nothing reserved, nothing accepted
            raise
        finally:
            self._waiting.discard(msg)
        if msg._id:  # shutdown accepted and failed it while this task woke up
            ledger.release(size)
            return False
        msg._sink = TO_CHANNELS
        return True

    def unreserve(self, msg: ProducerMessage) -> None:
        """The enqueue of a reserved input message failed (cancelled, closed)."""
        if self._reserved(msg):
            self._ledger.release(msg._size)
            msg._sink, msg._size = None, 0

    # -- the dispatcher -----------------------------------------------------------
    def accept(self, msg: ProducerMessage) -> bool:
        """Accept a message a user put on ``producer.input``; False: it failed
        at once (its outcome goes to ``producer.errors``), do not route it."""
        ledger = self._ledger
        if self._shut_down and not msg._id:
            # The dispatcher was handed this message in the instant the close
            # failed everything outstanding, and runs once more before its
            # cancellation lands: accepted now, it would never be settled. It
            # fails like the rest (nobody reads producer.errors any more, so its
            # outcome is only on the message):
            # test_input_message_handed_over_as_the_producer_closes_gets_an_outcome.
            if self._reserved(msg):
                ledger.release(msg._size)
            msg._sink, msg._size = None, 0
            self._accept(msg)
            ledger.fail([msg], ProducerClosed("the producer closed before this "
                                              "message was accepted"))
            return False
        if msg._id:
            # Already accepted once: its outcome belongs to that send. The error
            # carries a fresh copy, so the first outcome is left untouched.
            copy = ProducerMessage(msg.topic, msg.value, msg.key, msg.headers, msg.partition,
                                   msg.timestamp, msg.metadata)
            copy._sink = TO_CHANNELS
            self._accept(copy)
            ledger.fail([copy], reused_error(msg))
            return False
        if self._reserved(msg):
            self._accept(msg)
            return True
        msg._sink = TO_CHANNELS
        try:
            size = self._intake.prepare(msg)
        except (TypeError, ValueError) as exc:
            msg._size = 0
            self._accept(msg)
            ledger.fail([msg], exc)
            return False
        # Valid but unreserved: changed after it was put on producer.input, or put
        # there while the producer closed. Its bytes are counted (the buffer may
        # go over by this one message) rather than waited for here.
        ledger.reserve_over(size)
        self._accept(msg)
        return True

    # -- shutdown -------------------------------------------------------------------
    def shut_down(self, leftovers: list[ProducerMessage]) -> None:
        """At shutdown (the dispatcher is cancelled): accept what users put on
        ``producer.input`` that the dispatcher never accepted (``leftovers``,
        still in the intake) and messages whose ``input.send()`` still waits for
        space, so they fail with the rest instead of vanishing. From now on a
        message the dispatcher is still handed fails at once (``accept``)."""
        pending: list[ProducerMessage] = []
        for msg in self._waiting:  # holds no bytes yet
            msg._size = 0
            pending.append(msg)
        for msg in leftovers:
            if not self._reserved(msg):
                msg._size = 0  # holds no bytes
            pending.append(msg)
        for msg in pending:
            if msg._id:
                continue
            msg._sink = TO_CHANNELS
            self._accept(msg)
        self._shut_down = True


class InputChannel(trio.abc.SendChannel[ProducerMessage]):
    """``producer.input``: the intake's send side, for sarama-style use.

    A message put here holds its buffer bytes before it enters the intake (see
    ``InputAcceptance.reserve``), so the dispatcher never waits for memory.

    Invariant: one task's calls are written in the order it made them. A
    ``send()`` burst is a list already queued in the intake that later
    ``send()`` calls join until the dispatcher takes it, so a message put
    here first ends that burst: a ``send()`` after it must not join a list
    queued ahead of it.
    """

    __slots__ = ("_acceptance", "_channel", "_intake")

    def __init__(
        self,
        acceptance: InputAcceptance,
        intake: Intake,
        channel: trio.MemorySendChannel[IntakeItem],
    ) -> None:
        self._acceptance = acceptance
        self._intake = intake
        self._channel = channel

    def send_nowait(self, value: ProducerMessage) -> None:
        """Raises ``trio.WouldBlock`` when the intake or the buffer memory is full."""
        if not isinstance(value, ProducerMessage):
            raise not_a_message_error("producer.input", value)
        self._intake.check_transaction()
        acceptance = self._acceptance
        if not acceptance.reserve_nowait(value):
            raise trio.WouldBlock
        acceptance.stamp(value)
        try:
            self._channel.send_nowait(value)
        except BaseException:
            acceptance.unreserve(value)
            raise
        self._intake.end_burst()

    async def send(self, value: ProducerMessage) -> None:
        """Waits for buffer memory (up to ``max_block``; then the message fails
        with BufferFullError on ``producer.errors``) and room in the intake."""
        if not isinstance(value, ProducerMessage):
            raise not_a_message_error("producer.input", value)
        self._intake.check_transaction()
        acceptance = self._acceptance
        if not await acceptance.reserve(value):
            return  # settled already: its outcome is on producer.errors
        acceptance.stamp(value)
        try:
            await self._channel.send(value)
        except BaseException:
            acceptance.unreserve(value)
            raise
        self._intake.end_burst()

    def clone(self) -> InputChannel:
        return InputChannel(self._acceptance, self._intake, self._channel.clone())

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
