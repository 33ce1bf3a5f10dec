"""The memory the buffer counts beyond wire bytes is what the interpreter allocates.

``buffer_memory`` counts each message's size bound (its encoded bytes, as Java's
``buffer.memory``). What a message also holds while in flight is reserved by estimates
built from ``sys.getsizeof``: a ``send_many`` message (``messages.MESSAGE_BYTES``, per
header ``HEADER_BYTES``, per headers tuple ``HEADERS_BYTES``) and a row of a ``send()``
burst with callbacks (``burst.KEPT_*``). These tests build the same objects and measure
them with ``tracemalloc``: an estimate that drifts from the allocations (a new slot, a
Python whose objects grew) fails here, rather than as peak RSS over the bound in a bench.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from pipeline import ProducerMessage
from pipeline.producer._columnar import burst as _burst
from pipeline.producer._columnar import messages as _messages

N = 20_000
#: Allocator rounding (8-byte classes) and list over-allocation make a few bytes of
#: the measure that no estimate models.
TOLERANCE = 0.07


def _allocated(build: Callable[[], Any]) -> int:
    """The bytes still allocated by what ``build`` returns."""
    tracemalloc.start()
    try:
        kept = build()
        allocated, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return allocated


def _values() -> list[bytes]:
    return [b"value-%08d" % i for i in range(N)]  # 14 bytes each, distinct objects


def _keys() -> list[bytes]:
    return [b"key-%06d" % i for i in range(N)]  # 10 bytes each


def _near(measured: float, estimate: int) -> bool:
    return abs(measured - estimate) <= TOLERANCE * measured


def _messages_of(headers: bool) -> Callable[[], list[ProducerMessage]]:
    def build() -> list[ProducerMessage]:
        values, keys = _values(), _keys()
        if not headers:
            return [ProducerMessage("t", values[i], keys[i]) for i in range(N)]
        return [ProducerMessage("t", values[i], keys[i],
                                [("trace-id", b"%016x" % i), ("source", b"s%07d" % i)])
                for i in range(N)]
    return build


def test_a_send_many_message_holds_what_message_bytes_counts() -> None:
    list_slot, payload = 8, 14 + 10
    plain = _allocated(_messages_of(headers=False))
    measured = plain / N - list_slot - payload
    assert _near(measured, _messages.MESSAGE_BYTES), (measured, _messages.MESSAGE_BYTES)


def test_a_message_with_two_headers_holds_what_its_headers_count() -> None:
    plain = _allocated(_messages_of(headers=False))
    with_headers = _allocated(_messages_of(headers=True))
    payload = 16 + 8  # the two header values' bytes (their keys are shared strs)
    measured = (with_headers - plain) / N - payload
    estimate = 2 * _messages.HEADER_BYTES + _messages.HEADERS_BYTES
    assert _near(measured, estimate), (measured, estimate)


@pytest.mark.parametrize("columns", ["rows", "keys", "headers"])
def test_a_burst_row_with_a_callback_keeps_what_kept_counts(columns: str) -> None:
    """The column lists ``RowOutcomes`` keeps for a burst with callbacks: values,
    timestamps (ints past the small-int cache) and callbacks; keys; header keys (shared
    strs), values and per row the end of its headers."""
    def rows() -> tuple[Any, ...]:
        callback = print
        return (_values(), [1_700_000_000_000 + i for i in range(N)],
                [callback for _ in range(N)])

    def keyed() -> tuple[Any, ...]:
        return rows(), _keys()

    def headers() -> tuple[Any, ...]:
        hkeys: list[str] = []
        hvalues: list[bytes] = []
        ends = [0]
        for i in range(N):
            hkeys += ["trace-id", "source"]
            hvalues += [b"%016x" % i, b"s%07d" % i]
            ends.append(len(hkeys))
        return rows(), hkeys, hvalues, ends

    base = _allocated(rows)
    if columns == "rows":
        measured, estimate = base / N - 14, _burst.KEPT_ROW_BYTES
    elif columns == "keys":
        measured, estimate = (_allocated(keyed) - base) / N - 10, _burst.KEPT_KEY_BYTES
    else:
        measured = (_allocated(headers) - base) / N - (16 + 8)
        estimate = 2 * _burst.KEPT_HEADER_BYTES + _burst.KEPT_ENDS_BYTES
    assert _near(measured, estimate), (measured, estimate)
