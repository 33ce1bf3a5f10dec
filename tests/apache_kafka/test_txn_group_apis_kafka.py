"""Every client version of the group and coordinator APIs, spoken to Apache Kafka 4.1.

The codec's classes are generated from Kafka's JSON specs and byte-tested by hand
(tests/protocol/*_fixtures.py); here the broker itself is the judge: each version's
request must be understood (a malformed one closes the connection or answers an error)
and each answer must decode to what the request did. One node: it is every coordinator.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from pipeline.cluster import Cluster
from pipeline.protocol.api import CLIENT_VERSIONS, ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import consumer_group_describe as cgd
from pipeline.protocol.messages import consumer_group_heartbeat as cgh
from pipeline.protocol.messages import delete_groups as dg
from pipeline.protocol.messages import describe_groups as dsg
from pipeline.protocol.messages import describe_transactions as dtx
from pipeline.protocol.messages import find_coordinator as fc
from pipeline.protocol.messages import heartbeat as hb
from pipeline.protocol.messages import join_group as jg
from pipeline.protocol.messages import leave_group as lg
from pipeline.protocol.messages import list_groups as lsg
from pipeline.protocol.messages import list_transactions as ltx
from pipeline.protocol.messages import offset_commit as oc
from pipeline.protocol.messages import offset_delete as od
from pipeline.protocol.messages import offset_fetch as of
from pipeline.protocol.messages import sync_group as sg
from pipeline.testing.kafka import KafkaCluster
from tests.testing.txn_raw import until

pytestmark = pytest.mark.kafka


def versions(key: ApiKey) -> range:
    lo, hi = CLIENT_VERSIONS[key]
    return range(lo, hi + 1)


async def test_find_coordinator_every_version(kafka_single: KafkaCluster) -> None:
    async with Cluster.open(kafka_single.bootstrap) as cluster:
        conn = await cluster.any_connection()
        port = int(kafka_single.bootstrap.rsplit(":", 1)[1])
        for v in versions(ApiKey.FIND_COORDINATOR):
            for key_type in (0, 1) if v >= 1 else (0,):
                key = f"coord-{key_type}-{v}"
                if v <= 3:
                    request = fc.FindCoordinatorRequest(key=key, key_type=key_type)
                else:
                    request = fc.FindCoordinatorRequest(key_type=key_type, coordinator_keys=(key,))

                async def ask(request: fc.FindCoordinatorRequest = request, v: int = v
                              ) -> Any:
                    r = await conn.request(request, version=v)
                    return r if v <= 3 else r.coordinators[0]

                found = await until(ask, lambda r: r.error_code == ErrorCode.NONE)
                assert (found.node_id, found.host, found.port) == (1, "127.0.0.1", port), v
                if v >= 4:
                    assert found.key == key


async def test_offset_apis_every_version(kafka_single: KafkaCluster,
                                         kafka_topic: Callable[[str], str]) -> None:
    topic = kafka_topic("offsets")
    await kafka_single.call(kafka_single.create_topic, topic, 2, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    async with Cluster.open(kafka_single.bootstrap) as cluster:
        conn = await cluster.any_connection()
        for v in versions(ApiKey.OFFSET_COMMIT):
            request = oc.OffsetCommitRequest(
                group_id=group, generation_id_or_member_epoch=-1, member_id="",
                topics=(oc.OffsetCommitRequestTopic(name=topic, partitions=(
                    oc.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=100 + v,
                        committed_leader_epoch=-1, committed_metadata=f"v{v}"),)),))
            r = await until(lambda request=request, v=v: conn.request(request, version=v),
                            lambda r: r.topics[0].partitions[0].error_code
                            != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions])
                    for t in r.topics] == [(topic, [(0, 0)])], v
            # every OffsetFetch version reads the commit back
            for fv in versions(ApiKey.OFFSET_FETCH):
                if fv <= 7:
                    got = await conn.request(of.OffsetFetchRequest(group_id=group, topics=(
                        of.OffsetFetchRequestTopic(name=topic, partition_indexes=(0, 1)),)),
                        version=fv)
                    parts = got.topics[0].partitions
                else:
                    got8 = await conn.request(of.OffsetFetchRequest(groups=(
                        of.OffsetFetchRequestGroup(group_id=group, topics=(
                            of.OffsetFetchRequestTopics(name=topic, partition_indexes=(0, 1)),
                        )),)), version=fv)
                    assert got8.groups[0].group_id == group
                    assert got8.groups[0].error_code == ErrorCode.NONE
                    parts = got8.groups[0].topics[0].partitions
                assert sorted((p.partition_index, p.committed_offset, p.metadata, p.error_code)
                              for p in parts) == [(0, 100 + v, f"v{v}", 0),
                                                  (1, -1, "", 0)], (v, fv)
        for v in versions(ApiKey.LIST_GROUPS):
            listed = await conn.request(lsg.ListGroupsRequest(), version=v)
            assert listed.error_code == ErrorCode.NONE
            (mine,) = [g for g in listed.groups if g.group_id == group]
            if v >= 4:
                assert mine.group_state == "Empty"
            if v >= 5:
                assert mine.group_type == "classic"
        for v in versions(ApiKey.DESCRIBE_GROUPS):
            described = await conn.request(dsg.DescribeGroupsRequest(groups=(group,)), version=v)
            (d,) = described.groups
            assert (d.error_code, d.group_id, d.group_state, d.members) == (0, group, "Empty", ())
        for v in versions(ApiKey.OFFSET_DELETE):
            deleted = await conn.request(od.OffsetDeleteRequest(group_id=group, topics=(
                od.OffsetDeleteRequestTopic(name=topic, partitions=(
                    od.OffsetDeleteRequestPartition(partition_index=0),)),)), version=v)
            assert deleted.error_code == ErrorCode.NONE
            assert deleted.topics[0].partitions[0].error_code == ErrorCode.NONE
        for v in versions(ApiKey.DELETE_GROUPS):
            name = group if v == 0 else f"{group}-{v}"
            gone = await conn.request(dg.DeleteGroupsRequest(groups_names=(name,)), version=v)
            expected = ErrorCode.NONE if v == 0 else ErrorCode.GROUP_ID_NOT_FOUND
            assert [(x.group_id, x.error_code) for x in gone.results] == [(name, expected)]


async def test_classic_group_apis_every_version(kafka_single: KafkaCluster) -> None:
    """Join, sync, heartbeat and leave a one-member classic group at every version of each
    (JoinGroup v4+ first answers MEMBER_ID_REQUIRED with the id to join with, KIP-394)."""
    async with Cluster.open(kafka_single.bootstrap) as cluster:
        conn = await cluster.any_connection()
        for i in versions(ApiKey.JOIN_GROUP):
            group = f"classic-{i}-{uuid.uuid4().hex[:6]}"
            svs, hvs, lvs = (min(i, CLIENT_VERSIONS[k][1])
                             for k in (ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP))
            join = jg.JoinGroupRequest(
                group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=30000,
                member_id="", protocol_type="consumer",
                protocols=(jg.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01"),))
            joined = await until(lambda join=join, i=i: conn.request(join, version=i),
                                 lambda r: r.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            if i >= 4:
                assert joined.error_code == ErrorCode.MEMBER_ID_REQUIRED, i
                assert joined.member_id
                join = jg.JoinGroupRequest(
                    group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=30000,
                    member_id=joined.member_id, protocol_type="consumer",
                    protocols=join.protocols)
                joined = await conn.request(join, version=i)
            member = joined.member_id
            assert (joined.error_code, joined.generation_id, joined.leader) == (0, 1, member), i
            assert [(m.member_id, m.metadata) for m in joined.members] == [(member, b"\x00\x01")]
            if i >= 7:
                assert (joined.protocol_type, joined.protocol_name) == ("consumer", "range")
            synced = await conn.request(sg.SyncGroupRequest(
                group_id=group, generation_id=1, member_id=member, protocol_type="consumer",
                protocol_name="range",
                assignments=(sg.SyncGroupRequestAssignment(member_id=member,
                                                           assignment=b"\x07\x08"),)),
                version=svs)
            assert (synced.error_code, synced.assignment) == (0, b"\x07\x08"), svs
            beat = await conn.request(hb.HeartbeatRequest(group_id=group, generation_id=1,
                                                          member_id=member), version=hvs)
            assert beat.error_code == ErrorCode.NONE, hvs
            if lvs <= 2:
                leave = lg.LeaveGroupRequest(group_id=group, member_id=member)
            else:
                leave = lg.LeaveGroupRequest(group_id=group, members=(
                    lg.MemberIdentity(member_id=member, reason="done"),))
            left = await conn.request(leave, version=lvs)
            assert left.error_code == ErrorCode.NONE, lvs
            if lvs >= 3:
                assert [(m.member_id, m.error_code) for m in left.members] == [(member, 0)]


async def test_consumer_group_heartbeat_every_version(kafka_single: KafkaCluster,
                                                      kafka_topic: Callable[[str], str]) -> None:
    """KIP-848: a member joins with epoch 0 (its own id: KIP-1082), is assigned the topic's
    partitions, is described by ConsumerGroupDescribe, and leaves with epoch -1."""
    topic = kafka_topic("cgh")
    await kafka_single.call(kafka_single.create_topic, topic, 2, 1)
    async with Cluster.open(kafka_single.bootstrap) as cluster:
        conn = await cluster.any_connection()
        for v in versions(ApiKey.CONSUMER_GROUP_HEARTBEAT):
            group, member = f"kip848-{v}-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
            joined = await until(lambda g=group, m=member, v=v: conn.request(
                cgh.ConsumerGroupHeartbeatRequest(
                    group_id=g, member_id=m, member_epoch=0, rebalance_timeout_ms=30000,
                    subscribed_topic_names=(topic,), topic_partitions=()), version=v),
                lambda r: r.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            assert (joined.error_code, joined.member_id) == (0, member), joined
            assert joined.member_epoch >= 1 and joined.heartbeat_interval_ms > 0

            async def assigned(g: str = group, m: str = member, v: int = v,
                               epoch: int = joined.member_epoch) -> Any:
                return await conn.request(cgh.ConsumerGroupHeartbeatRequest(
                    group_id=g, member_id=m, member_epoch=epoch), version=v)

            beat = joined
            if beat.assignment is None or not beat.assignment.topic_partitions:
                beat = await until(assigned, lambda r: r.assignment is not None
                                   and bool(r.assignment.topic_partitions))
            assert beat.assignment is not None
            assert [sorted(tp.partitions) for tp in beat.assignment.topic_partitions] == [[0, 1]]
            for dv in versions(ApiKey.CONSUMER_GROUP_DESCRIBE):
                described = await conn.request(
                    cgd.ConsumerGroupDescribeRequest(group_ids=(group,)), version=dv)
                (d,) = described.groups
                assert (d.error_code, d.group_id) == (0, group)
                (m,) = d.members
                assert (m.member_id, m.subscribed_topic_names) == (member, (topic,))
                assert [(tp.topic_name, sorted(tp.partitions))
                        for tp in m.assignment.topic_partitions] == [(topic, [0, 1])]
                if dv >= 1:
                    assert m.member_type == 1  # consumer (KIP-1099)
            left = await conn.request(cgh.ConsumerGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=-1), version=v)
            assert (left.error_code, left.member_epoch) == (0, -1)


async def test_transaction_listing_every_version(kafka_single: KafkaCluster) -> None:
    """DescribeTransactions / ListTransactions on an id that never existed (the open and
    completed paths are in tests/testing/test_fake_vs_kafka.py)."""
    async with Cluster.open(kafka_single.bootstrap) as cluster:
        conn = await cluster.any_connection()
        for v in versions(ApiKey.DESCRIBE_TRANSACTIONS):
            r = await until(lambda v=v: conn.request(dtx.DescribeTransactionsRequest(
                transactional_ids=("never-used",)), version=v),
                lambda r: r.transaction_states[0].error_code
                != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            (state,) = r.transaction_states
            assert (state.transactional_id, state.error_code) == (
                "never-used", ErrorCode.TRANSACTIONAL_ID_NOT_FOUND)
        for v in versions(ApiKey.LIST_TRANSACTIONS):
            request = ltx.ListTransactionsRequest(
                state_filters=("Ongoing", "Bogus"), producer_id_filters=(),
                duration_filter=-1, transactional_id_pattern="never-.*" if v >= 2 else None)
            listed = await conn.request(request, version=v)
            assert (listed.error_code, listed.unknown_state_filters) == (0, ("Bogus",)), v
            assert listed.transaction_states == ()
