"""The connection handshake: what runs on a new connection before anyone may use it.

:meth:`BrokerConnection.connect <pipeline.cluster.connection.BrokerConnection.connect>`
starts the reader task, then calls :func:`handshake`; a failure closes the
connection and is raised from ``connect``. Today the handshake is ApiVersions
and version negotiation. Authentication (issue 14: SaslHandshake v1 +
SaslAuthenticate v2, reading ``security_protocol``/``sasl_*`` from the
:class:`~pipeline.cluster.config.ClusterConfig`) belongs here too, after
ApiVersions, since it needs the negotiated versions and must finish before the
first request is let through.

The handshake talks through the narrow :class:`Requester` seam (one
``request`` method), not the whole connection, so it is testable on its own.
"""

from __future__ import annotations

import logging
from typing import Protocol, TypeVar

from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.errors import BrokerProtocolError, UnsupportedApiError
from pipeline.protocol.api import CLIENT_VERSIONS, ApiKey
from pipeline.protocol.base import Request, Response
from pipeline.protocol.errors import ErrorCode, UnsupportedVersionError, error_code
from pipeline.protocol.messages.api_versions import ApiVersionsRequest
from pipeline.protocol.versions import api_versions_retry_version, negotiate_all

__all__ = ["CLIENT_SOFTWARE_NAME", "CLIENT_SOFTWARE_VERSION", "Requester", "handshake"]

logger = logging.getLogger("pipeline.cluster")

CLIENT_SOFTWARE_NAME = "trio-kafka-pipeline"
CLIENT_SOFTWARE_VERSION = "0.1.0"

R = TypeVar("R", bound=Response)


class Requester(Protocol):
    """What the handshake needs of a connection: send one request, get its response."""

    async def request(self, request: Request[R], *, version: int | None = None) -> R: ...


async def handshake(conn: Requester, config: ClusterConfig) -> dict[ApiKey, int]:
    """Run the handshake on a new connection; return the negotiated API versions.

    Raises:
      BrokerConnectionError: the connection failed meanwhile.
      BrokerProtocolError: the broker rejected ApiVersions with an error.
      UnsupportedApiError: no ApiVersions version in common.
    """
    # ``config`` is passed for the authentication step (issue 14), which reads
    # its security options; ApiVersions needs none of them.
    return await negotiate_api_versions(conn)


async def negotiate_api_versions(conn: Requester) -> dict[ApiKey, int]:
    """ApiVersions at our highest version, retried lower when the broker says so.

    A broker that does not support our version answers UNSUPPORTED_VERSION in
    v0 format, listing its own ApiVersions range (KIP-511;
    :func:`~pipeline.protocol.codec.decode_response_as` reads that body): we
    retry once at the highest common version, else v0.
    """
    version = CLIENT_VERSIONS[ApiKey.API_VERSIONS][1]
    request = ApiVersionsRequest(
        client_software_name=CLIENT_SOFTWARE_NAME,
        client_software_version=CLIENT_SOFTWARE_VERSION,
    )
    while True:
        response = await conn.request(request, version=version)
        if response.error_code == ErrorCode.NONE:
            break
        retry_version = api_versions_retry_version(response)
        if retry_version is not None and retry_version < version:
            logger.debug("%s rejected ApiVersions v%d; retrying v%d", conn, version, retry_version)
            version = retry_version
            continue
        name = error_code(response.error_code).name
        raise BrokerProtocolError(f"{conn} rejected ApiVersions v{version}: {name}")
    try:
        return negotiate_all(response)
    except UnsupportedVersionError as exc:
        raise UnsupportedApiError(f"{conn}: {exc}") from exc
