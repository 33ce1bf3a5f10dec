"""Errors the producer raises or reports.

Two families, kept apart on purpose:

* raised by ``send()`` / ``send_nowait()`` / ``open_producer()``: the message was
  *not accepted* (bad input, buffer full, producer closed, invalid config).
  Nothing was queued, so nothing else is lost.
* reported as the outcome of an accepted message: always a ``ProducerError``
  carrying the message and the specific ``cause``. Every accepted message gets
  exactly one outcome: a ``RecordMetadata`` or a ``ProducerError``.
  ``ProducerError`` is defined in ``_message.py``, beside the message it carries
  (each refers to the other), and re-exported here.
"""

from __future__ import annotations

from pipeline.cluster.errors import ConfigError as ConfigError
from pipeline.cluster.errors import KafkaError
from pipeline.producer._message import ProducerError as ProducerError
from pipeline.protocol.errors import ErrorCode


class MessageTooLargeError(KafkaError, ValueError):
    """A message larger than ``max_message_bytes`` was refused by ``send()``."""


class BufferFullError(KafkaError):
    """``buffer_memory`` is exhausted: ``send_nowait`` refuses, ``send`` gave up after ``max_block``."""


class ProducerClosed(KafkaError):
    """The producer is closing or closed.

    Raised by ``send()`` after close began; used as the ``cause`` of the
    ``ProducerError`` of every message still undelivered when ``close_timeout``
    ran out.
    """

    @classmethod
    def unsettled(cls, close_timeout: float | None) -> ProducerClosed:
        """The cause for what a close leaves unsettled (``close_timeout``: the
        one that ran out, for a graceful close; None: a close without flush)."""
        ran_out = f" (close_timeout={close_timeout}s ran out)" if close_timeout is not None else ""
        return cls(f"the producer closed before this message was acknowledged{ran_out}; "
                   "it may or may not have been written")


class DeliveryTimeoutError(KafkaError):
    """The message's ``delivery_timeout`` elapsed before it was acknowledged."""

    retriable = True


class BrokerResponseError(KafkaError):
    """The broker answered a produce request for this partition with an error code."""

    def __init__(self, code: ErrorCode, error_message: str | None = None) -> None:
        self.code = code
        self.error_message = error_message
        detail = f": {error_message}" if error_message else ""
        super().__init__(f"{code.name} ({int(code)}) {code.description}{detail}")

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        return self.code.retriable


class TransactionError(KafkaError):
    """A transactional producer's error. The subclasses say what to do (Java's KIP-1050
    classes): ``TransactionStateError`` (a call in the wrong state: fix the code),
    ``TransactionAbortableError`` (abort, then go on), ``ProducerFencedError`` (close
    this producer), ``TransactionFatalError`` (this producer can do no more
    transactional work)."""

    #: The Kafka error code behind it, when a broker's answer was the cause.
    code: ErrorCode | None = None


class TransactionStateError(TransactionError):
    """A transactional call in the wrong state, e.g. ``send()`` with no transaction
    open, ``begin_transaction()`` inside one, ``commit_transaction()`` outside one.
    Nothing was sent or changed."""


class TransactionAbortableError(TransactionError):
    """The open transaction cannot commit (a record of it failed, the broker answered
    TRANSACTION_ABORTABLE, the coordinator refused the commit); call
    ``abort_transaction()`` (``async with producer.transaction()`` does), then the
    producer may begin another one."""


class ProducerFencedError(TransactionError):
    """Another producer with the same ``transactional_id`` took over (it initialised
    after this one), or the coordinator fenced this producer's epoch. This producer can
    do no more transactional work: close it; make a new one if this process still owns
    the work."""


class TransactionFatalError(TransactionError):
    """An error no abort can undo (authorization refused, an unsupported broker, a
    state the coordinator and this producer disagree on). The producer refuses further
    transactional calls, each with this error; close it."""


class TransactionTimedOutError(TransactionAbortableError):
    """The coordinator aborted the transaction because it stayed open longer than
    ``transaction_timeout``: nothing of it is visible to ``read_committed`` readers.
    Abort it here too (a no-op at the broker), then begin another."""


class TransactionAbortedError(KafkaError):
    """The cause of each record of an aborted transaction that had no outcome yet:
    it was not written, or is hidden from ``read_committed`` readers by the abort."""


class SerializationError(KafkaError, ValueError):
    """A ``key_serializer`` or ``value_serializer`` failed (or returned something other
    than bytes or None): the record was not accepted; the message says which field, the
    topic, and the serializer's own error."""
