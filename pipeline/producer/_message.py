"""The message: one record as a Python object, where it landed, how it failed.

A ``ProducerMessage`` travels through every stage unchanged in identity: the
stages move *references*, and the outcome is written onto the message once.
The write-once rule (``_state`` goes PENDING -> OK or FAILED, never back) is
what makes "exactly one terminal outcome per accepted message" checkable: a
second attempt to settle a message is a bug, counted in ``Ledger`` stats and
asserted zero by the tests. The handles users await (``Delivery``) live in
``_outcomes/delivery.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pipeline.cluster.errors import KafkaError
from pipeline.producer._speedups import fields, load
from pipeline.producer._speedups.fields import names, slots

PENDING, OK, FAILED = 0, 1, 2

#: ``_sink`` of a message from ``producer.input``: its outcome goes to
#: ``producer.successes`` / ``producer.errors``.
TO_CHANNELS = object()

Headers = Sequence[tuple[str, bytes | None]]


class ProducerError(KafkaError):
    """The terminal failure of one accepted message.

    Attributes:
        message: the ``ProducerMessage`` that was not delivered.
        cause: the specific error (``BrokerResponseError``, ``DeliveryTimeoutError``,
            ``ProducerClosed``, ``UnknownTopicError``, a connection error, ...).
    """

    def __init__(self, message: ProducerMessage, cause: BaseException) -> None:
        self.message = message
        self.cause = cause
        where = message.topic if message.partition is None or message.partition < 0 else (
            f"{message.topic}[{message.partition}]"
        )
        super().__init__(f"message to {where} not delivered: {type(cause).__name__}: {cause}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message, self.cause))


class RecordMetadata(NamedTuple):
    """Where an acknowledged message landed.

    ``offset`` is -1 and ``offset_known`` False when the broker confirmed the
    write without an offset (acks=0, or a DUPLICATE_SEQUENCE_NUMBER answer to an
    idempotent retry of a batch that was already written). ``timestamp`` is the
    broker's LogAppendTime when the topic uses it, else the record's timestamp.

    A named tuple (immutable, compared by value): it is built once per awaited
    delivery or callback, and a tuple costs a tenth of a frozen dataclass.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    offset_known: bool = True


_new_metadata = tuple.__new__


def _plain_pair(pair: object) -> bool:
    """A header as ``send`` takes it without a change: an exact ``(str, bytes | None)``."""
    return (type(pair) is tuple and len(pair) == 2 and type(pair[0]) is str
            and (pair[1] is None or type(pair[1]) is bytes))


class ProducerMessage:
    """One record to produce, and after delivery, where it went.

    Users build these for ``producer.input`` and ``send_many``; ``send()``
    builds one from its arguments. ``metadata`` is free for the caller (it is
    never sent). After a success ``partition``, ``offset`` and ``timestamp`` are
    set; the message is then what ``producer.successes`` yields.

    ``headers`` given as a list of ``(str, bytes | None)`` pairs are kept as a
    tuple of those pairs (Java's ``ProducerRecord`` copies its headers too): a
    later change to the list does not change the message.
    """

    __slots__ = slots(fields.DELIVERY_MESSAGE, fields.SEND_MESSAGE, fields.MESSAGE_INIT)

    def __init__(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        metadata: Any = None,
    ) -> None:
        self.topic = topic
        self.value = value
        self.key = key
        if type(headers) is list and all(map(_plain_pair, headers)):
            headers = tuple(headers)
        self.headers: Headers = headers if headers is not None else ()
        self.partition = partition
        self.timestamp = timestamp
        self.metadata = metadata
        self.offset = -1
        # Retry level (sarama's msg.retries): how many times this message was
        # sent back by a broker producer. The watermark protocol orders by it.
        self._level = 0
        self._state = PENDING
        self._outcome: BaseException | None = None
        # Who hears of the outcome besides the message itself: None (nobody:
        # the common case, settled with no extra work), a trio.Event (someone
        # awaits this Delivery), the on_delivery callable (an OnDelivery once
        # someone awaits it too), its send_many DeliveryGroup, or TO_CHANNELS
        # (it came from producer.input). One field, because a message reaches
        # the producer through exactly one entry point.
        self._sink: object = None
        self._size = 0
        self._deadline = 0.0
        self._id = 0

    def __repr__(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}[{self.partition}]"
        state = ("pending", "ok", "failed")[self._state]
        off = f" offset={self.offset}" if self._state == OK else ""
        return f"<ProducerMessage {where} key={self.key!r} {state}{off}>"

    def done(self) -> bool:
        """True once the message has its outcome (success or failure)."""
        return self._state != PENDING

    def record_metadata(self) -> RecordMetadata:
        return _metadata_py(self)


#: What MESSAGE_INIT's fields after the seven arguments start as (``__init__``'s stores).
_STARTS = (-1, 0, PENDING, None, None, 0, 0.0, 0)
#: The definition of a new message's state; the C init must store exactly what it does.
init_py = ProducerMessage.__init__
_delivery_c = load("_delivery")
if _delivery_c is not None:
    _delivery_c.install_message_init(ProducerMessage, names(fields.MESSAGE_INIT), _STARTS)


def _metadata_py(msg: ProducerMessage) -> RecordMetadata:
    """``RecordMetadata`` of a settled message (the twin of ``_speedups._delivery.metadata``)."""
    return _new_metadata(RecordMetadata, (
        msg.topic, msg.partition, msg.offset, msg.timestamp, msg.offset >= 0))



#: ``on_delivery(metadata, error)``: exactly one of the two is not None.
DeliveryCallback = Callable[["RecordMetadata | None", "ProducerError | None"], object]
