"""SASL mechanisms as sans-I/O state machines: PLAIN, SCRAM-SHA-256/512, OAUTHBEARER.

Each client is driven the same way by the connection layer, which carries the
bytes in SaslAuthenticate requests (KIP-152)::

    client = ScramClient("SCRAM-SHA-256", "alice", password, nonce=nonce)
    message = client.start()
    while message is not None:
        challenge = <send message, receive the broker's auth_bytes>
        message = client.step(challenge)
    # client.complete is True: the broker proved it knows the credentials too

Nothing here does I/O, reads a clock or draws randomness: the SCRAM client
nonce is passed in (the connection layer draws it from ``secrets``), so the
RFC 5802 / RFC 7677 example exchanges replay exactly in tests.

Secrets: the password and token are kept only as long as the exchange needs
them, never appear in a ``repr`` or an exception text. Errors name what went
wrong in the exchange, never the bytes exchanged.

SCRAM (RFC 5802, RFC 7677): ``n,,`` GS2 header (no channel binding, no
authzid), the user name escaped as a saslname (``=`` -> ``=2C``... per RFC
5802 5.1), the password used as its UTF-8 bytes (what Kafka's own
``ScramFormatter`` does: no SASLprep), at least 4096 iterations accepted
(Kafka's minimum; fewer would let a rogue server weaken the proof), and the
server's signature verified before the exchange counts as complete.

OAUTHBEARER (RFC 7628 section 3.1, KIP-255): the client's first and only
message is ``n,,\\x01auth=Bearer <token>\\x01\\x01``. A broker that rejects the
token answers a JSON error challenge instead of an empty one; the client then
sends a lone ``\\x01`` (RFC 7628 3.2.3) and the broker fails the exchange with
its error message. :attr:`OAuthBearerClient.server_error` keeps the JSON
``status`` for the error report.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Protocol

from pipeline.protocol.errors import ProtocolError

__all__ = [
    "MECHANISMS",
    "SCRAM_HASHES",
    "SCRAM_MIN_ITERATIONS",
    "OAuthBearerClient",
    "PlainClient",
    "SaslClient",
    "SaslError",
    "ScramClient",
    "scram_keys",
    "scram_saslname",
]

#: Mechanisms this client implements, in the spelling Kafka uses.
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

#: SCRAM mechanism -> hashlib name. SCRAM-SHA-1 is here only so RFC 5802's own
#: example exchange can be replayed; Kafka does not offer it.
SCRAM_HASHES = {"SCRAM-SHA-1": "sha1", "SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}

#: Kafka's ScramMechanism.minIterations: fewer from a server is refused.
SCRAM_MIN_ITERATIONS = 4096

_GS2_HEADER = b"n,,"


class SaslError(ProtocolError):
    """The SASL exchange cannot go on (a malformed or dishonest server message, or
    the server's own error). The message never contains credentials."""


class SaslClient(Protocol):
    """One authentication exchange, client side."""

    mechanism: str

    def start(self) -> bytes:
        """The client's first message."""
        ...

    def step(self, challenge: bytes) -> bytes | None:
        """The next message for the server's ``challenge``, or None when the exchange
        is complete on the client's side."""
        ...

    @property
    def complete(self) -> bool: ...


# ----------------------------------------------------------------------------- PLAIN


class PlainClient:
    """PLAIN (RFC 4616): one message ``authzid NUL authcid NUL passwd``; empty authzid."""

    mechanism = "PLAIN"

    def __init__(self, username: str, password: str) -> None:
        if "\x00" in username or "\x00" in password:
            raise SaslError("PLAIN user names and passwords cannot contain NUL characters")
        self._message: bytes | None = b"\x00" + username.encode() + b"\x00" + password.encode()
        self._state = "start"

    def start(self) -> bytes:
        if self._state != "start" or self._message is None:
            raise SaslError("PLAIN exchange already started")
        self._state = "sent"
        message, self._message = self._message, None  # the password is not kept
        return message

    def step(self, challenge: bytes) -> bytes | None:
        if self._state != "sent":
            raise SaslError(f"unexpected PLAIN challenge in state {self._state}")
        if challenge:
            raise SaslError(f"the server answered PLAIN with {len(challenge)} unexpected bytes")
        self._state = "done"
        return None

    @property
    def complete(self) -> bool:
        return self._state == "done"

    def __repr__(self) -> str:
        return f"<PlainClient {self._state}>"


# ----------------------------------------------------------------------------- SCRAM


def scram_saslname(name: str) -> str:
    """A user name as a SCRAM saslname: ``=`` -> ``=3D``, ``,`` -> ``=2C`` (RFC 5802 5.1)."""
    return name.replace("=", "=3D").replace(",", "=2C")


def scram_keys(hash_name: str, password: bytes, salt: bytes, iterations: int
               ) -> tuple[bytes, bytes, bytes]:
    """(client key, stored key, server key) for a password (RFC 5802 section 3).

    ``SaltedPassword = Hi(password, salt, i)`` is PBKDF2-HMAC with one block, which
    ``hashlib.pbkdf2_hmac`` computes in C.
    """
    salted = hashlib.pbkdf2_hmac(hash_name, password, salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hash_name).digest()
    stored_key = hashlib.new(hash_name, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hash_name).digest()
    return client_key, stored_key, server_key


def _attributes(message: bytes, what: str) -> dict[str, str]:
    """``a=1,b=2`` -> {"a": "1", "b": "2"} (values may contain ``=``)."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslError(f"the SCRAM {what} is not UTF-8") from None
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise SaslError(f"malformed SCRAM {what} (attribute {key[:1]!r})")
        out.setdefault(key, value)
    return out


class ScramClient:
    """SCRAM client (RFC 5802): client-first, client-final, then the server signature.

    Args:
      mechanism: ``"SCRAM-SHA-256"`` or ``"SCRAM-SHA-512"`` (``"SCRAM-SHA-1"`` for the
          RFC's own example only).
      username, password: the credentials.
      nonce: the client nonce: printable ASCII without ``,`` (the caller draws it
          from a cryptographic source; 24+ characters).
    """

    def __init__(self, mechanism: str, username: str, password: str, *, nonce: str) -> None:
        try:
            self._hash = SCRAM_HASHES[mechanism]
        except KeyError:
            raise SaslError(f"not a SCRAM mechanism: {mechanism!r}") from None
        if not nonce or "," in nonce or not nonce.isascii() or not nonce.isprintable():
            raise SaslError("a SCRAM nonce must be printable ASCII without ','")
        self.mechanism = mechanism
        self._nonce = nonce
        self._password: bytes | None = password.encode("utf-8")
        self._first_bare = f"n={scram_saslname(username)},r={nonce}".encode()
        self._server_signature: bytes | None = None
        self._state = "start"

    def start(self) -> bytes:
        if self._state != "start":
            raise SaslError("SCRAM exchange already started")
        self._state = "first-sent"
        return _GS2_HEADER + self._first_bare

    def step(self, challenge: bytes) -> bytes | None:
        if self._state == "first-sent":
            self._state = "final-sent"
            return self._client_final(challenge)
        if self._state == "final-sent":
            self._verify(challenge)
            self._state = "done"
            return None
        raise SaslError(f"unexpected SCRAM challenge in state {self._state}")

    @property
    def complete(self) -> bool:
        return self._state == "done"

    def _client_final(self, server_first: bytes) -> bytes:
        attrs = _attributes(server_first, "server-first message")
        if "e" in attrs:
            raise SaslError(f"the server refused the SCRAM exchange: {attrs['e']}")
        if "m" in attrs:
            raise SaslError("the server requires a SCRAM extension this client does not know")
        nonce, salt_b64, iterations_text = attrs.get("r"), attrs.get("s"), attrs.get("i")
        if nonce is None or salt_b64 is None or iterations_text is None:
            raise SaslError("the SCRAM server-first message lacks its nonce, salt or iterations")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslError("the server's SCRAM nonce does not extend the client's")
        try:
            salt = base64.b64decode(salt_b64, validate=True)
            iterations = int(iterations_text)
        except ValueError:
            raise SaslError("the SCRAM server-first message has a bad salt or count") from None
        if iterations < SCRAM_MIN_ITERATIONS:
            raise SaslError(
                f"the server asked for {iterations} SCRAM iterations; at least "
                f"{SCRAM_MIN_ITERATIONS} are required"
            )
        password, self._password = self._password, None  # not kept past this point
        assert password is not None
        client_key, stored_key, server_key = scram_keys(self._hash, password, salt, iterations)
        without_proof = b"c=" + base64.b64encode(_GS2_HEADER) + b",r=" + nonce.encode()
        auth_message = self._first_bare + b"," + server_first + b"," + without_proof
        signature = hmac.new(stored_key, auth_message, self._hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = hmac.new(server_key, auth_message, self._hash).digest()
        return without_proof + b",p=" + base64.b64encode(proof)

    def _verify(self, server_final: bytes) -> None:
        attrs = _attributes(server_final, "server-final message")
        if "e" in attrs:
            raise SaslError(f"the server refused the SCRAM proof: {attrs['e']}")
        try:
            signature = base64.b64decode(attrs.get("v", ""), validate=True)
        except ValueError:
            signature = b""
        assert self._server_signature is not None
        if not signature or not hmac.compare_digest(signature, self._server_signature):
            raise SaslError(
                "the server's SCRAM signature is wrong: it does not know this user's "
                "credentials (a misconfigured or impersonating broker)"
            )

    def __repr__(self) -> str:
        return f"<ScramClient {self.mechanism} {self._state}>"


# ----------------------------------------------------------------------------- OAUTHBEARER


class OAuthBearerClient:
    """OAUTHBEARER (RFC 7628, KIP-255): the token in one message; an error challenge
    is acknowledged with ``\\x01`` so the broker can fail the exchange."""

    mechanism = "OAUTHBEARER"

    def __init__(self, token: str) -> None:
        if not token or any(c in token for c in "\x01 ") or not token.isascii():
            raise SaslError("an OAUTHBEARER token must be non-empty ASCII without spaces")
        self._message: bytes | None = _GS2_HEADER + b"\x01auth=Bearer " + token.encode() + b"\x01\x01"
        self._state = "start"
        #: the broker's JSON error ``status`` (e.g. "invalid_token"), when it sent one
        self.server_error: str | None = None

    def start(self) -> bytes:
        if self._state != "start" or self._message is None:
            raise SaslError("OAUTHBEARER exchange already started")
        self._state = "sent"
        message, self._message = self._message, None
        return message

    def step(self, challenge: bytes) -> bytes | None:
        if self._state != "sent":
            raise SaslError(f"unexpected OAUTHBEARER challenge in state {self._state}")
        if not challenge:
            self._state = "done"
            return None
        # An error challenge (RFC 7628 3.2.2): acknowledge it; the broker then fails.
        self._state = "error-acknowledged"
        try:
            status = json.loads(challenge.decode("utf-8")).get("status")
        except (ValueError, AttributeError):
            status = None
        self.server_error = str(status) if status else "the broker rejected the token"
        return b"\x01"

    @property
    def complete(self) -> bool:
        return self._state == "done"

    def __repr__(self) -> str:
        return f"<OAuthBearerClient {self._state}>"
