"""A Kafka-faithful in-process cluster for tests: `FakeCluster`.

Built on the project's own codec, for the error paths a real single-node broker
(tansu) cannot produce, and for users to test their own code::

    fake = FakeCluster(brokers=3, seed=1)
    fake.create_topic("t", 6)
    await nursery.start(fake.run)
    stream = await fake.connector("fake-0", 9092)

Semantics follow Apache Kafka 3.x, not tansu. Sequence checking (per
partition, producer id and epoch; the last 5 batches cached):

* a duplicate of a cached batch -> NONE with the ORIGINAL base offset;
* a gap, or a new epoch not starting at 0 -> OUT_OF_ORDER_SEQUENCE_NUMBER;
* an older epoch -> INVALID_PRODUCER_EPOCH;
* sequences wrap from 2**31-1 to 0;
* a producer id the partition has no state for is accepted at any
  sequence: Kafka >= 2.5 dropped UNKNOWN_PRODUCER_ID here ("If there is no
  current producer epoch ... accept writes with any sequence number").
  `FakeCluster(strict_unknown_producer=True)` gives the pre-2.5 answer,
  UNKNOWN_PRODUCER_ID for a non-zero first sequence, so clients can test
  their recovery path.

InitProducerId v3+ with the current (pid, epoch) bumps the epoch the way
Kafka's transaction coordinator does (KIP-360): a retried bump gets the same
answer, an exhausted epoch (>= 32766) rotates to a new producer id, anything
else is PRODUCER_FENCED (INVALID_PRODUCER_EPOCH before v4). Real Kafka gives a
null-transactional-id producer a brand-new id instead;
`FakeCluster(kip360_bump=False)` does that.

See `pipeline/testing/fake/cluster.py` for how a request is handled and
where each fault applies, `fake/produce.py` and `fake/handlers.py` for the
per-API rules.
"""

from __future__ import annotations

from pipeline.testing.fake.cluster import (
    DROP,
    NO_RESPONSE,
    SUPPORTED_VERSIONS,
    ControlContext,
    FakeCluster,
    FaultHandle,
    LogEntry,
    RecordedRequest,
)

__all__ = [
    "DROP",
    "NO_RESPONSE",
    "SUPPORTED_VERSIONS",
    "ControlContext",
    "FakeCluster",
    "FaultHandle",
    "LogEntry",
    "RecordedRequest",
]
