"""Byte fixtures for the consumer-group APIs, written by hand from the protocol guide's BNF.

OffsetCommit, OffsetFetch, JoinGroup, Heartbeat, LeaveGroup, SyncGroup, DescribeGroups,
ListGroups, DeleteGroups, OffsetDelete and KIP-848's ConsumerGroupHeartbeat and
ConsumerGroupDescribe, at the lowest and highest version the client speaks
(``CLIENT_VERSIONS``), one field per line. The classes are generated from Kafka 4.1's own
JSON specs; these bytes check the generator read them as the wire format means them
(ConsumerGroupHeartbeatResponse's nullable ``assignment`` struct: an int8 marker, -1 null,
1 present, before the struct).
"""

from __future__ import annotations

import uuid
from typing import Any

from pipeline.protocol.messages import consumer_group_describe as cgd
from pipeline.protocol.messages import consumer_group_heartbeat as cgh
from pipeline.protocol.messages import delete_groups as dg
from pipeline.protocol.messages import describe_groups as dsg
from pipeline.protocol.messages import heartbeat as hb
from pipeline.protocol.messages import join_group as jg
from pipeline.protocol.messages import leave_group as lg
from pipeline.protocol.messages import list_groups as lsg
from pipeline.protocol.messages import offset_commit as oc
from pipeline.protocol.messages import offset_delete as od
from pipeline.protocol.messages import offset_fetch as of
from pipeline.protocol.messages import sync_group as sg

TOPIC_ID = uuid.UUID("5f2a8c1e-9b3d-4e6f-8a7b-1c2d3e4f5a6b")
TOPIC_ID_BYTES = b"\x5f\x2a\x8c\x1e\x9b\x3d\x4e\x6f\x8a\x7b\x1c\x2d\x3e\x4f\x5a\x6b"
OFFSET_42 = b"\x00\x00\x00\x00\x00\x00\x00\x2a"
NO_OPERATIONS = b"\x80\x00\x00\x00"  # authorized_operations: INT32_MIN (not asked for)

GROUP_FIXTURES: list[tuple[str, int, Any, bytes]] = [
    # ---- OffsetCommit (8) --------------------------------------------------
    ("OffsetCommitRequest", 2,
     oc.OffsetCommitRequest(
         group_id="g1", generation_id_or_member_epoch=7, member_id="m-1", retention_time_ms=-1,
         topics=(oc.OffsetCommitRequestTopic(name="orders", partitions=(
             oc.OffsetCommitRequestPartition(partition_index=0, committed_offset=42,
                                             committed_metadata=""),)),)),
     b"\x00\x02g1"  # group_id
     b"\x00\x00\x00\x07"  # generation_id
     b"\x00\x03m-1"  # member_id
     b"\xff\xff\xff\xff\xff\xff\xff\xff"  # retention_time_ms: -1 (the broker's)
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00"  # partition_index
     + OFFSET_42  # committed_offset
     + b"\x00\x00"),  # committed_metadata: ""
    ("OffsetCommitRequest", 9,
     oc.OffsetCommitRequest(
         group_id="g1", generation_id_or_member_epoch=7, member_id="m-1",
         group_instance_id=None,
         topics=(oc.OffsetCommitRequestTopic(name="orders", partitions=(
             oc.OffsetCommitRequestPartition(partition_index=0, committed_offset=42,
                                             committed_leader_epoch=5,
                                             committed_metadata=None),)),)),
     b"\x03g1"  # group_id (compact)
     b"\x00\x00\x00\x07"  # member epoch
     b"\x04m-1"  # member_id
     b"\x00"  # group_instance_id: null
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     b"\x02"  # partitions: compact 1
     b"\x00\x00\x00\x00"  # partition_index
     + OFFSET_42  # committed_offset
     + b"\x00\x00\x00\x05"  # committed_leader_epoch
     b"\x00"  # committed_metadata: null
     b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    ("OffsetCommitResponse", 2,
     oc.OffsetCommitResponse(topics=(oc.OffsetCommitResponseTopic(name="orders", partitions=(
         oc.OffsetCommitResponsePartition(partition_index=0, error_code=0),)),)),
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00" b"\x00\x00"),  # partition 0: NONE
    ("OffsetCommitResponse", 9,
     oc.OffsetCommitResponse(throttle_time_ms=0, topics=(oc.OffsetCommitResponseTopic(
         name="orders", partitions=(
             oc.OffsetCommitResponsePartition(partition_index=0, error_code=0),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     b"\x02"  # partitions: compact 1
     b"\x00\x00\x00\x00" b"\x00\x00"  # partition 0: NONE
     b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    # ---- OffsetFetch (9) ---------------------------------------------------
    ("OffsetFetchRequest", 1,
     of.OffsetFetchRequest(group_id="g1", topics=(
         of.OffsetFetchRequestTopic(name="orders", partition_indexes=(0,)),)),
     b"\x00\x02g1"  # group_id
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01" b"\x00\x00\x00\x00"),  # partition_indexes [0]
    ("OffsetFetchRequest", 9,
     of.OffsetFetchRequest(groups=(of.OffsetFetchRequestGroup(
         group_id="g1", member_id=None, member_epoch=-1, topics=None),), require_stable=True),
     b"\x02"  # groups: compact 1
     b"\x03g1"  # group_id
     b"\x00"  # member_id: null
     b"\xff\xff\xff\xff"  # member_epoch: -1
     b"\x00"  # topics: null (all)
     b"\x00"  # group tagged fields
     b"\x01"  # require_stable
     b"\x00"),  # tagged fields
    ("OffsetFetchResponse", 1,
     of.OffsetFetchResponse(topics=(of.OffsetFetchResponseTopic(name="orders", partitions=(
         of.OffsetFetchResponsePartition(partition_index=0, committed_offset=42, metadata="",
                                         error_code=0),)),)),
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00"  # partition_index
     + OFFSET_42  # committed_offset
     + b"\x00\x00"  # metadata: ""
     b"\x00\x00"),  # error_code
    ("OffsetFetchResponse", 9,
     of.OffsetFetchResponse(throttle_time_ms=0, groups=(of.OffsetFetchResponseGroup(
         group_id="g1", error_code=0, topics=(of.OffsetFetchResponseTopics(
             name="orders", partitions=(of.OffsetFetchResponsePartitions(
                 partition_index=0, committed_offset=42, committed_leader_epoch=-1,
                 metadata="", error_code=0),)),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # groups: compact 1
     b"\x03g1"  # group_id
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     b"\x02"  # partitions: compact 1
     b"\x00\x00\x00\x00"  # partition_index
     + OFFSET_42  # committed_offset
     + b"\xff\xff\xff\xff"  # committed_leader_epoch: -1
     b"\x01"  # metadata: "" (compact)
     b"\x00\x00"  # error_code
     b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x00\x00"  # group error_code
     b"\x00"  # group tagged fields
     b"\x00"),  # tagged fields
    # ---- JoinGroup (11) ----------------------------------------------------
    ("JoinGroupRequest", 0,
     jg.JoinGroupRequest(group_id="g1", session_timeout_ms=10000, member_id="",
                         protocol_type="consumer",
                         protocols=(jg.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01"),)),
     b"\x00\x02g1"  # group_id
     b"\x00\x00\x27\x10"  # session_timeout_ms 10000
     b"\x00\x00"  # member_id: ""
     b"\x00\x08consumer"  # protocol_type
     b"\x00\x00\x00\x01"  # protocols: 1
     b"\x00\x05range"  # name
     b"\x00\x00\x00\x02\x00\x01"),  # metadata
    ("JoinGroupRequest", 9,
     jg.JoinGroupRequest(group_id="g1", session_timeout_ms=45000, rebalance_timeout_ms=300000,
                         member_id="m-1", group_instance_id=None, protocol_type="consumer",
                         protocols=(jg.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01"),),
                         reason="rejoin"),
     b"\x03g1"  # group_id (compact)
     b"\x00\x00\xaf\xc8"  # session_timeout_ms 45000
     b"\x00\x04\x93\xe0"  # rebalance_timeout_ms 300000
     b"\x04m-1"  # member_id
     b"\x00"  # group_instance_id: null
     b"\x09consumer"  # protocol_type
     b"\x02"  # protocols: compact 1
     b"\x06range"  # name
     b"\x03\x00\x01"  # metadata (compact bytes)
     b"\x00"  # protocol tagged fields
     b"\x07rejoin"  # reason
     b"\x00"),  # tagged fields
    ("JoinGroupResponse", 0,
     jg.JoinGroupResponse(error_code=0, generation_id=1, protocol_name="range", leader="m-1",
                          member_id="m-1",
                          members=(jg.JoinGroupResponseMember(member_id="m-1", metadata=b"\x00\x01"),)),
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x01"  # generation_id
     b"\x00\x05range"  # protocol_name
     b"\x00\x03m-1"  # leader
     b"\x00\x03m-1"  # member_id
     b"\x00\x00\x00\x01"  # members: 1
     b"\x00\x03m-1"  # member_id
     b"\x00\x00\x00\x02\x00\x01"),  # metadata
    ("JoinGroupResponse", 9,
     jg.JoinGroupResponse(throttle_time_ms=0, error_code=0, generation_id=1,
                          protocol_type="consumer", protocol_name="range", leader="m-1",
                          skip_assignment=False, member_id="m-1",
                          members=(jg.JoinGroupResponseMember(member_id="m-1", group_instance_id=None,
                                                              metadata=b"\x00\x01"),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x01"  # generation_id
     b"\x09consumer"  # protocol_type
     b"\x06range"  # protocol_name
     b"\x04m-1"  # leader
     b"\x00"  # skip_assignment
     b"\x04m-1"  # member_id
     b"\x02"  # members: compact 1
     b"\x04m-1"  # member_id
     b"\x00"  # group_instance_id: null
     b"\x03\x00\x01"  # metadata
     b"\x00"  # member tagged fields
     b"\x00"),  # tagged fields
    # ---- Heartbeat (12) ----------------------------------------------------
    ("HeartbeatRequest", 0, hb.HeartbeatRequest(group_id="g1", generation_id=1, member_id="m-1"),
     b"\x00\x02g1"  # group_id
     b"\x00\x00\x00\x01"  # generation_id
     b"\x00\x03m-1"),  # member_id
    ("HeartbeatRequest", 4,
     hb.HeartbeatRequest(group_id="g1", generation_id=1, member_id="m-1", group_instance_id=None),
     b"\x03g1"  # group_id (compact)
     b"\x00\x00\x00\x01"  # generation_id
     b"\x04m-1"  # member_id
     b"\x00"  # group_instance_id: null
     b"\x00"),  # tagged fields
    ("HeartbeatResponse", 0, hb.HeartbeatResponse(error_code=27),
     b"\x00\x1b"),  # error_code: REBALANCE_IN_PROGRESS
    ("HeartbeatResponse", 4, hb.HeartbeatResponse(throttle_time_ms=0, error_code=0),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x00"),  # tagged fields
    # ---- LeaveGroup (13) ---------------------------------------------------
    ("LeaveGroupRequest", 0, lg.LeaveGroupRequest(group_id="g1", member_id="m-1"),
     b"\x00\x02g1"  # group_id
     b"\x00\x03m-1"),  # member_id
    ("LeaveGroupRequest", 5,
     lg.LeaveGroupRequest(group_id="g1", members=(
         lg.MemberIdentity(member_id="m-1", group_instance_id=None, reason="bye"),)),
     b"\x03g1"  # group_id (compact)
     b"\x02"  # members: compact 1
     b"\x04m-1"  # member_id
     b"\x00"  # group_instance_id: null
     b"\x04bye"  # reason
     b"\x00"  # member tagged fields
     b"\x00"),  # tagged fields
    ("LeaveGroupResponse", 0, lg.LeaveGroupResponse(error_code=0),
     b"\x00\x00"),  # error_code
    ("LeaveGroupResponse", 5,
     lg.LeaveGroupResponse(throttle_time_ms=0, error_code=0, members=(
         lg.MemberResponse(member_id="m-1", group_instance_id=None, error_code=0),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x02"  # members: compact 1
     b"\x04m-1"  # member_id
     b"\x00"  # group_instance_id: null
     b"\x00\x00"  # error_code
     b"\x00"  # member tagged fields
     b"\x00"),  # tagged fields
    # ---- SyncGroup (14) ----------------------------------------------------
    ("SyncGroupRequest", 0,
     sg.SyncGroupRequest(group_id="g1", generation_id=1, member_id="m-1", assignments=(
         sg.SyncGroupRequestAssignment(member_id="m-1", assignment=b"\x00\x01"),)),
     b"\x00\x02g1"  # group_id
     b"\x00\x00\x00\x01"  # generation_id
     b"\x00\x03m-1"  # member_id
     b"\x00\x00\x00\x01"  # assignments: 1
     b"\x00\x03m-1"  # member_id
     b"\x00\x00\x00\x02\x00\x01"),  # assignment
    ("SyncGroupRequest", 5,
     sg.SyncGroupRequest(group_id="g1", generation_id=1, member_id="m-1", group_instance_id=None,
                         protocol_type="consumer", protocol_name="range", assignments=()),
     b"\x03g1"  # group_id (compact)
     b"\x00\x00\x00\x01"  # generation_id
     b"\x04m-1"  # member_id
     b"\x00"  # group_instance_id: null
     b"\x09consumer"  # protocol_type
     b"\x06range"  # protocol_name
     b"\x01"  # assignments: compact 0 (a follower)
     b"\x00"),  # tagged fields
    ("SyncGroupResponse", 0, sg.SyncGroupResponse(error_code=0, assignment=b"\x00\x01"),
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x02\x00\x01"),  # assignment
    ("SyncGroupResponse", 5,
     sg.SyncGroupResponse(throttle_time_ms=0, error_code=0, protocol_type="consumer",
                          protocol_name="range", assignment=b"\x00\x01"),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x09consumer"  # protocol_type
     b"\x06range"  # protocol_name
     b"\x03\x00\x01"  # assignment (compact bytes)
     b"\x00"),  # tagged fields
    # ---- DescribeGroups (15) -----------------------------------------------
    ("DescribeGroupsRequest", 0, dsg.DescribeGroupsRequest(groups=("g1",)),
     b"\x00\x00\x00\x01" b"\x00\x02g1"),  # groups ["g1"]
    ("DescribeGroupsRequest", 6,
     dsg.DescribeGroupsRequest(groups=("g1",), include_authorized_operations=True),
     b"\x02" b"\x03g1"  # groups: compact 1
     b"\x01"  # include_authorized_operations
     b"\x00"),  # tagged fields
    ("DescribeGroupsResponse", 0,
     dsg.DescribeGroupsResponse(groups=(dsg.DescribedGroup(
         error_code=0, group_id="g1", group_state="Stable", protocol_type="consumer",
         protocol_data="range", members=(dsg.DescribedGroupMember(
             member_id="m-1", client_id="c", client_host="/127.0.0.1",
             member_metadata=b"\x00", member_assignment=b"\x01"),)),)),
     b"\x00\x00\x00\x01"  # groups: 1
     b"\x00\x00"  # error_code
     b"\x00\x02g1"  # group_id
     b"\x00\x06Stable"  # group_state
     b"\x00\x08consumer"  # protocol_type
     b"\x00\x05range"  # protocol_data
     b"\x00\x00\x00\x01"  # members: 1
     b"\x00\x03m-1"  # member_id
     b"\x00\x01c"  # client_id
     b"\x00\x0a/127.0.0.1"  # client_host
     b"\x00\x00\x00\x01\x00"  # member_metadata
     b"\x00\x00\x00\x01\x01"),  # member_assignment
    ("DescribeGroupsResponse", 6,
     dsg.DescribeGroupsResponse(throttle_time_ms=0, groups=(dsg.DescribedGroup(
         error_code=69, error_message="Group g1 not found.", group_id="g1", group_state="Dead",
         protocol_type="", protocol_data="", members=(),
         authorized_operations=-2147483648),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # groups: compact 1
     b"\x00\x45"  # error_code: GROUP_ID_NOT_FOUND
     b"\x14Group g1 not found."  # error_message
     b"\x03g1"  # group_id
     b"\x05Dead"  # group_state
     b"\x01"  # protocol_type: ""
     b"\x01"  # protocol_data: ""
     b"\x01"  # members: compact 0
     + NO_OPERATIONS
     + b"\x00"  # group tagged fields
     b"\x00"),  # tagged fields
    # ---- ListGroups (16) ---------------------------------------------------
    ("ListGroupsRequest", 0, lsg.ListGroupsRequest(), b""),
    ("ListGroupsRequest", 5,
     lsg.ListGroupsRequest(states_filter=("Stable",), types_filter=("consumer",)),
     b"\x02" b"\x07Stable"  # states_filter: compact 1
     b"\x02" b"\x09consumer"  # types_filter: compact 1
     b"\x00"),  # tagged fields
    ("ListGroupsResponse", 0,
     lsg.ListGroupsResponse(error_code=0, groups=(
         lsg.ListedGroup(group_id="g1", protocol_type="consumer"),)),
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x01"  # groups: 1
     b"\x00\x02g1"  # group_id
     b"\x00\x08consumer"),  # protocol_type
    ("ListGroupsResponse", 5,
     lsg.ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=(
         lsg.ListedGroup(group_id="g1", protocol_type="consumer", group_state="Stable",
                         group_type="consumer"),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x02"  # groups: compact 1
     b"\x03g1"  # group_id
     b"\x09consumer"  # protocol_type
     b"\x07Stable"  # group_state
     b"\x09consumer"  # group_type
     b"\x00"  # group tagged fields
     b"\x00"),  # tagged fields
    # ---- DeleteGroups (42) -------------------------------------------------
    ("DeleteGroupsRequest", 0, dg.DeleteGroupsRequest(groups_names=("g1",)),
     b"\x00\x00\x00\x01" b"\x00\x02g1"),  # groups_names ["g1"]
    ("DeleteGroupsRequest", 2, dg.DeleteGroupsRequest(groups_names=("g1",)),
     b"\x02" b"\x03g1"  # groups_names: compact 1
     b"\x00"),  # tagged fields
    ("DeleteGroupsResponse", 0,
     dg.DeleteGroupsResponse(throttle_time_ms=0, results=(
         dg.DeletableGroupResult(group_id="g1", error_code=0),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00\x00\x01"  # results: 1
     b"\x00\x02g1"  # group_id
     b"\x00\x00"),  # error_code
    ("DeleteGroupsResponse", 2,
     dg.DeleteGroupsResponse(throttle_time_ms=0, results=(
         dg.DeletableGroupResult(group_id="g1", error_code=68),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # results: compact 1
     b"\x03g1"  # group_id
     b"\x00\x44"  # error_code: NON_EMPTY_GROUP
     b"\x00"  # result tagged fields
     b"\x00"),  # tagged fields
    # ---- OffsetDelete (47) -------------------------------------------------
    ("OffsetDeleteRequest", 0,
     od.OffsetDeleteRequest(group_id="g1", topics=(od.OffsetDeleteRequestTopic(
         name="orders", partitions=(od.OffsetDeleteRequestPartition(partition_index=0),)),)),
     b"\x00\x02g1"  # group_id
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01" b"\x00\x00\x00\x00"),  # partitions: [0]
    ("OffsetDeleteResponse", 0,
     od.OffsetDeleteResponse(error_code=0, throttle_time_ms=0, topics=(od.OffsetDeleteResponseTopic(
         name="orders", partitions=(
             od.OffsetDeleteResponsePartition(partition_index=0, error_code=0),)),)),
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00" b"\x00\x00"),  # partition 0: NONE
    # ---- ConsumerGroupHeartbeat (68) ---------------------------------------
    ("ConsumerGroupHeartbeatRequest", 0,
     cgh.ConsumerGroupHeartbeatRequest(
         group_id="g1", member_id="", member_epoch=0, instance_id=None, rack_id=None,
         rebalance_timeout_ms=300000, subscribed_topic_names=("orders",), server_assignor=None,
         topic_partitions=None),
     b"\x03g1"  # group_id (compact)
     b"\x01"  # member_id: "" (joining)
     b"\x00\x00\x00\x00"  # member_epoch
     b"\x00"  # instance_id: null
     b"\x00"  # rack_id: null
     b"\x00\x04\x93\xe0"  # rebalance_timeout_ms 300000
     b"\x02" b"\x07orders"  # subscribed_topic_names: compact 1
     b"\x00"  # server_assignor: null
     b"\x00"  # topic_partitions: null
     b"\x00"),  # tagged fields
    ("ConsumerGroupHeartbeatRequest", 1,
     cgh.ConsumerGroupHeartbeatRequest(
         group_id="g1", member_id="m-1", member_epoch=5, instance_id=None, rack_id="r1",
         rebalance_timeout_ms=-1, subscribed_topic_names=None, subscribed_topic_regex="ord.*",
         server_assignor="uniform",
         topic_partitions=(cgh.TopicPartitions(topic_id=TOPIC_ID, partitions=(0, 1)),)),
     b"\x03g1"  # group_id
     b"\x04m-1"  # member_id
     b"\x00\x00\x00\x05"  # member_epoch
     b"\x00"  # instance_id: null
     b"\x03r1"  # rack_id
     b"\xff\xff\xff\xff"  # rebalance_timeout_ms: -1 (unchanged)
     b"\x00"  # subscribed_topic_names: null (unchanged)
     b"\x06ord.*"  # subscribed_topic_regex
     b"\x08uniform"  # server_assignor
     b"\x02"  # topic_partitions: compact 1
     + TOPIC_ID_BYTES  # topic_id
     + b"\x03" b"\x00\x00\x00\x00" b"\x00\x00\x00\x01"  # partitions [0, 1]
     b"\x00"  # topic partitions tagged fields
     b"\x00"),  # tagged fields
    ("ConsumerGroupHeartbeatResponse", 0,
     cgh.ConsumerGroupHeartbeatResponse(
         throttle_time_ms=0, error_code=0, error_message=None, member_id="m-1", member_epoch=1,
         heartbeat_interval_ms=5000, assignment=cgh.Assignment(topic_partitions=(
             cgh.ResponseTopicPartitions(topic_id=TOPIC_ID, partitions=(0,)),))),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x00"  # error_message: null
     b"\x04m-1"  # member_id
     b"\x00\x00\x00\x01"  # member_epoch
     b"\x00\x00\x13\x88"  # heartbeat_interval_ms 5000
     b"\x01"  # assignment: present
     b"\x02"  # topic_partitions: compact 1
     + TOPIC_ID_BYTES  # topic_id
     + b"\x02" b"\x00\x00\x00\x00"  # partitions [0]
     b"\x00"  # topic partitions tagged fields
     b"\x00"  # assignment tagged fields
     b"\x00"),  # tagged fields
    ("ConsumerGroupHeartbeatResponse", 1,
     cgh.ConsumerGroupHeartbeatResponse(
         throttle_time_ms=0, error_code=0, error_message=None, member_id="m-1", member_epoch=2,
         heartbeat_interval_ms=5000, assignment=None),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x00"  # error_message: null
     b"\x04m-1"  # member_id
     b"\x00\x00\x00\x02"  # member_epoch
     b"\x00\x00\x13\x88"  # heartbeat_interval_ms 5000
     b"\xff"  # assignment: null (unchanged)
     b"\x00"),  # tagged fields
    # ---- ConsumerGroupDescribe (69) ----------------------------------------
    ("ConsumerGroupDescribeRequest", 0,
     cgd.ConsumerGroupDescribeRequest(group_ids=("g1",), include_authorized_operations=False),
     b"\x02" b"\x03g1"  # group_ids: compact 1
     b"\x00"  # include_authorized_operations
     b"\x00"),  # tagged fields
    ("ConsumerGroupDescribeRequest", 1,
     cgd.ConsumerGroupDescribeRequest(group_ids=("g1",), include_authorized_operations=True),
     b"\x02" b"\x03g1"  # group_ids: compact 1
     b"\x01"  # include_authorized_operations
     b"\x00"),  # tagged fields
    ("ConsumerGroupDescribeResponse", 0,
     cgd.ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=(cgd.DescribedGroup(
         error_code=0, error_message=None, group_id="g1", group_state="Stable", group_epoch=3,
         assignment_epoch=3, assignor_name="uniform", members=(),
         authorized_operations=-2147483648),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # groups: compact 1
     b"\x00\x00"  # error_code
     b"\x00"  # error_message: null
     b"\x03g1"  # group_id
     b"\x07Stable"  # group_state
     b"\x00\x00\x00\x03"  # group_epoch
     b"\x00\x00\x00\x03"  # assignment_epoch
     b"\x08uniform"  # assignor_name
     b"\x01"  # members: compact 0
     + NO_OPERATIONS
     + b"\x00"  # group tagged fields
     b"\x00"),  # tagged fields
    ("ConsumerGroupDescribeResponse", 1,
     cgd.ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=(cgd.DescribedGroup(
         error_code=0, error_message=None, group_id="g1", group_state="Stable", group_epoch=3,
         assignment_epoch=3, assignor_name="uniform", members=(cgd.Member(
             member_id="m-1", instance_id=None, rack_id=None, member_epoch=3, client_id="c",
             client_host="/127.0.0.1", subscribed_topic_names=("orders",),
             subscribed_topic_regex=None,
             assignment=cgd.Assignment(topic_partitions=(cgd.TopicPartitions(
                 topic_id=TOPIC_ID, topic_name="orders", partitions=(0,)),)),
             target_assignment=cgd.Assignment(), member_type=1),),
         authorized_operations=-2147483648),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # groups: compact 1
     b"\x00\x00"  # error_code
     b"\x00"  # error_message: null
     b"\x03g1"  # group_id
     b"\x07Stable"  # group_state
     b"\x00\x00\x00\x03"  # group_epoch
     b"\x00\x00\x00\x03"  # assignment_epoch
     b"\x08uniform"  # assignor_name
     b"\x02"  # members: compact 1
     b"\x04m-1"  # member_id
     b"\x00"  # instance_id: null
     b"\x00"  # rack_id: null
     b"\x00\x00\x00\x03"  # member_epoch
     b"\x02c"  # client_id
     b"\x0b/127.0.0.1"  # client_host
     b"\x02" b"\x07orders"  # subscribed_topic_names: compact 1
     b"\x00"  # subscribed_topic_regex: null
     b"\x02"  # assignment.topic_partitions: compact 1
     + TOPIC_ID_BYTES  # topic_id
     + b"\x07orders"  # topic_name
     b"\x02" b"\x00\x00\x00\x00"  # partitions [0]
     b"\x00"  # topic partitions tagged fields
     b"\x00"  # assignment tagged fields
     b"\x01"  # target_assignment.topic_partitions: compact 0
     b"\x00"  # target_assignment tagged fields
     b"\x01"  # member_type: consumer
     b"\x00"  # member tagged fields
     + NO_OPERATIONS
     + b"\x00"  # group tagged fields
     b"\x00"),  # tagged fields
]
