"""ConsumerConfig: every consumer option, one frozen object, validated once.

Names are the Java consumer's settings in Python spelling, durations in seconds
(``session_timeout=45.0`` is ``session.timeout.ms=45000``); defaults are the Java
client's (4.x) unless the comment says otherwise. As ``ProducerConfig`` does, it holds
one :class:`~pipeline.cluster.config.ClusterConfig` (``config.cluster``: bootstrap
connections, timeouts, security) and takes every cluster option by name, flat:
``ConsumerConfig(group_id="billing", sasl_username=...)``. An unknown name is an
error listing every valid one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import Field, dataclass, field
from typing import Any

from pipeline.cluster.config import ClusterConfig, merge_options
from pipeline.cluster.errors import ConfigError
from pipeline.cluster.stats import check_statistics_options
from pipeline.consumer._assignors import (
    Assignor,
    RangeAssignor,
    RebalanceProtocol,
    RoundRobinAssignor,
    rebalance_protocol,
)
from pipeline.consumer._sticky import CooperativeStickyAssignor

__all__ = ["ASSIGNORS", "ConsumerConfig", "make_config"]

#: ``partition_assignment_strategy`` names: Kafka's, so Java / librdkafka members agree.
ASSIGNORS: dict[str, type[RangeAssignor | RoundRobinAssignor | CooperativeStickyAssignor]] = {
    "range": RangeAssignor,
    "roundrobin": RoundRobinAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
}
_RESETS = ("earliest", "latest", "none")
_ISOLATION = ("read_uncommitted", "read_committed")
_GROUP_PROTOCOLS = ("classic", "consumer")


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class ConsumerConfig:
    """Every consumer option. Pass it to ``open_consumer`` or give the options as keywords."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    # The group. None: no group (partitions assigned by the application, nothing
    # committed), as a Java consumer that only calls assign().
    group_id: str | None = None
    group_instance_id: str | None = None  # KIP-345 static membership
    # "consumer": KIP-848, the broker assigns (session, heartbeat and assignors are then
    # the broker's settings, so setting them here is refused).
    group_protocol: str = "classic"
    # The member is removed when the coordinator hears no heartbeat for this long.
    session_timeout: float = 45.0
    heartbeat_interval: float = 3.0
    # The longest gap between two records (or batches) taken from the consumer;
    # past it the member leaves the group and the next iteration says so. Also the
    # rebalance timeout: how long the group waits for this member to rejoin.
    max_poll_interval: float = 300.0
    # Assignors offered in JoinGroup, most preferred first. Java's default; it makes
    # rebalances eager (range cannot cooperate): give "cooperative-sticky" alone for
    # incremental rebalancing.
    partition_assignment_strategy: tuple[str, ...] = ("range", "cooperative-sticky")
    client_rack: str | None = None  # sent in subscriptions (v3) and fetches (KIP-392)

    # Offsets.
    enable_auto_commit: bool = True
    auto_commit_interval: float = 5.0
    auto_offset_reset: str = "latest"  # no committed offset: "earliest", "latest", "none"
    isolation_level: str = "read_uncommitted"

    # Fetching.
    fetch_min_bytes: int = 1
    fetch_max_bytes: int = 50 * 1024 * 1024
    fetch_max_wait: float = 0.5
    max_partition_fetch_bytes: int = 1024 * 1024
    # The most records one batches() list holds (a fetch's records are split).
    max_poll_records: int = 500
    check_crcs: bool = True

    # Bounds of the calls that wait for the cluster: commit(), committed(), seek's
    # offset lookups, the first join (Java's default.api.timeout.ms).
    # Deserializers ("bytes", "str", "json" or a callable (bytes | None) -> obj) and
    # interceptors (on_consume(records) -> records, on_commit(offsets)): _hooks.py.
    key_deserializer: Any = None
    value_deserializer: Any = None
    interceptors: tuple[Any, ...] = ()

    default_api_timeout: float = 60.0
    close_timeout: float = 30.0  # close: the final commit and LeaveGroup

    # Statistics (librdkafka's statistics.interval.ms and stats_cb): every
    # statistics_interval seconds, on_statistics(consumer.statistics()) is called (plain
    # or async, in the consumer's trio task). 0: never.
    statistics_interval: float = 0.0
    on_statistics: Callable[[Any], Any] | None = field(default=None, compare=False, repr=False)

    def __init__(self, *, cluster: ClusterConfig | None = None, **options: Any) -> None:
        unknown = sorted(set(options) - _OWN_NAMES - _CLUSTER_NAMES)
        if unknown:
            raise ConfigError(
                f"unknown consumer option(s) {unknown}; valid options are {sorted(_ALL_NAMES)}"
            )
        if cluster is not None and not isinstance(cluster, ClusterConfig):
            raise ConfigError(f"invalid cluster={cluster!r}: must be a ClusterConfig")
        net = {k: v for k, v in options.items() if k not in _OWN_NAMES}
        if cluster is None:
            cluster = ClusterConfig(**net)
        elif net:
            cluster = dataclasses.replace(cluster, **net)
        object.__setattr__(self, "cluster", cluster)
        for f in _OWN_FIELDS:
            value = options[f.name] if f.name in options else f.default
            if f.name == "partition_assignment_strategy":
                value = _strategy(value)
            object.__setattr__(self, f.name, value)
        self.validate()

    @classmethod
    def option_fields(cls) -> tuple[Field[Any], ...]:
        """The consumer's own options (``cluster`` included) and each cluster option."""
        return (*(f for f in dataclasses.fields(cls) if f.init), *ClusterConfig.option_fields())

    @property
    def request_timeout(self) -> float:
        return self.cluster.request_timeout

    @property
    def isolation(self) -> int:
        """The Fetch / ListOffsets wire value (0 read_uncommitted, 1 read_committed)."""
        return _ISOLATION.index(self.isolation_level)

    def assignors(self) -> list[Assignor]:
        """New assignor instances, in preference order."""
        return [ASSIGNORS[name]() for name in self.partition_assignment_strategy]

    @property
    def rebalance_protocol(self) -> RebalanceProtocol:
        return rebalance_protocol(self.assignors())

    def replace(self, **changes: Any) -> ConsumerConfig:
        """A copy with ``changes`` (consumer or cluster options by name), validated."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid option and what is allowed."""

        def bad(option: str, allowed: str) -> ConfigError:
            return ConfigError(f"invalid {option}={getattr(self, option)!r}: {allowed}")

        for name in ("group_id", "group_instance_id", "client_rack"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise bad(name, "must be a non-empty string or None")
        if self.group_protocol not in _GROUP_PROTOCOLS:
            raise bad("group_protocol", f"use one of {list(_GROUP_PROTOCOLS)}")
        if self.group_protocol == "consumer":
            # As the Java client and librdkafka: with KIP-848 the broker owns these.
            for name, broker_side in (
                ("session_timeout", "group.consumer.session.timeout.ms"),
                ("heartbeat_interval", "group.consumer.heartbeat.interval.ms"),
                ("partition_assignment_strategy", "group.consumer.assignors"),
            ):
                if getattr(self, name) != _DEFAULTS[name]:
                    raise bad(name, f'not with group_protocol="consumer": the broker sets it '
                              f"({broker_side})")
        for name in ("session_timeout", "heartbeat_interval", "max_poll_interval",
                     "auto_commit_interval", "default_api_timeout", "close_timeout"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise bad(name, "must be a number of seconds > 0")
        if not _is_number(self.fetch_max_wait) or self.fetch_max_wait < 0:
            raise bad("fetch_max_wait", "must be a number of seconds >= 0")
        if self.heartbeat_interval >= self.session_timeout:
            raise bad("heartbeat_interval",
                      f"must be lower than session_timeout ({self.session_timeout}), "
                      "typically a third of it, or the member expires between heartbeats")
        if not self.partition_assignment_strategy:
            raise bad("partition_assignment_strategy", "name at least one assignor")
        for name in self.partition_assignment_strategy:
            if name not in ASSIGNORS:
                raise ConfigError(
                    f"invalid partition_assignment_strategy: unknown assignor {name!r}; "
                    f"use {sorted(ASSIGNORS)}"
                )
        if self.auto_offset_reset not in _RESETS:
            raise bad("auto_offset_reset", f"use one of {list(_RESETS)}")
        if self.isolation_level not in _ISOLATION:
            raise bad("isolation_level", f"use one of {list(_ISOLATION)}")
        for name in ("fetch_max_bytes", "max_partition_fetch_bytes", "max_poll_records"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise bad(name, "must be a positive integer")
        if not isinstance(self.fetch_min_bytes, int) or self.fetch_min_bytes < 0:
            raise bad("fetch_min_bytes", "must be an integer >= 0")
        for name in ("enable_auto_commit", "check_crcs"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be True or False")
        for name in ("key_deserializer", "value_deserializer"):
            value = getattr(self, name)
            if value is not None and not callable(value) and value not in ("bytes", "str", "json"):
                raise bad(name, 'use "bytes", "str", "json" or a callable (bytes | None) -> obj')
        if not isinstance(self.interceptors, tuple | list) or any(
                not (hasattr(i, "on_consume") or hasattr(i, "on_commit"))
                for i in self.interceptors):
            raise bad("interceptors", "must be a list of objects with on_consume(records) "
                      "and/or on_commit(offsets)")
        if self.group_id is None and self.group_instance_id is not None:
            raise bad("group_instance_id", "static membership needs a group_id")
        check_statistics_options(self.statistics_interval, self.on_statistics)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _strategy(value: object) -> object:
    """``"range,cooperative-sticky"`` or a sequence of names, as a tuple of names."""
    if isinstance(value, str):
        return tuple(n.strip() for n in value.split(",") if n.strip())
    if isinstance(value, Sequence):
        return tuple(value)
    return value


_OWN_FIELDS = tuple(f for f in dataclasses.fields(ConsumerConfig) if f.name != "cluster")
_DEFAULTS = {f.name: f.default for f in _OWN_FIELDS}
_OWN_NAMES = frozenset(f.name for f in _OWN_FIELDS)
_CLUSTER_NAMES = frozenset(f.name for f in ClusterConfig.option_fields())
_ALL_NAMES = frozenset(f.name for f in ConsumerConfig.option_fields())


def make_config(config: ConsumerConfig | ClusterConfig | None, options: dict[str, Any]) -> ConsumerConfig:
    """Keyword options over a config (a ``ClusterConfig`` becomes its cluster part)."""
    if isinstance(config, ClusterConfig):
        return ConsumerConfig(cluster=config, **options)
    return merge_options(ConsumerConfig, config, options, kind="consumer")
