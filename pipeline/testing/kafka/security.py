"""Secured CLIENT listeners for :class:`~pipeline.testing.kafka.KafkaCluster`: TLS, SASL, mTLS.

Only the CLIENT listener is secured; INTERNAL (replication, the cluster's own admin calls)
and CONTROLLER stay PLAINTEXT, so what a test does to the client side never touches
replication or the launcher's own waits.

* **TLS** (``SSL``, ``SASL_SSL``): a CA made with trustme signs one certificate for
  ``127.0.0.1`` (an IP SAN, nothing else: connecting as ``localhost`` is a hostname
  mismatch), given to the brokers as a PEM keystore (PKCS#8 key + chain). The CA is
  :attr:`KafkaCluster.ssl_cafile`. With ``ssl_client_auth="required"`` (mTLS) the brokers
  trust that CA for client certificates too, and :attr:`KafkaCluster.ssl_client_certfile` /
  ``ssl_client_keyfile`` is one it signed.
* **SASL** (``SASL_PLAINTEXT``, ``SASL_SSL``): the mechanisms in ``sasl_mechanisms``
  (default all of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER). ``scram_users`` are
  PLAIN users (``user_<name>`` in the PLAIN JAAS line) and SCRAM credentials for both
  hashes (``StorageTool format --add-scram``, so they exist before the first start).
  OAUTHBEARER uses Kafka's unsecured JWS validator (tests only): any ``alg: none`` token
  with ``sub`` and ``exp`` claims is accepted until ``exp``; :func:`unsecured_token` makes
  one, :func:`unsecured_token_provider` a provider for ``sasl_oauth_token_provider``.
* Re-authentication (KIP-368) is the broker's ``connections.max.reauth.ms``; per
  mechanism: ``broker_config={"listener.name.client.scram-sha-512.connections.max.reauth.ms":
  "3000"}``.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.testing.kafka.dist import KafkaClusterError

__all__ = [
    "SASL_MECHANISMS",
    "ClusterSecurity",
    "Pki",
    "SecuredClient",
    "unsecured_token",
    "unsecured_token_provider",
]

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_CLIENT_AUTH = ("none", "requested", "required")
# StorageTool's --add-scram and the JAAS line take these without quoting trouble.
_SAFE = re.compile(r"^[A-Za-z0-9._@+-]+$")
_LISTENER = "listener.name.client."


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsecured_token(principal: str, lifetime: float = 3600.0, *,
                    now: float | None = None) -> tuple[str, float]:
    """An unsecured JWS (``alg: none``) for Kafka's test validator, and its expiry in
    epoch seconds: ``(token, expires_at)``, what a token provider returns.

    ``iat`` is whole seconds, rounded down: Kafka refuses a token whose ``iat * 1000`` is
    after its own clock in whole milliseconds (``validateIssuedAt``, no clock skew
    allowed by default), so a fractional ``iat`` of this very instant was refused
    whenever the broker checked it within the same millisecond (CI, stop 23)."""
    now = time.time() if now is None else now
    issued = math.floor(now)
    expires = now + lifetime
    header = _b64(json.dumps({"alg": "none"}).encode())
    claims = _b64(json.dumps({"sub": principal, "iat": issued, "exp": expires}).encode())
    return f"{header}.{claims}.", expires


def unsecured_token_provider(principal: str, lifetime: float = 3600.0
                             ) -> Callable[[], tuple[str, float]]:
    """A ``sasl_oauth_token_provider`` handing out fresh unsecured tokens; ``.calls``
    counts them."""
    def provide() -> tuple[str, float]:
        provide.calls += 1  # type: ignore[attr-defined]
        return unsecured_token(principal, lifetime)

    provide.calls = 0  # type: ignore[attr-defined]
    return provide


@dataclass(frozen=True)
class Pki:
    """The cluster's certificates, as PEM files in one directory."""

    ca_file: Path  # the CA: signs the brokers' and the client's certificates
    broker_keystore: Path  # PKCS#8 key + certificate chain for 127.0.0.1
    client_cert: Path
    client_key: Path

    @classmethod
    def load_or_create(cls, directory: Path) -> Pki:
        """The certificates in ``directory`` (a kept work dir), else new ones there."""
        pki = cls(directory / "ca.pem", directory / "broker-keystore.pem",
                  directory / "client.pem", directory / "client.key")
        return pki if pki.ca_file.exists() else cls.create(directory)

    @classmethod
    def create(cls, directory: Path) -> Pki:
        import trustme
        from cryptography.hazmat.primitives import serialization

        directory.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        broker = ca.issue_cert("127.0.0.1")
        client = ca.issue_cert("pipeline-test-client")

        def pkcs8(pem: bytes) -> bytes:
            key = serialization.load_pem_private_key(pem, password=None)
            return key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())

        pki = cls(directory / "ca.pem", directory / "broker-keystore.pem",
                  directory / "client.pem", directory / "client.key")
        ca.cert_pem.write_to_path(str(pki.ca_file))
        pki.broker_keystore.write_bytes(
            pkcs8(broker.private_key_pem.bytes())
            + b"".join(blob.bytes() for blob in broker.cert_chain_pems))
        pki.client_cert.write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
        pki.client_key.write_bytes(pkcs8(client.private_key_pem.bytes()))
        for path in (pki.broker_keystore, pki.client_key):
            path.chmod(0o600)
        return pki


@dataclass(frozen=True)
class ClusterSecurity:
    """What the CLIENT listener requires (see the module doc)."""

    protocol: str = "PLAINTEXT"
    mechanisms: tuple[str, ...] = ()
    users: Mapping[str, str] = field(default_factory=dict, repr=False)
    client_auth: str = "none"

    @classmethod
    def build(cls, protocol: str, scram_users: Mapping[str, str] | None,
              sasl_mechanisms: tuple[str, ...] | list[str] | None,
              ssl_client_auth: str) -> ClusterSecurity:
        protocol = protocol.upper() if isinstance(protocol, str) else protocol
        if protocol not in _PROTOCOLS:
            raise ValueError(f"security_protocol must be one of {_PROTOCOLS}, not {protocol!r}")
        sasl = protocol.startswith("SASL_")
        users = dict(scram_users or {})
        for name, password in users.items():
            if not _SAFE.match(name) or not _SAFE.match(password):
                raise ValueError(
                    "scram_users names and passwords may only use letters, digits and ._@+- "
                    f"(they go into broker config lines); {name!r} does not fit"
                )
        mechanisms = tuple(sasl_mechanisms) if sasl_mechanisms is not None else (
            SASL_MECHANISMS if sasl else ())
        unknown = sorted(set(mechanisms) - set(SASL_MECHANISMS))
        if unknown:
            raise ValueError(f"sasl_mechanisms: unknown {unknown}; known {SASL_MECHANISMS}")
        if not sasl and (users or sasl_mechanisms):
            raise ValueError(f"scram_users / sasl_mechanisms need a SASL security_protocol, "
                             f"not {protocol}")
        if sasl and not mechanisms:
            raise ValueError("a SASL listener needs at least one of sasl_mechanisms")
        if ssl_client_auth not in _CLIENT_AUTH:
            raise ValueError(f"ssl_client_auth must be one of {_CLIENT_AUTH}")
        if ssl_client_auth != "none" and protocol not in ("SSL", "SASL_SSL"):
            raise ValueError("ssl_client_auth needs security_protocol SSL or SASL_SSL")
        return cls(protocol, mechanisms, users, ssl_client_auth)

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def format_args(self) -> list[str]:
        """``StorageTool format`` arguments creating the SCRAM credentials."""
        args: list[str] = []
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            if mechanism in self.mechanisms:
                for name, password in self.users.items():
                    args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        return args

    def broker_config(self, pki: Pki | None) -> dict[str, str]:
        """The CLIENT listener's settings (every node the same)."""
        config: dict[str, str] = {}
        if self.tls:
            assert pki is not None
            config.update({
                _LISTENER + "ssl.keystore.type": "PEM",
                _LISTENER + "ssl.keystore.location": str(pki.broker_keystore),
                _LISTENER + "ssl.client.auth": self.client_auth,
            })
            if self.client_auth != "none":
                config.update({
                    _LISTENER + "ssl.truststore.type": "PEM",
                    _LISTENER + "ssl.truststore.location": str(pki.ca_file),
                })
        if self.sasl:
            config[_LISTENER + "sasl.enabled.mechanisms"] = ",".join(self.mechanisms)
            modules = {
                "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule required"
                + "".join(f' user_{n}="{p}"' for n, p in self.users.items()) + ";",
                "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule "
                                 "required;",
                "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule "
                                 "required;",
                "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer."
                               'OAuthBearerLoginModule required unsecuredLoginStringClaim_sub='
                               '"pipeline-broker";',
            }
            for mechanism in self.mechanisms:
                config[f"{_LISTENER}{mechanism.lower()}.sasl.jaas.config"] = modules[mechanism]
        return config

    def client_options(self, pki: Pki | None, *, mechanism: str | None, user: str | None,
                       password: str | None, client_certificate: bool) -> dict[str, Any]:
        """This project's options (ClusterConfig fields) for reaching the CLIENT listener."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            assert pki is not None
            options["ssl_cafile"] = str(pki.ca_file)
            if client_certificate:
                options["ssl_certfile"] = str(pki.client_cert)
                options["ssl_keyfile"] = str(pki.client_key)
        if self.sasl:
            mechanism = mechanism or self.mechanisms[0]
            options["sasl_mechanism"] = mechanism
            if mechanism == "OAUTHBEARER":
                options["sasl_oauth_token_provider"] = unsecured_token_provider(user or "alice")
            else:
                name = user or next(iter(self.users), None)
                if name is None:
                    raise ValueError("no scram_users to authenticate as")
                options["sasl_username"] = name
                options["sasl_password"] = password if password is not None else self.users[name]
        return options

    def librdkafka_config(self, pki: Pki | None, *, mechanism: str | None, user: str | None,
                          password: str | None, client_certificate: bool) -> dict[str, Any]:
        """The same for confluent-kafka (librdkafka property names)."""
        ours = self.client_options(pki, mechanism=mechanism, user=user, password=password,
                                   client_certificate=client_certificate)
        config: dict[str, Any] = {"security.protocol": self.protocol}
        if self.tls:
            config["ssl.ca.location"] = ours["ssl_cafile"]
            if client_certificate:
                config["ssl.certificate.location"] = ours["ssl_certfile"]
                config["ssl.key.location"] = ours["ssl_keyfile"]
        if self.sasl:
            config["sasl.mechanism"] = ours["sasl_mechanism"]
            if ours["sasl_mechanism"] == "OAUTHBEARER":
                config["enable.sasl.oauthbearer.unsecure.jwt"] = True
                config["sasl.oauthbearer.config"] = f"principal={user or 'alice'}"
            else:
                config["sasl.username"] = ours["sasl_username"]
                config["sasl.password"] = ours["sasl_password"]
        return config


class SecuredClient:
    """:class:`~pipeline.testing.kafka.KafkaCluster`'s client-side view of its CLIENT
    listener: the CA, the client certificate, and ready-made client options."""

    security: ClusterSecurity
    pki: Pki | None

    def _init_security(self, protocol: str, scram_users: Mapping[str, str] | None,
                       sasl_mechanisms: Sequence[str] | None, client_auth: str) -> None:
        self.security = ClusterSecurity.build(
            protocol, scram_users,
            tuple(sasl_mechanisms) if sasl_mechanisms is not None else None, client_auth)
        self.pki = None  # made at start when the CLIENT listener uses TLS

    def _ensure_pki(self, directory: Path) -> None:
        """The certificates in this launch's work dir. A launch retried after a port
        conflict has a new work dir (the old one was removed with its certificates):
        the PKI follows it, never pointing into a removed directory."""
        if self.security.tls and (self.pki is None or self.pki.ca_file.parent != directory
                                  or not self.pki.ca_file.exists()):
            self.pki = Pki.load_or_create(directory)

    @property
    def security_protocol(self) -> str:
        """The CLIENT listener's protocol."""
        return self.security.protocol

    @property
    def ssl_cafile(self) -> str:
        """The CA that signed the brokers' certificates (a TLS CLIENT listener)."""
        return str(self._pki().ca_file)

    @property
    def ssl_client_certfile(self) -> str:
        """A client certificate the brokers trust (mTLS), signed by :attr:`ssl_cafile`."""
        return str(self._pki().client_cert)

    @property
    def ssl_client_keyfile(self) -> str:
        return str(self._pki().client_key)

    def _pki(self) -> Pki:
        if not self.security.tls:
            raise KafkaClusterError(f"the CLIENT listener is {self.security.protocol}: no TLS")
        if self.pki is None:
            raise KafkaClusterError("the cluster is not started")
        return self.pki

    def client_options(self, mechanism: str | None = None, *, user: str | None = None,
                       password: str | None = None, client_certificate: bool | None = None
                       ) -> dict[str, Any]:
        """Options (ClusterConfig fields) for this project's clients to reach
        :attr:`bootstrap`: the protocol, the CA, SASL credentials (``mechanism``, default
        the first enabled; ``user`` default the first of ``scram_users``; OAUTHBEARER: an
        unsecured token provider for ``user``), and the client certificate when the
        brokers ask for one (``client_certificate`` overrides)."""
        if client_certificate is None:
            client_certificate = self.security.client_auth != "none"
        return self.security.client_options(
            self.pki, mechanism=mechanism, user=user, password=password,
            client_certificate=client_certificate)

    def librdkafka_config(self, mechanism: str | None = None, *, user: str | None = None,
                          password: str | None = None, client_certificate: bool | None = None
                          ) -> dict[str, Any]:
        """The same as :meth:`client_options`, for confluent-kafka (without
        ``bootstrap.servers``)."""
        if client_certificate is None:
            client_certificate = self.security.client_auth != "none"
        return self.security.librdkafka_config(
            self.pki, mechanism=mechanism, user=user, password=password,
            client_certificate=client_certificate)

