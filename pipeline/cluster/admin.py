"""An async admin client on the cluster layer: topics, configs, reassignments, elections.

# Strategy

An :class:`Admin` sends admin requests over a :class:`~pipeline.cluster.pool.Cluster`'s
connections: versions are negotiated per connection like every other request, so a broker
that lacks an API gives :class:`~pipeline.cluster.errors.UnsupportedApiError` naming it.

On KRaft any broker forwards admin requests to the active controller (the Java client sends
them to Metadata's ``controller_id``, which KRaft fills with a random live broker), so a
request goes to any connected broker, or to one node when the resource lives there (broker
configs, a node's own view of the metadata).

Every call has one deadline (``timeout``). Until then, a connection failure, a request that
timed out, and a whole-request error that is retriable (NOT_CONTROLLER, REQUEST_TIMED_OUT...)
are retried on another connection after a backoff; then the call raises
:class:`AdminError` (REQUEST_TIMED_OUT) naming the last failure. When no bootstrap address
ever answered, the call fails at once with the
:class:`~pipeline.cluster.errors.BootstrapError` (each address and its cause) instead.
Per-resource errors are returned, never retried: ``create_topics`` answers ``{name: None |
AdminError}``, and :func:`~pipeline.cluster.admin_types.raise_errors` turns that into an
exception. A retried mutation may report what its lost first attempt did
(TOPIC_ALREADY_EXISTS for a topic it created itself), as in every Kafka client.

:meth:`Admin.open` builds the Cluster an Admin owns from a ``ClusterConfig`` (with an admin
client's defaults: :func:`~pipeline.cluster.admin_sender.admin_cluster_config`);
``Admin(cluster)`` borrows one that is already open (a producer's, say). ``Admin.open(..., direct=True)`` talks
to the bootstrap addresses themselves and never to addresses learned from metadata: for a
broker that advertises an address this host cannot reach, or one behind a fault proxy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from pipeline.cluster.admin_configs import alter_configs, describe_configs
from pipeline.cluster.admin_sender import (
    AdminSender,
    DirectConnection,
    admin_cluster_config,
    error_or_none,
    unique_names,
)
from pipeline.cluster.admin_types import (
    AdminError,
    ClusterDescription,
    ConfigEntry,
    ElectionType,
    NewTopic,
    PartitionDescription,
    Reassignment,
    TopicDescription,
    TopicPartition,
)
from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.errors import ConfigError
from pipeline.cluster.metadata import BrokerAddress
from pipeline.cluster.pool import Cluster
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages import alter_partition_reassignments as apr
from pipeline.protocol.messages import create_topics as ct
from pipeline.protocol.messages import delete_topics as dt
from pipeline.protocol.messages import elect_leaders as el
from pipeline.protocol.messages import list_partition_reassignments as lpr
from pipeline.protocol.messages import metadata as md
from pipeline.util.groups import unwrap_single_errors

__all__ = ["Admin"]

_TOPIC, _BROKER = 2, 4  # config resource types


class Admin:
    """Admin operations over a cluster client. Open with :meth:`open`."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        timeout: float = 60.0,
        direct: DirectConnection | None = None,
    ) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"invalid timeout={timeout!r}: must be a number of seconds > 0")
        self.cluster = cluster
        self.timeout = timeout
        self._sender = AdminSender(cluster, timeout=timeout, direct=direct)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        bootstrap: str | Sequence[str],
        config: ClusterConfig | None = None,
        *,
        timeout: float = 60.0,  # noqa: ASYNC109 - bounds each admin call, not this one
        direct: bool = False,
        **options: Any,
    ) -> AsyncIterator[Admin]:
        """Open an admin client (and the cluster client it owns) on ``bootstrap``.

        Args:
          config, options: the cluster client's settings, as for ``Cluster.open``
              (:class:`~pipeline.cluster.config.ClusterConfig`; keyword ``options`` over
              it). Without a ``config``, an admin client's own defaults apply first:
              ``client_id="pipeline-admin"``, a request timeout a little longer than
              ``timeout`` (a request may take all of it) and a metadata timeout a little
              shorter (so a call that reaches no broker says why).
          timeout: bounds every call, retries included.
          direct: send every request to a bootstrap address, never to one learned from
              metadata (then calls naming a ``node`` are refused).

        Raises:
          ConfigError: an unknown or invalid option, before anything connects.
        """
        cfg = admin_cluster_config(config, options, timeout)
        with unwrap_single_errors():  # one real error comes out as itself
            async with Cluster.open(bootstrap, cfg) as cluster:
                if not direct:
                    yield cls(cluster, timeout=timeout)
                    return
                async with trio.open_nursery() as nursery:
                    pinned = DirectConnection(nursery, cluster, bootstrap)
                    try:
                        yield cls(cluster, timeout=timeout, direct=pinned)
                    finally:
                        await pinned.aclose()

    # ---------------------------------------------------------------- cluster

    async def describe_cluster(self, *, node: int | None = None) -> ClusterDescription:
        """The brokers, cluster id and controller as one broker (``node``, else any) sees them."""
        response = await self._metadata([], node=node)
        return ClusterDescription(
            cluster_id=response.cluster_id,
            controller_id=response.controller_id,
            brokers={b.node_id: BrokerAddress(b.host, b.port) for b in response.brokers},
        )

    async def describe_topics(
        self, topics: Iterable[str] | None = None, *, node: int | None = None
    ) -> dict[str, TopicDescription]:
        """Describe ``topics`` (every topic when None) as one broker (``node``, else any)
        sees them. A topic that does not exist is described with its error
        (UNKNOWN_TOPIC_OR_PARTITION), not raised."""
        names = None if topics is None else unique_names(topics)
        response = await self._metadata(names, node=node)
        out: dict[str, TopicDescription] = {}
        for t in response.topics:
            if t.name is None:
                continue
            partitions = tuple(
                PartitionDescription(
                    partition=p.partition_index,
                    leader=p.leader_id,
                    leader_epoch=p.leader_epoch,
                    replicas=tuple(p.replica_nodes),
                    isr=tuple(p.isr_nodes),
                    offline=tuple(p.offline_replicas),
                    error=error_code(p.error_code),
                )
                for p in sorted(t.partitions, key=lambda p: p.partition_index)
            )
            out[t.name] = TopicDescription(
                name=t.name,
                error=error_code(t.error_code),
                topic_id=t.topic_id if any(t.topic_id.bytes) else None,
                internal=bool(t.is_internal),
                partitions=partitions,
            )
        return out

    # ----------------------------------------------------------------- topics

    async def create_topics(
        self, topics: Sequence[NewTopic], *, validate_only: bool = False
    ) -> dict[str, AdminError | None]:
        """Create ``topics``; ``{name: None}`` for each one created (or valid, with
        ``validate_only``), ``{name: AdminError}`` for each refused."""
        if not topics:
            return {}
        names = [t.name for t in topics]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate topic names in {names!r}")

        def build(version: int, timeout_ms: int) -> ct.CreateTopicsRequest:
            return ct.CreateTopicsRequest(
                topics=tuple(_creatable(t) for t in topics),
                timeout_ms=timeout_ms,
                validate_only=validate_only,
            )

        response = await self._call(ApiKey.CREATE_TOPICS, build)
        results = {
            r.name: error_or_none(r.error_code, r.error_message, r.name) for r in response.topics
        }
        return _complete(results, names, "CreateTopics")

    async def create_topic(
        self,
        name: str,
        partitions: int = -1,
        replication_factor: int = -1,
        config: Mapping[str, str] | None = None,
        *,
        exist_ok: bool = False,
    ) -> bool:
        """Create one topic; True if created, False if it existed (only with ``exist_ok``).

        Raises:
          AdminError: the broker refused (TOPIC_ALREADY_EXISTS unless ``exist_ok``).
        """
        topic = NewTopic(name, partitions, replication_factor, dict(config or {}))
        error = (await self.create_topics([topic]))[name]
        if error is None:
            return True
        if exist_ok and error.code == ErrorCode.TOPIC_ALREADY_EXISTS:
            return False
        raise error

    async def delete_topics(self, topics: Iterable[str]) -> dict[str, AdminError | None]:
        """Delete topics by name; ``{name: None | AdminError}``."""
        names = unique_names(topics)
        if not names:
            return {}

        def build(version: int, timeout_ms: int) -> dt.DeleteTopicsRequest:
            if version >= 6:
                return dt.DeleteTopicsRequest(
                    topics=tuple(dt.DeleteTopicState(name=n) for n in names),
                    timeout_ms=timeout_ms,
                )
            return dt.DeleteTopicsRequest(topic_names=tuple(names), timeout_ms=timeout_ms)

        response = await self._call(ApiKey.DELETE_TOPICS, build)
        results = {
            r.name: error_or_none(r.error_code, getattr(r, "error_message", None), r.name)
            for r in response.responses
            if r.name is not None
        }
        return _complete(results, names, "DeleteTopics")

    # ----------------------------------------------------- partitions, leaders

    async def alter_partition_reassignments(
        self, reassignments: Mapping[tuple[str, int], Sequence[int] | None]
    ) -> dict[TopicPartition, AdminError | None]:
        """Start moving partitions to new replica lists (preferred leader first), or cancel
        a reassignment in progress with ``None``. Returns once the controller accepted them;
        the data moves in the background (:meth:`list_partition_reassignments`)."""
        wanted = {TopicPartition(*tp): r for tp, r in reassignments.items()}
        if not wanted:
            return {}
        by_topic: dict[str, list[apr.ReassignablePartition]] = {}
        for tp, replicas in sorted(wanted.items()):
            by_topic.setdefault(tp.topic, []).append(
                apr.ReassignablePartition(
                    partition_index=tp.partition,
                    replicas=None if replicas is None else tuple(replicas),
                )
            )

        def build(version: int, timeout_ms: int) -> apr.AlterPartitionReassignmentsRequest:
            return apr.AlterPartitionReassignmentsRequest(
                timeout_ms=timeout_ms,
                topics=tuple(
                    apr.ReassignableTopic(name=t, partitions=tuple(ps))
                    for t, ps in by_topic.items()
                ),
            )

        response = await self._call(ApiKey.ALTER_PARTITION_REASSIGNMENTS, build, top_error=True)
        results = {
            TopicPartition(t.name, p.partition_index): error_or_none(
                p.error_code, p.error_message, f"{t.name}-{p.partition_index}"
            )
            for t in response.responses
            for p in t.partitions
        }
        return _complete(results, list(wanted), "AlterPartitionReassignments")

    async def list_partition_reassignments(
        self, partitions: Iterable[tuple[str, int]] | None = None
    ) -> dict[TopicPartition, Reassignment]:
        """The reassignments in progress (among ``partitions``, or all of them)."""
        topics: tuple[lpr.ListPartitionReassignmentsTopics, ...] | None = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, index in sorted(set(partitions)):
                by_topic.setdefault(topic, []).append(index)
            topics = tuple(
                lpr.ListPartitionReassignmentsTopics(name=t, partition_indexes=tuple(ps))
                for t, ps in by_topic.items()
            )

        def build(version: int, timeout_ms: int) -> lpr.ListPartitionReassignmentsRequest:
            return lpr.ListPartitionReassignmentsRequest(timeout_ms=timeout_ms, topics=topics)

        response = await self._call(ApiKey.LIST_PARTITION_REASSIGNMENTS, build, top_error=True)
        return {
            TopicPartition(t.name, p.partition_index): Reassignment(
                replicas=tuple(p.replicas),
                adding=tuple(p.adding_replicas),
                removing=tuple(p.removing_replicas),
            )
            for t in response.topics
            for p in t.partitions
        }

    async def elect_leaders(
        self,
        partitions: Iterable[tuple[str, int]] | None = None,
        *,
        election: ElectionType = ElectionType.PREFERRED,
    ) -> dict[TopicPartition, AdminError | None]:
        """Run leader elections (preferred by default) for ``partitions`` (None: all).

        A partition already led by its preferred replica answers ELECTION_NOT_NEEDED."""
        topic_partitions: tuple[el.TopicPartitions, ...] | None = None
        wanted: list[TopicPartition] = []
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, index in sorted(set(partitions)):
                by_topic.setdefault(topic, []).append(index)
                wanted.append(TopicPartition(topic, index))
            topic_partitions = tuple(
                el.TopicPartitions(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()
            )

        def build(version: int, timeout_ms: int) -> el.ElectLeadersRequest:
            if version == 0 and election != ElectionType.PREFERRED:
                raise AdminError(
                    ErrorCode.UNSUPPORTED_VERSION, "this broker only runs preferred elections"
                )
            return el.ElectLeadersRequest(
                election_type=int(election) if version >= 1 else 0,
                topic_partitions=topic_partitions,
                timeout_ms=timeout_ms,
            )

        response = await self._call(ApiKey.ELECT_LEADERS, build, top_error=True)
        results = {
            TopicPartition(r.topic, p.partition_id): error_or_none(
                p.error_code, p.error_message, f"{r.topic}-{p.partition_id}"
            )
            for r in response.replica_election_results
            for p in r.partition_result
        }
        return _complete(results, wanted, "ElectLeaders")

    # ---------------------------------------------------------------- configs

    async def describe_topic_config(
        self, topic: str, names: Iterable[str] | None = None
    ) -> dict[str, ConfigEntry]:
        """The topic's configs (``names`` only, or all)."""
        return await describe_configs(self._sender, _TOPIC, topic, names, node=None)

    async def describe_broker_config(
        self, node_id: int, names: Iterable[str] | None = None
    ) -> dict[str, ConfigEntry]:
        """Broker ``node_id``'s configs (asked of that broker itself)."""
        return await describe_configs(self._sender, _BROKER, str(node_id), names, node=node_id)

    async def alter_topic_config(
        self,
        topic: str,
        updates: Mapping[str, str] | None = None,
        delete: Iterable[str] = (),
        *,
        validate_only: bool = False,
    ) -> None:
        """Set (``updates``) and/or ``delete`` (back to the default) topic configs,
        incrementally: configs not named keep their values.

        Raises:
          AdminError: the broker refused (INVALID_CONFIG, UNKNOWN_TOPIC_OR_PARTITION...).
        """
        await alter_configs(self._sender, _TOPIC, topic, updates or {}, delete, validate_only, node=None)

    async def alter_broker_config(
        self,
        node_id: int,
        updates: Mapping[str, str] | None = None,
        delete: Iterable[str] = (),
        *,
        validate_only: bool = False,
    ) -> None:
        """Set and/or delete dynamic configs of broker ``node_id`` (sent to that broker)."""
        await alter_configs(self._sender,
            _BROKER, str(node_id), updates or {}, delete, validate_only, node=node_id
        )

    # ---------------------------------------------------------------- sending

    async def _metadata(self, topics: list[str] | None, *, node: int | None) -> Any:
        def build(version: int, timeout_ms: int) -> md.MetadataRequest:
            return md.MetadataRequest(
                topics=None if topics is None else tuple(
                    md.MetadataRequestTopic(name=t) for t in topics
                ),
                allow_auto_topic_creation=False,
            )

        return await self._call(ApiKey.METADATA, build, node=node)

    async def _call(
        self,
        api: ApiKey,
        build: Callable[[int, int], Any],
        *,
        node: int | None = None,
        top_error: bool = False,
    ) -> Any:
        return await self._sender.call(api, build, node=node, top_error=top_error)


def _creatable(t: NewTopic) -> ct.CreatableTopic:
    return ct.CreatableTopic(
        name=t.name,
        num_partitions=t.partitions,
        replication_factor=t.replication_factor,
        assignments=tuple(
            ct.CreatableReplicaAssignment(partition_index=p, broker_ids=tuple(r))
            for p, r in (t.assignments or {}).items()
        ),
        configs=tuple(ct.CreatableTopicConfig(name=k, value=v) for k, v in t.config.items()),
    )


def _complete(results: dict[Any, AdminError | None], wanted: Iterable[Any], api: str
              ) -> dict[Any, AdminError | None]:
    """Every requested key gets an answer: one the response left out is an error."""
    for key in wanted:
        if key not in results:
            results[key] = AdminError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"missing from the {api} response", resource=key
            )
    return results
