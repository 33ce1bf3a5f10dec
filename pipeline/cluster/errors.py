"""Errors raised by the I/O layer, mapped at the cluster boundary.

Everything the client raises derives from :class:`KafkaError`. Stream-level
failures (refused, reset, closed, timed out) become
:class:`BrokerConnectionError`; bytes that do not parse become
:class:`BrokerProtocolError`. ``retriable`` tells the producer whether a fresh
attempt (after a metadata refresh and backoff) can succeed.

The hierarchy::

    KafkaError                      everything the client raises
      ConfigError (also ValueError) an invalid option, raised before anything connects
      BrokerConnectionError         retriable: stream refused, reset or closed
        RequestTimedOutError        retriable: no response within request_timeout
      BrokerProtocolError           a malformed frame: the connection is closed
      UnsupportedApiError           the broker lacks an API we need
      UnknownTopicError             the topic does not exist (auto-creation off)
      MetadataTimeoutError, TopicMetadataError
      AuthenticationError           not retriable: waiting messages fail with it at once
        SaslAuthenticationError     wrong password, unknown user, rejected token
        SaslMechanismError          the mechanism is not enabled (lists what is)
        TlsError                    + TlsCertificateError, TlsHostnameError,
                                      TlsClientCertificateError
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AuthenticationError",
    "BootstrapError",
    "BrokerConnectionError",
    "BrokerProtocolError",
    "ConfigError",
    "KafkaError",
    "MetadataTimeoutError",
    "RequestTimedOutError",
    "SaslAuthenticationError",
    "SaslMechanismError",
    "TlsCertificateError",
    "TlsClientCertificateError",
    "TlsError",
    "TlsHostnameError",
    "TopicMetadataError",
    "UnknownTopicError",
    "UnsupportedApiError",
]


class KafkaError(Exception):
    """Base of every error the client raises."""

    retriable: ClassVar[bool] = False


class ConfigError(KafkaError, ValueError):
    """An invalid option (cluster, producer or consumer): the message names the
    option and what is allowed. Raised before anything connects."""


class BrokerConnectionError(KafkaError):
    """The connection to a broker was refused, reset or closed.

    A request that failed with this error may or may not have reached the
    broker: only idempotence makes a retry safe against duplicates.

    ``reason`` is the cause alone, without the broker's name ("connection refused",
    "name not resolved (...)", "TLS handshake failed: ...", "timed out ..."): what
    :class:`BootstrapError` lists per address.
    """

    retriable = True

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message


class RequestTimedOutError(BrokerConnectionError):
    """No response within ``request_timeout``; the connection was closed."""

    retriable = True


class BrokerProtocolError(KafkaError):
    """The broker sent bytes that do not parse; the connection was closed.

    Retriable: a new connection renegotiates versions, and the producer's retry
    budget bounds how often a broker that keeps misbehaving is tried again.
    """

    retriable = True


class UnsupportedApiError(KafkaError):
    """The broker does not support any version of an API that we speak."""


class UnknownTopicError(KafkaError):
    """The topic does not exist and auto-creation is off (or the broker refused it)."""

    def __init__(self, topic: str, detail: str | None = None) -> None:
        self.topic = topic
        if detail is None:
            detail = (
                f"topic {topic!r} does not exist. Create it first (for example "
                f"`kafka-topics.sh --create --topic {topic} --partitions N`, or an admin "
                "CreateTopics request), or open the cluster with "
                "allow_auto_topic_creation=True to let the broker create it "
                "(the broker must also have auto.create.topics.enable=true)"
            )
        super().__init__(detail)


class MetadataTimeoutError(KafkaError):
    """Metadata could not be obtained before the deadline."""

    retriable = True


class BootstrapError(BrokerConnectionError, MetadataTimeoutError):
    """No bootstrap address could be connected to within ``connect_timeout``.

    ``causes`` maps each address (``"host:port"``) to why the last attempt on it
    failed; the message lists them all. Raised by the first metadata request of a
    cluster client (``open_producer``, the reader, ``Admin`` calls, the CLI). It is
    also a :class:`MetadataTimeoutError`: the metadata never came.
    """

    def __init__(self, message: str, causes: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.causes = dict(causes or {})


class TopicMetadataError(KafkaError):
    """Metadata for a topic carries an error that waiting will not fix (authorization, invalid name)."""

    def __init__(self, topic: str, error_code: int, description: str) -> None:
        self.topic = topic
        self.error_code = error_code
        super().__init__(f"metadata for topic {topic!r} failed: {description}")


class AuthenticationError(KafkaError):
    """The broker and the client could not establish who is who: SASL failed, or TLS
    refused a certificate. Not retriable (KIP-152: the Java client treats
    ``AuthenticationException`` as fatal for the request): waiting does not fix
    credentials or trust, so the operation fails at once with this error and the
    reconnect backoff bounds how often the broker is tried again.

    Texts name the broker, the mechanism and the user, never a password or token.
    """


class SaslAuthenticationError(AuthenticationError):
    """The broker refused the credentials (wrong password, unknown user, rejected
    token), or the SASL exchange itself failed. Kafka answers a wrong password and an
    unknown user alike, on purpose, so they are one error here too."""


class SaslMechanismError(AuthenticationError):
    """The broker does not enable the configured SASL mechanism (``mechanisms`` lists
    what it offers), or the listener does not expect SASL at all."""

    def __init__(self, message: str, mechanisms: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.mechanisms = mechanisms


class TlsError(AuthenticationError):
    """The TLS handshake failed for a reason that retrying cannot fix."""


class TlsCertificateError(TlsError):
    """The broker's certificate is not trusted (unknown or self-signed CA, expired):
    pass ``ssl_cafile`` with the CA that signed it."""


class TlsHostnameError(TlsError):
    """The broker's certificate is valid but for another name than the one connected to."""


class TlsClientCertificateError(TlsError):
    """The broker refused the client's certificate, or its absence (mTLS,
    ``ssl.client.auth=required``): pass ``ssl_certfile`` / ``ssl_keyfile``."""
