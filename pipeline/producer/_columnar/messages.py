"""``send_many``'s ``ProducerMessage`` objects as columnar rows.

A ``send_many`` call of one topic's plain messages (see ``take``) travels as the
rows of ``send_batch`` chunks do (``rows.py``): each chunk of the call is one
``RowChunk`` holding its messages (``RowChunk.messages``, in call order) and one
``RowRun`` whose columns were taken off the messages column-wise; the topic
producer splits it per partition and batch, the broker producer encodes it with
the columnar kernel, and the ledger settles it run by run. What users see of a
message does not change: when a run settles, ``settle`` writes each of its rows'
outcome back onto the row's message, exactly as the per-message path does
(``_state``, ``offset``, ``partition``, LogAppendTime into ``timestamp``; a
failure's ``_outcome``), before the call's group counts them.

Three steps, each one pass over a chunk's messages, in C (``_send.c``:
``take_messages``, ``accept_messages``, ``settle_messages``) or in the twins below
(``PIPELINE_PURE_PYTHON=1``): the same fields read and written, the same results.

* ``take``: check every message and gather its fields into column lists, with
  normalize's in-place changes (a ``str`` value or key becomes its UTF-8 bytes,
  headers a tuple of pairs, a missing timestamp the call's CreateTime millisecond)
  and the per-message size bound. A message that is not *plain* (``take_plain``'s
  rules) returns None: the whole call then takes the per-message path, which
  raises the same errors for bad input as it always did, or sends it.
* ``accept``: a chunk's messages get their acceptance ids (consecutive, as the
  ledger handed them out), which marks them sent (``send_many`` refuses a message
  sent before); ``unaccept`` undoes it for a chunk that never reached the intake.
* ``settle``: a settled run's outcome onto its rows' messages.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from itertools import accumulate
from typing import Any

from pipeline.producer._columnar.burst import pack_columns
from pipeline.producer._intake.normalize import (
    MAX_PARTITION,
    MAX_TIMESTAMP,
    SIZE_BASE,
    prefix_size,
)
from pipeline.producer._message import FAILED, OK, ProducerMessage
from pipeline.protocol.columnar import Columns

__all__ = ["MessageRows", "accept", "settle", "take", "unaccept"]

_NoneType = type(None)

# What a message in flight holds in memory besides its wire bytes (the size bound):
# the message object, its value's and key's bytes objects; a header: its pair, its
# value's bytes object, its place in the headers tuple; and a message with headers, that
# tuple. Its chunk reserves these too, so a buffer full of send_many messages is a
# buffer_memory of memory, not two or three (held to what the interpreter allocates by
# tests/producer/test_held_bytes.py).
MESSAGE_BYTES = sys.getsizeof(ProducerMessage("", None)) + 2 * sys.getsizeof(b"")
HEADER_BYTES = sys.getsizeof(("", b"")) + sys.getsizeof(b"") + 8
HEADERS_BYTES = sys.getsizeof(())


class MessageRows:
    """A ``send_many`` call's messages as column lists (``take``'s result)."""

    __slots__ = ("header_ends", "header_keys", "header_values", "keys", "partitions", "sizes",
                 "timestamps", "topic", "values")

    def __init__(self, topic: str, values: list[bytes | None], keys: list[bytes | None] | None,
                 header_keys: list[str] | None, header_values: list[bytes | None] | None,
                 header_ends: list[int] | None, timestamps: list[int],
                 partitions: list[int] | None, sizes: list[int]) -> None:
        self.topic = topic
        self.values = values
        self.keys = keys  # None: no message has a key
        # Headers flat (None: no message has headers): keys, values, and per message
        # the end of its headers in them after a leading 0 (burst.py's layout).
        self.header_keys = header_keys
        self.header_values = header_values
        self.header_ends = header_ends
        self.timestamps = timestamps
        self.partitions = partitions  # -1: the partitioner's choice; None: none pinned
        self.sizes = sizes  # each message's size bound (normalize's, batch_size_for_record)

    def cumulative(self) -> list[int]:
        """Each message's size bound summed up to it, in call order."""
        return list(accumulate(self.sizes))

    def held(self, start: int, stop: int) -> int:
        """The memory messages ``start .. stop - 1`` hold beyond their size bounds
        (``MESSAGE_BYTES``, ``HEADER_BYTES``, ``HEADERS_BYTES``): their chunk's, until its
        last row settles. The messages with headers are counted as at most one per header
        (exact when each message has some, no scan of the rows)."""
        ends = self.header_ends
        headers = 0 if ends is None else ends[stop] - ends[start]
        messages = stop - start
        return (messages * MESSAGE_BYTES + headers * HEADER_BYTES
                + min(messages, headers) * HEADERS_BYTES)

    def pack(self, start: int, stop: int) -> tuple[Columns, int]:
        """Messages ``start .. stop - 1`` packed into their own ``Columns``, and the
        bytes of that copy (a chunk's own, freed with its last row)."""
        whole = start == 0 and stop == len(self.values)
        keys, ends = self.keys, self.header_ends
        hkeys, hvalues = self.header_keys, self.header_values
        if ends is not None and not whole:
            assert hkeys is not None
            assert hvalues is not None
            a, b = ends[start], ends[stop]
            hkeys, hvalues = hkeys[a:b], hvalues[a:b]
            ends = [end - a for end in ends[start:stop + 1]]
        if whole:
            return pack_columns(self.values, keys, hkeys, hvalues, ends, self.timestamps,
                                self.partitions)
        parts = self.partitions
        return pack_columns(self.values[start:stop], None if keys is None else keys[start:stop],
                            hkeys, hvalues, ends, self.timestamps[start:stop],
                            None if parts is None else parts[start:stop])


def _take_py(msgs: list[ProducerMessage], now_ms: int, max_bytes: int) -> tuple[Any, ...] | None:
    """``_send.take_messages``'s twin: ``(topic, values, keys, header_keys,
    header_values, header_ends, timestamps, partitions, sizes)`` of ``msgs`` when
    every one is plain (``take``), else None. Writes normalize's changes onto the
    messages it passed (a str value or key as UTF-8, headers as a tuple of pairs,
    ``timestamp`` ``now_ms`` where it was None): the per-message path that follows
    a None leaves them as they are (they are what it would write)."""
    if not msgs:
        return None
    topic = msgs[0].topic
    if type(topic) is not str or not topic:
        return None
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    hkeys: list[str] = []
    hvalues: list[bytes | None] = []
    ends: list[int] = [0]
    stamps: list[int] = []
    parts: list[int] = []
    sizes: list[int] = []
    any_key = any_headers = any_partition = False
    for msg in msgs:
        if type(msg) is not ProducerMessage or msg.topic != topic or type(msg.topic) is not str:
            return None
        value: Any = msg.value  # (anything a user put there)
        key: Any = msg.key
        if type(value) is str:
            try:
                msg.value = value = value.encode()
            except UnicodeEncodeError:
                return None  # (the per-message path raises it)
        if value is not None and type(value) is not bytes:
            return None
        if type(key) is str:
            try:
                msg.key = key = key.encode()
            except UnicodeEncodeError:
                return None
        if key is not None and type(key) is not bytes:
            return None
        size = SIZE_BASE + (1 if value is None else len(value) + prefix_size(len(value))) + (
            1 if key is None else len(key) + prefix_size(len(key)))
        headers = msg.headers
        if headers:
            pairs = _plain_headers(headers)
            if pairs is None:
                return None
            for hkey, hvalue in pairs:
                hkeys.append(hkey)
                hvalues.append(hvalue)
                hk = len(hkey.encode())
                size += prefix_size(hk) + hk + (
                    1 if hvalue is None else prefix_size(len(hvalue)) + len(hvalue))
            size += prefix_size(len(pairs)) - 1  # (SIZE_BASE counts a 1-byte header count)
            msg.headers = pairs
            any_headers = True
        ends.append(len(hkeys))
        partition = msg.partition
        if partition is None:
            parts.append(-1)
        elif type(partition) is int and 0 <= partition <= MAX_PARTITION:
            parts.append(partition)
            any_partition = True
        else:
            return None
        timestamp = msg.timestamp
        if timestamp is None:
            msg.timestamp = timestamp = now_ms
        elif type(timestamp) is not int or not 0 <= timestamp <= MAX_TIMESTAMP:
            return None
        if size > max_bytes:
            return None  # (the per-message path raises MessageTooLargeError)
        values.append(value)
        keys.append(key)
        if key is not None:
            any_key = True
        stamps.append(timestamp)
        sizes.append(size)
    return (topic, values, keys if any_key else None,
            hkeys if any_headers else None, hvalues if any_headers else None,
            ends if any_headers else None, stamps, parts if any_partition else None, sizes)


def _plain_headers(headers: Any) -> tuple[tuple[str, bytes | None], ...] | None:
    """Headers in their plain form (``_send.c``'s ``plain_headers``: a dict, or a list
    or tuple of 2-tuples; exact str keys encodable as UTF-8, values bytes or None;
    exact types) as normalize leaves them, a tuple of pairs; None: not plain."""
    if type(headers) is dict:
        pairs = tuple(headers.items())
    elif type(headers) in (list, tuple):
        for pair in headers:
            if type(pair) is not tuple or len(pair) != 2:
                return None
        pairs = tuple(headers)
    else:
        return None
    for hkey, hvalue in pairs:
        if type(hkey) is not str or (hvalue is not None and type(hvalue) is not bytes):
            return None
        try:
            hkey.encode()
        except UnicodeEncodeError:
            return None
    return pairs


def _accept_py(msgs: list[ProducerMessage], first_id: int, deadline: float) -> None:
    """``_send.accept_messages``'s twin: message i gets id ``first_id + i`` and the
    chunk's delivery ``deadline`` (``first_id`` 0: every id back to 0, unaccepted)."""
    for msg_id, msg in enumerate(msgs, first_id):
        msg._id = msg_id if first_id else 0
        if first_id:
            msg._deadline = deadline


def _settle_py(msgs: list[ProducerMessage], rows: Any, state: int, offset: int,
               partition: int | None, timestamp: int, outcome: BaseException | None) -> None:
    """``_send.settle_messages``'s twin: the outcome of a run onto its rows' messages
    (``rows``: their indices in ``msgs`` in the run's order, int64s or a range of
    step 1; every one checked against ``len(msgs)`` before anything is written). OK: ``offset + k`` for
    the run's k-th row (-1 for all when ``offset`` < 0), its ``partition``, and
    ``timestamp`` when >= 0 (LogAppendTime). FAILED: ``outcome``, and the run's
    ``partition`` when it has one (a message pinned past the topic's keeps its own)."""
    if state not in (OK, FAILED):
        raise ValueError(f"settle_messages: state {state} is not OK or FAILED")
    if type(rows) is range:
        if rows.step != 1 or rows.start < 0 or rows.stop > len(msgs):
            raise ValueError(f"settle_messages: rows range({rows.start}, {rows.stop}, "
                             f"{rows.step}) is not within 0..{len(msgs) - 1} in steps of 1")
    else:
        for row in rows:
            if not 0 <= row < len(msgs):
                raise ValueError(f"settle_messages: row {row} is outside 0..{len(msgs) - 1}")
    if state == OK:
        for k, row in enumerate(rows):
            msg = msgs[row]
            msg._state = OK
            msg.offset = offset + k if offset >= 0 else -1
            msg.partition = partition
            if timestamp >= 0:
                msg.timestamp = timestamp
        return
    for row in rows:
        msg = msgs[row]
        msg._state = FAILED
        msg._outcome = outcome
        if partition is not None:
            msg.partition = partition


_take: Callable[..., tuple[Any, ...] | None] = _take_py
_accept: Callable[[list[ProducerMessage], int, float], None] = _accept_py
_settle: Callable[..., None] = _settle_py


def take(msgs: list[ProducerMessage], now_ms: int, max_bytes: int) -> MessageRows | None:
    """``msgs`` as column lists when every message is *plain*: an exact
    ``ProducerMessage`` of the first message's topic (an exact str); value and key
    bytes, str (sent as UTF-8) or None; headers empty or pairs / a mapping that
    ``as_headers`` takes, with exact str keys; partition None or an exact int in
    0..2**31-1; timestamp None or an exact int in 0..2**63-1; its size bound
    within ``max_bytes``. Else None (the per-message path)."""
    got = _take(msgs, now_ms, max_bytes)
    return None if got is None else MessageRows(*got)


def accept(msgs: list[ProducerMessage], first_id: int, deadline: float) -> None:
    """A chunk's messages are accepted with ids ``first_id ..`` and the chunk's delivery
    ``deadline`` (what ``Ledger.accept_all`` writes): they count as sent."""
    _accept(msgs, first_id, deadline)


def unaccept(msgs: list[ProducerMessage]) -> None:
    """A chunk's messages were never accepted after all: they may be sent again."""
    _accept(msgs, 0, 0.0)


def settle(msgs: list[ProducerMessage], run: Any) -> None:
    """Write the outcome of ``run`` (settled) onto its rows' messages."""
    rows = range(run.count) if run.rows is None else run.rows
    _settle(msgs, rows, run._state, run.offset, run.partition, run.timestamp, run._outcome)


def _use(c: Any) -> None:
    """Bind the three steps to ``_send.c``'s (``c``: the loaded extension; ``send_path``
    sets it up) or, for None, to the twins. Stateless both ways: producers already
    open may switch between two calls."""
    global _take, _accept, _settle
    if c is not None:
        _take, _accept, _settle = c.take_messages, c.accept_messages, c.settle_messages
    else:
        _take, _accept, _settle = _take_py, _accept_py, _settle_py
