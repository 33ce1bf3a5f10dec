"""The security options of :class:`~pipeline.cluster.config.ClusterConfig`: their checks,
the TLS context they build, and what a failed TLS handshake means.

Names and meanings follow the Java client and librdkafka:

==========================  ===========================================================
``security_protocol``       ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``
``ssl_cafile``              PEM file of the CA(s) that signed the brokers' certificates
                            (default: the system's trusted CAs)
``ssl_certfile``            PEM client certificate (chain), for mTLS; may hold the key too
``ssl_keyfile``             PEM private key of the client certificate
``ssl_password``            password of an encrypted ``ssl_keyfile`` (secret)
``ssl_check_hostname``      the certificate must name the host connected to (default True)
``ssl_context``             a ready :class:`ssl.SSLContext` instead of the four above
``sasl_mechanism``          ``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``, ``OAUTHBEARER``
``sasl_username``           user (PLAIN, SCRAM)
``sasl_password``           password (PLAIN, SCRAM; secret)
``sasl_oauth_token_provider``  OAUTHBEARER: ``() -> (token, expires_at)``, sync or async;
                            ``expires_at`` in epoch seconds (``time.time()``)
==========================  ===========================================================

Every check runs once, when the config is built (files must exist and load), and a
:class:`~pipeline.cluster.errors.ConfigError` names the option and what to do. A
secret's value never appears in an error text or a ``repr``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, Union

from pipeline.cluster.errors import (
    AuthenticationError,
    BrokerConnectionError,
    ConfigError,
    KafkaError,
    TlsCertificateError,
    TlsClientCertificateError,
    TlsError,
    TlsHostnameError,
)
from pipeline.cluster.transport import PLAINTEXT_HINT, connect_failure_reason
from pipeline.protocol.sasl import MECHANISMS

__all__ = [
    "SECRET_OPTIONS",
    "SECURITY_PROTOCOLS",
    "SecurityOptions",
    "TokenProvider",
    "build_ssl_context",
    "describe_broker",
    "early_close_hint",
    "redact_options",
    "stream_error",
    "tls_answer_error",
    "tls_error",
    "tls_failure_hint",
    "tls_failure_reason",
    "uses_sasl",
    "uses_tls",
    "validate_security",
]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

#: Options whose values are secrets (or may hold them: a token provider's closure).
SECRET_OPTIONS = frozenset({"sasl_password", "ssl_password", "sasl_oauth_token_provider"})

#: OAUTHBEARER token source: returns ``(token, expires_at_epoch_seconds)``, or an
#: awaitable of that.
TokenProvider = Callable[[], Union[tuple[str, float], Awaitable[tuple[str, float]]]]  # noqa: UP007

_TLS_FILES = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
_SASL_OPTIONS = ("sasl_mechanism", "sasl_username", "sasl_password", "sasl_oauth_token_provider")

# X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH (OpenSSL)
_NAME_MISMATCH = frozenset({62, 64})
# TLS alerts a server sends when it refuses the client's certificate or its absence.
_CLIENT_CERT_ALERTS = frozenset({
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "TLSV1_ALERT_ACCESS_DENIED",
})


class SecurityOptions(Protocol):
    """The fields of ``ClusterConfig`` checked here (a protocol: config.py imports us)."""

    @property
    def security_protocol(self) -> str: ...
    @property
    def ssl_cafile(self) -> str | None: ...
    @property
    def ssl_certfile(self) -> str | None: ...
    @property
    def ssl_keyfile(self) -> str | None: ...
    @property
    def ssl_password(self) -> str | None: ...
    @property
    def ssl_check_hostname(self) -> bool: ...
    @property
    def ssl_context(self) -> ssl.SSLContext | None: ...
    @property
    def sasl_mechanism(self) -> str | None: ...
    @property
    def sasl_username(self) -> str | None: ...
    @property
    def sasl_password(self) -> str | None: ...
    @property
    def sasl_oauth_token_provider(self) -> TokenProvider | None: ...
    @property
    def connector(self) -> Any: ...


def uses_tls(protocol: str) -> bool:
    return protocol in ("SSL", "SASL_SSL")


def uses_sasl(protocol: str) -> bool:
    return protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def redact_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with every secret value replaced by ``"***"`` (for echoes and reprs)."""
    return {k: ("***" if k in SECRET_OPTIONS and v is not None else v) for k, v in options.items()}


def _bad(option: str, value: object, allowed: str) -> ConfigError:
    shown = "(hidden)" if option in SECRET_OPTIONS else repr(value)
    return ConfigError(f"invalid {option}={shown}: {allowed}")


def validate_security(cfg: SecurityOptions) -> ssl.SSLContext | None:
    """Check the security options (in place: ``security_protocol`` and
    ``sasl_mechanism`` are upper-cased); return the TLS context they describe, if any.

    Raises:
      ConfigError: naming the first invalid option and what to do.
    """
    protocol = cfg.security_protocol
    if not isinstance(protocol, str) or protocol.upper() not in SECURITY_PROTOCOLS:
        raise _bad("security_protocol", protocol, f"must be one of {', '.join(SECURITY_PROTOCOLS)}")
    protocol = protocol.upper()
    object.__setattr__(cfg, "security_protocol", protocol)
    _check_sasl(cfg, protocol)
    return _check_tls(cfg, protocol)


def _check_sasl(cfg: SecurityOptions, protocol: str) -> None:
    if not uses_sasl(protocol):
        given = [name for name in _SASL_OPTIONS if getattr(cfg, name) is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} set but security_protocol={protocol}: SASL options need "
                "security_protocol='SASL_SSL' (or 'SASL_PLAINTEXT', unencrypted)"
            )
        return
    mechanism = cfg.sasl_mechanism
    if mechanism is None:
        raise ConfigError(
            f"security_protocol={protocol} needs sasl_mechanism: one of {', '.join(MECHANISMS)}"
        )
    if not isinstance(mechanism, str):
        raise _bad("sasl_mechanism", mechanism, f"must be one of {', '.join(MECHANISMS)}")
    mechanism = mechanism.upper()
    if mechanism == "GSSAPI":
        raise ConfigError(
            "sasl_mechanism=GSSAPI (Kerberos) is not supported; supported: "
            + ", ".join(MECHANISMS)
        )
    if mechanism not in MECHANISMS:
        raise _bad("sasl_mechanism", cfg.sasl_mechanism, f"must be one of {', '.join(MECHANISMS)}")
    object.__setattr__(cfg, "sasl_mechanism", mechanism)
    if mechanism == "OAUTHBEARER":
        if cfg.sasl_oauth_token_provider is None:
            raise ConfigError(
                "sasl_mechanism=OAUTHBEARER needs sasl_oauth_token_provider: a callable "
                "(sync or async) returning (token, expires_at_epoch_seconds)"
            )
        if not callable(cfg.sasl_oauth_token_provider):
            raise _bad("sasl_oauth_token_provider", None, "must be a callable")
        extra = [n for n in ("sasl_username", "sasl_password") if getattr(cfg, n) is not None]
        if extra:
            raise ConfigError(
                f"{', '.join(extra)} are not used by OAUTHBEARER (the token provider "
                "authenticates); leave them out"
            )
        return
    if cfg.sasl_oauth_token_provider is not None:
        raise ConfigError(
            f"sasl_oauth_token_provider is only used with sasl_mechanism=OAUTHBEARER, "
            f"not {mechanism}"
        )
    for name in ("sasl_username", "sasl_password"):
        value = getattr(cfg, name)
        if value is None:
            raise ConfigError(f"sasl_mechanism={mechanism} needs {name}")
        if not isinstance(value, str) or not value:
            raise _bad(name, value, "must be a non-empty string")
        if "\x00" in value:
            raise _bad(name, value, "cannot contain NUL characters")


def _check_tls(cfg: SecurityOptions, protocol: str) -> ssl.SSLContext | None:
    files = {name: getattr(cfg, name) for name in _TLS_FILES}
    if not isinstance(cfg.ssl_check_hostname, bool):
        raise _bad("ssl_check_hostname", cfg.ssl_check_hostname, "must be True or False")
    if not uses_tls(protocol):
        given = [n for n, v in files.items() if v is not None]
        given += [n for n in ("ssl_password", "ssl_context") if getattr(cfg, n) is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} set but security_protocol={protocol}: TLS options need "
                "security_protocol='SSL' or 'SASL_SSL'"
            )
        return None
    if cfg.ssl_context is not None:
        if not isinstance(cfg.ssl_context, ssl.SSLContext):
            raise _bad("ssl_context", type(cfg.ssl_context).__name__, "must be an ssl.SSLContext")
        given = [n for n, v in files.items() if v is not None]
        if cfg.ssl_password is not None:
            given.append("ssl_password")
        if given:
            raise ConfigError(
                f"pass either ssl_context or {', '.join(given)}, not both (the context "
                "already holds its CA and certificates)"
            )
    if cfg.connector is not None:
        given = [n for n, v in files.items() if v is not None]
        if cfg.ssl_context is not None:
            given.append("ssl_context")
        if given:
            raise ConfigError(
                f"{', '.join(given)} cannot be used with a custom connector: the connector "
                "opens the streams (build it with tcp_connector(ssl_context=...))"
            )
        return None
    if cfg.ssl_context is not None:
        return cfg.ssl_context
    for name, path in files.items():
        if path is None:
            continue
        if not isinstance(path, str | os.PathLike):
            raise _bad(name, path, "must be a file path")
        if not os.path.isfile(path):
            raise ConfigError(f"invalid {name}={os.fspath(path)!r}: no such file")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"invalid {name}={os.fspath(path)!r}: not readable (permissions)")
    if cfg.ssl_keyfile is not None and cfg.ssl_certfile is None:
        raise ConfigError("ssl_keyfile needs ssl_certfile (the client certificate it belongs to)")
    if cfg.ssl_password is not None:
        if cfg.ssl_certfile is None:
            raise ConfigError("ssl_password is the password of ssl_keyfile; no key was given")
        if not isinstance(cfg.ssl_password, str):
            raise _bad("ssl_password", None, "must be a string")
    return build_ssl_context(cfg)


class _KeyNeedsPassword(Exception):
    pass


def _no_password() -> str:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
    raise _KeyNeedsPassword


def build_ssl_context(cfg: SecurityOptions) -> ssl.SSLContext:
    """The client TLS context of ``cfg`` (system CAs unless ``ssl_cafile``; TLS 1.2+).

    Raises:
      ConfigError: a file that is not PEM, a key that does not fit, a wrong password.
    """
    try:
        context = ssl.create_default_context(cafile=cfg.ssl_cafile)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            f"invalid ssl_cafile={cfg.ssl_cafile!r}: no PEM certificate could be read from it "
            f"({_reason(exc)})"
        ) from None
    context.check_hostname = cfg.ssl_check_hostname
    if cfg.ssl_certfile is not None:
        password: str | Callable[[], str] = (
            cfg.ssl_password if cfg.ssl_password is not None else _no_password
        )
        try:
            context.load_cert_chain(cfg.ssl_certfile, cfg.ssl_keyfile, password=password)
        except _KeyNeedsPassword:
            raise ConfigError(
                "the private key in ssl_keyfile (or ssl_certfile) is encrypted: pass ssl_password"
            ) from None
        except (ssl.SSLError, ValueError, OSError) as exc:
            raise ConfigError(
                f"ssl_certfile={cfg.ssl_certfile!r} / ssl_keyfile={cfg.ssl_keyfile!r} could not "
                f"be loaded ({_reason(exc)}): they must be PEM, the key must belong to the "
                "certificate, and ssl_password must decrypt the key"
            ) from None
    return context


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason) if reason else type(exc).__name__


def _ssl_errors(exc: BaseException) -> list[ssl.SSLError]:
    """The ssl errors behind ``exc`` (trio wraps them in BrokenResourceError)."""
    found: list[ssl.SSLError] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            found.append(current)
        current = current.__cause__ or current.__context__
    return found


def tls_error(exc: BaseException, where: str) -> AuthenticationError | None:
    """The specific, non-retriable error a failed TLS exchange means, or None when it is
    an ordinary connection failure (reset, EOF) that may pass.

    ``where`` names the broker (``"broker 1 (127.0.0.1:9093)"``).
    """
    for error in _ssl_errors(exc):
        if isinstance(error, ssl.SSLCertVerificationError):
            detail = error.verify_message or _reason(error)
            if error.verify_code in _NAME_MISMATCH:
                return TlsHostnameError(
                    f"TLS: the certificate of {where} does not match the name connected to "
                    f"({detail}); connect with a name the certificate lists (or, for tests "
                    "only, ssl_check_hostname=False)"
                )
            return TlsCertificateError(
                f"TLS: the certificate of {where} is not trusted ({detail}); pass ssl_cafile "
                "with the CA that signed the brokers' certificates"
            )
        reason = error.reason or ""
        if reason in _CLIENT_CERT_ALERTS:
            return TlsClientCertificateError(
                f"TLS: {where} refused the client certificate ({reason}); the listener "
                "requires one it trusts (ssl.client.auth=required): pass ssl_certfile and "
                "ssl_keyfile signed by a CA the broker trusts"
            )
        if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST"):
            return TlsError(
                f"TLS: {where} did not answer the TLS handshake with TLS ({reason}): the "
                "listener is probably not TLS; check security_protocol (PLAINTEXT or "
                "SASL_PLAINTEXT for a plaintext listener)"
            )
    return None



def tls_failure_hint(exc: BaseException) -> str:
    """For a retriable TLS failure: what it may mean (an empty string if not TLS)."""
    reason = tls_failure_reason(exc)
    return f"; {reason}" if reason else ""


def tls_failure_reason(exc: BaseException) -> str | None:
    """A retriable TLS failure in a few words ("TLS handshake failed: ..."), or None
    when ``exc`` holds no TLS error."""
    for error in _ssl_errors(exc):
        if isinstance(error, ssl.SSLEOFError) or "EOF" in (error.reason or ""):
            return ("TLS handshake failed: the broker closed the connection during it; "
                    f"{PLAINTEXT_HINT}")
        return f"TLS handshake failed ({error.reason or type(error).__name__})"
    return None


def early_close_hint(protocol: str, responses: int, handshake_responses: int | None) -> str:
    """Why a broker may have closed a connection this early: the protocol spoken.
    ``responses`` read so far, ``handshake_responses`` of them by the handshake (None
    while it runs)."""
    if responses == 0:
        return (f" before answering ApiVersions (security_protocol={protocol}: if the "
                "listener uses TLS, use SSL or SASL_SSL; if not, PLAINTEXT or SASL_PLAINTEXT)")
    if handshake_responses == responses and not uses_sasl(protocol):
        return (f" after the handshake, before answering a request (security_protocol="
                f"{protocol}: a listener that requires SASL closes such connections; use "
                "SASL_SSL or SASL_PLAINTEXT with sasl_mechanism)")
    return ""


def tls_answer_error(data: bytes | bytearray, where: str, protocol: str) -> TlsError | None:
    """A TLS record (alert, handshake) where the first Kafka size prefix belongs: no
    response is that large (0x15/0x16 03 ...); the listener speaks TLS and we do not."""
    if data[:2] in (b"\x15\x03", b"\x16\x03"):
        return TlsError(f"{where} answered with TLS: the listener uses TLS; set "
                        f"security_protocol=SSL or SASL_SSL (it is {protocol})")
    return None


def describe_broker(node_id: int, host: str, port: int) -> str:
    """How errors name a broker (bootstrap addresses have negative pseudo ids)."""
    if node_id < 0:
        return f"bootstrap broker {host}:{port}"
    return f"broker {node_id} ({host}:{port})"


def stream_error(exc: BaseException, where: str, what: str) -> KafkaError:
    """What a failed connect, read or write means: a TLS refusal (not retriable), or a
    retriable :class:`BrokerConnectionError` whose ``reason`` says why in a few words
    (for a connect: "connection refused", "name not resolved (...)", "TLS handshake
    failed: ...", "timed out: ...")."""
    specific = tls_error(exc, where)
    if specific is not None:
        return specific
    tls = tls_failure_reason(exc)
    if what == "connect":
        reason = tls if tls is not None else connect_failure_reason(exc)
    else:
        reason = f"{what} failed: {exc!r}" + (f"; {tls}" if tls else "")
    return BrokerConnectionError(f"{where}: {reason}", reason=reason)
