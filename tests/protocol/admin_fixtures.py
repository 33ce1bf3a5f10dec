"""Byte fixtures for the admin APIs, written by hand from the protocol guide's BNF.

The JSON specs of these APIs (tools/kafka-specs/{DescribeConfigs,ElectLeaders,
IncrementalAlterConfigs,AlterPartitionReassignments,ListPartitionReassignments}*.json) were
written for this project, so these bytes are the first independent check of them: each
fixture spells out the wire layout field by field. The second check is the real broker
(tests/apache_kafka/test_admin_kafka.py).
"""

from __future__ import annotations

from typing import Any

from pipeline.protocol.messages import alter_partition_reassignments as apr
from pipeline.protocol.messages import describe_configs as dc
from pipeline.protocol.messages import elect_leaders as el
from pipeline.protocol.messages import incremental_alter_configs as iac
from pipeline.protocol.messages import list_partition_reassignments as lpr

ADMIN_FIXTURES: list[tuple[str, int, Any, bytes]] = [
    # ---- DescribeConfigs (32) ----------------------------------------------
    ("DescribeConfigsRequest", 1,
     dc.DescribeConfigsRequest(resources=(dc.DescribeConfigsResource(
         resource_type=2, resource_name="orders", configuration_keys=("max.message.bytes",)),)),
     b"\x00\x00\x00\x01"  # resources: 1
     b"\x02"  # resource_type: topic
     b"\x00\x06orders"  # resource_name
     b"\x00\x00\x00\x01" b"\x00\x11max.message.bytes"  # configuration_keys: 1
     b"\x00"),  # include_synonyms: false
    ("DescribeConfigsRequest", 4,
     dc.DescribeConfigsRequest(resources=(dc.DescribeConfigsResource(
         resource_type=2, resource_name="orders", configuration_keys=None),),
         include_synonyms=True),
     b"\x02"  # resources: compact 1
     b"\x02" b"\x07orders"  # resource_type, resource_name (compact)
     b"\x00"  # configuration_keys: null (compact)
     b"\x00"  # resource tagged fields
     b"\x01"  # include_synonyms
     b"\x00"  # include_documentation
     b"\x00"),  # tagged fields
    ("DescribeConfigsResponse", 1,
     dc.DescribeConfigsResponse(throttle_time_ms=0, results=(dc.DescribeConfigsResult(
         error_code=0, error_message=None, resource_type=2, resource_name="orders",
         configs=(dc.DescribeConfigsResourceResult(
             name="max.message.bytes", value="100000", read_only=False, config_source=1,
             is_sensitive=False, synonyms=(dc.DescribeConfigsSynonym(
                 name="max.message.bytes", value="100000", source=1),)),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00\x00\x01"  # results: 1
     b"\x00\x00" b"\xff\xff"  # error_code, error_message: null
     b"\x02" b"\x00\x06orders"  # resource_type, resource_name
     b"\x00\x00\x00\x01"  # configs: 1
     b"\x00\x11max.message.bytes" b"\x00\x06100000"  # name, value
     b"\x00" b"\x01" b"\x00"  # read_only, config_source: topic, is_sensitive
     b"\x00\x00\x00\x01"  # synonyms: 1
     b"\x00\x11max.message.bytes" b"\x00\x06100000" b"\x01"),  # name, value, source
    ("DescribeConfigsResponse", 4,
     dc.DescribeConfigsResponse(throttle_time_ms=0, results=(dc.DescribeConfigsResult(
         error_code=0, error_message=None, resource_type=2, resource_name="orders",
         configs=(dc.DescribeConfigsResourceResult(
             name="min.insync.replicas", value="2", read_only=False, config_source=5,
             is_sensitive=False, synonyms=(), config_type=3, documentation=None),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # results: compact 1
     b"\x00\x00" b"\x00"  # error_code, error_message: null (compact)
     b"\x02" b"\x07orders"  # resource_type, resource_name
     b"\x02"  # configs: compact 1
     b"\x14min.insync.replicas" b"\x022"  # name, value
     b"\x00" b"\x05" b"\x00"  # read_only, config_source: default, is_sensitive
     b"\x01"  # synonyms: compact 0
     b"\x03"  # config_type: int
     b"\x00"  # documentation: null
     b"\x00"  # config tagged fields
     b"\x00"  # result tagged fields
     b"\x00"),  # tagged fields
    # ---- ElectLeaders (43) -------------------------------------------------
    ("ElectLeadersRequest", 0,
     el.ElectLeadersRequest(topic_partitions=(el.TopicPartitions(topic="t", partitions=(0, 1)),),
                            timeout_ms=60000),
     b"\x00\x00\x00\x01"  # topic_partitions: 1
     b"\x00\x01t"  # topic
     b"\x00\x00\x00\x02" b"\x00\x00\x00\x00" b"\x00\x00\x00\x01"  # partitions: [0, 1]
     b"\x00\x00\xea\x60"),  # timeout_ms: 60000
    ("ElectLeadersRequest", 2,
     el.ElectLeadersRequest(election_type=0, topic_partitions=None, timeout_ms=30000),
     b"\x00"  # election_type: preferred
     b"\x00"  # topic_partitions: null (compact) = every partition
     b"\x00\x00\x75\x30"  # timeout_ms: 30000
     b"\x00"),  # tagged fields
    ("ElectLeadersResponse", 0,
     el.ElectLeadersResponse(throttle_time_ms=0, replica_election_results=(el.ReplicaElectionResult(
         topic="t", partition_result=(
             el.PartitionResult(partition_id=0, error_code=0, error_message=None),
             el.PartitionResult(partition_id=1, error_code=84, error_message="not needed"))),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00\x00\x01" b"\x00\x01t"  # results: 1, topic
     b"\x00\x00\x00\x02"  # partition_result: 2
     b"\x00\x00\x00\x00" b"\x00\x00" b"\xff\xff"  # partition 0: NONE, null message
     b"\x00\x00\x00\x01" b"\x00\x54" b"\x00\x0anot needed"),  # partition 1: ELECTION_NOT_NEEDED
    ("ElectLeadersResponse", 2,
     el.ElectLeadersResponse(throttle_time_ms=0, error_code=0, replica_election_results=(
         el.ReplicaElectionResult(topic="t", partition_result=(
             el.PartitionResult(partition_id=0, error_code=0, error_message=None),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x02" b"\x02t"  # results: compact 1, topic
     b"\x02"  # partition_result: compact 1
     b"\x00\x00\x00\x00" b"\x00\x00" b"\x00" b"\x00"  # partition 0, NONE, null, tagged fields
     b"\x00"  # result tagged fields
     b"\x00"),  # tagged fields
    # ---- IncrementalAlterConfigs (44) --------------------------------------
    ("IncrementalAlterConfigsRequest", 0,
     iac.IncrementalAlterConfigsRequest(resources=(iac.AlterConfigsResource(
         resource_type=2, resource_name="t", configs=(
             iac.AlterableConfig(name="min.insync.replicas", config_operation=0, value="2"),
             iac.AlterableConfig(name="retention.ms", config_operation=1, value=None))),),
         validate_only=False),
     b"\x00\x00\x00\x01"  # resources: 1
     b"\x02" b"\x00\x01t"  # resource_type: topic, resource_name
     b"\x00\x00\x00\x02"  # configs: 2
     b"\x00\x13min.insync.replicas" b"\x00" b"\x00\x012"  # SET min.insync.replicas=2
     b"\x00\x0cretention.ms" b"\x01" b"\xff\xff"  # DELETE retention.ms
     b"\x00"),  # validate_only
    ("IncrementalAlterConfigsRequest", 1,
     iac.IncrementalAlterConfigsRequest(resources=(iac.AlterConfigsResource(
         resource_type=4, resource_name="1", configs=(
             iac.AlterableConfig(name="log.cleaner.threads", config_operation=0, value="2"),)),),
         validate_only=True),
     b"\x02"  # resources: compact 1
     b"\x04" b"\x021"  # resource_type: broker, resource_name "1"
     b"\x02"  # configs: compact 1
     b"\x14log.cleaner.threads" b"\x00" b"\x022" b"\x00"  # SET ...=2, tagged fields
     b"\x00"  # resource tagged fields
     b"\x01"  # validate_only
     b"\x00"),  # tagged fields
    ("IncrementalAlterConfigsResponse", 0,
     iac.IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=(
         iac.AlterConfigsResourceResponse(error_code=0, error_message=None, resource_type=2,
                                          resource_name="t"),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00\x00\x01"  # responses: 1
     b"\x00\x00" b"\xff\xff" b"\x02" b"\x00\x01t"),  # NONE, null, topic "t"
    ("IncrementalAlterConfigsResponse", 1,
     iac.IncrementalAlterConfigsResponse(throttle_time_ms=5, responses=(
         iac.AlterConfigsResourceResponse(error_code=40, error_message="bad", resource_type=2,
                                          resource_name="t"),)),
     b"\x00\x00\x00\x05"  # throttle_time_ms
     b"\x02"  # responses: compact 1
     b"\x00\x28" b"\x04bad" b"\x02" b"\x02t" b"\x00"  # INVALID_CONFIG, "bad", topic "t", tags
     b"\x00"),  # tagged fields
    # ---- AlterPartitionReassignments (45) ----------------------------------
    ("AlterPartitionReassignmentsRequest", 0,
     apr.AlterPartitionReassignmentsRequest(timeout_ms=60000, topics=(apr.ReassignableTopic(
         name="t", partitions=(apr.ReassignablePartition(partition_index=0, replicas=(2, 1, 3)),
                               apr.ReassignablePartition(partition_index=1, replicas=None))),)),
     b"\x00\x00\xea\x60"  # timeout_ms
     b"\x02" b"\x02t"  # topics: compact 1, name
     b"\x03"  # partitions: compact 2
     b"\x00\x00\x00\x00" b"\x04" b"\x00\x00\x00\x02" b"\x00\x00\x00\x01" b"\x00\x00\x00\x03"
     b"\x00"  # partition 0 -> [2, 1, 3], tagged fields
     b"\x00\x00\x00\x01" b"\x00" b"\x00"  # partition 1 -> null (cancel), tagged fields
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    ("AlterPartitionReassignmentsRequest", 1,
     apr.AlterPartitionReassignmentsRequest(timeout_ms=1000, allow_replication_factor_change=False,
                                            topics=(apr.ReassignableTopic(name="t", partitions=(
                                                apr.ReassignablePartition(partition_index=0,
                                                                          replicas=(3,)),)),)),
     b"\x00\x00\x03\xe8"  # timeout_ms: 1000
     b"\x00"  # allow_replication_factor_change: false
     b"\x02" b"\x02t" b"\x02"  # topics: 1, name, partitions: 1
     b"\x00\x00\x00\x00" b"\x02" b"\x00\x00\x00\x03" b"\x00"  # partition 0 -> [3]
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    ("AlterPartitionReassignmentsResponse", 0,
     apr.AlterPartitionReassignmentsResponse(throttle_time_ms=0, error_code=0, error_message=None,
                                             responses=(apr.ReassignableTopicResponse(
                                                 name="t", partitions=(
                                                     apr.ReassignablePartitionResponse(
                                                         partition_index=0, error_code=0,
                                                         error_message=None),
                                                     apr.ReassignablePartitionResponse(
                                                         partition_index=1, error_code=85,
                                                         error_message="none"))),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00" b"\x00"  # error_code, error_message: null
     b"\x02" b"\x02t" b"\x03"  # responses: 1, name, partitions: 2
     b"\x00\x00\x00\x00" b"\x00\x00" b"\x00" b"\x00"  # partition 0: NONE
     b"\x00\x00\x00\x01" b"\x00\x55" b"\x05none" b"\x00"  # partition 1: NO_REASSIGNMENT_IN_PROGRESS
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    ("AlterPartitionReassignmentsResponse", 1,
     apr.AlterPartitionReassignmentsResponse(throttle_time_ms=0, allow_replication_factor_change=True,
                                             error_code=0, error_message=None, responses=()),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x01"  # allow_replication_factor_change (echoed)
     b"\x00\x00" b"\x00"  # error_code, error_message: null
     b"\x01"  # responses: compact 0
     b"\x00"),  # tagged fields
    # ---- ListPartitionReassignments (46) -----------------------------------
    ("ListPartitionReassignmentsRequest", 0,
     lpr.ListPartitionReassignmentsRequest(timeout_ms=60000, topics=(
         lpr.ListPartitionReassignmentsTopics(name="t", partition_indexes=(0, 2)),)),
     b"\x00\x00\xea\x60"  # timeout_ms
     b"\x02" b"\x02t"  # topics: compact 1, name
     b"\x03" b"\x00\x00\x00\x00" b"\x00\x00\x00\x02"  # partition_indexes: [0, 2]
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    ("ListPartitionReassignmentsResponse", 0,
     lpr.ListPartitionReassignmentsResponse(throttle_time_ms=0, error_code=0, error_message=None,
                                            topics=(lpr.OngoingTopicReassignment(
                                                name="t", partitions=(
                                                    lpr.OngoingPartitionReassignment(
                                                        partition_index=0, replicas=(2, 1, 3),
                                                        adding_replicas=(2,),
                                                        removing_replicas=(3,)),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00" b"\x00"  # error_code, error_message: null
     b"\x02" b"\x02t" b"\x02"  # topics: 1, name, partitions: 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\x04" b"\x00\x00\x00\x02" b"\x00\x00\x00\x01" b"\x00\x00\x00\x03"  # replicas
     b"\x02" b"\x00\x00\x00\x02"  # adding_replicas
     b"\x02" b"\x00\x00\x00\x03"  # removing_replicas
     b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
]
