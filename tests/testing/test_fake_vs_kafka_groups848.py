"""The fake's KIP-848 group coordinator answers raw requests as Apache Kafka 4.1 does.

As ``test_fake_vs_kafka_groups.py`` (whose ``Group`` helper and normalisation this module
reuses): each scenario speaks raw ConsumerGroupHeartbeat, OffsetCommit, OffsetFetch,
ConsumerGroupDescribe and ListGroups requests to a target's group coordinator and returns
the answers normalised: member ids become ``m1``, ``m2``... in order of appearance, an
assignment the sorted partitions of the scenario's topic (checked to name that topic's
id), error codes by name. Epochs are compared as they are: each scenario's group is new,
so both start at group epoch 1. The answers Kafka 4.1.2 gave are pinned in ``EXPECTED``,
checked against the fake in the fast suite (virtual time) and against the session's
3-node Kafka under ``-m kafka``.

Assignments are compared exactly: with four partitions and one or two members of one
subscription, Kafka's uniform assignor and the fake's agree on every split (a member
keeps its lowest partitions up to its quota; module doc of ``fake/groups848.py``). Where
they may differ (which member gets an odd partition) no scenario asks.

Session and rebalance timeouts take real time on Kafka (45 s: Kafka's minimum session
timeout; a 5 s rebalance timeout): the heartbeats in between are paced by the clock, so
those answers are compared with repeats collapsed (how many fall before the timeout is
timing, which answer follows it is not).
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
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import consumer_group_describe as cgd
from pipeline.protocol.messages import consumer_group_heartbeat as cgh
from pipeline.protocol.messages import list_groups as lsg
from pipeline.protocol.messages import offset_commit as oc
from pipeline.protocol.messages import offset_fetch as of
from pipeline.testing.kafka import KafkaCluster

from .test_fake_vs_kafka import Target, fake_target, kafka_target
from .test_fake_vs_kafka_groups import Group, Ids

E = ErrorCode
ALL = [0, 1, 2, 3]
NOT_SENT: Any = object()  # a heartbeat field left at "unchanged" (null / -1)


class Group848(Group):
    """Raw KIP-848 requests for one group (one connection per member)."""

    topic_id: uuid.UUID

    async def hb(self, conn: BrokerConnection, ids: Ids, member_id: str, epoch: int, *,
                 owned: Any = NOT_SENT, topics: Any = NOT_SENT,
                 rebalance_ms: int = 60000, instance: str | None = None,
                 assignor: str | None = None, version: int | None = None
                 ) -> tuple[Any, ...]:
        """A heartbeat (by default a full one: subscription, rebalance timeout and owned
        partitions; ``owned=None`` / ``topics=None`` leave them out), normalised."""
        if owned is NOT_SENT:
            owned = []
        if topics is NOT_SENT:
            topics = (self.topic,)
        request = cgh.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=member_id, member_epoch=epoch,
            instance_id=instance, rebalance_timeout_ms=rebalance_ms,
            subscribed_topic_names=topics, server_assignor=assignor,
            topic_partitions=None if owned is None else (
                (cgh.TopicPartitions(topic_id=self.topic_id, partitions=tuple(owned)),)
                if owned else ()))
        r = await conn.request(request, version=version if version is not None
                               else conn.version_for(ApiKey.CONSUMER_GROUP_HEARTBEAT))
        if r.error_code:
            return (E(r.error_code),)
        return (E.NONE, ids(r.member_id or ""), r.member_epoch, r.heartbeat_interval_ms,
                None if r.assignment is None else self.partitions(r.assignment.topic_partitions))

    def partitions(self, topic_partitions: Any) -> list[int]:
        assert all(t.topic_id == self.topic_id for t in topic_partitions), topic_partitions
        return sorted(p for t in topic_partitions for p in t.partitions)

    async def describe848(self, conn: BrokerConnection, ids: Ids) -> tuple[Any, ...]:
        r = await conn.request(
            cgd.ConsumerGroupDescribeRequest(group_ids=(self.group_id,)),
            version=conn.version_for(ApiKey.CONSUMER_GROUP_DESCRIBE))
        (d,) = r.groups
        if d.error_code:
            return (E(d.error_code),)
        return (E.NONE, d.group_state, d.group_epoch, d.assignment_epoch, d.assignor_name,
                sorted((ids(m.member_id), m.instance_id, m.member_epoch,
                        self.partitions(m.assignment.topic_partitions),
                        self.partitions(m.target_assignment.topic_partitions),
                        m.subscribed_topic_names == (self.topic,), m.member_type)
                       for m in d.members))

    async def commit848(self, conn: BrokerConnection, member_id: str, epoch: int, offset: int,
                        version: int = 9) -> E:
        r = await conn.request(oc.OffsetCommitRequest(
            group_id=self.group_id, generation_id_or_member_epoch=epoch, member_id=member_id,
            topics=(oc.OffsetCommitRequestTopic(name=self.topic, partitions=(
                oc.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset),)),)),
            version=version)
        return E(r.topics[0].partitions[0].error_code)

    async def fetch848(self, conn: BrokerConnection, member_id: str | None, epoch: int
                       ) -> tuple[Any, ...]:
        r = await conn.request(of.OffsetFetchRequest(groups=(of.OffsetFetchRequestGroup(
            group_id=self.group_id, member_id=member_id, member_epoch=epoch,
            topics=(of.OffsetFetchRequestTopics(name=self.topic, partition_indexes=(0,)),)),)),
            version=9)
        (g,) = r.groups
        if g.error_code:
            return (E(g.error_code),)
        return (E.NONE, g.topics[0].partitions[0].committed_offset)

    async def listed848(self, conn: BrokerConnection) -> list[tuple[str, str, str]]:
        r = await conn.request(lsg.ListGroupsRequest(), version=5)
        return [(g.group_state, g.protocol_type, g.group_type) for g in r.groups
                if g.group_id == self.group_id]


@asynccontextmanager
async def group848(t: Target, name: str, topic: str) -> AsyncIterator[Group848]:
    """A new group subscribing ``topic``, created here with four partitions."""
    await t.create(topic, 4, 1, {})
    async with trio.open_nursery() as nursery:
        g = Group848(t, f"{name}-{uuid.uuid4().hex[:6]}", topic, nursery)
        topic_id = t.cluster.metadata.topics[topic].topic_id
        assert topic_id is not None
        g.topic_id = topic_id
        await g.settle()
        yield g
        nursery.cancel_scope.cancel()


def collapse(answers: list[Any]) -> list[Any]:
    """Consecutive repeats as one (how many heartbeats fit before a timeout is timing)."""
    return [a for i, a in enumerate(answers) if i == 0 or answers[i - 1] != a]


def mid() -> str:
    return str(uuid.uuid4())


# -- scenarios -----------------------------------------------------------------


async def revocation(t: Target, topic: str) -> list[Any]:
    """Join, a second member's join (its partitions unreleased until the first revokes
    them; the first told its smaller assignment and kept in its epoch until a heartbeat
    no longer owns them), the states ConsumerGroupDescribe shows on the way, commits with
    each member's epoch meanwhile, and a partial heartbeat (no assignment sent)."""
    ids = Ids()
    a, b = mid(), mid()
    async with group848(t, "revoke", topic) as g:
        c1, c2 = await g.conn("client-a"), await g.conn("client-b")
        out: list[Any] = [await g.hb(c1, ids, a, 0)]
        out.append(await g.describe848(c1, ids))
        out.append(await g.hb(c1, ids, a, 1, owned=ALL))
        out.append(await g.hb(c2, ids, b, 0))  # 2 and 3 are still a's
        out.append(await g.describe848(c1, ids))
        out.append(await g.hb(c2, ids, b, 2, owned=[]))
        out.append(await g.hb(c1, ids, a, 1, owned=ALL))  # a: revoke 2 and 3
        out.append(await g.hb(c1, ids, a, 1, owned=ALL))  # not yet revoked: same answer
        out.append(await g.describe848(c1, ids))
        out.append([await g.commit848(c1, a, 1, 5), await g.commit848(c2, b, 2, 6),
                    await g.commit848(c1, a, 2, 7)])
        out.append(await g.hb(c1, ids, a, 1, owned=[0, 1]))  # revoked: a moves to epoch 2
        out.append(await g.hb(c2, ids, b, 2, owned=[]))  # released: b gets them
        out.append(await g.hb(c2, ids, b, 2, owned=[2, 3]))
        out.append(await g.hb(c1, ids, a, 2, owned=None, topics=None, rebalance_ms=-1))
        out.append(await g.describe848(c1, ids))
        out.append(await g.fetch848(c1, a, 2))
    return out


async def epochs(t: Target, topic: str) -> list[Any]:
    """Epoch checks: a higher epoch, an unknown member, a join re-sent after a lost
    answer (accepted) and after the member moved on (fenced), the previous epoch re-sent
    with owned partitions inside the assignment (accepted) or not (fenced), leaving,
    an unknown group; and the request checks."""
    ids = Ids()
    a, b = mid(), mid()
    async with group848(t, "epochs", topic) as g:
        c1, c2 = await g.conn("a"), await g.conn("b")
        out: list[Any] = [await g.hb(c1, ids, a, 0)]
        out.append(await g.hb(c1, ids, a, 2, owned=ALL))  # ahead of the coordinator
        out.append(await g.hb(c1, ids, mid(), 1, owned=[]))  # nobody
        out.append(await g.hb(c1, ids, a, 0))  # the join's answer was lost: sent again
        out.append(await g.hb(c2, ids, b, 0))
        out.append(await g.hb(c1, ids, a, 1, owned=ALL))
        out.append(await g.hb(c1, ids, a, 1, owned=[0, 1]))  # -> epoch 2
        out.append(await g.hb(c1, ids, a, 1, owned=[0, 1]))  # that answer lost: again
        out.append(await g.hb(c1, ids, a, 1, owned=[0, 1, 2]))  # not inside: fenced
        out.append(await g.hb(c1, ids, a, 0))  # a join now: fenced (epoch 2 is not 0's next)
        out.append(await g.hb(c1, ids, a, 2, owned=[0, 1]))  # still a member at epoch 2
        out.append(await g.hb(c1, ids, a, -1, owned=None, topics=None, rebalance_ms=-1))
        out.append(await g.hb(c1, ids, a, 2, owned=[0, 1]))  # left: unknown
        out.append(await g.hb(c1, ids, a, -1, owned=None, topics=None, rebalance_ms=-1))
        out.append(await g.hb(c2, ids, b, 2, owned=[]))  # b takes everything
        out.append(await g.hb(c1, ids, a, 0))  # a joins again as a new member
        out.append(await g.describe848(c1, ids))
        refused = [
            await g.hb(c1, ids, mid(), 0, owned=[0]),  # owned partitions when joining
            await g.hb(c1, ids, mid(), 0, rebalance_ms=-1),  # no rebalance timeout
            await g.hb(c1, ids, mid(), 0, topics=None),  # no subscription
            await g.hb(c1, ids, "", 0),  # v1: the client names itself (KIP-1082)
            await g.hb(c1, ids, a, -3, owned=None),
            await g.hb(c1, ids, a, -2, owned=None),  # -2 without an instance id
            await g.hb(c1, ids, mid(), 0, assignor="nope"),
            await g.hb(c1, ids, a, 3, instance=""),
        ]
        out.append(refused)
        none = Group848(t, f"{g.group_id}-none", topic, g.nursery)  # a group never made
        none.topic_id = g.topic_id
        await none.settle()
        c3 = await none.conn("n")
        out.append([await none.hb(c3, ids, a, 1, owned=[]),
                    await none.hb(c3, ids, a, -1, owned=None, topics=None, rebalance_ms=-1),
                    await none.describe848(c3, ids)])
    return out


async def commits(t: Target, topic: str) -> list[Any]:
    """OffsetCommit / OffsetFetch v9 to a consumer group (Kafka 4.1's validateOffsetCommit:
    any epoch but the member's is STALE_MEMBER_EPOCH, higher too), v8 refused, commits
    without membership only while the group is empty; an empty classic group (made by
    such a commit) becomes a consumer group at the first join; ListGroups."""
    ids = Ids()
    a = mid()
    async with group848(t, "commits", topic) as g:
        c = await g.conn("c")
        out: list[Any] = [await g.commit848(c, "", -1, 1)]  # a simple (classic) group
        out.append(await g.listed848(c))
        out.append(await g.hb(c, ids, a, 0))
        out.append(await g.listed848(c))
        out.append([await g.commit848(c, a, 1, 2), await g.commit848(c, a, 0, 3),
                    await g.commit848(c, a, 2, 4), await g.commit848(c, mid(), 1, 5),
                    await g.commit848(c, "", -1, 6), await g.commit848(c, a, 1, 7, version=8),
                    await g.commit848(c, a, -1, 8)])
        out.append([await g.fetch848(c, a, 1), await g.fetch848(c, a, 0),
                    await g.fetch848(c, a, 2), await g.fetch848(c, mid(), 1),
                    await g.fetch848(c, None, -1)])
        out.append(await g.hb(c, ids, a, -1, owned=None, topics=None, rebalance_ms=-1))
        out.append([await g.commit848(c, a, 1, 9), await g.commit848(c, "", -1, 10),
                    await g.fetch848(c, None, -1)])
        out.append(await g.listed848(c))
        out.append(await g.describe848(c, ids))
    return out


async def static_members(t: Target, topic: str) -> list[Any]:
    """A static member: its instance id is refused to another member id while it is in
    the group; leaving with -2 keeps its partitions; a new member id with the same
    instance id takes them over at the same epoch (no rebalance); -1 leaves for good."""
    ids = Ids()
    s1, s2 = mid(), mid()
    async with group848(t, "static", topic) as g:
        c = await g.conn("s")
        out: list[Any] = [await g.hb(c, ids, s1, 0, instance="i-1")]
        out.append(await g.hb(c, ids, s2, 0, instance="i-1"))  # i-1 is s1's
        out.append(await g.hb(c, ids, s2, 1, owned=ALL, instance="i-1"))
        out.append(await g.hb(c, ids, s1, -2, owned=None, topics=None, rebalance_ms=-1,
                              instance="i-1"))
        out.append(await g.describe848(c, ids))
        out.append(await g.hb(c, ids, s2, 0, instance="i-1"))
        out.append(await g.describe848(c, ids))
        out.append(await g.hb(c, ids, s1, 1, owned=ALL, instance="i-1"))  # the old id
        out.append(await g.hb(c, ids, s2, -1, owned=None, topics=None, rebalance_ms=-1,
                              instance="i-1"))
        out.append(await g.describe848(c, ids))
        out.append(await g.hb(c, ids, s2, -2, owned=None, topics=None, rebalance_ms=-1,
                              instance="i-1"))  # unknown instance now
    return out


async def timeouts(t: Target, topic: str) -> list[Any]:
    """A member that does not revoke within its rebalance timeout (5 s) is removed; a
    member that stops heartbeating is removed after the session timeout (45 s), and its
    partitions go to the member left."""
    ids = Ids()
    a, b = mid(), mid()
    async with group848(t, "timeouts", topic) as g:
        c1, c2 = await g.conn("a"), await g.conn("b")
        out: list[Any] = [await g.hb(c1, ids, a, 0, rebalance_ms=5000)]
        out.append(await g.hb(c2, ids, b, 0))
        slow: list[Any] = []
        for _ in range(8):  # a owns 2 and 3 past its rebalance timeout
            slow.append(await g.hb(c1, ids, a, 1, owned=ALL, rebalance_ms=5000))
            await trio.sleep(1)
        out.append(collapse(slow))
        out.append(await g.hb(c2, ids, b, 2, owned=[]))
        a2 = mid()
        out.append(await g.hb(c1, ids, a2, 0))
        out.append(await g.hb(c2, ids, b, 3, owned=ALL))
        out.append(await g.hb(c2, ids, b, 3, owned=[0, 1]))
        out.append(await g.hb(c1, ids, a2, 4, owned=[]))
        # a2 goes silent; b heartbeats every 5 s until a2's session has ended
        alive: list[Any] = []
        epoch, owned = 4, [0, 1]
        for _ in range(11):
            answer = await g.hb(c2, ids, b, epoch, owned=owned)
            alive.append(answer)
            if answer[0] == E.NONE:
                epoch, owned = answer[2], answer[4]
            await trio.sleep(5)
        out.append(collapse(alive))
        out.append(await g.hb(c1, ids, a2, 4, owned=[]))
    return out


SCENARIOS = {
    "revocation": revocation,
    "epochs": epochs,
    "commits": commits,
    "static_members": static_members,
    "timeouts": timeouts,
}

# What Apache Kafka 4.1.2 answered (test_kafka_still_answers_kip848_groups_so checks it).
EXPECTED: dict[str, list[Any]] = {
    # (error, member, member epoch, heartbeat interval ms, assignment) per heartbeat;
    # (error, state, group epoch, assignment epoch, assignor,
    #  [(member, instance, epoch, assigned, target, subscribed t, member type)]) per describe
    "revocation": [
        (E.NONE, "m1", 1, 5000, ALL),
        (E.NONE, "Stable", 1, 1, "uniform", [("m1", None, 1, ALL, ALL, True, 1)]),
        (E.NONE, "m1", 1, 5000, ALL),  # a full request: the assignment every time
        (E.NONE, "m2", 2, 5000, []),  # the new group epoch, nothing released yet
        (E.NONE, "Reconciling", 2, 2, "uniform",
         [("m1", None, 1, ALL, [0, 1], True, 1), ("m2", None, 2, [], [2, 3], True, 1)]),
        (E.NONE, "m2", 2, 5000, []),
        (E.NONE, "m1", 1, 5000, [0, 1]),  # revoke 2 and 3, in epoch 1 still
        (E.NONE, "m1", 1, 5000, [0, 1]),
        (E.NONE, "Reconciling", 2, 2, "uniform",
         [("m1", None, 1, [0, 1], [0, 1], True, 1), ("m2", None, 2, [], [2, 3], True, 1)]),
        [E.NONE, E.NONE, E.STALE_MEMBER_EPOCH],  # a higher epoch is stale too
        (E.NONE, "m1", 2, 5000, [0, 1]),
        (E.NONE, "m2", 2, 5000, [2, 3]),
        (E.NONE, "m2", 2, 5000, [2, 3]),
        (E.NONE, "m1", 2, 5000, None),  # a partial heartbeat, nothing changed
        (E.NONE, "Stable", 2, 2, "uniform",
         [("m1", None, 2, [0, 1], [0, 1], True, 1), ("m2", None, 2, [2, 3], [2, 3], True, 1)]),
        (E.NONE, 6),
    ],
    "epochs": [
        (E.NONE, "m1", 1, 5000, ALL),
        (E.FENCED_MEMBER_EPOCH,),
        (E.UNKNOWN_MEMBER_ID,),
        (E.NONE, "m1", 1, 5000, ALL),  # the join again: epoch 0 is the previous epoch
        (E.NONE, "m2", 2, 5000, []),
        (E.NONE, "m1", 1, 5000, [0, 1]),
        (E.NONE, "m1", 2, 5000, [0, 1]),
        (E.NONE, "m1", 2, 5000, [0, 1]),  # the previous epoch, owning a subset
        (E.FENCED_MEMBER_EPOCH,),
        (E.FENCED_MEMBER_EPOCH,),  # a join by a member that moved on: fenced in 4.1
        (E.NONE, "m1", 2, 5000, [0, 1]),
        (E.NONE, "m1", -1, 0, None),
        (E.UNKNOWN_MEMBER_ID,),
        (E.UNKNOWN_MEMBER_ID,),
        (E.NONE, "m2", 3, 5000, ALL),
        (E.NONE, "m1", 4, 5000, []),
        (E.NONE, "Reconciling", 4, 4, "uniform",
         [("m1", None, 4, [], [2, 3], True, 1), ("m2", None, 3, ALL, [0, 1], True, 1)]),
        [(E.INVALID_REQUEST,)] * 6 + [(E.UNSUPPORTED_ASSIGNOR,), (E.INVALID_REQUEST,)],
        [(E.GROUP_ID_NOT_FOUND,)] * 3,
    ],
    "commits": [
        E.NONE,
        [("Empty", "", "classic")],
        (E.NONE, "m1", 1, 5000, ALL),  # the empty classic group becomes a consumer group
        [("Stable", "consumer", "consumer")],
        [E.NONE, E.STALE_MEMBER_EPOCH, E.STALE_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID,
         E.UNKNOWN_MEMBER_ID, E.UNSUPPORTED_VERSION, E.STALE_MEMBER_EPOCH],
        [(E.NONE, 2), (E.STALE_MEMBER_EPOCH,), (E.STALE_MEMBER_EPOCH,), (E.UNKNOWN_MEMBER_ID,),
         (E.NONE, 2)],
        (E.NONE, "m1", -1, 0, None),
        [E.UNKNOWN_MEMBER_ID, E.NONE, (E.NONE, 10)],
        [("Empty", "consumer", "consumer")],
        (E.NONE, "Empty", 2, 1, "uniform", []),
    ],
    "static_members": [
        (E.NONE, "m1", 1, 5000, ALL),
        (E.UNRELEASED_INSTANCE_ID,),
        (E.FENCED_INSTANCE_ID,),
        (E.NONE, "m1", -2, 0, None),
        (E.NONE, "Reconciling", 1, 1, "uniform", [("m1", "i-1", -2, ALL, ALL, True, 1)]),
        (E.NONE, "m2", 1, 5000, ALL),  # same epoch: no rebalance
        (E.NONE, "Stable", 1, 1, "uniform", [("m2", "i-1", 1, ALL, ALL, True, 1)]),
        (E.FENCED_INSTANCE_ID,),
        (E.NONE, "m2", -1, 0, None),
        (E.NONE, "Empty", 2, 1, "uniform", []),
        (E.UNKNOWN_MEMBER_ID,),
    ],
    "timeouts": [
        (E.NONE, "m1", 1, 5000, ALL),
        (E.NONE, "m2", 2, 5000, []),
        [(E.NONE, "m1", 1, 5000, [0, 1]), (E.UNKNOWN_MEMBER_ID,)],
        (E.NONE, "m2", 3, 5000, ALL),
        (E.NONE, "m3", 4, 5000, []),
        (E.NONE, "m2", 3, 5000, [0, 1]),
        (E.NONE, "m2", 4, 5000, [0, 1]),
        (E.NONE, "m3", 4, 5000, [2, 3]),
        [(E.NONE, "m2", 4, 5000, [0, 1]), (E.NONE, "m2", 5, 5000, ALL)],
        (E.UNKNOWN_MEMBER_ID,),
    ],
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_fake_answers_kip848_groups_as_kafka_did(
    scenario: str, autojump_clock: trio.abc.Clock
) -> None:
    async with fake_target() as target:
        assert await SCENARIOS[scenario](target, scenario) == EXPECTED[scenario]


@pytest.mark.kafka
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_kafka_still_answers_kip848_groups_so(
    scenario: str, kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str]
) -> None:
    async with kafka_target(kafka_cluster) as target:
        assert await SCENARIOS[scenario](target, kafka_topic(scenario)) == EXPECTED[scenario]
