"""The connection handshake on its own, through its one-method Requester seam."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.errors import BrokerProtocolError
from pipeline.cluster.handshake import CLIENT_SOFTWARE_NAME, handshake
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.api_versions import ApiVersion, ApiVersionsResponse
from pipeline.protocol.versions import unsupported_api_versions_response


class Script:
    """Answers each request with the next scripted response; records (request, version)."""

    def __init__(self, *answers: ApiVersionsResponse) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[Any, int | None]] = []

    async def request(self, request: Any, *, version: int | None = None) -> Any:
        self.sent.append((request, version))
        return self.answers.pop(0)


def full(*keys: tuple[int, int, int]) -> ApiVersionsResponse:
    return ApiVersionsResponse(
        api_keys=tuple(ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in keys)
    )


async def test_negotiates_at_our_highest_version() -> None:
    conn = Script(full((18, 0, 3), (0, 3, 9), (3, 1, 12)))
    versions = (await handshake(conn, ClusterConfig())).versions
    assert versions == {ApiKey.API_VERSIONS: 3, ApiKey.PRODUCE: 9, ApiKey.METADATA: 12}
    [(request, version)] = conn.sent
    assert version == 3
    assert request.client_software_name == CLIENT_SOFTWARE_NAME


async def test_retries_at_the_version_the_broker_names() -> None:
    conn = Script(unsupported_api_versions_response(0, 2), full((18, 0, 2), (0, 3, 9)))
    assert (await handshake(conn, ClusterConfig())).versions[ApiKey.PRODUCE] == 9
    assert [v for _, v in conn.sent] == [3, 2]


async def test_a_refusal_at_the_lowest_version_is_a_protocol_error() -> None:
    conn = Script(ApiVersionsResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
    with pytest.raises(BrokerProtocolError, match="rejected ApiVersions v3: CLUSTER_AUTHORIZATION"):
        await handshake(conn, ClusterConfig())


async def test_an_api_without_a_common_version_is_left_out() -> None:
    # Using it later fails with UnsupportedApiError (BrokerConnection.version_for).
    conn = Script(full((18, 0, 3), (0, 13, 13), (3, 1, 12)))
    assert (await handshake(conn, ClusterConfig())).versions == {
        ApiKey.API_VERSIONS: 3, ApiKey.METADATA: 12
    }


async def test_finalized_features_are_kept() -> None:
    from pipeline.protocol.messages.api_versions import FinalizedFeatureKey

    response = ApiVersionsResponse(
        api_keys=(ApiVersion(api_key=18, min_version=0, max_version=3),),
        finalized_features=(
            FinalizedFeatureKey(name="transaction.version", min_version_level=2,
                                max_version_level=2),
            FinalizedFeatureKey(name="metadata.version", min_version_level=27,
                                max_version_level=27)))
    result = await handshake(Script(response), ClusterConfig())
    assert result.finalized_features == {"transaction.version": 2, "metadata.version": 27}
    assert result.broker_versions == {18: (0, 3)}
    # a broker before KIP-584 (ApiVersions v0-2) finalizes nothing
    assert (await handshake(Script(full((18, 0, 2))), ClusterConfig())).finalized_features == {}
