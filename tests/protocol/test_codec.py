"""Whole frames: size prefix + header + body."""

from __future__ import annotations

import pytest

from pipeline.protocol.api import ApiKey
from pipeline.protocol.codec import (
    decode_request,
    decode_response,
    decode_response_as,
    encode_request,
    encode_response,
    peek_correlation_id,
)
from pipeline.protocol.errors import DecodeError, ErrorCode, UnsupportedVersionError
from pipeline.protocol.framing import FrameBuffer
from pipeline.protocol.header import RequestHeader
from pipeline.protocol.messages.api_versions import (
    ApiVersion,
    ApiVersionsRequest,
    ApiVersionsResponse,
)
from pipeline.protocol.messages.metadata import (
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
)
from pipeline.protocol.messages.produce import ProduceRequest

API_VERSIONS_V3_FRAME = (
    b"\x00\x00\x00\x23"  # size: 35
    b"\x00\x12"  # request_api_key: 18
    b"\x00\x03"  # request_api_version: 3
    b"\x00\x00\x00\x01"  # correlation_id
    b"\x00\x08pipeline"  # client_id (int16 length even in header v2)
    b"\x00"  # header tagged fields
    b"\x09pipeline"  # client_software_name
    b"\x060.1.0"  # client_software_version
    b"\x00"  # body tagged fields
)


def test_encode_request_frame() -> None:
    req = ApiVersionsRequest(client_software_name="pipeline", client_software_version="0.1.0")
    frame = encode_request(req, version=3, correlation_id=1, client_id="pipeline")
    assert frame == API_VERSIONS_V3_FRAME
    header, body = decode_request(frame[4:])
    assert header == RequestHeader(request_api_key=18, request_api_version=3, correlation_id=1,
                                   client_id="pipeline")
    assert body == req


def test_encode_request_v0_api_versions() -> None:
    frame = encode_request(ApiVersionsRequest(), version=0, correlation_id=0, client_id=None)
    assert frame == (
        b"\x00\x00\x00\x0a"  # size
        b"\x00\x12\x00\x00"  # ApiVersions v0
        b"\x00\x00\x00\x00"  # correlation_id
        b"\xff\xff"  # client_id: null
    )


def test_metadata_request_roundtrip_every_client_version() -> None:
    req = MetadataRequest(topics=(MetadataRequestTopic(name="orders"),))
    for v in range(1, 13):
        frame = encode_request(req, version=v, correlation_id=v, client_id="c")
        header, body = decode_request(frame[4:])
        assert header.request_api_version == v
        assert header.correlation_id == v
        assert body == req


def test_response_roundtrip_and_peek() -> None:
    resp = MetadataResponse(controller_id=2)
    for v in (1, 8, 9, 12):
        frame = encode_response(resp, api_key=ApiKey.METADATA, version=v, correlation_id=99)
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        assert peek_correlation_id(frame[4:]) == 99
        cid, got = decode_response(frame[4:], api_key=ApiKey.METADATA, version=v)
        assert cid == 99
        assert got == resp
    # header v1 (flexible) has a tagged-field byte after the correlation id
    assert encode_response(resp, api_key=3, version=9, correlation_id=1)[4:9] == b"\x00\x00\x00\x01\x00"
    assert encode_response(resp, api_key=3, version=8, correlation_id=1)[4:9] == b"\x00\x00\x00\x01\x00"


def test_api_versions_response_uses_header_v0() -> None:
    resp = ApiVersionsResponse(api_keys=(ApiVersion(api_key=18, min_version=0, max_version=4),))
    frame = encode_response(resp, api_key=18, version=3, correlation_id=5)
    assert frame[4:8] == b"\x00\x00\x00\x05"
    assert frame[8:10] == b"\x00\x00"  # error_code right after the v0 header
    assert decode_response(frame[4:], api_key=18, version=3) == (5, resp)


def test_api_versions_unsupported_version_falls_back_to_v0() -> None:
    # a broker answering our v3 request it doesn't understand replies in v0
    v0 = ApiVersionsResponse(error_code=ErrorCode.UNSUPPORTED_VERSION,
                             api_keys=(ApiVersion(api_key=18, min_version=0, max_version=2),))
    frame = encode_response(v0, api_key=18, version=0, correlation_id=1)
    cid, got = decode_response(frame[4:], api_key=18, version=3)
    assert cid == 1
    assert got.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert got.api_keys == v0.api_keys


def test_decode_request_unknown_version_carries_header() -> None:
    frame = b"\x00\x12\x00\x63\x00\x00\x00\x2a\x00\x01c\x00"  # ApiVersions v99
    with pytest.raises(UnsupportedVersionError) as info:
        decode_request(frame)
    assert isinstance(info.value.header, RequestHeader)
    assert info.value.header.correlation_id == 42
    with pytest.raises(UnsupportedVersionError):
        decode_request(b"\x03\xe7\x00\x00\x00\x00\x00\x01\xff\xff")  # api key 999


def test_version_and_key_checks() -> None:
    with pytest.raises(UnsupportedVersionError):
        encode_request(ProduceRequest(), version=14, correlation_id=1, client_id=None)
    with pytest.raises(ValueError, match="not a response"):
        encode_response(MetadataResponse(), api_key=ApiKey.PRODUCE, version=3, correlation_id=1)
    with pytest.raises(UnsupportedVersionError):
        decode_response(b"\x00\x00\x00\x01", api_key=3, version=13)
    with pytest.raises(UnsupportedVersionError):
        decode_response(b"\x00\x00\x00\x01", api_key=999, version=0)


def test_truncated_frames() -> None:
    with pytest.raises(DecodeError):
        peek_correlation_id(b"\x00\x00\x01")
    with pytest.raises(DecodeError):
        decode_request(b"\x00\x12\x00")
    frame = encode_response(MetadataResponse(), api_key=3, version=12, correlation_id=1)
    with pytest.raises(DecodeError):
        decode_response(frame[4:-1], api_key=3, version=12)


def test_frames_through_frame_buffer() -> None:
    frames = [
        encode_request(MetadataRequest(topics=None), version=v, correlation_id=v, client_id="x")
        for v in range(1, 13)
    ]
    fb = FrameBuffer()
    fb.receive_data(b"".join(frames))
    for v in range(1, 13):
        f = fb.next_frame()
        assert isinstance(f, bytes)
        header, body = decode_request(f)
        assert header.correlation_id == v
        assert body.topics is None


def test_api_versions_body_unreadable_at_the_asked_version_is_read_as_v0() -> None:
    # The Java client's rule, the second half of the one fallback in
    # decode_response_as: whatever the error code, a v1+ ApiVersions body that
    # does not parse at the asked version is read as v0.
    v0 = ApiVersionsResponse(api_keys=(ApiVersion(api_key=18, min_version=0, max_version=2),))
    frame = encode_response(v0, api_key=18, version=0, correlation_id=9)
    with pytest.raises(DecodeError):
        ApiVersionsResponse.decode(frame[8:], 3)  # it really is unreadable as v3
    assert decode_response_as(frame[4:], ApiVersionsResponse, version=3) == (9, v0)
