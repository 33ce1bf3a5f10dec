"""ClusterConfig: every option of the cluster client, one frozen object, validated once.

The :class:`~pipeline.cluster.pool.Cluster`, each
:class:`~pipeline.cluster.connection.BrokerConnection`, the consumer and the
producer read their cluster-level settings from it; nothing downstream
re-translates, re-defaults or clamps them. A ``ProducerConfig`` holds one
(``config.cluster``), and takes every field here as a producer option of the
same name (as the Java client's producer config includes its common client
configs).

Names follow the Java client's settings in Python spelling, with seconds for
durations (``request_timeout=30.0`` is ``request.timeout.ms=30000``).

Security (TLS and SASL) options use the names users know from the Java client
and librdkafka (``security_protocol``, ``ssl_cafile``, ``sasl_mechanism``,
``sasl_username``...); their checks, and the TLS context they build, live in
:mod:`pipeline.cluster.security`. They act in two places: the stream
(:meth:`ClusterConfig.make_connector` wraps TCP in TLS) and the connection
handshake (``handshake.py``: SASL after ApiVersions). Every entry point accepts
them: ``Cluster.open(**options)``, ``open_producer(**options)``,
``ProducerConfig``, the consumer's ``config=``, ``Admin.open``.

Adding an option means: a field here, its check in :meth:`ClusterConfig.validate`,
and reading it where it acts. A secret field is declared ``repr=False`` and listed
in :data:`~pipeline.cluster.security.SECRET_OPTIONS`.
"""

from __future__ import annotations

import dataclasses
import random
import ssl
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from pipeline.cluster.errors import ConfigError
from pipeline.cluster.security import TokenProvider, uses_tls, validate_security
from pipeline.cluster.transport import Connector, tcp_connector
from pipeline.protocol.framing import DEFAULT_MAX_FRAME_SIZE

__all__ = ["ClusterConfig", "cluster_config", "merge_options", "parse_option_value"]


def _bad(option: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"invalid {option}={value!r}: {allowed}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """How to reach and talk to a Kafka cluster. Pass it to ``Cluster.open`` or give
    the fields as keywords."""

    client_id: str = "pipeline"
    # Per request: no answer within it closes the connection (the request may
    # or may not have been applied) and fails every request pending on it.
    request_timeout: float = 30.0
    # Setting a connection up, per attempt: TCP connect, TLS handshake, ApiVersions
    # and SASL (librdkafka's socket.connection.setup.timeout.ms; Java's names the TCP
    # part). Also how long the first metadata request keeps trying the bootstrap
    # addresses before it fails with a BootstrapError naming each one's cause.
    connect_timeout: float = 5.0
    # Requests written and not yet answered, per connection. Slots are taken
    # before writing, so the wire never holds more.
    max_in_flight: int = 5
    # Largest response frame accepted; a bigger size prefix means a corrupt
    # stream (or a non-Kafka peer), and the connection is closed.
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE

    # Metadata.
    metadata_max_age: float = 300.0  # refresh at least this often
    metadata_timeout: float = 60.0  # a refresh (or a wait for a leader) gives up after it
    allow_auto_topic_creation: bool = False  # ask brokers to create unknown topics

    # Backoff (pipeline.util.backoff) between reconnects to a broker and between
    # failed metadata rounds; the producer's retries use the same three.
    retry_backoff: float = 0.1
    retry_backoff_max: float = 1.0
    retry_backoff_jitter: float = 0.2  # +-20% (KIP-580); 0 makes retry times exact in tests

    # Injection points (tests, fakes, custom transports); never compared or shown.
    # connector: how streams are opened; None = TCP built from the options above.
    connector: Connector | None = field(default=None, compare=False, repr=False)
    # rng: jitter source (and the producer's partitioner); None = a fresh Random().
    rng: random.Random | None = field(default=None, compare=False, repr=False)

    # Security (pipeline.cluster.security has the table). Secrets are repr=False:
    # a config is logged, echoed and pickled to Spark executors.
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    ssl_cafile: str | None = None  # None: the system's trusted CAs
    ssl_certfile: str | None = None  # client certificate (mTLS)
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)
    sasl_mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 | OAUTHBEARER
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    sasl_oauth_token_provider: TokenProvider | None = field(
        default=None, compare=False, repr=False
    )
    # The TLS context the options above describe, built (and so checked) once.
    _tls: ssl.SSLContext | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid option and what is allowed."""
        if not isinstance(self.client_id, str):
            raise _bad("client_id", self.client_id, "must be a string")
        if not _is_number(self.retry_backoff) or self.retry_backoff < 0:
            raise _bad("retry_backoff", self.retry_backoff, "must be a number of seconds >= 0")
        for name in ("request_timeout", "connect_timeout", "metadata_max_age",
                     "metadata_timeout", "retry_backoff_max"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise _bad(name, value, "must be a number of seconds > 0")
        if not _is_number(self.retry_backoff_jitter) or not 0 <= self.retry_backoff_jitter < 1:
            raise _bad("retry_backoff_jitter", self.retry_backoff_jitter, "must be in [0, 1)")
        if self.retry_backoff_max < self.retry_backoff:
            raise _bad("retry_backoff_max", self.retry_backoff_max,
                       f"must be >= retry_backoff ({self.retry_backoff})")
        for name in ("max_in_flight", "max_frame_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise _bad(name, value, "must be a positive integer")
        if not isinstance(self.allow_auto_topic_creation, bool):
            raise _bad("allow_auto_topic_creation", self.allow_auto_topic_creation,
                       "must be True or False")
        if self.connector is not None and not callable(self.connector):
            raise _bad("connector", self.connector,
                       "must be an async callable (host, port) -> trio.abc.Stream")
        if self.rng is not None and not isinstance(self.rng, random.Random):
            raise _bad("rng", self.rng, "must be a random.Random")
        object.__setattr__(self, "_tls", validate_security(self))

    @property
    def cluster(self) -> ClusterConfig:
        """Itself: the cluster part of a config, as ``ProducerConfig.cluster`` is."""
        return self

    @classmethod
    def option_fields(cls) -> tuple[dataclasses.Field[Any], ...]:
        """Every option a user can give by name."""
        return _FIELDS

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a Spark task's config) as its options; unpickling validates again
        # and rebuilds the TLS context, which cannot be pickled, where it is used.
        return (_rebuild, (type(self), {f.name: getattr(self, f.name) for f in _FIELDS}))

    @property
    def uses_tls(self) -> bool:
        return uses_tls(self.security_protocol)

    def make_connector(self) -> Connector:
        """The stream opener: the injected ``connector`` (which then provides TLS itself,
        if any), else TCP with ``connect_timeout``, TLS-wrapped for SSL and SASL_SSL."""
        if self.connector is not None:
            return self.connector
        return tcp_connector(ssl_context=self._tls, connect_timeout=self.connect_timeout)


_FIELDS = tuple(f for f in dataclasses.fields(ClusterConfig) if f.init)


def _rebuild(cls: type[ClusterConfig], options: dict[str, Any]) -> ClusterConfig:
    return cls(**options)

class _Options(Protocol):
    @classmethod
    def option_fields(cls) -> tuple[dataclasses.Field[Any], ...]: ...


C = TypeVar("C", bound=_Options)


def merge_options(cls: type[C], config: C | None, options: dict[str, Any], *, kind: str) -> C:
    """``config`` (or ``cls()`` defaults) with keyword ``options`` over it; an unknown
    name raises :class:`ConfigError` listing every valid ``kind`` option."""
    known = {f.name for f in cls.option_fields()}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown {kind} option(s) {unknown}; valid options are {sorted(known)}")
    if config is None:
        return cls(**options)
    return cast(C, dataclasses.replace(cast(Any, config), **options)) if options else config


def cluster_config(config: ClusterConfig | None, options: dict[str, Any]) -> ClusterConfig:
    """Merge keyword options over a config's cluster part (or the defaults)."""
    return merge_options(
        ClusterConfig, config.cluster if config is not None else None, options, kind="cluster"
    )


def parse_option_value(text: str) -> Any:
    """An option given as text (CLI ``-X``, Spark options, properties) as a Python value:
    ``"10"`` -> 10, ``"0.5"`` -> 0.5, ``"true"`` -> True, ``"none"`` -> None, else the text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text
