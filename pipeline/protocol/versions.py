"""API version negotiation against a broker's ApiVersions response.

``negotiate(key, broker_min, broker_max)`` is the highest version both sides speak,
or ``UnsupportedVersionError`` naming the API and both ranges. ``negotiate_all``
negotiates every API the broker lists; an API with no common version is left out,
unless it is ``required``, which raises. ``api_versions_retry_version`` reads a
broker's refusal of our ApiVersions version (the version to retry with), and
``unsupported_api_versions_response`` is the v0 answer a fake broker gives to a
version it does not serve.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from pipeline.protocol.api import CLIENT_VERSIONS, ApiKey
from pipeline.protocol.errors import ErrorCode, UnsupportedVersionError, error_code
from pipeline.protocol.messages.api_versions import (
    ApiVersion,
    ApiVersionsRequest,
    ApiVersionsResponse,
)

__all__ = [
    "API_VERSIONS_FALLBACK_VERSION",
    "API_VERSIONS_V0_REQUEST",
    "api_versions_retry_version",
    "broker_ranges",
    "negotiate",
    "negotiate_all",
    "unsupported_api_versions_response",
]

#: The version to fall back to when a broker rejects our ApiVersions request.
API_VERSIONS_FALLBACK_VERSION: Final = 0
#: The (empty) v0 ApiVersions request body every broker understands.
API_VERSIONS_V0_REQUEST: Final = ApiVersionsRequest()


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api_key={api_key}"


def negotiate(api_key: int, broker_min: int, broker_max: int) -> int:
    """The highest version both we (``CLIENT_VERSIONS``) and the broker support."""
    try:
        ours = CLIENT_VERSIONS[ApiKey(api_key)]
    except (ValueError, KeyError):
        raise UnsupportedVersionError(f"{_api_name(api_key)}: this client does not speak this API") from None
    lo = max(ours[0], broker_min)
    hi = min(ours[1], broker_max)
    if hi < lo:
        raise UnsupportedVersionError(
            f"{_api_name(api_key)}: no common version; client supports {ours[0]}-{ours[1]}, "
            f"broker supports {broker_min}-{broker_max}"
        )
    return hi


def broker_ranges(response: ApiVersionsResponse) -> dict[int, tuple[int, int]]:
    """``{api_key: (min, max)}`` as listed by the broker."""
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def negotiate_all(
    response: ApiVersionsResponse, *, required: Iterable[ApiKey] = ()
) -> dict[ApiKey, int]:
    """Negotiated versions for every API we speak that the broker lists.

    APIs whose ranges are disjoint are left out (using one later fails with a
    clear error via :func:`negotiate`), except those in ``required``, which
    raise :class:`UnsupportedVersionError` right away, as do ``required`` APIs
    the broker does not list at all.
    """
    if response.error_code != ErrorCode.NONE:
        raise UnsupportedVersionError(
            f"ApiVersions failed with error code {response.error_code} "
            f"({error_code(response.error_code).name})"
        )
    ranges = broker_ranges(response)
    required_set = set(required)
    out: dict[ApiKey, int] = {}
    for key in CLIENT_VERSIONS:
        rng = ranges.get(int(key))
        if rng is None:
            if key in required_set:
                raise UnsupportedVersionError(f"{key.name}: the broker does not support this API")
            continue
        try:
            out[key] = negotiate(key, rng[0], rng[1])
        except UnsupportedVersionError:
            if key in required_set:
                raise
    return out


def api_versions_retry_version(response: ApiVersionsResponse) -> int | None:
    """After an UNSUPPORTED_VERSION ApiVersions answer: the version to retry with.

    Brokers (KIP-511) list their own ApiVersions range in that error response;
    we retry with the highest common version, else v0. ``None`` if the response
    is not an UNSUPPORTED_VERSION error.
    """
    if response.error_code != ErrorCode.UNSUPPORTED_VERSION:
        return None
    rng = broker_ranges(response).get(int(ApiKey.API_VERSIONS))
    if rng is not None:
        try:
            return negotiate(ApiKey.API_VERSIONS, rng[0], rng[1])
        except UnsupportedVersionError:
            pass
    return API_VERSIONS_FALLBACK_VERSION


def unsupported_api_versions_response(min_version: int, max_version: int) -> ApiVersionsResponse:
    """A broker's answer to an ApiVersions request above its range (for fakes).

    UNSUPPORTED_VERSION listing only the broker's own ApiVersions range, to be
    encoded **as v0** whatever version was asked (KIP-511), so any client can
    read it and retry (:func:`api_versions_retry_version` on the client side).
    """
    return ApiVersionsResponse(
        error_code=ErrorCode.UNSUPPORTED_VERSION,
        api_keys=(
            ApiVersion(
                api_key=ApiKey.API_VERSIONS, min_version=min_version, max_version=max_version
            ),
        ),
    )
