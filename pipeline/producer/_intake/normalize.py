"""Input normalisation: what every entry point checks before it accepts.

Pure functions (no producer state): the type rules of a message's fields and
their clear errors, the size bound a message reserves in ``buffer_memory``
(the same bound as ``batch_size_for_record``), the ``on_delivery`` sink, and
the errors shared by the intake's entry points (a reused message, a call
that waited while the producer closed).

``normalize`` is the per-message slow path of every entry point: ``send()``
inlines the common case (bytes value, optional bytes key, nothing else) and
hands everything else here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.producer._errors import MessageTooLargeError, ProducerClosed
from pipeline.producer._message import DeliveryCallback, ProducerMessage
from pipeline.protocol.records import batch_size_for_record

# batch_size_for_record(None, None) minus the two null markers: the fixed part
# of the bound (61-byte batch header + the record's varint overhead, headers count).
SIZE_BASE = batch_size_for_record(None, None) - 2

_BYTES_LIKE = (bytes, bytearray, memoryview)
#: The largest timestamp a record holds (an int64 of milliseconds).
MAX_TIMESTAMP = (1 << 63) - 1


def prefix_size(n: int) -> int:
    """Bytes of the zigzag varint length prefix of an ``n``-byte key or value
    (as in batch_size_for_record); the hot paths inline the first two widths."""
    return 1 if n < 64 else 2 if n < 8192 else 3 if n < 1 << 20 else 4 if n < 1 << 27 else 5


def as_bytes(what: str, value: object) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, _BYTES_LIKE):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(
        f"{what} must be bytes, bytearray, memoryview, str (sent as UTF-8) or None, "
        f"not {type(value).__name__}: serialize it first (e.g. json.dumps(obj).encode())"
    )


def as_headers(headers: object) -> tuple[tuple[str, bytes | None], ...]:
    if not headers:
        return ()
    if isinstance(headers, Mapping):
        headers = list(headers.items())
    elif isinstance(headers, (str, bytes)):
        raise TypeError(
            f"headers must be a sequence of (str, bytes | None) pairs or a mapping, "
            f"not {type(headers).__name__}"
        )
    out = []
    try:
        for key, value in headers:  # type: ignore[attr-defined]
            if not isinstance(key, str):
                raise TypeError(f"header key must be str, not {type(key).__name__}")
            out.append((key, as_bytes(f"header {key!r} value", value)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"headers must be a sequence of (str, bytes | None) pairs: {exc}") from None
    return tuple(out)


#: A row's checked extras (``row_extras``): its size bound, headers, pinned partition
#: (-1: none) and timestamp (None: the clock's).
RowExtras = tuple[int, tuple[tuple[str, bytes | None], ...], int, "int | None"]
#: The largest partition a row's int32 column holds.
MAX_PARTITION = (1 << 31) - 1


def row_extras(key: bytes | None, value: bytes | None, headers: object, partition: object,
                timestamp: object) -> RowExtras | None:
    """A row's headers, partition and timestamp as its columns take them, with the
    row's size bound; None when one of them is not in its plain form (an int
    subclass, a partition past int32, a str subclass header key...): the
    per-message path then normalizes it, or raises its error. Bad headers raise
    here what ``normalize`` raises for them (it checks them first)."""
    if partition is None:
        pin = -1
    elif type(partition) is int and 0 <= partition <= MAX_PARTITION:
        pin = partition
    else:
        return None
    if timestamp is not None and not (type(timestamp) is int and 0 <= timestamp <= MAX_TIMESTAMP):
        return None
    pairs = as_headers(headers)  # (normalize's rule and errors; () when falsy)
    for hkey, _ in pairs:
        if type(hkey) is not str:
            return None  # (the columns hold exact str keys only: atomic_list)
    return batch_size_for_record(key, value, pairs), pairs, pin, timestamp


def normalize(msg: ProducerMessage, current_ms: Callable[[], int], max_message_bytes: int) -> int:
    """Validate and normalize ``msg`` in place; return its size in bytes.

    Fields are read once into locals, and only unusual values take the slow
    helpers. A message without a timestamp gets ``current_ms()`` (CreateTime).
    Raises ``TypeError``/``ValueError`` on a bad field and
    ``MessageTooLargeError`` over ``max_message_bytes``; the size is stored
    on the message (``_size``: the bytes it holds in ``buffer_memory``).
    """
    topic, value, key, headers = msg.topic, msg.value, msg.key, msg.headers
    if type(topic) is not str or not topic:
        raise TypeError(f"topic must be a non-empty str, not {topic!r}")
    if value is not None and type(value) is not bytes:
        msg.value = value = as_bytes("value", value)
    if key is not None and type(key) is not bytes:
        msg.key = key = as_bytes("key", key)
    if headers:
        msg.headers = headers = as_headers(headers)
        size = batch_size_for_record(key, value, headers)
    else:
        # Same bound as batch_size_for_record, inlined for the common case:
        # batch header + max record overhead + varint-prefixed key and value.
        size = SIZE_BASE + (
            1 if key is None else len(key) + prefix_size(len(key))
        ) + (1 if value is None else len(value) + prefix_size(len(value)))
    partition = msg.partition
    if partition is not None and (type(partition) is not int or partition < 0):
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ValueError(f"partition must be None or an int >= 0, not {partition!r}")
        msg.partition = int(partition)
    timestamp = msg.timestamp
    if timestamp is None:
        msg.timestamp = current_ms()
    elif type(timestamp) is not int or not 0 <= timestamp <= MAX_TIMESTAMP:
        if (isinstance(timestamp, bool) or not isinstance(timestamp, int)
                or not 0 <= timestamp <= MAX_TIMESTAMP):
            raise ValueError(
                f"timestamp must be None or milliseconds since the epoch (an int in "
                f"0..2**63-1: a record's int64), not {timestamp!r}"
            )
        msg.timestamp = int(timestamp)
    if size > max_message_bytes:
        raise MessageTooLargeError(
            f"message of {size} bytes (key, value, headers and batch overhead) exceeds "
            f"max_message_bytes={max_message_bytes}: raise max_message_bytes "
            "(and the topic's max.message.bytes on the broker) or send smaller values"
        )
    msg._size = size
    return size


def on_delivery_sink(fn: DeliveryCallback) -> DeliveryCallback:
    """The ``_sink`` of a message sent with ``on_delivery=fn``: ``fn`` itself
    (no object per message; ``Delivery._park`` wraps it in an ``OnDelivery``
    only if someone also awaits the delivery)."""
    if not callable(fn):
        raise TypeError(
            f"on_delivery must be a callable taking (metadata, error), not {type(fn).__name__}"
        )
    return fn


def not_a_message_error(where: str, value: object) -> TypeError:
    """``send_many`` / ``producer.input`` got something that is not a
    ``ProducerMessage`` (a columnar ``send()``'s delivery is one such: it was
    sent already)."""
    return TypeError(
        f"{where} takes ProducerMessage objects, not {type(value).__name__} ({value!r}); "
        "build a ProducerMessage(topic, value, ...) for each record"
        + (" (a Delivery was sent already: build a new ProducerMessage to send it again)"
           if hasattr(value, "__await__") else "")
    )


def reused_error(msg: ProducerMessage) -> ValueError:
    return ValueError(
        f"{msg!r} was already sent: a ProducerMessage is sent once (it carries that send's "
        "outcome); build a new ProducerMessage to send the same record again"
    )


def closed_while_waiting(what: str) -> ProducerClosed:
    """A send that waited for `what` while the producer closed: not accepted, and
    nothing of it stays in the ledger
    (``test_send_waiting_for_space_when_the_producer_closes``)."""
    return ProducerClosed(
        f"the producer closed while this call waited for {what}: the message was not accepted"
    )


def copied_bytes(columns: Any) -> Callable[[int, int], int]:
    """``(start, stop) -> bytes`` of the rows' copies that ``build_columns`` made
    (Python lists and numpy object arrays are packed into new buffers; Arrow
    buffers are borrowed): a chunk reserves them from ``buffer_memory`` too,
    because they live until its last row settles, beside the encoded batches."""
    parts = []
    for col in (columns.values, columns.keys):
        if col is not None and type(col.data.obj) is bytes:
            parts.append(col.offsets)
    headers = columns.headers
    if headers is not None and type(headers.values.data.obj) is bytes:
        parts.append(None)  # header entries: counted per row below (rare and small)

    def copied(start: int, stop: int) -> int:
        total = 0
        for offsets in parts:
            if offsets is None:
                hoff = headers.offsets
                a, b = hoff[start], hoff[stop]
                total += (headers.keys.offsets[b] - headers.keys.offsets[a]
                          + headers.values.offsets[b] - headers.values.offsets[a] + 16 * (b - a))
            else:
                total += offsets[stop] - offsets[start] + 8 * (stop - start)
        return total

    return copied
