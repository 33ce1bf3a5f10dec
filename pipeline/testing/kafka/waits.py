"""What :class:`~pipeline.testing.kafka.KafkaCluster` waits for, as async functions on an
:class:`~pipeline.cluster.admin.Admin` (run on the cluster's private trio loop).

Each wait polls until its condition holds or its timeout passes, then raises
:class:`~pipeline.testing.kafka.dist.KafkaClusterError` saying what it waited for and what it
saw last. Admin errors while polling (a broker restarting, a topic not yet everywhere) are
remembered and polled through. ``check`` is called on every round: it raises when a node that
should be running has died, so a crash is reported at once with its log, not as a timeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import trio

from pipeline.cluster.admin import Admin
from pipeline.cluster.admin_types import AdminError, NewTopic, TopicDescription, raise_errors
from pipeline.cluster.errors import KafkaError
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.kafka.dist import KafkaClusterError

__all__ = [
    "current_leader",
    "move_leader",
    "wait_leaders_everywhere",
    "wait_ready",
    "wait_rejoined",
]

T = TypeVar("T")
Check = Callable[[], None]
_POLL = 0.1  # seconds between polls: metadata changes propagate within ~100 ms on loopback


class _Seen:
    """What a poll saw last, for the timeout message."""

    state = "nothing yet"


async def _poll(what: str, patience: float, check: Check,
                probe: Callable[[_Seen], Awaitable[T | None]]) -> T:
    seen = _Seen()
    with trio.move_on_after(patience):
        while True:
            check()
            try:
                result = await probe(seen)
            except AdminError as exc:
                if not exc.code.retriable:
                    raise
                seen.state = f"{type(exc).__name__}: {exc}"
                result = None
            except KafkaError as exc:  # connection trouble: a broker stopping or starting
                seen.state = f"{type(exc).__name__}: {exc}"
                result = None
            if result is not None:
                return result
            await trio.sleep(_POLL)
    check()
    raise KafkaClusterError(f"{what}: not within {patience:.0f}s (last seen: {seen.state})")


async def wait_ready(admin: Admin, nodes: Sequence[int], probe_topic: str, check: Check,
                     patience: float) -> None:
    """Every broker registered, then ``probe_topic`` (replication factor = nodes) fully
    replicated."""

    async def registered(seen: _Seen) -> bool | None:
        brokers = sorted((await admin.describe_cluster()).brokers)
        seen.state = f"registered brokers {brokers}"
        return True if set(nodes) <= set(brokers) else None

    await _poll(f"brokers {list(nodes)} registering", patience, check, registered)

    async def replicated(seen: _Seen) -> bool | None:
        created = await admin.create_topics([NewTopic(probe_topic, 1, len(nodes))])
        error = created[probe_topic]
        if error is not None and error.code == ErrorCode.INVALID_REPLICATION_FACTOR:
            seen.state = str(error)  # the controller has not seen every broker register yet
            return None
        raise_errors(created, ignore=(ErrorCode.TOPIC_ALREADY_EXISTS,))
        desc = (await admin.describe_topics([probe_topic]))[probe_topic]
        seen.state = repr(desc)
        return True if desc.fully_replicated else None

    await _poll(f"probe topic {probe_topic!r} fully replicated", patience, check, replicated)


async def wait_rejoined(admin: Admin, node: int, running: Sequence[int], check: Check,
                        patience: float) -> None:
    """``node`` registered, answering, and, as every running broker sees it, in the ISR of
    every partition it replicates."""

    async def rejoined(seen: _Seen) -> bool | None:
        brokers = (await admin.describe_cluster()).brokers
        if node not in brokers:
            seen.state = f"node {node} not registered (brokers {sorted(brokers)})"
            return None
        for viewer in running:
            lagging = [
                f"{t.name}-{p.partition}"
                for t in (await admin.describe_topics(node=viewer)).values()
                for p in t.partitions
                if node in p.replicas and node not in p.isr
            ]
            if lagging:
                seen.state = f"node {viewer} sees {node} outside the ISR of {lagging[:10]}"
                return None
        return True

    await _poll(f"node {node} rejoining", patience, check, rejoined)


async def wait_leaders_everywhere(
    admin: Admin, topic: str, nodes: Sequence[int], check: Check, patience: float,
    *, partition: int | None = None, leader: int | None = None,
) -> TopicDescription:
    """Every running broker in ``nodes`` sees ``topic`` with a leader for every partition
    (and, given ``partition`` and ``leader``, that leader for that partition)."""

    async def everywhere(seen: _Seen) -> TopicDescription | None:
        desc: TopicDescription | None = None
        for n in nodes:
            desc = (await admin.describe_topics([topic], node=n))[topic]
            parts = {p.partition: p.leader for p in desc.partitions}
            seen.state = f"node {n} sees {desc.error.name}, leaders {parts}"
            if desc.error != ErrorCode.NONE or not parts or min(parts.values()) < 0:
                return None
            if partition is not None and parts.get(partition) != leader:
                return None
        return desc

    want = f"leader {leader} for {topic}-{partition}" if partition is not None else (
        f"a leader for every partition of {topic!r}")
    return await _poll(f"every broker {list(nodes)} seeing {want}", patience, check, everywhere)


async def current_leader(admin: Admin, topic: str, partition: int, check: Check,
                         patience: float) -> int:
    """The partition's leader as a broker sees it now, waiting while it has none."""

    async def leader(seen: _Seen) -> int | None:
        desc = (await admin.describe_topics([topic]))[topic]
        if desc.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise KafkaClusterError(f"topic {topic!r} does not exist")
        if desc.partitions and not 0 <= partition < len(desc.partitions):
            raise ValueError(
                f"topic {topic!r} has {len(desc.partitions)} partitions; no partition {partition}"
            )
        seen.state = repr(desc)
        found = [p.leader for p in desc.partitions if p.partition == partition]
        return found[0] if found and found[0] >= 0 else None

    return await _poll(f"a leader for {topic}-{partition}", patience, check, leader)


async def move_leader(admin: Admin, topic: str, partition: int, to_node: int,
                      running: Sequence[int], check: Check, patience: float) -> None:
    """Make ``to_node`` the first replica (a reassignment), elect it (preferred election) and
    wait until every running broker names it leader."""
    deadline = trio.current_time() + patience
    desc = (await admin.describe_topics([topic]))[topic]
    if desc.error != ErrorCode.NONE:
        raise KafkaClusterError(f"cannot move the leader of {topic}-{partition}: {desc.error.name}")
    parts = [p for p in desc.partitions if p.partition == partition]
    if not parts:
        raise ValueError(f"topic {topic!r} has no partition {partition}")
    replicas = list(parts[0].replicas)
    others = [r for r in replicas if r != to_node]
    # to_node first; a replica set without it swaps it in for the last one (same size).
    target = [to_node, *others][: len(replicas)]
    if target != replicas:
        raise_errors(await admin.alter_partition_reassignments({(topic, partition): target}))

        async def reassigned(seen: _Seen) -> bool | None:
            ongoing = await admin.list_partition_reassignments([(topic, partition)])
            now = (await admin.describe_topics([topic]))[topic].partitions[partition]
            seen.state = f"replicas {list(now.replicas)} isr {list(now.isr)}, ongoing {ongoing}"
            return True if not ongoing and list(now.replicas) == target else None

        await _poll(f"reassigning {topic}-{partition} to {target}",
                    deadline - trio.current_time(), check, reassigned)

    async def elected(seen: _Seen) -> bool | None:
        results = await admin.elect_leaders([(topic, partition)])
        error = next(iter(results.values()), None)
        if error is not None and error.code != ErrorCode.ELECTION_NOT_NEEDED:
            if not error.code.retriable:
                raise error
            seen.state = str(error)  # e.g. PREFERRED_LEADER_NOT_AVAILABLE: not in sync yet
            return None
        return True

    await _poll(f"electing {to_node} leader of {topic}-{partition}",
                deadline - trio.current_time(), check, elected)
    await wait_leaders_everywhere(admin, topic, running, check, deadline - trio.current_time(),
                                  partition=partition, leader=to_node)
