"""Producer configuration: one frozen dataclass, validated as a whole.

Names follow the Java client's settings in Python spelling, with seconds for
durations (``linger=0.005`` is Java's ``linger.ms=5``). Defaults are the Java
client's where they make sense for Python, and every deviation is explained
next to the field.

``ProducerConfig`` holds one :class:`~pipeline.cluster.config.ClusterConfig`,
``config.cluster``: the cluster-level options (``client_id``,
``request_timeout``, ``max_in_flight``, the ``retry_backoff*`` trio, metadata,
security, ``connector``, ``rng``) live there, are validated there once (the TLS
context they describe is built once), and that very object is what the
cluster client gets. Users still give every option flat, as in the Java client
(``ProducerConfig(linger=0.01, request_timeout=10.0)``,
``open_producer(bootstrap, sasl_username=...)``): the constructor sends each
cluster-level name to the ``ClusterConfig`` and the rest to the producer's own
fields, and an unknown name is an error listing every valid one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import Field, dataclass, field
from typing import Any, Literal

from pipeline.cluster.config import ClusterConfig, merge_options
from pipeline.cluster.stats import check_statistics_options
from pipeline.producer._errors import ConfigError
from pipeline.protocol.compression import Compression

Acks = Literal[0, 1, "all", -1]

_COMPRESSION_NAMES = {
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}
# KIP-390 level ranges; snappy has no levels.
_LEVELS: dict[Compression, tuple[int, int]] = {
    Compression.GZIP: (1, 9),
    Compression.LZ4: (1, 17),
    Compression.ZSTD: (-131072, 22),
}
_PARTITIONERS = ("default", "murmur2", "murmur2_random", "round_robin", "random")


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class ProducerConfig:
    """Every producer option. Pass it to ``open_producer`` or give the options as keywords.

    ``ProducerConfig(**options)`` takes the producer's fields below and every
    :class:`~pipeline.cluster.config.ClusterConfig` option by name (or a whole
    ``cluster=ClusterConfig(...)``, with named cluster options applied over it);
    the cluster-level ones are kept in ``self.cluster``.
    """

    # How to reach and talk to the cluster: the one ClusterConfig, handed as is
    # to the cluster client (validated, and its TLS context built, once).
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    # Delivery guarantees.
    acks: Acks = "all"
    idempotent: bool = True  # as in the Java client since 3.0 (KIP-679)
    retries: int = 2**31 - 1  # bounded in practice by delivery_timeout, as in Java
    delivery_timeout: float = 120.0

    # Batching.
    linger: float = 0.005
    # librdkafka's batch.size (Java's is 16 KiB): the client and Kafka's broker both pay per
    # batch (measured on Kafka 4.1.2, 1M x 100 B send_batch: 1.15M -> 1.40M msgs/s against
    # 256 KiB batches); under Kafka's default message.max.bytes (1,048,588) with room.
    batch_bytes: int = 1_000_000
    max_batch_messages: int = 10_000
    # A Produce request's bytes (several partitions' batches): 4 MiB lets one request
    # carry a few full batches. Java and librdkafka cap a request at 1 MB, sarama and
    # franz-go at 100 MiB; Kafka's socket.request.max.bytes is 100 MiB. Kafka handles one
    # request of a connection at a time, so each costs a round trip: measured on Kafka
    # 4.1.2, 1M x 100 B send_batch: 1.34M -> 1.60M msgs/s, 136 -> 35 requests (8 MiB:
    # the same; tansu: no change).
    max_request_bytes: int = 4 * 1024 * 1024
    max_message_bytes: int = 1024 * 1024
    compression: str = "none"
    compression_level: int | None = None

    # Memory and blocking.
    buffer_memory: int = 32 * 1024 * 1024
    max_block: float = 60.0
    channel_capacity: int = 1024  # items per internal channel (each item is a list of messages)

    # Results and shutdown.
    return_successes: bool = False
    close_timeout: float = 30.0
    # A failure nobody reads (no awaited delivery, no on_delivery, no awaited group) is
    # logged at WARNING, aggregated per 5 s; this also raises them when the block ends.
    raise_on_unobserved_failure: bool = False

    # Transactions (Java's transactional.id / transaction.timeout.ms). A transactional
    # producer is idempotent with acks="all"; every record goes in a transaction.
    transactional_id: str | None = None
    transaction_timeout: float = 60.0

    # Partitioning: a name, a Partitioner object, or a callable(topic, key, value, n) -> int.
    partitioner: Any = "default"

    # The producer-flow seed's first and last steps (_intake/hooks.py): serializers, a
    # name ("bytes", "str", "json") or a callable (obj) -> bytes | None, and interceptors
    # (objects with on_send(message) -> message and / or on_acknowledgement(meta, error)).
    key_serializer: Any = None
    value_serializer: Any = None
    interceptors: tuple[Any, ...] = ()

    # Statistics (librdkafka's statistics.interval.ms and stats_cb): every
    # statistics_interval seconds, on_statistics(producer.statistics()) is called (plain
    # or async, in the producer's trio task). 0: never, as librdkafka's default.
    statistics_interval: float = 0.0
    on_statistics: Callable[[Any], Any] | None = field(default=None, compare=False, repr=False)

    # Injection point for deterministic tests (rng is a ClusterConfig field).
    timestamp_ms: Callable[[], int] | None = field(default=None, compare=False, repr=False)

    def __init__(self, *, cluster: ClusterConfig | None = None, **options: Any) -> None:
        own = _OWN_NAMES
        unknown = sorted(set(options) - own - _CLUSTER_NAMES)
        if unknown:
            raise ConfigError(
                f"unknown producer option(s) {unknown}; valid options are {sorted(_ALL_NAMES)}"
            )
        if cluster is not None and not isinstance(cluster, ClusterConfig):
            raise ConfigError(f"invalid cluster={cluster!r}: must be a ClusterConfig")
        net = {k: v for k, v in options.items() if k not in own}
        if cluster is None:
            cluster = ClusterConfig(**net)
        elif net:
            cluster = dataclasses.replace(cluster, **net)  # validated again, as a whole
        object.__setattr__(self, "cluster", cluster)
        for f in _OWN_FIELDS:
            if f.name in options:
                value = options[f.name]
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, f.name, value)
        self.validate()

    @classmethod
    def option_fields(cls) -> tuple[Field[Any], ...]:
        """Every option a user can give by name: the producer's own fields
        (``cluster`` included) and each ClusterConfig option."""
        return (*(f for f in dataclasses.fields(cls) if f.init), *ClusterConfig.option_fields())

    # The two cluster options the producer itself reads, by their flat names.
    @property
    def request_timeout(self) -> float:
        """A Produce request's timeout, and the bound of start-up waits."""
        return self.cluster.request_timeout

    @property
    def max_in_flight(self) -> int:
        """Requests in flight per broker connection (also the idempotent bound)."""
        return self.cluster.max_in_flight

    @property
    def acks_value(self) -> int:
        """The wire value: 0, 1 or -1."""
        return -1 if self.acks in ("all", -1) else int(self.acks)

    @property
    def compression_codec(self) -> Compression:
        return _COMPRESSION_NAMES[self.compression]

    @property
    def max_in_flight_per_partition(self) -> int:
        # Partition muting: without idempotence a second in-flight batch could
        # land before a failed first one is retried (sarama #2619), so only one
        # batch per partition may be in flight. With idempotence the broker
        # rejects any batch that would overtake a failed one (sequence gap), so
        # up to max_in_flight (<= 5, the broker's cache) may be in flight.
        return self.max_in_flight if self.idempotent else 1

    def replace(self, **changes: Any) -> ProducerConfig:
        """A copy with ``changes`` (producer or cluster options by name), validated."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        def bad(option: str, value: object, allowed: str) -> ConfigError:
            return ConfigError(f"invalid {option}={value!r}: {allowed}")

        if self.acks not in (0, 1, -1, "all"):
            raise bad("acks", self.acks, 'use 0, 1 or "all"')
        if self.compression not in _COMPRESSION_NAMES:
            raise bad("compression", self.compression, f"use one of {sorted(_COMPRESSION_NAMES)}")
        if self.compression_level is not None:
            codec = _COMPRESSION_NAMES[self.compression]
            if codec not in _LEVELS:
                raise bad(
                    "compression_level", self.compression_level,
                    f"compression={self.compression!r} takes no level; leave it None",
                )
            lo, hi = _LEVELS[codec]
            if not lo <= self.compression_level <= hi:
                raise bad(
                    "compression_level", self.compression_level,
                    f"{self.compression} levels are {lo}..{hi}",
                )
        if not isinstance(self.linger, (int, float)) or self.linger < 0:
            raise bad("linger", self.linger, "must be a number of seconds >= 0")
        for name in ("delivery_timeout", "max_block", "close_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise bad(name, value, "must be a number of seconds > 0")
        if self.delivery_timeout < self.linger + self.request_timeout:
            raise bad(
                "delivery_timeout", self.delivery_timeout,
                f"must be >= linger + request_timeout ({self.linger} + {self.request_timeout}), "
                "as in the Java client, or every slow request would time out its messages",
            )
        for name in ("batch_bytes", "max_request_bytes", "max_message_bytes", "buffer_memory",
                     "max_batch_messages", "channel_capacity"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise bad(name, value, "must be a positive integer")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise bad("retries", self.retries, "must be an integer >= 0")
        if self.max_message_bytes > self.max_request_bytes:
            raise bad("max_message_bytes", self.max_message_bytes,
                      f"must be <= max_request_bytes ({self.max_request_bytes})")
        if self.max_message_bytes > self.buffer_memory:
            raise bad("max_message_bytes", self.max_message_bytes,
                      f"must be <= buffer_memory ({self.buffer_memory})")
        if self.idempotent:
            if self.acks_value != -1:
                raise ConfigError(
                    f'idempotent=True requires acks="all" (got acks={self.acks!r}); '
                    "pass idempotent=False to use weaker acks"
                )
            if self.retries == 0:
                raise ConfigError(
                    "idempotent=True requires retries > 0 (got 0); "
                    "pass idempotent=False to disable retries"
                )
            if self.max_in_flight > 5:
                raise bad("max_in_flight", self.max_in_flight,
                          "must be <= 5 with idempotent=True (Kafka caches 5 batches per producer)")
        if not isinstance(self.interceptors, tuple | list) or any(
                not (hasattr(i, "on_send") or hasattr(i, "on_acknowledgement"))
                for i in self.interceptors):
            raise bad("interceptors", self.interceptors,
                      "must be a list of objects with on_send(message) and/or "
                      "on_acknowledgement(metadata, error)")
        for name in ("key_serializer", "value_serializer"):
            value = getattr(self, name)
            if value is not None and not callable(value) and value not in ("bytes", "str", "json"):
                raise bad(name, value, 'use "bytes", "str", "json" or a callable '
                          "(obj) -> bytes | None")
        if self.transactional_id is not None:
            if not isinstance(self.transactional_id, str) or not self.transactional_id:
                raise bad("transactional_id", self.transactional_id, "must be a non-empty str")
            if not self.idempotent:
                raise ConfigError(
                    "transactional_id requires idempotent=True (a transactional producer is "
                    "idempotent); leave idempotent unset")
        if (not isinstance(self.transaction_timeout, (int, float))
                or isinstance(self.transaction_timeout, bool) or self.transaction_timeout <= 0):
            raise bad("transaction_timeout", self.transaction_timeout,
                      "must be a number of seconds > 0 (the broker caps it at its "
                      "transaction.max.timeout.ms, 15 minutes by default)")
        check_statistics_options(self.statistics_interval, self.on_statistics)
        if isinstance(self.partitioner, str) and self.partitioner not in _PARTITIONERS:
            raise bad("partitioner", self.partitioner,
                      f"use one of {list(_PARTITIONERS)}, a Partitioner, or a callable")


_OWN_FIELDS = tuple(f for f in dataclasses.fields(ProducerConfig) if f.name != "cluster")
_OWN_NAMES = frozenset(f.name for f in _OWN_FIELDS)
_CLUSTER_NAMES = frozenset(f.name for f in ClusterConfig.option_fields())
_ALL_NAMES = frozenset(f.name for f in ProducerConfig.option_fields())


def make_config(config: ProducerConfig | None, options: dict[str, Any]) -> ProducerConfig:
    """Merge keyword options over a config, with a clear error for unknown names."""
    return merge_options(ProducerConfig, config, options, kind="producer")
