"""The fake cluster's group coordinator answers raw group requests as Apache Kafka 4.1 does.

As ``test_fake_vs_kafka.py`` (whose targets and helpers this module reuses): each scenario
speaks raw requests to a target's group coordinator and returns the answers normalised
(member ids become ``m1``, ``m2``... in order of appearance); the answers Kafka gave are
pinned in ``EXPECTED``, checked against the fake in the fast suite and against the
session's 3-node Kafka under ``-m kafka``.

The paths covered are the ones the consumer (and its scenario tests) rely on: KIP-394's
MEMBER_ID_REQUIRED, a join/sync/heartbeat cycle, a second member's join (the first
learning of it by REBALANCE_IN_PROGRESS, commits accepted while preparing the rebalance
and refused while completing it), a follower's SyncGroup waiting for the leader's,
generation and member checks, static members replaced without a rebalance (and the old
member id fenced), leaving, listing and describing groups, and the validation errors.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from pipeline.cluster.connection import BrokerConnection
from pipeline.protocol.api import ApiKey
from pipeline.protocol.consumer_protocol import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import describe_groups as dsg
from pipeline.protocol.messages import find_coordinator as fc
from pipeline.protocol.messages import heartbeat as hb
from pipeline.protocol.messages import join_group as jg
from pipeline.protocol.messages import leave_group as lg
from pipeline.protocol.messages import list_groups as lsg
from pipeline.protocol.messages import offset_commit as oc
from pipeline.protocol.messages import offset_fetch as of
from pipeline.protocol.messages import sync_group as sg
from pipeline.testing.kafka import KafkaCluster

from .test_fake_vs_kafka import Target, fake_target, kafka_target, until

E = ErrorCode
SUB = ConsumerProtocolSubscription(topics=("t",)).encode()
ASSIGNED = ConsumerProtocolAssignment.of([("t", 0)]).encode()


class Ids:
    """Member ids normalised by order of appearance (each broker invents its own)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {"": ""}

    def __call__(self, member_id: str) -> str:
        if member_id not in self.names:
            self.names[member_id] = f"m{len(self.names)}"
        return self.names[member_id]


class Group:
    """Raw requests for one group, each member on a connection of its own (a broker
    answers a connection's requests in order, and a JoinGroup may wait)."""

    def __init__(self, t: Target, group_id: str, topic: str, nursery: trio.Nursery) -> None:
        self.t, self.group_id, self.topic, self.nursery = t, group_id, topic, nursery
        self.node = -1

    async def find(self) -> int:
        conn = await self.t.cluster.any_connection()
        version = conn.version_for(ApiKey.FIND_COORDINATOR)

        async def ask() -> Any:
            r = await conn.request(fc.FindCoordinatorRequest(coordinator_keys=(self.group_id,)),
                                   version=version)
            return r.coordinators[0]

        found = await until(ask, lambda c: c.error_code == E.NONE)
        node: int = found.node_id
        self.node = node
        return node

    async def settle(self) -> None:
        """Until the group's coordinator answers as such (a fresh Kafka cluster loads
        and moves its coordinators for a while): FindCoordinator, then an OffsetFetch
        that must not say COORDINATOR_LOAD_IN_PROGRESS or NOT_COORDINATOR."""
        async def ask() -> int:
            await self.find()
            conn = await self.t.cluster.connection(self.node)
            r = await conn.request(of.OffsetFetchRequest(groups=(of.OffsetFetchRequestGroup(
                group_id=self.group_id, topics=(of.OffsetFetchRequestTopics(
                    name=self.topic, partition_indexes=(0,)),)),)),
                version=conn.version_for(ApiKey.OFFSET_FETCH))
            code: int = r.groups[0].error_code
            return code

        await until(ask, lambda code: code == E.NONE)

    async def conn(self, client_id: str = "c") -> BrokerConnection:
        address = self.t.cluster.metadata.brokers[self.node]
        cfg = self.t.cluster.config
        conn = await BrokerConnection.connect(
            self.nursery, cfg.make_connector(), address.host, address.port,
            node_id=self.node, config=cfg, client_id=client_id)
        return conn

    async def join(self, conn: BrokerConnection, member_id: str = "", *,
                   instance: str | None = None, session_ms: int = 30000,
                   protocol_type: str = "consumer", protocol: str = "range") -> jg.JoinGroupResponse:
        request = jg.JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=session_ms, rebalance_timeout_ms=60000,
            member_id=member_id, group_instance_id=instance, protocol_type=protocol_type,
            protocols=(jg.JoinGroupRequestProtocol(name=protocol, metadata=SUB),))
        return await conn.request(request, version=conn.version_for(ApiKey.JOIN_GROUP))

    async def sync(self, conn: BrokerConnection, member_id: str, generation: int,
                   assignments: dict[str, bytes] | None = None,
                   instance: str | None = None) -> sg.SyncGroupResponse:
        request = sg.SyncGroupRequest(
            group_id=self.group_id, generation_id=generation, member_id=member_id,
            group_instance_id=instance, protocol_type="consumer", protocol_name="range",
            assignments=tuple(sg.SyncGroupRequestAssignment(member_id=m, assignment=a)
                              for m, a in (assignments or {}).items()))
        return await conn.request(request, version=conn.version_for(ApiKey.SYNC_GROUP))

    async def heartbeat(self, conn: BrokerConnection, member_id: str, generation: int,
                        instance: str | None = None) -> int:
        r = await conn.request(hb.HeartbeatRequest(
            group_id=self.group_id, generation_id=generation, member_id=member_id,
            group_instance_id=instance), version=conn.version_for(ApiKey.HEARTBEAT))
        code: int = r.error_code
        return code

    async def commit(self, conn: BrokerConnection, member_id: str, generation: int,
                     offset: int, *, version: int | None = None) -> int:
        r = await conn.request(oc.OffsetCommitRequest(
            group_id=self.group_id, generation_id_or_member_epoch=generation, member_id=member_id,
            topics=(oc.OffsetCommitRequestTopic(name=self.topic, partitions=(
                oc.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset),)),)),
            version=version if version is not None else conn.version_for(ApiKey.OFFSET_COMMIT))
        return r.topics[0].partitions[0].error_code

    async def committed(self, conn: BrokerConnection) -> int:
        r = await conn.request(of.OffsetFetchRequest(groups=(of.OffsetFetchRequestGroup(
            group_id=self.group_id, topics=(of.OffsetFetchRequestTopics(
                name=self.topic, partition_indexes=(0,)),)),), require_stable=True),
            version=conn.version_for(ApiKey.OFFSET_FETCH))
        return r.groups[0].topics[0].partitions[0].committed_offset

    async def describe(self, conn: BrokerConnection, ids: Ids, version: int | None = None
                       ) -> tuple[Any, ...]:
        r = await conn.request(dsg.DescribeGroupsRequest(groups=(self.group_id,)),
                               version=version if version is not None
                               else conn.version_for(ApiKey.DESCRIBE_GROUPS))
        (d,) = r.groups
        return (d.error_code, d.group_state, d.protocol_type, d.protocol_data,
                sorted((ids(m.member_id), m.client_id, m.member_metadata == SUB,
                        m.member_assignment) for m in d.members))  # Kafka's order varies

    async def listed(self, conn: BrokerConnection) -> list[tuple[str, str]]:
        r = await conn.request(lsg.ListGroupsRequest(), version=conn.version_for(ApiKey.LIST_GROUPS))
        return [(g.group_state, g.protocol_type) for g in r.groups if g.group_id == self.group_id]

    async def leave(self, conn: BrokerConnection, member_id: str, instance: str | None = None
                    ) -> tuple[int, list[int]]:
        r = await conn.request(lg.LeaveGroupRequest(group_id=self.group_id, members=(
            lg.MemberIdentity(member_id=member_id, group_instance_id=instance),)),
            version=conn.version_for(ApiKey.LEAVE_GROUP))
        return r.error_code, [m.error_code for m in r.members]


async def answered(answers: dict[str, Any], key: str) -> None:
    """Until a parked request's task stored its answer."""
    with trio.fail_after(30):
        while key not in answers:  # noqa: ASYNC110 - a request another task waits on
            await trio.sleep(0.01)


def joined(r: jg.JoinGroupResponse, ids: Ids) -> tuple[Any, ...]:
    return (r.error_code, r.generation_id, r.protocol_type, r.protocol_name, ids(r.leader),
            ids(r.member_id), r.skip_assignment,
            sorted((ids(m.member_id), m.group_instance_id, m.metadata == SUB)
                   for m in r.members))  # Kafka's order varies


@asynccontextmanager
async def group_of(t: Target, name: str, topic: str) -> AsyncIterator[Group]:
    """A new group (its commits go to ``topic``, created here with one partition)."""
    await t.create(topic, 1, 1, {})
    async with trio.open_nursery() as nursery:
        g = Group(t, f"{name}-{uuid.uuid4().hex[:6]}", topic, nursery)
        await g.settle()
        yield g
        nursery.cancel_scope.cancel()


# -- scenarios -----------------------------------------------------------------


async def one_member(t: Target, topic: str) -> list[Any]:
    """KIP-394, a join/sync/heartbeat cycle, commits, describe/list, leave."""
    ids = Ids()
    async with group_of(t, "one", topic) as g:
        c = await g.conn("client-one")
        first = await g.join(c)
        out: list[Any] = [(first.error_code, first.member_id.startswith("client-one-"))]
        mid = first.member_id
        r = await g.join(c, mid)
        out.append(joined(r, ids))
        s = await g.sync(c, mid, r.generation_id, {mid: ASSIGNED})
        out.append((s.error_code, s.protocol_type, s.protocol_name, s.assignment == ASSIGNED))
        out.append([await g.heartbeat(c, mid, 1), await g.heartbeat(c, mid, 2),
                    await g.heartbeat(c, "nobody", 1)])
        out.append(await g.describe(c, ids))
        out.append([await g.commit(c, mid, 1, 7), await g.commit(c, mid, 0, 8),
                    await g.commit(c, "", -1, 9), await g.committed(c)])
        out.append(await g.listed(c))
        out.append(await g.leave(c, mid))
        out.append(await g.describe(c, ids))
        out.append([await g.heartbeat(c, mid, 1), await g.commit(c, "", -1, 10),
                    await g.committed(c)])
        out.append(await g.listed(c))
    return out


async def second_member(t: Target, topic: str) -> list[Any]:
    """A second member's JoinGroup parks until the first rejoins, which it learns from a
    heartbeat; commits of the old generation pass while the rebalance prepares, commits
    of the new one are refused until the leader's SyncGroup, which the follower's waits
    for."""
    ids = Ids()
    async with group_of(t, "two", topic) as g:
        c1, c2 = await g.conn("a"), await g.conn("b")
        m1 = (await g.join(c1)).member_id
        r1 = await g.join(c1, m1)
        await g.sync(c1, m1, 1, {m1: ASSIGNED})
        m2 = (await g.join(c2)).member_id
        ids(m1), ids(m2)
        answers: dict[str, Any] = {}

        async def member2_joins() -> None:
            answers["join2"] = await g.join(c2, m2)

        g.nursery.start_soon(member2_joins)
        out: list[Any] = []
        hb1 = await until(lambda: g.heartbeat(c1, m1, 1), lambda code: code != E.NONE)
        out.append(hb1)
        out.append(await g.describe(c1, ids))
        out.append(await g.commit(c1, m1, 1, 3))  # preparing: the old generation commits
        r1 = await g.join(c1, m1)
        await answered(answers, "join2")
        out.append(joined(r1, ids))
        out.append(joined(answers["join2"], ids))
        out.append(await g.commit(c1, m1, 2, 4))  # completing: refused
        out.append(await g.heartbeat(c2, m2, 2))  # completing: a heartbeat is fine

        async def member2_syncs() -> None:
            answers["sync2"] = await g.sync(c2, m2, 2)

        g.nursery.start_soon(member2_syncs)
        await trio.sleep(0.5)
        out.append("sync2" in answers)  # the follower waits for the leader
        s1 = await g.sync(c1, m1, 2, {m1: ASSIGNED})  # m2 left out: it gets empty bytes
        await answered(answers, "sync2")
        out.append((s1.error_code, s1.assignment == ASSIGNED))
        out.append((answers["sync2"].error_code, answers["sync2"].assignment))
        out.append([await g.commit(c1, m1, 2, 5), await g.commit(c1, m1, 1, 6),
                    await g.committed(c1)])
        out.append(await g.describe(c1, ids))
        out.append([(await g.sync(c1, m1, 1)).error_code])
    return out


async def static_member(t: Target, topic: str) -> list[Any]:
    """A static member joins without MEMBER_ID_REQUIRED; rejoining with its instance id
    and no member id replaces its member id in the same generation; the old id is fenced."""
    ids = Ids()
    async with group_of(t, "static", topic) as g:
        c = await g.conn("s")
        r = await g.join(c, instance="i-1")
        out: list[Any] = [joined(r, ids)]
        old = r.member_id
        out.append((await g.sync(c, old, 1, {old: ASSIGNED}, "i-1")).error_code)
        again = await g.join(c, instance="i-1")
        out.append(joined(again, ids))
        new = again.member_id
        out.append((await g.sync(c, new, again.generation_id, {new: ASSIGNED}, "i-1")).assignment
                   == ASSIGNED)
        out.append([await g.heartbeat(c, old, 1, "i-1"), await g.heartbeat(c, new, 1, "i-1"),
                    await g.heartbeat(c, new, 1, "i-other")])
        out.append(await g.leave(c, "", "i-1"))
        out.append(await g.describe(c, ids))
    return out


async def refusals(t: Target, topic: str) -> list[Any]:
    """Validation: session timeout bounds, protocol type mismatch, unknown members and
    groups, describe of an unknown group (v5 and v6), commits to an unknown group."""
    ids = Ids()
    async with group_of(t, "refusals", topic) as g:
        c = await g.conn("r")
        out: list[Any] = []
        bad_session = await g.join(c, session_ms=1000)
        out.append(bad_session.error_code)
        out.append((await g.join(c, "ghost")).error_code)  # a member id for no group
        out.append((await g.sync(c, "ghost", 1)).error_code)
        out.append(await g.heartbeat(c, "ghost", 1))
        out.append(await g.describe(c, ids, version=5))
        out.append(await g.describe(c, ids, version=6))
        out.append([await g.commit(c, "ghost", 3, 1, version=8),
                    await g.commit(c, "ghost", 3, 1, version=9)])
        m = (await g.join(c)).member_id
        await g.join(c, m)
        other = await g.conn("o")
        out.append((await g.join(other, protocol_type="connect")).error_code)
        out.append((await g.join(other, protocol="roundrobin")).error_code)
        out.append(await g.commit(other, "", -1, 1))  # not a member, group not empty
    return out


SCENARIOS = {
    "one_member": one_member,
    "second_member": second_member,
    "static_member": static_member,
    "refusals": refusals,
}

# What Apache Kafka 4.1.2 answered (test_kafka_still_answers_groups_so checks it).
EXPECTED: dict[str, list[Any]] = {
    "one_member": [
        (E.MEMBER_ID_REQUIRED, True),
        (E.NONE, 1, "consumer", "range", "m1", "m1", False, [("m1", None, True)]),
        (E.NONE, "consumer", "range", True),
        [E.NONE, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID],
        (E.NONE, "Stable", "consumer", "range", [("m1", "client-one", True, ASSIGNED)]),
        [E.NONE, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, 7],
        [("Stable", "consumer")],
        (E.NONE, [E.NONE]),
        (E.NONE, "Empty", "consumer", "", []),
        [E.UNKNOWN_MEMBER_ID, E.NONE, 10],
        [("Empty", "consumer")],
    ],
    "second_member": [
        E.REBALANCE_IN_PROGRESS,
        (E.NONE, "PreparingRebalance", "consumer", "",
         [("m1", "a", False, ASSIGNED), ("m2", "b", False, b"")]),
        E.NONE,
        (E.NONE, 2, "consumer", "range", "m1", "m1", False,
         [("m1", None, True), ("m2", None, True)]),
        (E.NONE, 2, "consumer", "range", "m1", "m2", False, []),
        E.REBALANCE_IN_PROGRESS,
        E.NONE,
        False,
        (E.NONE, True),
        (E.NONE, b""),
        [E.NONE, E.ILLEGAL_GENERATION, 5],
        (E.NONE, "Stable", "consumer", "range",
         [("m1", "a", True, ASSIGNED), ("m2", "b", True, b"")]),
        [E.ILLEGAL_GENERATION],
    ],
    "static_member": [
        (E.NONE, 1, "consumer", "range", "m1", "m1", False, [("m1", "i-1", True)]),
        E.NONE,
        # no rebalance: generation 1 still, the leader told to skip the assignment (v9)
        (E.NONE, 1, "consumer", "range", "m2", "m2", True, [("m2", "i-1", True)]),
        True,
        [E.FENCED_INSTANCE_ID, E.NONE, E.UNKNOWN_MEMBER_ID],
        (E.NONE, [E.NONE]),
        (E.NONE, "Empty", "consumer", "", []),
    ],
    "refusals": [
        E.INVALID_SESSION_TIMEOUT,
        E.UNKNOWN_MEMBER_ID,
        E.UNKNOWN_MEMBER_ID,
        E.UNKNOWN_MEMBER_ID,
        (E.NONE, "Dead", "", "", []),
        (E.GROUP_ID_NOT_FOUND, "Dead", "", "", []),
        [E.ILLEGAL_GENERATION, E.GROUP_ID_NOT_FOUND],
        E.INCONSISTENT_GROUP_PROTOCOL,
        E.INCONSISTENT_GROUP_PROTOCOL,
        E.UNKNOWN_MEMBER_ID,
    ],
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_fake_answers_groups_as_kafka_did(scenario: str) -> None:
    async with fake_target() as target:
        assert await SCENARIOS[scenario](target, scenario) == EXPECTED[scenario]


@pytest.mark.kafka
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_kafka_still_answers_groups_so(
    scenario: str, kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str]
) -> None:
    async with kafka_target(kafka_cluster) as target:
        assert await SCENARIOS[scenario](target, kafka_topic(scenario)) == EXPECTED[scenario]
