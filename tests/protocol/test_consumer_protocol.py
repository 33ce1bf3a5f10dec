"""The consumer protocol's member bytes: Kafka's layouts, byte for byte, every version.

The expected bytes are written out field by field from ``ConsumerProtocolSubscription.json``
/ ``ConsumerProtocolAssignment.json`` (int16 version prefix, int16-length strings, int32
array counts, int32-length nullable bytes). Interoperability with librdkafka's members is
proven on Apache Kafka (tests/apache_kafka/test_groups_kafka.py).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.protocol.consumer_protocol import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    group_partitions,
)
from pipeline.protocol.errors import DecodeError


def s(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


NULL_BYTES = i32(-1)
SUB = ConsumerProtocolSubscription(
    topics=("b", "a"),
    user_data=b"\x00\x00\x00\x07",
    owned_partitions=(("a", (0, 2)),),
    generation_id=7,
    rack_id="r1",
)
V0_BODY = i32(2) + s("a") + s("b") + i32(4) + b"\x00\x00\x00\x07"
OWNED = i32(1) + s("a") + i32(2) + i32(0) + i32(2)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (0, i16(0) + V0_BODY),
        (1, i16(1) + V0_BODY + OWNED),
        (2, i16(2) + V0_BODY + OWNED + i32(7)),
        (3, i16(3) + V0_BODY + OWNED + i32(7) + s("r1")),
    ],
)
def test_subscription_bytes_per_version(version: int, expected: bytes) -> None:
    assert SUB.encode(version) == expected


def test_subscription_decodes_each_version_with_defaults_for_missing_fields() -> None:
    v0 = ConsumerProtocolSubscription.decode(SUB.encode(0))
    assert v0 == ConsumerProtocolSubscription(topics=("a", "b"), user_data=b"\x00\x00\x00\x07")
    v2 = ConsumerProtocolSubscription.decode(SUB.encode(2))
    assert (v2.owned, v2.generation_id, v2.rack_id) == ({("a", 0), ("a", 2)}, 7, None)
    v3 = ConsumerProtocolSubscription.decode(SUB.encode(3))
    assert v3.rack_id == "r1" and v3.topics == ("a", "b")


def test_null_user_data_and_null_rack() -> None:
    sub = ConsumerProtocolSubscription(topics=("t",))
    assert sub.encode(3) == i16(3) + i32(1) + s("t") + NULL_BYTES + i32(0) + i32(-1) + i16(-1)
    assert ConsumerProtocolSubscription.decode(sub.encode(3)) == sub


def test_an_empty_rack_reads_as_none_as_the_java_client_does() -> None:
    data = i16(3) + i32(0) + NULL_BYTES + i32(0) + i32(-1) + s("")
    assert ConsumerProtocolSubscription.decode(data).rack_id is None


def test_a_newer_version_is_read_with_the_newest_layout_and_trailing_fields_ignored() -> None:
    data = i16(9) + SUB.encode(3)[2:] + b"future field"
    decoded = ConsumerProtocolSubscription.decode(data)
    assert decoded == ConsumerProtocolSubscription.decode(SUB.encode(3))
    assignment = ConsumerProtocolAssignment.of([("t", 1)])
    assert ConsumerProtocolAssignment.decode(i16(5) + assignment.encode()[2:] + b"xx") == assignment


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_bytes(version: int) -> None:
    a = ConsumerProtocolAssignment.of([("t", 2), ("s", 0), ("t", 0)], user_data=None)
    expected = (
        i16(version) + i32(2) + s("s") + i32(1) + i32(0) + s("t") + i32(2) + i32(0) + i32(2)
        + NULL_BYTES
    )
    assert a.encode(version) == expected
    assert ConsumerProtocolAssignment.decode(expected) == a
    assert a.partitions == {("s", 0), ("t", 0), ("t", 2)}


def test_empty_assignment_bytes_are_an_empty_assignment() -> None:
    assert ConsumerProtocolAssignment.decode(b"").partitions == frozenset()


@pytest.mark.parametrize(
    "data",
    [
        i16(-1) + i32(0) + NULL_BYTES,  # negative version
        i16(1) + i32(1),  # topic missing
        i16(1) + i32(0) + NULL_BYTES + i32(1) + s("a"),  # partitions missing
        i16(0) + i32(0) + i32(5) + b"ab",  # user data shorter than its length
    ],
)
def test_malformed_subscriptions_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        ConsumerProtocolSubscription.decode(data)


@pytest.mark.parametrize("data", [i16(0), i16(-3) + i32(0), i16(0) + i32(1) + s("t") + i32(3)])
def test_malformed_assignments_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        ConsumerProtocolAssignment.decode(data)


def test_unknown_version_to_write_is_refused() -> None:
    with pytest.raises(ValueError, match="0-3"):
        SUB.encode(4)
    with pytest.raises(ValueError, match="0-3"):
        ConsumerProtocolAssignment().encode(-1)


names = st.text(alphabet="abcxyz._-", min_size=1, max_size=8)
partitions = st.frozensets(st.tuples(names, st.integers(0, 2**31 - 1)), max_size=20)


@given(
    topics=st.lists(names, max_size=5, unique=True),
    user_data=st.none() | st.binary(max_size=16),
    owned=partitions,
    generation=st.integers(-1, 2**31 - 1),
    rack=st.none() | names,
)
def test_subscription_round_trip(
    topics: list[str], user_data: bytes | None, owned: frozenset[tuple[str, int]],
    generation: int, rack: str | None,
) -> None:
    sub = ConsumerProtocolSubscription(
        topics=tuple(sorted(topics)), user_data=user_data,
        owned_partitions=group_partitions(owned), generation_id=generation, rack_id=rack,
    )
    assert ConsumerProtocolSubscription.decode(sub.encode()) == sub
    assert ConsumerProtocolSubscription.decode(sub.encode(1)).owned == owned


@given(assigned=partitions, user_data=st.none() | st.binary(max_size=16))
def test_assignment_round_trip(assigned: frozenset[tuple[str, int]], user_data: bytes | None) -> None:
    a = ConsumerProtocolAssignment.of(assigned, user_data)
    for version in range(4):
        back = ConsumerProtocolAssignment.decode(a.encode(version))
        assert back == a and back.partitions == assigned
