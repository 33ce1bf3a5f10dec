"""What the admin client takes and returns: frozen values, validated on construction.

Kept apart from :mod:`pipeline.cluster.admin` (the I/O) so the shapes can be read, built and
tested without a broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

from pipeline.cluster.errors import KafkaError
from pipeline.cluster.metadata import BrokerAddress
from pipeline.protocol.errors import ErrorCode

__all__ = [
    "AdminError",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigSource",
    "ElectionType",
    "NewTopic",
    "PartitionDescription",
    "Reassignment",
    "TopicDescription",
    "TopicPartition",
    "raise_errors",
]

K = TypeVar("K")


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class ElectionType(IntEnum):
    """ElectLeaders' election type (KIP-460)."""

    PREFERRED = 0  # move leadership to the first replica, if it is in sync
    UNCLEAN = 1  # elect any live replica when no in-sync replica is alive (may lose data)


class ConfigSource(IntEnum):
    """Where a config's value comes from (DescribeConfigs ``config_source``)."""

    UNKNOWN = -1
    TOPIC = 1
    DYNAMIC_BROKER = 2
    DYNAMIC_DEFAULT_BROKER = 3
    STATIC_BROKER = 4
    DEFAULT = 5
    DYNAMIC_BROKER_LOGGER = 6


class AdminError(KafkaError):
    """An admin request failed for one resource (a topic, a partition, a config resource),
    or as a whole.

    ``code`` is the broker's error code (``code.retriable`` tells whether asking again can
    help), ``detail`` the broker's message (may be None), ``resource`` what it was about.
    """

    def __init__(self, code: ErrorCode, detail: str | None = None, *, resource: Any = None) -> None:
        self.code = code
        self.detail = detail
        self.resource = resource
        where = f"{resource}: " if resource is not None else ""
        super().__init__(f"{where}{code.name}: {detail or code.description}")


def raise_errors(
    results: Mapping[K, AdminError | None], *, ignore: Collection[ErrorCode] = ()
) -> None:
    """Raise the first failure in ``results`` (by key order) whose code is not in ``ignore``;
    a note on it counts the others."""
    failures = [e for _, e in sorted(results.items(), key=lambda kv: str(kv[0])) if e is not None]
    failures = [e for e in failures if e.code not in ignore]
    if not failures:
        return
    first = failures[0]
    if len(failures) > 1:
        first.add_note(f"{len(failures) - 1} more failed: " + "; ".join(map(str, failures[1:])))
    raise first


def _frozen(mapping: Mapping[Any, Any] | None) -> Mapping[Any, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create. ``-1`` for ``partitions`` / ``replication_factor`` means the
    broker's default (``num.partitions`` / ``default.replication.factor``).

    ``assignments`` (``{partition: [node ids]}``, preferred leader first) replaces both
    counts, as in Kafka's CreateTopics.
    """

    name: str
    partitions: int = -1
    replication_factor: int = -1
    config: Mapping[str, str] = field(default_factory=dict)
    assignments: Mapping[int, Sequence[int]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"topic name must be a non-empty string, not {self.name!r}")
        for what, value in (("partitions", self.partitions),
                            ("replication_factor", self.replication_factor)):
            if not isinstance(value, int) or isinstance(value, bool) or not (
                value == -1 or value >= 1
            ):
                raise ValueError(
                    f"topic {self.name!r}: {what} must be a positive int or -1 (broker "
                    f"default), not {value!r}"
                )
        bad = {k: v for k, v in dict(self.config).items() if not isinstance(k, str)
               or not isinstance(v, str)}
        if bad:
            raise ValueError(
                f"topic {self.name!r}: config names and values must be strings "
                f"(e.g. {{'max.message.bytes': '100000'}}), got {bad!r}"
            )
        object.__setattr__(self, "config", _frozen(self.config))
        if self.assignments is not None:
            if self.partitions != -1 or self.replication_factor != -1:
                raise ValueError(
                    f"topic {self.name!r}: give either assignments or partitions/"
                    "replication_factor, not both"
                )
            if sorted(self.assignments) != list(range(len(self.assignments))) or not all(
                self.assignments.values()
            ):
                raise ValueError(
                    f"topic {self.name!r}: assignments must map partitions 0..n-1 to "
                    f"non-empty replica lists, got {dict(self.assignments)!r}"
                )
            object.__setattr__(
                self,
                "assignments",
                MappingProxyType({p: tuple(r) for p, r in sorted(self.assignments.items())}),
            )


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition as a broker's metadata describes it."""

    partition: int
    leader: int  # node id; -1 while the partition has no leader
    leader_epoch: int
    replicas: tuple[int, ...]  # preferred leader first
    isr: tuple[int, ...]
    offline: tuple[int, ...] = ()
    error: ErrorCode = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic as a broker's metadata describes it; ``error`` is NONE when it exists."""

    name: str
    error: ErrorCode = ErrorCode.NONE
    topic_id: uuid.UUID | None = None
    internal: bool = False
    partitions: tuple[PartitionDescription, ...] = ()  # by partition index

    @property
    def fully_replicated(self) -> bool:
        """Exists, every partition has a leader and every replica is in sync."""
        return (
            self.error == ErrorCode.NONE
            and bool(self.partitions)
            and all(p.leader >= 0 and set(p.isr) == set(p.replicas) for p in self.partitions)
        )


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """The brokers a broker's metadata lists (the unfenced ones, on KRaft)."""

    cluster_id: str | None
    controller_id: int  # on KRaft: a broker that forwards to the active controller
    brokers: Mapping[int, BrokerAddress]


@dataclass(frozen=True, slots=True)
class Reassignment:
    """A partition reassignment in progress (ListPartitionReassignments)."""

    replicas: tuple[int, ...]  # target plus replicas still being removed
    adding: tuple[int, ...]
    removing: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config of a topic or broker (DescribeConfigs)."""

    name: str
    value: str | None  # None for a sensitive config
    source: ConfigSource
    read_only: bool = False
    sensitive: bool = False

    @property
    def is_default(self) -> bool:
        return self.source == ConfigSource.DEFAULT
