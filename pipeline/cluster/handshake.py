"""The connection handshake: what runs on a new connection before anyone may use it.

:meth:`BrokerConnection.connect <pipeline.cluster.connection.BrokerConnection.connect>`
starts the reader task, then calls :func:`handshake`; a failure closes the
connection and is raised from ``connect``. The handshake is

1. ApiVersions and version negotiation (Kafka answers ApiVersions before
   authentication, KIP-35/KIP-152);
2. with ``security_protocol`` SASL_PLAINTEXT or SASL_SSL, authentication:
   SaslHandshake v1 and SaslAuthenticate (up to v2) rounds
   (:class:`~pipeline.cluster.sasl.Authenticator`), which needs the negotiated
   versions and finishes before the first request is let through.

It returns the versions, the cluster's finalized feature levels (KIP-584: e.g.
``transaction.version``, which decides the transactions protocol) and the session
lifetime the broker granted; the
connection re-authenticates before that lifetime ends (KIP-368,
``connection.py``). TLS happened earlier, in the connector.

The handshake talks through the narrow :class:`Requester` seam (one
``request`` method), not the whole connection, so it is testable on its own. It
ends by a deadline (what is left of ``connect_timeout``: librdkafka's
``socket.connection.setup.timeout.ms`` covers it too), and a broker that never
answers is reported as such, naming the step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import trio

from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.errors import (
    BrokerConnectionError,
    BrokerProtocolError,
    UnsupportedApiError,
)
from pipeline.cluster.sasl import Authenticator, Requester
from pipeline.cluster.security import uses_sasl
from pipeline.protocol.api import CLIENT_VERSIONS, ApiKey
from pipeline.protocol.errors import ErrorCode, UnsupportedVersionError, error_code
from pipeline.protocol.messages.api_versions import ApiVersionsRequest, ApiVersionsResponse
from pipeline.protocol.versions import api_versions_retry_version, broker_ranges, negotiate_all

__all__ = [
    "CLIENT_SOFTWARE_NAME",
    "CLIENT_SOFTWARE_VERSION",
    "Handshake",
    "Requester",
    "api_versions",
    "finalized_features",
    "handshake",
]

logger = logging.getLogger("pipeline.cluster")

CLIENT_SOFTWARE_NAME = "trio-kafka-pipeline"
CLIENT_SOFTWARE_VERSION = "0.1.0"

@dataclass(frozen=True, slots=True)
class Handshake:
    """What a finished handshake established."""

    versions: dict[ApiKey, int]
    #: seconds until the broker ends the authenticated session (KIP-368), 0 for none
    session_lifetime: float = 0.0
    #: the cluster's finalized feature levels (KIP-584), ``{name: max level}``, as the
    #: broker's ApiVersions (v3+) listed them; a feature at level 0 is not listed
    finalized_features: Mapping[str, int] = field(default_factory=dict)
    #: ``{api_key: (min, max)}`` as the broker listed them (also APIs or versions this
    #: client does not negotiate: e.g. Produce v12, whose meaning in a transaction depends
    #: on ``transaction.version``)
    broker_versions: Mapping[int, tuple[int, int]] = field(default_factory=dict)


async def handshake(conn: Requester, config: ClusterConfig,
                    authenticator: Authenticator | None = None, *,
                    deadline: float = math.inf) -> Handshake:
    """Run the handshake on a new connection, by ``deadline`` (trio time: what is
    left of ``connect_timeout``).

    ``authenticator`` is the cluster client's (shared OAUTHBEARER tokens); without
    one, a SASL config gets its own.

    Raises:
      BrokerConnectionError: the connection failed meanwhile, or ``deadline`` came
          (its ``reason`` names the step that got no answer).
      BrokerProtocolError: the broker rejected ApiVersions with an error.
      UnsupportedApiError: no ApiVersions version in common.
      AuthenticationError: SASL failed (:mod:`pipeline.cluster.sasl`); not retriable.
    """
    step = (f"timed out: connected, but no answer to ApiVersions within "
            f"{config.connect_timeout}s (security_protocol={config.security_protocol}; "
            "is this a Kafka listener?)")
    with trio.move_on_at(deadline):
        response = await api_versions(conn)
        try:
            versions = negotiate_all(response)
        except UnsupportedVersionError as exc:
            raise UnsupportedApiError(f"{conn}: {exc}") from exc
        features = finalized_features(response)
        ranges = broker_ranges(response)
        if not uses_sasl(config.security_protocol):
            return Handshake(versions, finalized_features=features, broker_versions=ranges)
        step = f"timed out: SASL authentication did not finish within {config.connect_timeout}s"
        if authenticator is None:
            authenticator = Authenticator(config)
        lifetime = await authenticator.authenticate(conn, versions, str(conn))
        return Handshake(versions, lifetime, features, ranges)
    raise BrokerConnectionError(f"{conn}: {step}", reason=step)


def finalized_features(response: ApiVersionsResponse) -> dict[str, int]:
    """``{feature: finalized max level}`` of an ApiVersions response (empty before v3)."""
    return {f.name: f.max_version_level for f in response.finalized_features}


async def api_versions(conn: Requester) -> ApiVersionsResponse:
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
    return response
