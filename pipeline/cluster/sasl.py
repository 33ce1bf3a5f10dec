"""SASL authentication of a connection: SaslHandshake v1, then SaslAuthenticate rounds.

The mechanisms themselves are sans-I/O state machines in
:mod:`pipeline.protocol.sasl`; this module carries their bytes over a connection
(through the one-method :class:`Requester` seam the handshake uses too) and maps every refusal to a specific, non-retriable
:class:`~pipeline.cluster.errors.AuthenticationError`:

* SaslHandshake answered UNSUPPORTED_SASL_MECHANISM -> :class:`SaslMechanismError`
  listing what the broker offers; ILLEGAL_SASL_STATE (a listener without SASL) ->
  :class:`SaslMechanismError` saying to check ``security_protocol``;
* SaslAuthenticate answered SASL_AUTHENTICATION_FAILED, or an exchange the
  client cannot finish (a server signature that does not verify) ->
  :class:`SaslAuthenticationError` naming the mechanism and the user (never the
  password or token) and the broker's own message.

One :class:`Authenticator` serves every connection of a cluster client, so
OAUTHBEARER tokens are fetched once and shared (:class:`TokenCache`). The same
:meth:`Authenticator.authenticate` runs again on a live connection for KIP-368
re-authentication (``connection.py``): SaslAuthenticate v1+ answers carry the
session lifetime the broker grants, which is what it returns.
"""

from __future__ import annotations

import inspect
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from pipeline.cluster.errors import SaslAuthenticationError, SaslMechanismError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.base import Request, Response
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.sasl_authenticate import SaslAuthenticateRequest
from pipeline.protocol.messages.sasl_handshake import SaslHandshakeRequest
from pipeline.protocol.sasl import (
    OAuthBearerClient,
    PlainClient,
    SaslClient,
    SaslError,
    ScramClient,
)

if TYPE_CHECKING:
    from pipeline.cluster.config import ClusterConfig
    from pipeline.cluster.security import TokenProvider

__all__ = ["REFRESH_FRACTION", "Authenticator", "Requester", "TokenCache", "new_nonce"]

R = TypeVar("R", bound=Response)


class Requester(Protocol):
    """What the handshake and authentication need of a connection: send one request,
    get its response."""

    async def request(self, request: Request[R], *, version: int | None = None) -> R: ...

logger = logging.getLogger("pipeline.cluster")

#: A token is refreshed once this fraction of its lifetime has passed (the Java
#: client's ``sasl.login.refresh.window.factor`` default).
REFRESH_FRACTION = 0.8

# Exchanges longer than this are a broker bug, not a slow broker: no mechanism here
# needs more than 3 SaslAuthenticate rounds.
_MAX_ROUNDS = 8


def new_nonce() -> str:
    """A SCRAM client nonce: 24 random bytes, URL-safe base64 (no ``,``)."""
    return secrets.token_urlsafe(24)


class TokenCache:
    """OAUTHBEARER tokens from the user's provider, shared by every connection.

    A token is used until :data:`REFRESH_FRACTION` of its lifetime has passed, then
    the next authentication (a new connection, or a KIP-368 re-authentication,
    which the broker requires before the token's expiry) fetches a fresh one: so
    the broker never sees an expired token. If that refresh fails while the current
    token is still valid, the current one is used and a warning logged; with no
    valid token the failure is a :class:`SaslAuthenticationError`. Fetches are
    single-flight. A synchronous provider runs in a worker thread (it may block on
    HTTP); an async one runs in the caller's task.

    ``wall_clock`` (seconds since the epoch) is only read to turn the provider's
    absolute expiry into a lifetime; everything else runs on trio's clock.
    """

    def __init__(self, provider: TokenProvider, *,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._provider = provider
        self._wall_clock = wall_clock
        self._lock = trio.Lock()
        self._token: str | None = None
        self._refresh_at = -math.inf  # trio time
        self._expires_at = -math.inf  # trio time
        self.fetches = 0  # provider calls (tests, statistics)

    async def token(self) -> str:
        async with self._lock:
            now = trio.current_time()
            if self._token is not None and now < self._refresh_at:
                return self._token
            try:
                token, lifetime = await self._fetch()
            except SaslAuthenticationError as exc:
                if self._token is not None and now < self._expires_at:
                    logger.warning(
                        "OAUTHBEARER token refresh failed (%s); using the current token, "
                        "which expires in %.1fs", exc, self._expires_at - now,
                    )
                    return self._token
                raise
            self._token = token
            self._refresh_at = now + REFRESH_FRACTION * lifetime
            self._expires_at = now + lifetime
            return token

    async def _fetch(self) -> tuple[str, float]:
        provider: Any = self._provider
        self.fetches += 1
        try:
            if inspect.iscoroutinefunction(provider) or inspect.iscoroutinefunction(
                getattr(provider, "__call__", None)  # noqa: B004 - an async __call__
            ):
                result = await provider()
            else:
                result = await trio.to_thread.run_sync(provider)
                if inspect.isawaitable(result):
                    result = await result
        except Exception as exc:
            # The provider's own text may carry its secrets (a client secret in a URL):
            # only its type is shown; the exception itself is the __cause__.
            raise SaslAuthenticationError(
                f"the OAUTHBEARER token provider raised {type(exc).__name__}"
            ) from exc
        if (
            not isinstance(result, tuple | list)
            or len(result) != 2
            or not isinstance(result[0], str)
            or not isinstance(result[1], int | float)
            or isinstance(result[1], bool)
        ):
            raise SaslAuthenticationError(
                "the OAUTHBEARER token provider must return (token: str, expires_at: float "
                f"seconds since the epoch), not a {type(result).__name__}"
            )
        token, expires_at = result[0], float(result[1])
        lifetime = expires_at - self._wall_clock()
        if lifetime <= 0:
            raise SaslAuthenticationError(
                f"the OAUTHBEARER token provider returned a token that expired {-lifetime:.1f}s "
                "ago (expires_at is seconds since the epoch, like time.time())"
            )
        return token, lifetime


class Authenticator:
    """Authenticates connections of one cluster client with its SASL options."""

    def __init__(self, config: ClusterConfig, *, nonce: Callable[[], str] = new_nonce,
                 wall_clock: Callable[[], float] = time.time) -> None:
        mechanism = config.sasl_mechanism
        assert mechanism is not None, "validated by ClusterConfig"
        self.mechanism = mechanism
        self._username = config.sasl_username
        self._password = config.sasl_password
        self._nonce = nonce
        self.tokens: TokenCache | None = None
        if mechanism == "OAUTHBEARER":
            assert config.sasl_oauth_token_provider is not None
            self.tokens = TokenCache(config.sasl_oauth_token_provider, wall_clock=wall_clock)

    def __repr__(self) -> str:
        return f"<Authenticator {self.mechanism} user={self._username!r}>"

    @property
    def who(self) -> str:
        """The identity for error texts: the user, or "a token" for OAUTHBEARER."""
        return "an OAUTHBEARER token" if self.tokens is not None else f"user {self._username!r}"

    async def _client(self) -> SaslClient:
        if self.tokens is not None:
            return OAuthBearerClient(await self.tokens.token())
        assert self._username is not None
        assert self._password is not None
        if self.mechanism == "PLAIN":
            return PlainClient(self._username, self._password)
        return ScramClient(self.mechanism, self._username, self._password, nonce=self._nonce())

    async def authenticate(self, conn: Requester, versions: Mapping[ApiKey, int],
                           where: str) -> float:
        """Run SaslHandshake v1 + SaslAuthenticate on ``conn``; return the session
        lifetime the broker granted, in seconds (0: no re-authentication needed).

        Raises:
          SaslMechanismError: the broker does not offer the mechanism, or the
              listener does not expect SASL.
          SaslAuthenticationError: the credentials were refused, or the exchange failed.
          BrokerConnectionError: the connection failed meanwhile (retriable).
        """
        handshake_version = versions.get(ApiKey.SASL_HANDSHAKE)
        authenticate_version = versions.get(ApiKey.SASL_AUTHENTICATE)
        if handshake_version is None or handshake_version < 1 or authenticate_version is None:
            raise SaslMechanismError(
                f"{where} does not support SaslHandshake v1 and SaslAuthenticate (Kafka 1.0+): "
                "this client cannot authenticate to it, or the listener does not expect SASL"
            )
        response = await conn.request(SaslHandshakeRequest(mechanism=self.mechanism),
                                      version=handshake_version)
        code = error_code(response.error_code)
        if code == ErrorCode.UNSUPPORTED_SASL_MECHANISM:
            offered = tuple(response.mechanisms)
            raise SaslMechanismError(
                f"{where} does not enable SASL mechanism {self.mechanism}; it offers "
                f"{', '.join(offered) if offered else 'none'} (set sasl_mechanism to one of them)",
                offered,
            )
        if code == ErrorCode.ILLEGAL_SASL_STATE:
            raise SaslMechanismError(
                f"{where} refused SaslHandshake (ILLEGAL_SASL_STATE): this listener does not "
                "expect SASL; check security_protocol (PLAINTEXT or SSL for a listener "
                "without SASL)"
            )
        if code != ErrorCode.NONE:
            raise SaslAuthenticationError(f"{where} refused SaslHandshake: {code.name}")
        client = await self._client()
        try:
            message: bytes | None = client.start()
            lifetime_ms = 0
            rounds = 0
            while message is not None:
                rounds += 1
                if rounds > _MAX_ROUNDS:
                    raise SaslError(f"no end after {_MAX_ROUNDS} rounds")
                answer = await conn.request(SaslAuthenticateRequest(auth_bytes=message),
                                            version=authenticate_version)
                code = error_code(answer.error_code)
                if code != ErrorCode.NONE:
                    raise SaslAuthenticationError(self._refusal(where, code, answer.error_message,
                                                                client))
                lifetime_ms = answer.session_lifetime_ms
                message = client.step(answer.auth_bytes)
        except SaslError as exc:
            raise SaslAuthenticationError(
                f"SASL {self.mechanism} authentication of {self.who} at {where} failed: {exc}"
            ) from None
        logger.debug("%s: authenticated %s with %s; session lifetime %d ms",
                     where, self.who, self.mechanism, lifetime_ms)
        return max(0, lifetime_ms) / 1000.0

    def _refusal(self, where: str, code: ErrorCode, message: str | None,
                 client: SaslClient) -> str:
        detail = message or code.description
        server_error = getattr(client, "server_error", None)
        if server_error:
            detail = f"{detail} (token status: {server_error})"
        return (
            f"authentication failed: {where} refused {self.who} with SASL {self.mechanism} "
            f"({code.name}: {detail})"
        )
