"""``normalize.py`` rules found unpinned by ``make mutants`` (docs/testing.md, "Mutation testing").

Pure functions, so direct unit tests: ``prefix_size`` against Kafka's varint
rule for a record's key/value length, and ``normalize``'s handling of values
that are valid but not of the exact type the fast checks expect.
"""

from __future__ import annotations

from enum import IntEnum

import pytest

from pipeline.producer._intake.normalize import normalize, prefix_size
from pipeline.producer._message import ProducerMessage
from pipeline.protocol.records import _zigzag_varint


def kafka_length_prefix(n: int) -> int:
    """Bytes of a record's key/value length as Kafka writes it (KIP-98 record
    format): a zigzag varint, so length n is encoded as 2n, 7 bits a byte."""
    return max(1, -(-(2 * n).bit_length() // 7))


# Each width's last and first length: 1 byte up to 63, 2 up to 8191, 3 up to
# 2^20 - 1, 4 up to 2^27 - 1, 5 up to the int32 lengths Kafka allows.
BOUNDS = [0, 1, 63, 64, 8191, 8192, (1 << 20) - 1, 1 << 20, (1 << 26), (1 << 27) - 1,
          1 << 27, 1 << 28, (1 << 31) - 1]


@pytest.mark.parametrize("n", BOUNDS)
def test_prefix_size_is_the_zigzag_varint_width_of_the_length(n: int) -> None:
    """``prefix_size(n)`` (the bound a message reserves in ``buffer_memory``
    and checks against ``max_message_bytes``) is the exact width of the length
    prefix on the wire, at both sides of every width change, including values
    of 2^27 bytes and more (5 bytes), which no scenario test sends. A bound
    one byte short lets a message over ``max_message_bytes`` through; one
    byte long refuses a message that fits."""
    assert prefix_size(n) == kafka_length_prefix(n) == len(_zigzag_varint(n))


class Slot(IntEnum):
    """An int subclass, as users pass them (IntEnum, or bool, which is refused)."""

    ZERO = 0
    THREE = 3


def normalized(**fields: object) -> ProducerMessage:
    msg = ProducerMessage("t", b"v", **fields)  # type: ignore[arg-type]
    normalize(msg, lambda: 1_700_000_000_000, 1_000_000)
    return msg


@pytest.mark.parametrize("slot", [Slot.ZERO, Slot.THREE])
def test_an_int_subclass_partition_is_accepted_as_a_plain_int(slot: Slot) -> None:
    """A partition that is an int subclass (an IntEnum) but not a bool is a
    valid partition, including 0; it is stored as a plain ``int`` (the wire
    encoder and the partition producers' dict keys see the same int as for
    ``partition=0``). Only a bool or a negative value is refused."""
    msg = normalized(partition=slot)
    assert msg.partition == int(slot) and type(msg.partition) is int
    with pytest.raises(ValueError, match="partition must be None or an int >= 0"):
        normalized(partition=True)
    with pytest.raises(ValueError, match="partition must be None or an int >= 0"):
        normalized(partition=-1)


@pytest.mark.parametrize("stamp", [Slot.ZERO, Slot.THREE])
def test_an_int_subclass_timestamp_is_accepted_as_a_plain_int(stamp: Slot) -> None:
    """The same for a timestamp: an int subclass >= 0, including 0 (the
    epoch), is a valid CreateTime, stored as a plain ``int``; a bool or a
    negative value is refused."""
    msg = normalized(timestamp=stamp)
    assert msg.timestamp == int(stamp) and type(msg.timestamp) is int
    with pytest.raises(ValueError, match="timestamp must be None or milliseconds"):
        normalized(timestamp=False)
    with pytest.raises(ValueError, match="timestamp must be None or milliseconds"):
        normalized(timestamp=-1)


def test_a_timestamp_at_either_end_of_int64_is_accepted_whatever_its_int_type() -> None:
    """0 and 2**63-1 (a record's int64) are valid CreateTimes, as exact ints and as
    int subclasses (which take the slow check); 2**63 is refused by both."""
    from pipeline.producer._intake.normalize import MAX_TIMESTAMP

    class Ms(int):
        pass

    for stamp in (0, MAX_TIMESTAMP, Ms(0), Ms(MAX_TIMESTAMP)):
        msg = normalized(timestamp=stamp)
        assert msg.timestamp == stamp and type(msg.timestamp) is int
    for bad in (MAX_TIMESTAMP + 1, Ms(MAX_TIMESTAMP + 1)):
        with pytest.raises(ValueError, match="timestamp must be None or milliseconds"):
            normalized(timestamp=bad)
