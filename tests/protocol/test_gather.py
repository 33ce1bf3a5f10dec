"""Gather frames: ``encode_request_parts`` is ``encode_request`` as buffers,
with long byte fields (record batches) by reference, not copied."""

from __future__ import annotations

import pytest

from pipeline.protocol.codec import (
    GATHER_MIN,
    GatherWriter,
    decode_request,
    encode_request,
    encode_request_parts,
)
from pipeline.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic
from pipeline.protocol.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)
from pipeline.protocol.primitives import Writer


def _produce(records: list[bytes | None]) -> ProduceRequest:
    half = len(records) // 2
    return ProduceRequest(
        acks=-1,
        timeout_ms=30_000,
        topic_data=(
            TopicProduceData(name="a", partition_data=tuple(
                PartitionProduceData(index=i, records=r) for i, r in enumerate(records[:half]))),
            TopicProduceData(name="b", partition_data=tuple(
                PartitionProduceData(index=i, records=r) for i, r in enumerate(records[half:]))),
        ),
    )


RECORDS = [
    bytes(range(256)) * 8,  # long: by reference
    None,
    b"x" * (GATHER_MIN - 1),  # the longest copied field
    b"y" * GATHER_MIN,  # the shortest kept one
    b"",
    b"z" * 200_000,
]


@pytest.mark.parametrize("version", range(3, 12))
def test_parts_join_to_the_frame_and_keep_long_records(version: int) -> None:
    request = _produce(RECORDS)
    frame = encode_request(request, version=version, correlation_id=7, client_id="c")
    parts = encode_request_parts(request, version=version, correlation_id=7, client_id="c")
    assert b"".join(parts) == frame
    assert all(len(p) for p in parts)
    kept = [p for p in parts if not isinstance(p, bytearray)]
    # the same objects, not copies: exactly the fields of GATHER_MIN bytes or more
    assert [id(p) for p in kept] == [id(RECORDS[k]) for k in (0, 3, 5)]
    header, body = decode_request(memoryview(frame)[4:])
    assert header.correlation_id == 7 and body == request


def test_a_request_without_long_fields_is_one_part() -> None:
    request = MetadataRequest(topics=(MetadataRequestTopic(name="t"),))
    frame = encode_request(request, version=9, correlation_id=1, client_id=None)
    assert encode_request_parts(request, version=9, correlation_id=1, client_id=None) == [frame]
    small = _produce([b"v" * 10, b"w" * 20])
    parts = encode_request_parts(small, version=9, correlation_id=2, client_id="c")
    assert len(parts) == 1
    assert parts[0] == encode_request(small, version=9, correlation_id=2, client_id="c")


def test_two_long_fields_in_a_row_and_one_at_the_end() -> None:
    w = GatherWriter()
    a, b = b"a" * GATHER_MIN, b"b" * (GATHER_MIN + 1)
    w.int8(1)
    w.bytes_(a)
    w.compact_bytes(b)
    parts = w.parts()
    assert parts[1] is a and parts[3] is b and len(parts) == 4
    plain = Writer()
    plain.int8(1)
    plain.bytes_(a)
    plain.compact_bytes(b)
    assert w.getvalue() == plain.getvalue() and len(w) == len(plain)
    w.nullable_bytes(None)
    w.compact_nullable_bytes(None)
    plain.nullable_bytes(None)
    plain.compact_nullable_bytes(None)
    assert w.getvalue() == plain.getvalue() and w.parts()[-1] == b"\xff\xff\xff\xff\x00"
