"""ApiVersions, Metadata, CreateTopics and DeleteTopics.

Kafka 3.x behaviour, deliberately unlike tansu where the two differ:

* Metadata auto-creates a missing topic only when the request allows it (v4+
  flag; always for v1-v3) AND the fake's `auto_create_topics` is on. The
  response that creates it says LEADER_NOT_AVAILABLE (5) with no partitions,
  as Kafka's does; the next Metadata sees it.
* A stopped broker disappears from Metadata's broker list.
* ListOffsets and Fetch: `reads.py`.
* ApiVersions v3+ lists the finalized features (`FakeCluster(transaction_version=)`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import api_versions as av
from pipeline.protocol.messages import create_topics as ct
from pipeline.protocol.messages import delete_topics as dt
from pipeline.protocol.messages import metadata as md

from .state import FakeState, PartitionState, TopicState

Inject = Callable[[str | None, int | None], int | None]

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def valid_topic_name(name: str) -> bool:
    return bool(_LEGAL_TOPIC.match(name)) and name not in (".", "..")


def new_topic(
    state: FakeState,
    name: str,
    partitions: int,
    *,
    topic_id: Any,
    start: int,
    replication_factor: int,
    leaders: Sequence[int] | None = None,
    configs: dict[str, str] | None = None,
) -> TopicState:
    """Create a topic with leaders spread round-robin from `start` over the alive brokers
    (Kafka's assignment: random start index, then one broker after the other)."""
    alive = sorted(b.node_id for b in state.alive_brokers()) or sorted(state.brokers)
    parts = []
    for p in range(partitions):
        if leaders is not None:
            leader = leaders[p]
            if leader not in state.brokers:
                raise ValueError(f"leader {leader} is not a broker")
        else:
            leader = alive[(start + p) % len(alive)]
        i = alive.index(leader) if leader in alive else 0
        replicas = [leader] + [
            alive[(i + k) % len(alive)]
            for k in range(1, len(alive))
            if alive[(i + k) % len(alive)] != leader
        ]
        parts.append(
            PartitionState(
                topic=name,
                index=p,
                leader=leader,
                leader_epoch=0,
                replicas=tuple(replicas[: max(1, replication_factor)]),
            )
        )
    topic = TopicState(name=name, topic_id=topic_id, partitions=parts, configs=dict(configs or {}))
    state.topics[name] = topic
    return topic


# --------------------------------------------------------------------------
# ApiVersions


def handle_api_versions(
    supported: dict[int, tuple[int, int]], injected: int | None,
    features: dict[str, int] | None = None,
) -> av.ApiVersionsResponse:
    keys = tuple(
        av.ApiVersion(api_key=k, min_version=lo_, max_version=hi)
        for k, (lo_, hi) in sorted(supported.items())
    )
    finalized = tuple(
        av.FinalizedFeatureKey(name=name, min_version_level=level, max_version_level=level)
        for name, level in sorted((features or {}).items()) if level > 0  # 0: not listed
    )
    return av.ApiVersionsResponse(
        error_code=injected or 0, api_keys=keys, finalized_features=finalized,
        finalized_features_epoch=1 if finalized else -1,
    )


# --------------------------------------------------------------------------
# Metadata


def handle_metadata(
    state: FakeState,
    version: int,
    request: md.MetadataRequest,
    inject: Inject,
    create: Callable[[str], TopicState],
) -> md.MetadataResponse:
    brokers = tuple(
        md.MetadataResponseBroker(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
        for b in sorted(state.alive_brokers(), key=lambda b: b.node_id)
    )
    allow_auto = request.allow_auto_topic_creation if version >= 4 else True
    topics_out: list[md.MetadataResponseTopic] = []
    if request.topics is None or (version == 0 and not request.topics):
        names: list[str] = sorted(state.topics)
        explicit = False
    else:
        names = [t.name for t in request.topics if t.name is not None]
        explicit = True
    for name in names:
        injected = inject(name, None)
        topic = state.topics.get(name)
        if injected is not None:
            topics_out.append(_md_topic(name, injected, topic))
        elif topic is not None:
            topics_out.append(
                _md_topic(name, 0, topic, alive={b.node_id for b in state.alive_brokers()})
            )
        elif not valid_topic_name(name):
            topics_out.append(_md_topic(name, ErrorCode.INVALID_TOPIC_EXCEPTION, None))
        elif explicit and allow_auto and state.config.auto_create_topics:
            created = create(name)
            topics_out.append(
                _md_topic(name, ErrorCode.LEADER_NOT_AVAILABLE, created, partitions=False)
            )
        else:
            topics_out.append(_md_topic(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None))
    return md.MetadataResponse(
        brokers=brokers,
        cluster_id=state.config.cluster_id,
        controller_id=state.controller_id(),
        topics=tuple(topics_out),
    )


def _md_topic(
    name: str,
    code: int,
    topic: TopicState | None,
    *,
    alive: set[int] | None = None,
    partitions: bool = True,
) -> md.MetadataResponseTopic:
    parts: list[md.MetadataResponsePartition] = []
    if topic is not None and partitions and code == 0:
        for p in topic.partitions:
            online = alive is None or p.leader in alive
            isr = tuple(r for r in p.replicas if alive is None or r in alive)
            parts.append(
                md.MetadataResponsePartition(
                    error_code=0 if online else int(ErrorCode.LEADER_NOT_AVAILABLE),
                    partition_index=p.index,
                    leader_id=p.leader if online else -1,
                    leader_epoch=p.leader_epoch,
                    replica_nodes=p.replicas,
                    isr_nodes=isr,
                    offline_replicas=tuple(r for r in p.replicas if r not in isr),
                )
            )
    kwargs: dict[str, Any] = {}
    if topic is not None:
        kwargs["topic_id"] = topic.topic_id
    return md.MetadataResponseTopic(
        error_code=int(code), name=name, partitions=tuple(parts), **kwargs
    )


# --------------------------------------------------------------------------
# CreateTopics / DeleteTopics


def handle_create_topics(
    state: FakeState,
    version: int,
    request: ct.CreateTopicsRequest,
    inject: Inject,
    create: Callable[[str, int, int, Sequence[int] | None, dict[str, str]], TopicState],
) -> ct.CreateTopicsResponse:
    results = []
    seen: set[str] = set()
    for t in request.topics:
        code, message, topic = _create_one(state, request, t, seen, inject, create)
        kwargs: dict[str, Any] = {}
        if topic is not None:
            kwargs["topic_id"] = topic.topic_id
            kwargs["num_partitions"] = len(topic.partitions)
            kwargs["replication_factor"] = (
                len(topic.partitions[0].replicas) if topic.partitions else -1
            )
        results.append(
            ct.CreatableTopicResult(
                name=t.name, error_code=int(code), error_message=message, **kwargs
            )
        )
    return ct.CreateTopicsResponse(topics=tuple(results))


def _create_one(
    state: FakeState,
    request: ct.CreateTopicsRequest,
    t: ct.CreatableTopic,
    seen: set[str],
    inject: Inject,
    create: Callable[[str, int, int, Sequence[int] | None, dict[str, str]], TopicState],
) -> tuple[int, str | None, TopicState | None]:
    injected = inject(t.name, None)
    if injected is not None:
        return injected, None, None
    if t.name in seen:
        return ErrorCode.INVALID_REQUEST, "Duplicate topic name.", None
    seen.add(t.name)
    if not valid_topic_name(t.name):
        return ErrorCode.INVALID_TOPIC_EXCEPTION, f"Topic name {t.name!r} is illegal.", None
    if t.name in state.topics:
        return ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{t.name}' already exists.", None
    configs = {c.name: c.value for c in t.configs if c.value is not None}
    leaders: list[int] | None = None
    if t.assignments:
        if t.num_partitions != -1 or t.replication_factor != -1:
            return (
                ErrorCode.INVALID_REQUEST,
                "Both assignments and partitions/replication factor set.",
                None,
            )
        by_index = sorted(t.assignments, key=lambda a: a.partition_index)
        if [a.partition_index for a in by_index] != list(range(len(by_index))):
            return ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Partitions must be 0..n-1.", None
        leaders = []
        for a in by_index:
            if not a.broker_ids or any(b not in state.brokers for b in a.broker_ids):
                return ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Unknown broker in assignment.", None
            leaders.append(a.broker_ids[0])
        partitions = len(by_index)
        rf = len(by_index[0].broker_ids)
    else:
        partitions = (
            t.num_partitions if t.num_partitions != -1 else state.config.auto_create_partitions
        )
        rf = (
            t.replication_factor
            if t.replication_factor != -1
            else min(state.config.default_replication_factor, len(state.brokers))
        )
        if partitions <= 0:
            return ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0.", None
        if rf <= 0 or rf > len(state.alive_brokers()):
            return (
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"Replication factor: {rf} larger than available brokers: {len(state.alive_brokers())}.",
                None,
            )
    if "max.message.bytes" in configs:
        try:
            int(configs["max.message.bytes"])
        except ValueError:
            return ErrorCode.INVALID_CONFIG, "max.message.bytes must be an integer.", None
    if request.validate_only:
        return 0, None, None
    return 0, None, create(t.name, partitions, rf, leaders, configs)


def handle_delete_topics(
    state: FakeState, version: int, request: dt.DeleteTopicsRequest, inject: Inject
) -> dt.DeleteTopicsResponse:
    targets: list[tuple[str | None, Any]] = []
    if version >= 6:
        targets = [(t.name, t.topic_id) for t in request.topics]
    else:
        targets = [(n, None) for n in request.topic_names]
    results = []
    for name, topic_id in targets:
        if name is None:
            found = next((t for t in state.topics.values() if t.topic_id == topic_id), None)
            name_out = found.name if found is not None else None
        else:
            found = state.topics.get(name)
            name_out = name
        injected = inject(name_out, None)
        kwargs: dict[str, Any] = {}
        if topic_id is not None:
            kwargs["topic_id"] = topic_id
        if injected is not None:
            code = injected
        elif found is None:
            code = int(
                ErrorCode.UNKNOWN_TOPIC_ID if name is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
        else:
            code = 0
            del state.topics[found.name]
            if version >= 6:
                kwargs["topic_id"] = found.topic_id
        results.append(dt.DeletableTopicResult(name=name_out, error_code=code, **kwargs))
    return dt.DeleteTopicsResponse(responses=tuple(results))


def random_uuid(bits: int) -> uuid.UUID:
    return uuid.UUID(int=bits)
