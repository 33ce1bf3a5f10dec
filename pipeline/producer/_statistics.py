"""``producer.statistics()``: the producer as numbers, per client, broker, topic and partition.

A snapshot is taken on demand (and every ``statistics_interval`` for ``on_statistics``);
taking one never changes anything. What happened so far comes from counters kept per
batch, per request or per failure, never per record accepted (the ledger's totals, the
stages' ``counters.py``, the cluster's per-broker ``BrokerStats``); what waits where now
is read off the stages' queues when the snapshot is taken. docs/observability.md lists
every field with its unit; the fields' own metadata (``pipeline.util.stats``) is what
the Prometheus and OpenTelemetry exporters read.

Where a record is, from the client's point of view: accepted and without an outcome,
it is either on the wire (``in_flight_messages``: in a Produce request not answered
yet) or queued (``queued_messages``: anywhere else in the producer). A partition's
``queued_messages`` counts the records waiting in its partition producer (for a leader,
a backoff, a retry chaser) and in its broker producer (for linger, a free request slot,
a retry); records between stages (the intake, the dispatcher, the topic producer, the
channels between them) are in the client's count only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from pipeline.cluster.stats import BrokerStatistics
from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.util.stats import Statistics, Summary, children, counter, gauge, info, summary

if TYPE_CHECKING:
    from pipeline.producer._stages.core import ProducerCore

__all__ = ["PartitionStatistics", "ProducerStatistics", "TopicStatistics", "snapshot"]


@dataclass(frozen=True, slots=True)
class PartitionStatistics(Statistics):
    """One partition (number -1: records that failed before a partition was chosen)."""

    METRIC_PREFIX: ClassVar[str] = "partition"

    leader: int = info("the leader's node id in the producer's metadata (-1: unknown)",
                       default=-1)
    queued_messages: int = gauge(
        "records waiting in the partition's stages, not on the wire", "messages")
    queued_bytes: int = gauge("their bytes", "bytes")
    in_flight_batches: int = gauge("batches in Produce requests not answered yet", "batches")
    in_flight_messages: int = gauge("records in them (without an outcome yet)", "messages")
    in_flight_bytes: int = gauge("their bytes", "bytes")
    batches: int = counter("batches sealed (a retry re-sends one: not counted again)",
                           "batches")
    delivered_messages: int = counter("records acknowledged", "messages")
    delivered_bytes: int = counter("their bytes", "bytes")
    failed_messages: int = counter("records failed", "messages")
    retries: int = counter("batches sent back to be sent again after an error", "batches")
    retried_messages: int = counter("records in them", "messages")
    batch_bytes: Summary = summary("size of the partition's last 128 batches sealed", "bytes")
    batch_messages: Summary = summary("records in them", "messages")


@dataclass(frozen=True, slots=True)
class TopicStatistics(Statistics):
    """One topic: its partitions' sums, and its batches' sizes."""

    METRIC_PREFIX: ClassVar[str] = "topic"

    queued_messages: int = gauge("records waiting in the topic's partitions' stages",
                                 "messages")
    queued_bytes: int = gauge("their bytes", "bytes")
    in_flight_messages: int = gauge("records in Produce requests not answered yet", "messages")
    in_flight_bytes: int = gauge("their bytes", "bytes")
    batches: int = counter("batches sealed", "batches")
    delivered_messages: int = counter("records acknowledged", "messages")
    delivered_bytes: int = counter("their bytes", "bytes")
    failed_messages: int = counter("records failed", "messages")
    retries: int = counter("batches sent back to be sent again after an error", "batches")
    batch_bytes: Summary = summary("size of the topic's last 1024 batches sealed", "bytes")
    batch_messages: Summary = summary("records in them", "messages")
    partitions: dict[int, PartitionStatistics] = children(
        "partition", PartitionStatistics, "per partition the producer wrote to or holds")


@dataclass(frozen=True, slots=True)
class ProducerStatistics(Statistics):
    """A producer's statistics (docs/observability.md). The first eight fields are the
    ledger's totals; the bytes of a record are the size bound ``buffer_memory`` counts
    (its share of a batch: ``protocol.records.batch_size_for_record``)."""

    METRIC_PREFIX: ClassVar[str] = "producer"

    accepted: int = counter("records accepted (send, send_many, send_batch, input)",
                            "messages")
    succeeded: int = counter("records acknowledged", "messages")
    failed: int = counter("records failed", "messages")
    outstanding: int = gauge(
        "ledger entries without an outcome (a record, or a whole send_batch chunk)",
        "entries")
    buffered_bytes: int = gauge(
        "buffer_memory in use: records without an outcome, outcomes not read yet", "bytes")
    requests_sent: int = counter("Produce requests written", "requests")
    double_settles: int = counter("records settled twice (a bug if ever > 0)", "messages")
    callback_errors: int = counter("on_delivery callbacks that raised", "callbacks")
    interceptor_errors: int = counter(
        "interceptor calls (on_send, on_acknowledgement) that raised or returned no message",
        "calls")
    client_id: str = info("the client_id option (labels every metric)", default="")
    timestamp: float = info("when the snapshot was taken: seconds since the epoch",
                            default=0.0)
    age: float = gauge("seconds since the producer opened", "seconds", default=0.0)
    buffer_memory: int = gauge("the buffer_memory option: the most buffered_bytes may be",
                               "bytes")
    queued_messages: int = gauge("records accepted, not on the wire, without an outcome",
                                 "messages")
    in_flight_requests: int = gauge("Produce requests not answered yet", "requests")
    in_flight_messages: int = gauge("records in them (without an outcome yet)", "messages")
    in_flight_bytes: int = gauge("their bytes", "bytes")
    delivered_bytes: int = counter("bytes of the records acknowledged", "bytes")
    retries: int = counter("batches sent back to be sent again after an error", "batches")
    brokers: dict[int, BrokerStatistics] = children(
        "broker", BrokerStatistics, "per broker the producer connected to, by node id")
    topics: dict[str, TopicStatistics] = children(
        "topic", TopicStatistics, "per topic the producer wrote to")


def snapshot(core: ProducerCore, started_at: float, interceptor_errors: int = 0,
             ) -> ProducerStatistics:
    """The producer's statistics now (``started_at``: the trio time it opened;
    ``interceptor_errors``: its interceptors' failed calls so far)."""
    ledger = core.ledger
    # [queued records, queued bytes, in-flight batches, records, bytes] per partition
    where: dict[tuple[str, int], list[int]] = {}

    def at(tp: tuple[str, int]) -> list[int]:
        entry = where.get(tp)
        if entry is None:
            entry = where[tp] = [0, 0, 0, 0, 0]
        return entry

    requests = 0
    for pp in core.partition_producers():
        records, nbytes = pp.waiting()
        if records:
            entry = at(pp.tp)
            entry[0] += records
            entry[1] += nbytes
    for bp in core.broker_producers():
        for tp, (records, nbytes) in bp.waiting().items():
            entry = at(tp)
            entry[0] += records
            entry[1] += nbytes
        in_flight, wire = bp.on_the_wire()
        requests += in_flight
        for tp, (batches, records, nbytes) in wire.items():
            entry = at(tp)
            entry[2] += batches
            entry[3] += records
            entry[4] += nbytes
    counters = core.context.counters
    failed = ledger.failed_by_partition
    names = {*(tp for tp in where), *counters.partitions, *failed}
    metadata = core.cluster.metadata
    parts: dict[str, dict[int, PartitionStatistics]] = {}
    for topic, partition in sorted(names):
        key = TopicPartition(topic, partition)
        queued, queued_bytes, batches, records, nbytes = where.get(key, (0, 0, 0, 0, 0))
        c = counters.partitions.get(key)
        done: dict[str, Any] = {} if c is None else dict(
            batches=c.batches, delivered_messages=c.delivered,
            delivered_bytes=c.delivered_bytes, retries=c.retries,
            retried_messages=c.retried_messages, batch_bytes=c.batch_bytes.summary(),
            batch_messages=c.batch_messages.summary())
        leader = metadata.leader_for(topic, partition) if partition >= 0 else None
        parts.setdefault(topic, {})[partition] = PartitionStatistics(
            leader=-1 if leader is None else leader,
            queued_messages=queued, queued_bytes=queued_bytes,
            in_flight_batches=batches, in_flight_messages=records, in_flight_bytes=nbytes,
            failed_messages=failed.get(key, 0), **done)
    topics = {}
    for name, by_partition in parts.items():
        ps = by_partition.values()
        windows = counters.topics.get(name)
        topics[name] = TopicStatistics(
            queued_messages=sum(p.queued_messages for p in ps),
            queued_bytes=sum(p.queued_bytes for p in ps),
            in_flight_messages=sum(p.in_flight_messages for p in ps),
            in_flight_bytes=sum(p.in_flight_bytes for p in ps),
            batches=sum(p.batches for p in ps),
            delivered_messages=sum(p.delivered_messages for p in ps),
            delivered_bytes=sum(p.delivered_bytes for p in ps),
            failed_messages=sum(p.failed_messages for p in ps),
            retries=sum(p.retries for p in ps),
            partitions=by_partition,
            batch_bytes=Summary() if windows is None else windows.batch_bytes.summary(),
            batch_messages=Summary() if windows is None else windows.batch_messages.summary())
    in_flight_messages = sum(t.in_flight_messages for t in topics.values())
    try:
        age = trio.current_time() - started_at
    except RuntimeError:  # (read outside trio: after the run ended)
        age = 0.0
    return ProducerStatistics(
        accepted=ledger.accepted,
        succeeded=ledger.succeeded,
        failed=ledger.failed,
        outstanding=len(ledger.outstanding),
        buffered_bytes=ledger.buffered_bytes,
        requests_sent=sum(bp.requests_sent for bp in core.broker_producers()),
        double_settles=ledger.double_settles,
        callback_errors=ledger.callback_errors,
        interceptor_errors=interceptor_errors,
        client_id=core.config.cluster.client_id or "",
        timestamp=time.time(),
        age=age,
        buffer_memory=ledger.buffer_memory,
        queued_messages=max(0, ledger.accepted - ledger.succeeded - ledger.failed
                            - in_flight_messages),
        in_flight_requests=requests,
        in_flight_messages=in_flight_messages,
        in_flight_bytes=sum(t.in_flight_bytes for t in topics.values()),
        delivered_bytes=sum(t.delivered_bytes for t in topics.values()),
        retries=sum(t.retries for t in topics.values()),
        brokers=core.cluster.broker_statistics(),
        topics=topics,
    )
