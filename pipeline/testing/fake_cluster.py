"""A Kafka-faithful in-process cluster for tests: `FakeCluster`.

Built on the project's own codec, for the error paths a real single-node broker
(tansu) cannot produce, and for users to test their own code::

    fake = FakeCluster(brokers=3, seed=1)
    fake.create_topic("t", 6)
    await nursery.start(fake.run)
    stream = await fake.connector("fake-0", 9092)

Semantics follow Apache Kafka, not tansu (tests/testing/test_fake_vs_kafka.py
sends the same raw requests to both and compares the answers). Sequence
checking (per partition, producer id and epoch; the last 5 batches cached):

* a duplicate of a cached batch -> NONE with the ORIGINAL base offset (and,
  as Kafka does, the cached batch's max timestamp as `log_append_time_ms`);
* a gap, or a new epoch not starting at 0 -> OUT_OF_ORDER_SEQUENCE_NUMBER;
* an older epoch -> INVALID_PRODUCER_EPOCH;
* sequences wrap from 2**31-1 to 0;
* a producer id the partition has no state for is accepted at any
  sequence: Kafka >= 2.5 dropped UNKNOWN_PRODUCER_ID here ("If there is no
  current producer epoch ... accept writes with any sequence number").
  `FakeCluster(strict_unknown_producer=True)` gives the pre-2.5 answer,
  UNKNOWN_PRODUCER_ID for a non-zero first sequence, so clients can test
  their recovery path.

InitProducerId without a transactional id always gives a new producer id with
epoch 0, whatever id and epoch the request carries (Kafka's transaction
coordinator does the same). A producer bumps its own epoch (KIP-360, the Java
client's idempotent path): a higher epoch starting at sequence 0 is accepted,
a lower one is fenced.

Size limits: a batch over `max.message.bytes` -> MESSAGE_TOO_LARGE, records
over `segment.bytes` -> RECORD_LIST_TOO_LARGE. Replication: the in-sync
replicas are the replicas on running brokers; an acks=-1 produce with fewer
than `min.insync.replicas` of them -> NOT_ENOUGH_REPLICAS.

Faults (`fake/fault_api.py`): `move_leader`, `stop_broker`,
`restart_broker(lose_producer_state=...)`, `drop_connections`, `fail_next`,
`fail_after_apply` (written, then answered with an error, as Kafka's
NOT_ENOUGH_REPLICAS_AFTER_APPEND / REQUEST_TIMED_OUT), `drop_response_after_apply`,
`delay_responses`, `stale_metadata` (Metadata answered from a frozen view) and
`control(api_key, fn, sticky=False)` hooks; a `FaultHandle`'s `remove()` ends a sticky
one. Every request is recorded (`requests`, `requests_of`); `log(topic, partition)`
is a partition's log. Topic configs it reads: `max.message.bytes`, `segment.bytes`,
`min.insync.replicas`.

Transactions (`fake/txn.py`, as Kafka 4.1 answers): FindCoordinator (groups and
transactional ids; `move_coordinator` moves one), InitProducerId with a transactional
id (epoch bumps, fencing, aborting an open transaction), AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit, EndTxn with COMMIT/ABORT markers, the v1 and v2
(KIP-890) protocols by request version, transaction timeouts on trio's clock,
DescribeTransactions and ListTransactions; Fetch and ListOffsets at read_committed stop at
the last stable offset and list aborted transactions. Committed offsets live in
`fake.offsets` (`fake/offsets.py`).

See `pipeline/testing/fake/cluster.py` for how a request is handled and
where each fault applies, `fake/produce.py` and `fake/handlers.py` for the
per-API rules (`fake/reads.py`: ListOffsets and Fetch).
"""

from __future__ import annotations

from pipeline.testing.fake.cluster import (
    DROP,
    GROUP,
    NO_RESPONSE,
    SUPPORTED_VERSIONS,
    TRANSACTION,
    ControlContext,
    FakeCluster,
    FakeSasl,
    FaultHandle,
    LogEntry,
    RecordedRequest,
)
from pipeline.testing.fake.offsets import CommittedOffset, OffsetStore

__all__ = [
    "DROP",
    "GROUP",
    "NO_RESPONSE",
    "SUPPORTED_VERSIONS",
    "TRANSACTION",
    "CommittedOffset",
    "ControlContext",
    "FakeCluster",
    "FakeSasl",
    "FaultHandle",
    "LogEntry",
    "OffsetStore",
    "RecordedRequest",
]
