"""Request/response headers and header-version selection."""

from __future__ import annotations

import pytest

from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import DecodeError, UnsupportedVersionError
from pipeline.protocol.header import (
    RequestHeader,
    ResponseHeader,
    request_header_version,
    response_header_version,
)

HDR = RequestHeader(request_api_key=3, request_api_version=12, correlation_id=7, client_id="pipeline")

REQUEST_HEADERS = [
    (0, RequestHeader(request_api_key=3, request_api_version=12, correlation_id=7),
     b"\x00\x03"  # request_api_key: METADATA
     b"\x00\x0c"  # request_api_version: 12
     b"\x00\x00\x00\x07"),  # correlation_id
    (1, HDR,
     b"\x00\x03" b"\x00\x0c" b"\x00\x00\x00\x07"
     b"\x00\x08pipeline"),  # client_id (int16 length)
    (2, HDR,
     b"\x00\x03" b"\x00\x0c" b"\x00\x00\x00\x07"
     b"\x00\x08pipeline"  # client_id: NOT compact, even in v2
     b"\x00"),  # tagged fields
    (2, RequestHeader(request_api_key=18, request_api_version=3, correlation_id=-1, client_id=None),
     b"\x00\x12" b"\x00\x03" b"\xff\xff\xff\xff"
     b"\xff\xff"  # client_id: null
     b"\x00"),
]


@pytest.mark.parametrize(("version", "header", "data"), REQUEST_HEADERS)
def test_request_header(version: int, header: RequestHeader, data: bytes) -> None:
    assert header.encode(version) == data
    assert RequestHeader.decode(data, version) == header


def test_request_header_v2_skips_unknown_tagged_fields() -> None:
    data = b"\x00\x03\x00\x0c\x00\x00\x00\x07\x00\x01a" b"\x01\x05\x01\xff"
    assert RequestHeader.decode(data, 2).client_id == "a"


@pytest.mark.parametrize(("version", "data"), [(0, b"\x00\x00\x00\x2a"), (1, b"\x00\x00\x00\x2a\x00")])
def test_response_header(version: int, data: bytes) -> None:
    h = ResponseHeader(correlation_id=42)
    assert h.encode(version) == data
    assert ResponseHeader.decode(data, version) == h


def test_header_errors() -> None:
    with pytest.raises(UnsupportedVersionError):
        HDR.encode(3)
    with pytest.raises(UnsupportedVersionError):
        ResponseHeader().encode(2)
    with pytest.raises(DecodeError):
        ResponseHeader.decode(b"\x00\x00", 0)
    with pytest.raises(DecodeError):
        RequestHeader.decode(b"\x00\x03\x00\x0c\x00\x00\x00\x07\x00\x05ab", 1)


@pytest.mark.parametrize(
    ("key", "version", "req", "resp"),
    [
        (ApiKey.PRODUCE, 3, 1, 0),
        (ApiKey.PRODUCE, 8, 1, 0),
        (ApiKey.PRODUCE, 9, 2, 1),
        (ApiKey.PRODUCE, 11, 2, 1),
        (ApiKey.METADATA, 8, 1, 0),
        (ApiKey.METADATA, 9, 2, 1),
        (ApiKey.FETCH, 11, 1, 0),
        (ApiKey.FETCH, 12, 2, 1),
        (ApiKey.API_VERSIONS, 0, 1, 0),
        (ApiKey.API_VERSIONS, 2, 1, 0),
        (ApiKey.API_VERSIONS, 3, 2, 0),  # ApiVersions responses always use header v0
        (ApiKey.API_VERSIONS, 4, 2, 0),
        (ApiKey.INIT_PRODUCER_ID, 1, 1, 0),
        (ApiKey.INIT_PRODUCER_ID, 2, 2, 1),
        (ApiKey.SASL_HANDSHAKE, 1, 1, 0),  # never flexible
        (ApiKey.SASL_AUTHENTICATE, 2, 2, 1),
        (ApiKey.CREATE_TOPICS, 5, 2, 1),
        (ApiKey.DELETE_TOPICS, 4, 2, 1),
        (ApiKey.LIST_OFFSETS, 6, 2, 1),
    ],
)
def test_header_versions(key: ApiKey, version: int, req: int, resp: int) -> None:
    assert request_header_version(key, version) == req
    assert response_header_version(key, version) == resp


def test_header_version_unknown_api() -> None:
    with pytest.raises(UnsupportedVersionError):
        request_header_version(9999, 0)
