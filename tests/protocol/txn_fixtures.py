"""Byte fixtures for the transaction APIs, written by hand from the protocol guide's BNF.

FindCoordinator, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit,
DescribeTransactions and ListTransactions, at the lowest and highest version the client
speaks (``CLIENT_VERSIONS``), one field per line. The generated classes come from Kafka
4.1's own JSON specs; these bytes check the generator read them as Kafka's wire format
means them. Kafka itself is the second check (tests/testing/test_fake_vs_kafka.py).
"""

from __future__ import annotations

from typing import Any

from pipeline.protocol.messages import add_offsets_to_txn as aot
from pipeline.protocol.messages import add_partitions_to_txn as apt
from pipeline.protocol.messages import describe_transactions as dtx
from pipeline.protocol.messages import end_txn as et
from pipeline.protocol.messages import find_coordinator as fc
from pipeline.protocol.messages import list_transactions as ltx
from pipeline.protocol.messages import txn_offset_commit as toc

PID = b"\x00\x00\x00\x00\x00\x00\x03\xe8"  # producer id 1000

TXN_FIXTURES: list[tuple[str, int, Any, bytes]] = [
    # ---- FindCoordinator (10) ----------------------------------------------
    ("FindCoordinatorRequest", 0, fc.FindCoordinatorRequest(key="g1"),
     b"\x00\x02g1"),  # key (a group: v0 has no key type)
    ("FindCoordinatorRequest", 6,
     fc.FindCoordinatorRequest(key_type=1, coordinator_keys=("txn-1",)),
     b"\x01"  # key_type: transaction
     b"\x02" b"\x06txn-1"  # coordinator_keys: compact 1
     b"\x00"),  # tagged fields
    ("FindCoordinatorResponse", 0,
     fc.FindCoordinatorResponse(error_code=0, node_id=1, host="k1", port=9092),
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x01"  # node_id
     b"\x00\x02k1"  # host
     b"\x00\x00\x23\x84"),  # port 9092
    ("FindCoordinatorResponse", 6,
     fc.FindCoordinatorResponse(throttle_time_ms=0, coordinators=(fc.Coordinator(
         key="txn-1", node_id=2, host="k2", port=9093, error_code=0, error_message=None),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # coordinators: compact 1
     b"\x06txn-1"  # key
     b"\x00\x00\x00\x02"  # node_id
     b"\x03k2"  # host
     b"\x00\x00\x23\x85"  # port 9093
     b"\x00\x00"  # error_code
     b"\x00"  # error_message: null
     b"\x00"  # coordinator tagged fields
     b"\x00"),  # tagged fields
    # ---- AddPartitionsToTxn (24) -------------------------------------------
    ("AddPartitionsToTxnRequest", 0,
     apt.AddPartitionsToTxnRequest(
         v3_and_below_transactional_id="txn-1", v3_and_below_producer_id=1000,
         v3_and_below_producer_epoch=3,
         v3_and_below_topics=(apt.AddPartitionsToTxnTopic(name="orders", partitions=(0, 2)),)),
     b"\x00\x05txn-1"  # transactional_id
     + PID  # producer_id
     + b"\x00\x03"  # producer_epoch
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x02" b"\x00\x00\x00\x00" b"\x00\x00\x00\x02"),  # partitions [0, 2]
    ("AddPartitionsToTxnRequest", 3,
     apt.AddPartitionsToTxnRequest(
         v3_and_below_transactional_id="txn-1", v3_and_below_producer_id=1000,
         v3_and_below_producer_epoch=3,
         v3_and_below_topics=(apt.AddPartitionsToTxnTopic(name="orders", partitions=(0, 2)),)),
     b"\x06txn-1"  # transactional_id (compact)
     + PID  # producer_id
     + b"\x00\x03"  # producer_epoch
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     b"\x03" b"\x00\x00\x00\x00" b"\x00\x00\x00\x02"  # partitions [0, 2]
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    ("AddPartitionsToTxnResponse", 0,
     apt.AddPartitionsToTxnResponse(throttle_time_ms=0, results_by_topic_v3_and_below=(
         apt.AddPartitionsToTxnTopicResult(name="orders", results_by_partition=(
             apt.AddPartitionsToTxnPartitionResult(partition_index=0, partition_error_code=0),
             apt.AddPartitionsToTxnPartitionResult(partition_index=2, partition_error_code=48),
         )),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00\x00\x01"  # results: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x02"  # results_by_partition: 2
     b"\x00\x00\x00\x00" b"\x00\x00"  # partition 0: NONE
     b"\x00\x00\x00\x02" b"\x00\x30"),  # partition 2: INVALID_TXN_STATE
    ("AddPartitionsToTxnResponse", 3,
     apt.AddPartitionsToTxnResponse(throttle_time_ms=0, results_by_topic_v3_and_below=(
         apt.AddPartitionsToTxnTopicResult(name="orders", results_by_partition=(
             apt.AddPartitionsToTxnPartitionResult(partition_index=0, partition_error_code=0),
         )),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # results: compact 1
     b"\x07orders"  # name
     b"\x02"  # results_by_partition: compact 1
     b"\x00\x00\x00\x00" b"\x00\x00"  # partition 0: NONE
     b"\x00"  # partition result tagged fields
     b"\x00"  # topic result tagged fields
     b"\x00"),  # tagged fields
    # ---- AddOffsetsToTxn (25) ----------------------------------------------
    ("AddOffsetsToTxnRequest", 0,
     aot.AddOffsetsToTxnRequest(transactional_id="txn-1", producer_id=1000, producer_epoch=3,
                                group_id="g1"),
     b"\x00\x05txn-1"  # transactional_id
     + PID  # producer_id
     + b"\x00\x03"  # producer_epoch
     b"\x00\x02g1"),  # group_id
    ("AddOffsetsToTxnRequest", 4,
     aot.AddOffsetsToTxnRequest(transactional_id="txn-1", producer_id=1000, producer_epoch=3,
                                group_id="g1"),
     b"\x06txn-1"  # transactional_id (compact)
     + PID  # producer_id
     + b"\x00\x03"  # producer_epoch
     b"\x03g1"  # group_id
     b"\x00"),  # tagged fields
    ("AddOffsetsToTxnResponse", 0, aot.AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=0),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"),  # error_code
    ("AddOffsetsToTxnResponse", 4,
     aot.AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=51),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x33"  # error_code: CONCURRENT_TRANSACTIONS
     b"\x00"),  # tagged fields
    # ---- EndTxn (26) -------------------------------------------------------
    ("EndTxnRequest", 0,
     et.EndTxnRequest(transactional_id="txn-1", producer_id=1000, producer_epoch=3, committed=True),
     b"\x00\x05txn-1"  # transactional_id
     + PID  # producer_id
     + b"\x00\x03"  # producer_epoch
     b"\x01"),  # committed
    ("EndTxnRequest", 5,
     et.EndTxnRequest(transactional_id="txn-1", producer_id=1000, producer_epoch=3,
                      committed=False),
     b"\x06txn-1"  # transactional_id (compact)
     + PID  # producer_id
     + b"\x00\x03"  # producer_epoch
     b"\x00"  # committed: false (abort)
     b"\x00"),  # tagged fields
    ("EndTxnResponse", 0, et.EndTxnResponse(throttle_time_ms=0, error_code=0),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"),  # error_code
    ("EndTxnResponse", 5,
     et.EndTxnResponse(throttle_time_ms=0, error_code=0, producer_id=1000, producer_epoch=4),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     + PID  # producer_id (KIP-890: the id to use next)
     + b"\x00\x04"  # producer_epoch (bumped)
     b"\x00"),  # tagged fields
    # ---- TxnOffsetCommit (28) ----------------------------------------------
    ("TxnOffsetCommitRequest", 0,
     toc.TxnOffsetCommitRequest(
         transactional_id="txn-1", group_id="g1", producer_id=1000, producer_epoch=3,
         topics=(toc.TxnOffsetCommitRequestTopic(name="orders", partitions=(
             toc.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=42,
                                                 committed_metadata=None),)),)),
     b"\x00\x05txn-1"  # transactional_id
     b"\x00\x02g1"  # group_id
     + PID  # producer_id
     + b"\x00\x03"  # producer_epoch
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\x00\x00\x00\x00\x00\x00\x00\x2a"  # committed_offset 42
     b"\xff\xff"),  # committed_metadata: null
    ("TxnOffsetCommitRequest", 5,
     toc.TxnOffsetCommitRequest(
         transactional_id="txn-1", group_id="g1", producer_id=1000, producer_epoch=3,
         generation_id=7, member_id="m-1", group_instance_id=None,
         topics=(toc.TxnOffsetCommitRequestTopic(name="orders", partitions=(
             toc.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=42,
                                                 committed_leader_epoch=5,
                                                 committed_metadata="x"),)),)),
     b"\x06txn-1"  # transactional_id (compact)
     b"\x03g1"  # group_id
     + PID  # producer_id
     + b"\x00\x03"  # producer_epoch
     b"\x00\x00\x00\x07"  # generation_id
     b"\x04m-1"  # member_id
     b"\x00"  # group_instance_id: null
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     b"\x02"  # partitions: compact 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\x00\x00\x00\x00\x00\x00\x00\x2a"  # committed_offset 42
     b"\x00\x00\x00\x05"  # committed_leader_epoch
     b"\x02x"  # committed_metadata
     b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    ("TxnOffsetCommitResponse", 0,
     toc.TxnOffsetCommitResponse(throttle_time_ms=0, topics=(toc.TxnOffsetCommitResponseTopic(
         name="orders", partitions=(
             toc.TxnOffsetCommitResponsePartition(partition_index=0, error_code=0),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00" b"\x00\x00"),  # partition 0: NONE
    ("TxnOffsetCommitResponse", 5,
     toc.TxnOffsetCommitResponse(throttle_time_ms=0, topics=(toc.TxnOffsetCommitResponseTopic(
         name="orders", partitions=(
             toc.TxnOffsetCommitResponsePartition(partition_index=0, error_code=22),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     b"\x02"  # partitions: compact 1
     b"\x00\x00\x00\x00" b"\x00\x16"  # partition 0: ILLEGAL_GENERATION
     b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    # ---- DescribeTransactions (65) -----------------------------------------
    ("DescribeTransactionsRequest", 0,
     dtx.DescribeTransactionsRequest(transactional_ids=("txn-1",)),
     b"\x02" b"\x06txn-1"  # transactional_ids: compact 1
     b"\x00"),  # tagged fields
    ("DescribeTransactionsResponse", 0,
     dtx.DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=(
         dtx.TransactionState(
             error_code=0, transactional_id="txn-1", transaction_state="Ongoing",
             transaction_timeout_ms=60000, transaction_start_time_ms=1_650_000_000_000,
             producer_id=1000, producer_epoch=3,
             topics=(dtx.TopicData(topic="orders", partitions=(0,)),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # transaction_states: compact 1
     b"\x00\x00"  # error_code
     b"\x06txn-1"  # transactional_id
     b"\x08Ongoing"  # transaction_state
     b"\x00\x00\xea\x60"  # transaction_timeout_ms 60000
     b"\x00\x00\x01\x80\x2b\xa9\xf4\x00"  # transaction_start_time_ms
     + PID  # producer_id
     + b"\x00\x03"  # producer_epoch
     b"\x02"  # topics: compact 1
     b"\x07orders"  # topic
     b"\x02" b"\x00\x00\x00\x00"  # partitions [0]
     b"\x00"  # topic tagged fields
     b"\x00"  # state tagged fields
     b"\x00"),  # tagged fields
    # ---- ListTransactions (66) ---------------------------------------------
    ("ListTransactionsRequest", 0,
     ltx.ListTransactionsRequest(state_filters=("Ongoing",), producer_id_filters=()),
     b"\x02" b"\x08Ongoing"  # state_filters: compact 1
     b"\x01"  # producer_id_filters: compact 0
     b"\x00"),  # tagged fields
    ("ListTransactionsRequest", 2,
     ltx.ListTransactionsRequest(state_filters=(), producer_id_filters=(1000,),
                                 duration_filter=60000, transactional_id_pattern="txn-.*"),
     b"\x01"  # state_filters: compact 0
     b"\x02" + PID  # producer_id_filters: compact 1
     + b"\x00\x00\x00\x00\x00\x00\xea\x60"  # duration_filter 60000
     b"\x07txn-.*"  # transactional_id_pattern
     b"\x00"),  # tagged fields
    ("ListTransactionsResponse", 0,
     ltx.ListTransactionsResponse(throttle_time_ms=0, error_code=0, unknown_state_filters=(),
                                  transaction_states=(ltx.TransactionState(
                                      transactional_id="txn-1", producer_id=1000,
                                      transaction_state="Ongoing"),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x01"  # unknown_state_filters: compact 0
     b"\x02"  # transaction_states: compact 1
     b"\x06txn-1"  # transactional_id
     + PID  # producer_id
     + b"\x08Ongoing"  # transaction_state
     b"\x00"  # state tagged fields
     b"\x00"),  # tagged fields
    ("ListTransactionsResponse", 2,
     ltx.ListTransactionsResponse(throttle_time_ms=0, error_code=0,
                                  unknown_state_filters=("Bogus",), transaction_states=()),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x02" b"\x06Bogus"  # unknown_state_filters: compact 1
     b"\x01"  # transaction_states: compact 0
     b"\x00"),  # tagged fields
]
