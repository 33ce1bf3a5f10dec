"""ClusterConfig: every option of the cluster client, one frozen object, validated once.

The :class:`~pipeline.cluster.pool.Cluster`, each
:class:`~pipeline.cluster.connection.BrokerConnection`, the consumer and the
producer read their cluster-level settings from it; nothing downstream
re-translates, re-defaults or clamps them. ``ProducerConfig`` extends it (as
the Java client's producer config includes its common client configs), so
every field here is also a producer option of the same name.

Names follow the Java client's settings in Python spelling, with seconds for
durations (``request_timeout=30.0`` is ``request.timeout.ms=30000``).

Adding an option (issue 14's ``security_protocol``, ``ssl_*``, ``sasl_*``, a
token provider) means: a field here, its check in :meth:`ClusterConfig.validate`,
and reading it where it acts (the stream in :meth:`ClusterConfig.make_connector`,
the authentication step in ``handshake.py``). Every entry point then accepts it:
``Cluster.open(**options)``, ``open_producer(**options)``, ``ProducerConfig``,
the consumer's ``config=``. A secret field must be declared ``repr=False``.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pipeline.cluster.errors import ConfigError
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
    # TCP connect (plus the TLS handshake, once there is one) per attempt.
    connect_timeout: float = 10.0
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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid option and what is allowed.

        A subclass extending it calls ``ClusterConfig.validate(self)`` (zero-argument
        ``super()`` does not work in slotted dataclasses).
        """
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

    @property
    def cluster(self) -> ClusterConfig:
        """The cluster-level options alone (a subclass's extra fields dropped)."""
        if type(self) is ClusterConfig:
            return self
        return ClusterConfig(**{f.name: getattr(self, f.name) for f in _FIELDS})

    def make_connector(self) -> Connector:
        """The stream opener: the injected ``connector``, else TCP with ``connect_timeout``."""
        if self.connector is not None:
            return self.connector
        return tcp_connector(connect_timeout=self.connect_timeout)


_FIELDS = dataclasses.fields(ClusterConfig)

C = TypeVar("C", bound=ClusterConfig)


def merge_options(cls: type[C], config: C | None, options: dict[str, Any], *, kind: str) -> C:
    """``config`` (or ``cls()`` defaults) with keyword ``options`` over it; an unknown
    name raises :class:`ConfigError` listing every valid ``kind`` option."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown {kind} option(s) {unknown}; valid options are {sorted(known)}")
    if config is None:
        return cls(**options)
    return dataclasses.replace(config, **options) if options else config


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
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text
