"""A small assign-mode reader on the project's own Fetch / ListOffsets codec.

Not a consumer group member (no group coordination, no committed offsets): it reads
the partitions it is told to, from the beginning, an offset or the end, and stops
after a count, at the end of the log, or when nothing new arrived for a while. Used
by ``python -m pipeline consume``, the demo's read-back, and tests.

``isolation_level="read_committed"`` reads transactional topics as Kafka's
``read_committed`` consumers do: only up to each partition's last stable offset (LSO:
the first offset of its oldest open transaction, else the high watermark), leaving out
aborted transactions' records and the COMMIT / ABORT markers
(:mod:`pipeline.protocol.read_committed`); "the end" (``start="end"``, ``stop_at_end``,
``topic_offsets``) is then the LSO. The default, ``"read_uncommitted"``, is Kafka's.

    async for rec in read_topic("127.0.0.1:9092", "orders", start="beginning",
                                stop_at_end=True):
        print(rec.partition, rec.offset, rec.key, rec.value)

``consume(...)`` is the blocking form returning a list; ``topic_offsets`` gives
``{partition: (earliest, latest)}``. Each takes ``config=ClusterConfig(...)`` (or a
``ProducerConfig``'s cluster part) and ``ClusterConfig`` fields by name over it (the
security options...), so it reaches a cluster the way the producer does.
``request_timeout`` (default: the config's, else 10 s) also bounds the metadata waits.
Errors come out as themselves (``pipeline.util.groups``), never wrapped in a nursery's
exception group.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import trio

from pipeline.cluster.config import ClusterConfig, cluster_config
from pipeline.cluster.errors import MetadataTimeoutError, UnknownTopicError
from pipeline.cluster.pool import Cluster
from pipeline.consumer._errors import ConsumerError
from pipeline.consumer._types import ConsumedRecord
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic, PartitionData
from pipeline.protocol.messages.list_offsets import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from pipeline.protocol.read_committed import IsolationLevel, ReadCommittedFilter, isolation_level
from pipeline.protocol.records import decode_record_batches
from pipeline.util.groups import unwrap_single_errors

__all__ = [
    "ConsumedRecord",
    "ConsumerError",
    "Isolation",
    "Start",
    "consume",
    "offsets_for_times",
    "read_topic",
    "topic_offsets",
]

#: "beginning", "end", an absolute offset >= 0, or a negative int: that many before the end
Start = Literal["beginning", "end"] | int
#: Kafka's consumer setting ``isolation.level``
Isolation = Literal["read_uncommitted", "read_committed"]

#: The reader's default per-request timeout (shorter than the producer's: a
#: reader that waits should say so early).
DEFAULT_REQUEST_TIMEOUT = 10.0

EARLIEST, LATEST = -2, -1
#: Fetch v13+ names topics by id; the name-based versions are enough here.
MAX_FETCH_VERSION = 12
_RETRIABLE_FETCH = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.NOT_COORDINATOR,
}


def _cluster_config(config: ClusterConfig | None, request_timeout: float | None,
                    options: dict[str, Any] | None = None) -> ClusterConfig:
    """The reader's cluster options: ``config`` (or the defaults) with keyword
    ``options`` (ClusterConfig fields: security, client_id...) over it;
    ``request_timeout`` (default 10 s without a config) also bounds metadata waits
    unless ``metadata_timeout`` is given."""
    opts = dict(options or {})
    if request_timeout is None:
        request_timeout = opts.pop("request_timeout", None)
    if request_timeout is None and config is None:
        request_timeout = DEFAULT_REQUEST_TIMEOUT
    if request_timeout is not None:
        opts["request_timeout"] = request_timeout
        opts.setdefault("metadata_timeout", request_timeout)
    if not opts:
        return config.cluster if config is not None else ClusterConfig()
    return cluster_config(config, opts)


async def _list_offsets(
    cluster: Cluster, topic: str, partitions: Sequence[int], timestamp: int
) -> dict[int, int]:
    """{partition: offset} for EARLIEST (-2) or LATEST (-1)."""
    by_leader: dict[int, list[int]] = {}
    for p in partitions:
        by_leader.setdefault(await cluster.leader_for(topic, p), []).append(p)
    out: dict[int, int] = {}
    for leader, parts in by_leader.items():
        conn = await cluster.connection(leader)
        request = ListOffsetsRequest(
            replica_id=-1,
            topics=(
                ListOffsetsTopic(
                    name=topic,
                    partitions=tuple(
                        ListOffsetsPartition(partition_index=p, timestamp=timestamp)
                        for p in parts
                    ),
                ),
            ),
        )
        response = await conn.request(request)
        for t in response.topics:
            for pr in t.partitions:
                if pr.error_code:
                    code = ErrorCode(pr.error_code)
                    raise ConsumerError(
                        f"ListOffsets for {topic}[{pr.partition_index}] failed: {code.name}"
                    )
                offset = pr.offset
                if offset < 0 and pr.old_style_offsets:  # ListOffsets v0
                    offset = pr.old_style_offsets[0]
                out[pr.partition_index] = offset
    return out


def _isolation(name: str) -> IsolationLevel:
    """(The public functions' ``isolation_level`` argument shadows the parser's name.)"""
    return isolation_level(name)  # ValueError naming the two choices


def _end_offset(pd: PartitionData, isolation: IsolationLevel) -> int:
    """Where a partition ends for a reader at ``isolation``: the high watermark, or under
    read_committed the last stable offset (a broker that reports none, -1, has no open
    transactions to hold a reader back: its high watermark)."""
    if isolation == IsolationLevel.READ_COMMITTED and pd.last_stable_offset >= 0:
        return min(pd.last_stable_offset, pd.high_watermark)
    return pd.high_watermark


async def _high_watermarks(
    cluster: Cluster, topic: str, partitions: Sequence[int],
    isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
) -> dict[int, int]:
    """{partition: high watermark} (the last stable offset under read_committed), from a
    Fetch that asks for (almost) no data.

    Used instead of ListOffsets(LATEST) because tansu answers that with a wrong offset
    once a partition holds a batch of more than one record (the Fetch high watermark
    is right on tansu and on Kafka alike).
    """
    earliest = await _list_offsets(cluster, topic, partitions, EARLIEST)
    by_leader: dict[int, list[int]] = {}
    for p in partitions:
        by_leader.setdefault(await cluster.leader_for(topic, p), []).append(p)
    out: dict[int, int] = {}
    for leader, parts in by_leader.items():
        conn = await cluster.connection(leader)
        version = min(conn.version_for(ApiKey.FETCH), MAX_FETCH_VERSION)
        request = FetchRequest(
            # max_wait_ms=0 gets an empty response from tansu; 10 ms costs nothing
            replica_id=-1, max_wait_ms=10, min_bytes=0, max_bytes=1,
            isolation_level=isolation, session_id=0, session_epoch=-1,
            topics=(FetchTopic(topic=topic, partitions=tuple(
                FetchPartition(partition=p, fetch_offset=earliest[p], partition_max_bytes=1)
                for p in parts
            )),),
        )
        response = await conn.request(request, version=version)
        for t in response.responses:
            for pd in t.partitions:
                if pd.error_code:
                    code = ErrorCode(pd.error_code)
                    raise ConsumerError(
                        f"Fetch {topic}[{pd.partition_index}] failed: {code.name}"
                    )
                out[pd.partition_index] = _end_offset(pd, isolation)
    missing = [p for p in partitions if p not in out]
    if missing:
        raise ConsumerError(f"no high watermark for {topic} partition(s) {missing}")
    return out


async def topic_offsets(
    bootstrap: str,
    topic: str,
    *,
    isolation_level: Isolation = "read_uncommitted",
    request_timeout: float | None = None,
    config: ClusterConfig | None = None,
    **options: Any,
) -> dict[int, tuple[int, int]]:
    """{partition: (earliest, latest)} of a topic; latest is the high watermark, or the
    last stable offset with ``isolation_level="read_committed"`` (``config``,
    ``request_timeout``, ``options``: as :func:`read_topic`)."""
    isolation = _isolation(isolation_level)
    cfg = _cluster_config(config, request_timeout, options)
    with unwrap_single_errors():
        async with Cluster.open(bootstrap, cfg) as cluster:
            return await _topic_offsets(cluster, topic, isolation)


async def offsets_for_times(
    bootstrap: str,
    topic: str,
    timestamp: int,
    *,
    partitions: Sequence[int] | None = None,
    request_timeout: float | None = None,
    config: ClusterConfig | None = None,
    **options: Any,
) -> dict[int, int]:
    """{partition: the offset of its first record with a timestamp >= ``timestamp``}
    (milliseconds since the epoch; ListOffsets by time, like the Java consumer's
    ``offsetsForTimes`` and kcat's ``-o s@TS``). A partition with no such record
    gets its end (high watermark): reading from there waits for new records.
    ``partitions``: all by default; ``config``, ``request_timeout``, ``options``: as
    :func:`read_topic`."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError(f"timestamp must be milliseconds since the epoch (an int >= 0), "
                         f"not {timestamp!r}")
    cfg = _cluster_config(config, request_timeout, options)
    with unwrap_single_errors():
        async with Cluster.open(bootstrap, cfg) as cluster:
            count = await cluster.partitions_for(topic)
            parts = list(range(count)) if partitions is None else list(partitions)
            bad = [p for p in parts if not 0 <= p < count]
            if bad:
                raise ConsumerError(
                    f"topic {topic!r} has {count} partition(s); no partition {bad[0]}")
            found = await _list_offsets(cluster, topic, parts, timestamp)
            missing = [p for p in parts if found.get(p, -1) < 0]
            ends = await _high_watermarks(cluster, topic, missing) if missing else {}
            return {p: ends[p] if p in ends else found[p] for p in parts}


async def _topic_offsets(cluster: Cluster, topic: str,
                         isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
                         ) -> dict[int, tuple[int, int]]:
    count = await cluster.partitions_for(topic)
    parts = list(range(count))
    lo = await _list_offsets(cluster, topic, parts, EARLIEST)
    hi = await _high_watermarks(cluster, topic, parts, isolation)
    return {p: (lo[p], hi[p]) for p in parts}



#: how long a reader that ends normally waits for its connections to close
_CLOSE_GRACE = 2.0


@asynccontextmanager
async def _cluster_beside(bootstrap: str, cfg: ClusterConfig) -> AsyncIterator[Cluster]:
    """``Cluster.open`` for an async generator: the cluster's nursery lives in a system
    task, not in the generator's frame.

    A generator that yields inside a nursery breaks trio when its caller leaves the loop
    early (``break``, an exception in the loop body): the generator is then closed later,
    by trio's finalizer in another task, and the nursery's exit corrupts the task's
    cancel-scope stack. Held here, nothing of the generator's frame spans a yield but
    this handle; leaving asks the owner task to close the cluster and waits for it (at
    once, cancelling its tasks, when leaving on an error or a cancellation)."""
    ready, stop, done = trio.Event(), trio.Event(), trio.Event()
    scope = trio.CancelScope()  # the owner's: cancelled, it ends the cluster's tasks at once
    box: dict[str, Any] = {}

    async def owner() -> None:
        try:
            with scope:
                async with Cluster.open(bootstrap, cfg) as cluster:
                    box["cluster"] = cluster
                    ready.set()
                    await stop.wait()
        except Exception as exc:  # a system task must not raise: the reader reports it
            box["error"] = exc
        finally:
            ready.set()
            done.set()

    trio.lowlevel.spawn_system_task(owner, name=f"read_topic cluster {bootstrap}")
    try:
        await ready.wait()
        if "error" in box:
            raise box["error"]
        yield box["cluster"]
    except BaseException:
        scope.cancel()  # left on an error, a cancellation or Ctrl-C: no graceful close
        raise
    finally:
        stop.set()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(_CLOSE_GRACE):
                await done.wait()
            scope.cancel()  # a close that takes longer is cut short
            await done.wait()
    if "error" in box:
        raise box["error"]


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    partitions: Sequence[int] | None = None,
    start: Start | Mapping[int, int] = "beginning",
    max_messages: int | None = None,
    stop_at_end: bool = False,
    idle_timeout: float | None = None,
    max_wait: float = 0.5,
    partition_max_bytes: int = 4 * 1024 * 1024,
    isolation_level: Isolation = "read_uncommitted",
    request_timeout: float | None = None,
    config: ClusterConfig | None = None,
    **options: Any,
) -> AsyncGenerator[ConsumedRecord, None]:
    """Yield records of ``topic`` in offset order per partition (partitions interleave).

    ``start``: "beginning", "end", an offset for every partition, ``-N`` (the last N
    of each), or ``{partition: offset}`` (e.g. from :func:`offsets_for_times`).

    Stops after ``max_messages``; with ``stop_at_end`` once every partition reached
    the high watermark it had when it was last fetched (like ``kcat -e``); with
    ``idle_timeout`` when no record arrived for that many seconds. With none of them
    it runs until cancelled.

    ``isolation_level="read_committed"``: only committed transactional records (and
    non-transactional ones), up to each partition's last stable offset, which is also
    the end for ``start="end"`` and ``stop_at_end`` (an open transaction holds it back).

    ``config`` is how to reach the cluster (a ``ClusterConfig``, or a ``ProducerConfig``:
    its cluster part is used), with keyword ``options`` (ClusterConfig fields, e.g.
    ``security_protocol="SASL_SSL", sasl_mechanism=..., sasl_username=...``) over it;
    ``request_timeout`` bounds each request and metadata wait (default: the config's,
    else 10 s).

    Raises ``UnknownTopicError``, ``ConsumerError`` (a partition that does not exist,
    a non-retriable fetch error) and connection errors (``BrokerConnectionError``).
    """
    isolation = _isolation(isolation_level)
    cfg = _cluster_config(config, request_timeout, options)
    with unwrap_single_errors():
        async with _cluster_beside(bootstrap, cfg) as cluster:
            try:
                with trio.fail_after(cfg.request_timeout):
                    count = await cluster.partitions_for(topic)
            except trio.TooSlowError:
                # No broker ever answered: say who and why, not just "too slow".
                raise cluster.bootstrap_error() or MetadataTimeoutError(
                    f"no metadata for topic {topic!r} within {cfg.request_timeout}s") from None
            parts = list(range(count)) if partitions is None else list(partitions)
            bad = [p for p in parts if not 0 <= p < count]
            if bad:
                raise ConsumerError(f"topic {topic!r} has {count} partition(s); no partition {bad[0]}")
            if start == "beginning":
                positions = await _list_offsets(cluster, topic, parts, EARLIEST)
            elif start == "end":
                positions = await _high_watermarks(cluster, topic, parts, isolation)
            elif isinstance(start, Mapping):
                unplaced = [p for p in parts if p not in start]
                if unplaced:
                    raise ValueError(f"start has no offset for partition {unplaced[0]}")
                positions = {p: start[p] for p in parts}
            elif isinstance(start, int) and start >= 0:
                positions = dict.fromkeys(parts, start)
            elif isinstance(start, int):
                lo = await _list_offsets(cluster, topic, parts, EARLIEST)
                hi = await _high_watermarks(cluster, topic, parts, isolation)
                positions = {p: max(lo[p], hi[p] + start) for p in parts}
            else:
                raise ValueError(f"start must be 'beginning', 'end' or an int, not {start!r}")

            high_water: dict[int, int] = {}
            if stop_at_end:
                high_water = await _high_watermarks(cluster, topic, parts, isolation)
            done = {p for p in parts if stop_at_end and positions[p] >= high_water[p]}
            yielded = 0
            last_record_at = trio.current_time()
            while len(done) < len(parts):
                if max_messages is not None and yielded >= max_messages:
                    return
                active = [p for p in parts if p not in done]
                by_leader: dict[int, list[int]] = {}
                for p in active:
                    by_leader.setdefault(await cluster.leader_for(topic, p), []).append(p)
                got_any = False
                for leader, lparts in by_leader.items():
                    conn = await cluster.connection(leader)
                    version = min(conn.version_for(ApiKey.FETCH), MAX_FETCH_VERSION)
                    request = FetchRequest(
                        replica_id=-1,
                        max_wait_ms=int(max_wait * 1000),
                        min_bytes=1,
                        max_bytes=64 * 1024 * 1024,
                        isolation_level=isolation,
                        session_id=0,
                        session_epoch=-1,
                        topics=(
                            FetchTopic(
                                topic=topic,
                                partitions=tuple(
                                    FetchPartition(
                                        partition=p,
                                        fetch_offset=positions[p],
                                        partition_max_bytes=partition_max_bytes,
                                    )
                                    for p in lparts
                                ),
                            ),
                        ),
                    )
                    response = await conn.request(request, version=version)
                    if response.error_code:
                        code = ErrorCode(response.error_code)
                        raise ConsumerError(f"Fetch from {topic} failed: {code.name}")
                    for t in response.responses:
                        for pd in t.partitions:
                            p = pd.partition_index
                            if pd.error_code:
                                code = ErrorCode(pd.error_code)
                                if code in _RETRIABLE_FETCH:
                                    await cluster.refresh([topic], force=True)
                                    continue
                                if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                                    raise UnknownTopicError(topic)
                                raise ConsumerError(
                                    f"Fetch {topic}[{p}] at offset {positions[p]} failed: "
                                    f"{code.name} ({code.description})"
                                )
                            if stop_at_end:
                                high_water[p] = max(high_water.get(p, 0),
                                                    _end_offset(pd, isolation))
                            if pd.records:
                                keep = (ReadCommittedFilter(pd.aborted_transactions or ())
                                        if isolation == IsolationLevel.READ_COMMITTED else None)
                                for batch in decode_record_batches(pd.records):
                                    next_offset = batch.base_offset + batch.last_offset_delta + 1
                                    # the filter must see every batch, control ones
                                    # too: an ABORT marker ends its producer's abort
                                    if (keep is not None and not keep(batch)) or batch.is_control:
                                        positions[p] = max(positions[p], next_offset)
                                        continue
                                    for rec in batch.records:
                                        offset = batch.base_offset + rec.offset_delta
                                        if offset < positions[p]:
                                            continue
                                        positions[p] = offset + 1
                                        got_any = True
                                        yield ConsumedRecord(
                                            topic,
                                            p,
                                            offset,
                                            batch.base_timestamp + rec.timestamp_delta,
                                            rec.key,
                                            rec.value,
                                            tuple(rec.headers),
                                        )
                                        yielded += 1
                                        if max_messages is not None and yielded >= max_messages:
                                            return
                                    positions[p] = max(positions[p], next_offset)
                            if stop_at_end and positions[p] >= high_water[p]:
                                done.add(p)
                now = trio.current_time()
                if got_any:
                    last_record_at = now
                elif idle_timeout is not None and now - last_record_at >= idle_timeout:
                    return


def consume(
    bootstrap: str,
    topic: str,
    *,
    partitions: Sequence[int] | None = None,
    start: Start = "beginning",
    max_messages: int | None = None,
    stop_at_end: bool = True,
    idle_timeout: float | None = None,
    timeout: float = math.inf,
    isolation_level: Isolation = "read_uncommitted",
    request_timeout: float | None = None,
    config: ClusterConfig | None = None,
    **options: Any,
) -> list[ConsumedRecord]:
    """Blocking helper: the records ``read_topic`` yields, as a list (``timeout`` bounds it)."""
    _isolation(isolation_level)  # ValueError before the loop
    cfg = _cluster_config(config, request_timeout, options)  # ConfigError before the loop

    async def run() -> list[ConsumedRecord]:
        out: list[ConsumedRecord] = []
        with trio.move_on_after(timeout):
            async for rec in read_topic(
                bootstrap, topic, partitions=partitions, start=start,
                max_messages=max_messages, stop_at_end=stop_at_end,
                idle_timeout=idle_timeout, isolation_level=isolation_level, config=cfg,
            ):
                out.append(rec)
        return out

    with unwrap_single_errors():
        return trio.run(run)
