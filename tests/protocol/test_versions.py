"""Version negotiation."""

from __future__ import annotations

import pytest

from pipeline.protocol.api import CLIENT_VERSIONS, ApiKey
from pipeline.protocol.errors import ErrorCode, UnsupportedVersionError
from pipeline.protocol.messages.api_versions import (
    ApiVersion,
    ApiVersionsRequest,
    ApiVersionsResponse,
)
from pipeline.protocol.versions import (
    API_VERSIONS_FALLBACK_VERSION,
    API_VERSIONS_V0_REQUEST,
    api_versions_retry_version,
    negotiate,
    negotiate_all,
)


def test_client_versions() -> None:
    assert CLIENT_VERSIONS[ApiKey.API_VERSIONS] == (0, 3)
    assert CLIENT_VERSIONS[ApiKey.METADATA] == (1, 12)
    assert CLIENT_VERSIONS[ApiKey.PRODUCE] == (3, 12)
    assert CLIENT_VERSIONS[ApiKey.INIT_PRODUCER_ID] == (0, 5)
    assert CLIENT_VERSIONS[ApiKey.FETCH] == (4, 17)
    assert set(CLIENT_VERSIONS) == set(ApiKey)


def test_negotiate_picks_highest_common() -> None:
    assert negotiate(ApiKey.PRODUCE, 0, 9) == 9
    assert negotiate(ApiKey.PRODUCE, 0, 99) == 12
    assert negotiate(ApiKey.PRODUCE, 5, 7) == 7
    assert negotiate(ApiKey.METADATA, 0, 1) == 1
    assert negotiate(ApiKey.API_VERSIONS, 0, 4) == 3


def test_negotiate_disjoint_names_api_and_ranges() -> None:
    with pytest.raises(UnsupportedVersionError) as info:
        negotiate(ApiKey.PRODUCE, 0, 2)
    msg = str(info.value)
    assert "PRODUCE" in msg
    assert "client supports 3-12" in msg
    assert "broker supports 0-2" in msg
    with pytest.raises(UnsupportedVersionError, match="METADATA"):
        negotiate(ApiKey.METADATA, 13, 15)
    with pytest.raises(UnsupportedVersionError):
        negotiate(7, 0, 3)  # an API we don't speak


def _resp(*ranges: tuple[int, int, int], error: int = 0) -> ApiVersionsResponse:
    return ApiVersionsResponse(
        error_code=error,
        api_keys=tuple(ApiVersion(api_key=k, min_version=a, max_version=b) for k, a, b in ranges),
    )


def test_negotiate_all() -> None:
    resp = _resp((0, 0, 9), (3, 0, 12), (18, 0, 4), (22, 0, 4), (1, 0, 3), (7, 0, 3))
    got = negotiate_all(resp)
    assert got == {ApiKey.PRODUCE: 9, ApiKey.METADATA: 12, ApiKey.API_VERSIONS: 3,
                   ApiKey.INIT_PRODUCER_ID: 4}  # FETCH 0-3 is disjoint -> left out; key 7 unknown
    with pytest.raises(UnsupportedVersionError, match="FETCH"):
        negotiate_all(resp, required=[ApiKey.FETCH])
    with pytest.raises(UnsupportedVersionError, match="SASL_HANDSHAKE"):
        negotiate_all(resp, required=[ApiKey.SASL_HANDSHAKE])
    with pytest.raises(UnsupportedVersionError, match="35"):
        negotiate_all(_resp(error=ErrorCode.UNSUPPORTED_VERSION))


def test_api_versions_fallback_helpers() -> None:
    assert API_VERSIONS_FALLBACK_VERSION == 0
    assert isinstance(API_VERSIONS_V0_REQUEST, ApiVersionsRequest)
    assert API_VERSIONS_V0_REQUEST.encode(0) == b""
    assert api_versions_retry_version(_resp((18, 0, 3))) is None
    assert api_versions_retry_version(_resp((18, 0, 2), error=35)) == 2
    assert api_versions_retry_version(_resp(error=35)) == 0
