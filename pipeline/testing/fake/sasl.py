"""SASL on the fake cluster's brokers, by Kafka's rules (``SaslServerAuthenticator``).

``FakeCluster(sasl=FakeSasl(users={"alice": "secret"}, session_lifetime=5.0))``
turns every broker's listener into a SASL_PLAINTEXT one:

* before authentication only ApiVersions, SaslHandshake and SaslAuthenticate are
  served; any other request closes the connection (Kafka: "Unexpected Kafka
  request ... during SASL handshake");
* SaslHandshake v1 for a mechanism that is not enabled is answered
  UNSUPPORTED_SASL_MECHANISM with the enabled list, then the connection closes;
* SaslAuthenticate runs PLAIN, SCRAM-SHA-256/512 (4096 iterations, a seeded salt
  and server nonce) or OAUTHBEARER (tokens issued by :meth:`FakeSasl.issue_token`;
  an unknown or expired one gets the RFC 7628 JSON error challenge). A refusal
  is SASL_AUTHENTICATION_FAILED with Kafka's own texts (a wrong password and an
  unknown user read the same), then the connection closes;
* with ``session_lifetime`` > 0 (``connections.max.reauth.ms``) the last
  SaslAuthenticate answer carries ``session_lifetime_ms`` (for OAUTHBEARER at most
  the token's remaining life); once it has passed, any request but SaslHandshake
  closes the connection; SaslHandshake on an authenticated connection starts a
  re-authentication (KIP-368) with the same mechanism and principal.

``authentications`` records each success (time, node, principal, mechanism, whether
it was a re-authentication).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
from dataclasses import dataclass, field
from typing import Any

from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.sasl_authenticate import SaslAuthenticateResponse
from pipeline.protocol.messages.sasl_handshake import SaslHandshakeResponse
from pipeline.protocol.sasl import MECHANISMS, SCRAM_HASHES, scram_keys

__all__ = ["Authentication", "ConnAuth", "FakeSasl", "SaslVerdict"]

_PRE_AUTH = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
_BAD_CREDENTIALS = (
    "Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism {mechanism}"
)


@dataclass(frozen=True, slots=True)
class Authentication:
    time: float
    node_id: int
    principal: str
    mechanism: str
    reauthentication: bool


@dataclass(slots=True)
class ConnAuth:
    """One connection's authentication state."""

    mechanism: str | None = None  # chosen by SaslHandshake
    principal: str | None = None  # set once authenticated
    session_ends: float = float("inf")  # fake (trio) time; inf: no expiry
    exchange: Any = None  # the server side of the exchange in progress
    reauthenticating: bool = False


@dataclass(frozen=True, slots=True)
class SaslVerdict:
    """What the server does with a request: answer it (``response``), let the normal
    handlers serve it (``serve``), and/or close the connection after (``close``)."""

    response: Any = None
    serve: bool = False
    close: bool = False


@dataclass
class FakeSasl:
    """SASL settings of a fake cluster (see the module doc)."""

    mechanisms: tuple[str, ...] = MECHANISMS
    users: dict[str, str] = field(default_factory=dict)  # PLAIN and SCRAM credentials
    session_lifetime: float = 0.0  # seconds; 0: sessions never expire
    seed: int = 0
    #: OAUTHBEARER: token -> (principal, expiry in fake time)
    tokens: dict[str, tuple[str, float]] = field(default_factory=dict)
    authentications: list[Authentication] = field(default_factory=list)
    #: requests that arrived on an expired session (Kafka closes the connection)
    expired_requests: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def issue_token(self, principal: str, *, expires_at: float) -> str:
        """A token the brokers accept for ``principal`` until fake time ``expires_at``."""
        token = f"fake-token-{principal}-{self._rng.getrandbits(64):016x}"
        self.tokens[token] = (principal, expires_at)
        return token

    # ----------------------------------------------------------------- serving

    def handle(self, auth: ConnAuth, node_id: int, api_key: int, version: int, request: Any,
               now: float) -> SaslVerdict:
        """Kafka's authentication rules for one request on a connection."""
        if api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(auth, request, now)
        if api_key == ApiKey.SASL_AUTHENTICATE:
            return self._authenticate(auth, node_id, version, request, now)
        if auth.principal is None or auth.reauthenticating:
            return SaslVerdict(serve=api_key in _PRE_AUTH, close=api_key not in _PRE_AUTH)
        if now >= auth.session_ends:
            self.expired_requests += 1
            return SaslVerdict(close=True)
        return SaslVerdict(serve=True)

    def _handshake(self, auth: ConnAuth, request: Any, now: float) -> SaslVerdict:
        mechanism = request.mechanism
        if auth.principal is not None:  # KIP-368 re-authentication
            if mechanism != auth.mechanism:
                return SaslVerdict(close=True)
            auth.reauthenticating = True
        elif auth.mechanism is not None:
            return SaslVerdict(close=True)  # a second handshake before authenticating
        if mechanism not in self.mechanisms:
            return SaslVerdict(
                response=SaslHandshakeResponse(
                    error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=self.mechanisms
                ),
                close=True,
            )
        auth.mechanism = mechanism
        auth.exchange = None
        return SaslVerdict(response=SaslHandshakeResponse(mechanisms=self.mechanisms))

    def _authenticate(self, auth: ConnAuth, node_id: int, version: int, request: Any,
                      now: float) -> SaslVerdict:
        mechanism = auth.mechanism
        if mechanism is None or (auth.principal is not None and not auth.reauthenticating):
            return SaslVerdict(close=True)  # ILLEGAL_SASL_STATE: Kafka closes
        try:
            challenge, principal, expiry = self._step(auth, mechanism, request.auth_bytes, now)
        except _Refused as refused:
            return SaslVerdict(
                response=SaslAuthenticateResponse(
                    error_code=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message=str(refused)
                ),
                close=True,
            )
        lifetime_ms = 0
        if principal is not None:
            if auth.reauthenticating and principal != auth.principal:
                return SaslVerdict(close=True)  # Kafka refuses a changed principal
            lifetime = self.session_lifetime
            if lifetime > 0 and expiry is not None:
                lifetime = min(lifetime, expiry - now)
            auth.session_ends = now + lifetime if lifetime > 0 else float("inf")
            lifetime_ms = int(lifetime * 1000) if lifetime > 0 else 0
            self.authentications.append(
                Authentication(now, node_id, principal, mechanism, auth.reauthenticating)
            )
            auth.principal = principal
            auth.reauthenticating = False
            auth.exchange = None
        return SaslVerdict(
            response=SaslAuthenticateResponse(
                auth_bytes=challenge,
                session_lifetime_ms=lifetime_ms if version >= 1 else 0,
            )
        )

    def _step(self, auth: ConnAuth, mechanism: str, data: bytes, now: float
              ) -> tuple[bytes, str | None, float | None]:
        """(challenge, principal when done, token expiry)."""
        if mechanism == "PLAIN":
            parts = data.split(b"\x00")
            if len(parts) != 3:
                raise _Refused("Authentication failed: Invalid username or password")
            user, password = parts[1].decode(), parts[2].decode()
            if self.users.get(user) != password:
                raise _Refused("Authentication failed: Invalid username or password")
            return b"", user, None
        if mechanism in SCRAM_HASHES:
            if auth.exchange is None:
                auth.exchange = _ScramServer(mechanism, self, self._rng)
            exchange: _ScramServer = auth.exchange
            return exchange.step(data)
        if mechanism == "OAUTHBEARER":
            if data == b"\x01":
                raise _Refused(json.dumps({"status": "invalid_token"}))
            token = _bearer_token(data)
            known = self.tokens.get(token) if token is not None else None
            if known is None or known[1] <= now:
                return json.dumps({"status": "invalid_token"}).encode(), None, None
            return b"", known[0], known[1]
        raise _Refused(f"mechanism {mechanism} not served")


class _Refused(Exception):
    pass


def _bearer_token(data: bytes) -> str | None:
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not text.startswith("n,") or not text.endswith("\x01\x01"):
        return None
    for item in text.split("\x01"):
        if item.startswith("auth=Bearer "):
            return item[len("auth=Bearer "):]
    return None


class _ScramServer:
    """RFC 5802, server side, for one exchange."""

    def __init__(self, mechanism: str, sasl: FakeSasl, rng: random.Random) -> None:
        self.mechanism = mechanism
        self.hash = SCRAM_HASHES[mechanism]
        self.sasl = sasl
        self.rng = rng
        self.state = "first"
        self.user = ""
        self.first_bare = b""
        self.server_first = b""
        self.nonce = ""
        self.salt = b""

    def _refuse(self) -> _Refused:
        return _Refused(_BAD_CREDENTIALS.format(mechanism=self.mechanism))

    def step(self, data: bytes) -> tuple[bytes, str | None, float | None]:
        if self.state == "first":
            if not data.startswith(b"n,,"):
                raise self._refuse()
            self.first_bare = data[3:]
            attrs = dict(p.split("=", 1) for p in self.first_bare.decode().split(",") if "=" in p)
            self.user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
            if self.user not in self.sasl.users:
                raise self._refuse()
            self.nonce = attrs.get("r", "") + f"{self.rng.getrandbits(96):024x}"
            salt = self.rng.getrandbits(128).to_bytes(16, "big")
            self.salt = salt
            self.server_first = (
                f"r={self.nonce},s={base64.b64encode(salt).decode()},i=4096".encode()
            )
            self.state = "final"
            return self.server_first, None, None
        if self.state != "final":
            raise self._refuse()
        without_proof, _, proof_b64 = data.rpartition(b",p=")
        if without_proof != b"c=biws,r=" + self.nonce.encode():
            raise self._refuse()
        password = self.sasl.users.get(self.user)
        if password is None:
            raise self._refuse()
        _, stored_key, server_key = scram_keys(
            self.hash, password.encode(), self.salt, 4096)
        auth_message = self.first_bare + b"," + self.server_first + b"," + without_proof
        signature = hmac.new(stored_key, auth_message, self.hash).digest()
        proof = base64.b64decode(proof_b64)
        if len(proof) != len(signature):
            raise self._refuse()
        claimed_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self.hash, claimed_key).digest(), stored_key):
            raise self._refuse()
        self.state = "done"
        server_signature = hmac.new(server_key, auth_message, self.hash).digest()
        return b"v=" + base64.b64encode(server_signature), self.user, None
