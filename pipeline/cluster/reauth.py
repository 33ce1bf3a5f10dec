"""KIP-368 re-authentication of a live connection, before its SASL session ends.

A broker with ``connections.max.reauth.ms`` grants each SASL session a lifetime
(SaslAuthenticate v1+ ``session_lifetime_ms``; for OAUTHBEARER at most the token's
remaining life) and closes the connection when a request other than SaslHandshake
arrives after it. There are two ways to keep a connection usable: re-authenticate on
the same connection between requests, or open a new one and drain the old. The Java
client does the first (``KafkaChannel.maybeBeginClientReauthentication``, at a random
point between 85% and 95% of the lifetime), and so do we:

* one timer task per SASL connection with a lifetime (:func:`reauthenticate`, in the
  connection's nursery) sleeps until that point (jitter from ``rng``: connections
  made together do not all re-authenticate at once);
* it closes the connection's *gate*: new requests wait; requests already on the wire
  are not touched, and their responses are matched by correlation id as always,
  before and between the re-authentication's own;
* it sends SaslHandshake and the SaslAuthenticate rounds past the gate (the broker
  serves a connection's requests in order, so everything written before SaslHandshake
  was served in the old session), then opens the gate with the new lifetime;
* a refusal closes the connection with its
  :class:`~pipeline.cluster.errors.AuthenticationError`, which every waiting sender
  and pending request then gets.

A new connection per session would cost a TCP (and TLS) handshake and a drain each
time, and move the producer's in-flight batches between connections.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Protocol, TypeVar

import trio

from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.errors import KafkaError
from pipeline.cluster.pending import PendingResponse
from pipeline.cluster.sasl import Authenticator
from pipeline.protocol.api import ApiKey
from pipeline.protocol.base import Request, Response

__all__ = ["REAUTH_AT", "REAUTH_JITTER", "reauthenticate"]

logger = logging.getLogger("pipeline.cluster")

#: Re-authenticate after this fraction of the session lifetime, plus up to
#: REAUTH_JITTER more (the Java client's 85% + 10%).
REAUTH_AT = 0.85
REAUTH_JITTER = 0.10
_rng = random.Random()

R = TypeVar("R", bound=Response)


class Renewable(Protocol):
    """What :func:`reauthenticate` needs of a :class:`~pipeline.cluster.connection.
    BrokerConnection` (a protocol: the connection module imports this one)."""

    config: ClusterConfig
    api_versions: dict[ApiKey, int]
    session_lifetime: float
    reauthentications: int
    _gate: trio.Event | None
    _reauth_scope: trio.CancelScope

    async def _send(self, request: Request[R], version: int | None, expect_response: bool,
                    *, gated: bool, wait: trio.CancelScope | None = ...
                    ) -> PendingResponse[R | None] | None: ...

    def _fail(self, error: KafkaError, *, notify: bool = True) -> None: ...


class _Ungated:
    """The connection as the re-authentication's Requester: past the gate."""

    def __init__(self, conn: Renewable) -> None:
        self._conn = conn

    async def request(self, request: Request[R], *, version: int | None = None) -> R:
        pending = await self._conn._send(request, version, True, gated=False)
        assert pending is not None  # (no deadline to wait until)
        response = await pending.wait()
        assert response is not None
        return response

    def __str__(self) -> str:
        return str(self._conn)


async def reauthenticate(conn: Renewable, authenticator: Authenticator) -> None:
    """Renew ``conn``'s session before each lifetime ends, until it closes."""
    rng: Any = conn.config.rng if conn.config.rng is not None else _rng
    requester = _Ungated(conn)
    with conn._reauth_scope:
        while conn.session_lifetime > 0:
            await trio.sleep(conn.session_lifetime * (REAUTH_AT + REAUTH_JITTER * rng.random()))
            gate = conn._gate = trio.Event()
            try:
                lifetime = await authenticator.authenticate(requester, conn.api_versions,
                                                            str(conn))
            except KafkaError as exc:
                logger.warning("%s: re-authentication failed: %s", conn, exc)
                conn._fail(exc)  # a connection that failed meanwhile keeps its first error
                return
            finally:
                conn._gate = None
                gate.set()
            conn.reauthentications += 1
            conn.session_lifetime = lifetime
            logger.debug("%s: re-authenticated; next session lifetime %.3fs", conn, lifetime)
