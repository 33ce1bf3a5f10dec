"""topicProducer: one task per topic; runs the partitioner.

It learns the topic's partition count (waiting for metadata the first time,
bounded by the messages' delivery deadlines), assigns each message a
partition, and hands one list per partition to that partition's producer.
Messages for an unknown topic, or with an explicit partition out of range,
fail here with a specific error; later messages are looked up again, so a
topic created meanwhile starts working.
"""

from __future__ import annotations

import logging
from array import array
from bisect import bisect_left
from itertools import accumulate, chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer._columnar.partitioning import key_partitions
from pipeline.producer._columnar.rows import RowRun, assign_rows
from pipeline.producer._errors import DeliveryTimeoutError
from pipeline.producer._message import PENDING, ProducerMessage
from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.producer._stages.partitioner import DefaultPartitioner, Murmur2Partitioner
from pipeline.protocol.columnar import record_size_bounds

if TYPE_CHECKING:
    from pipeline.producer._stages.context import StageContext
    from pipeline.producer._stages.ports import PartitionInboxes

log = logging.getLogger("pipeline.producer")
_key_of = attrgetter("key")
_partition_of = attrgetter("partition")
_size_of = attrgetter("_size")
# Below this many messages the per-message loop is as cheap as the run's setup.
_RUN_MIN = 16
# A row's partition when its partitioner raised (past any topic's: out of range).
_NO_PARTITION = (1 << 31) - 1


class PartitionOutOfRangeError(KafkaError, ValueError):
    """An explicit partition that the topic does not have."""


class TopicProducer:
    def __init__(
        self,
        ctx: StageContext,
        topic: str,
        partitioner: Any,
        partitions: PartitionInboxes,
    ) -> None:
        self._cluster = ctx.cluster
        self._ledger = ctx.ledger
        self._config = ctx.config
        self._partitions = partitions
        self.topic = topic
        # Our inbox: the dispatcher sends to ``inbox`` (and closes it to stop us).
        self.inbox: trio.MemorySendChannel[list[ProducerMessage]]
        self.inbox, self._inbox = trio.open_memory_channel[list[ProducerMessage]](
            ctx.config.channel_capacity)
        self._partitioner = partitioner
        # KIP-480/794 sticky partitioning for null keys: switch partitions after
        # a batch's worth of bytes went to the current one.
        self._sticky_bytes = 0
        self._sticky_partition = -1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        inbox = self._inbox
        async for msgs in inbox:
            pending = [msgs]
            while True:
                try:
                    pending.append(inbox.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            batch = pending[0] if len(pending) == 1 else list(chain.from_iterable(pending))
            await self._route(batch)

    async def _partition_count(
        self, msgs: list[ProducerMessage]
    ) -> tuple[int | None, list[ProducerMessage]]:
        """The topic's partition count, and the messages still waiting for it: while
        metadata is awaited, each message fails at its own delivery deadline (never
        at an earlier one's: nothing expires before its delivery_timeout)."""
        cluster = self._cluster
        n = cluster.partition_count_nowait(self.topic)
        if n is not None:
            return n, msgs
        while msgs:
            try:
                with trio.fail_at(min(m._deadline for m in msgs)):
                    return await cluster.partitions_for(self.topic), msgs
            except trio.TooSlowError:
                now = trio.current_time()
                self._ledger.fail([m for m in msgs if m._deadline <= now], DeliveryTimeoutError(
                    f"no metadata for topic {self.topic!r} within delivery_timeout="
                    f"{self._config.delivery_timeout}s"
                ))
                msgs = [m for m in msgs if m._deadline > now]
            except KafkaError as exc:
                self._ledger.fail(msgs, exc)
                break
        return None, msgs

    async def _route(self, msgs: list[ProducerMessage]) -> None:
        n, msgs = await self._partition_count(msgs)
        if n is None:
            return
        topic = self.topic
        bad: list[ProducerMessage] = []
        if RowRun in set(map(type, msgs)):
            by_partition = self._assign_mixed(msgs, n, bad)
        elif (
            type(self._partitioner) is DefaultPartitioner
            and n >= 1
            and len(msgs) >= _RUN_MIN
            and list(map(_key_of, msgs)).count(None) == len(msgs)
            and list(map(_partition_of, msgs)).count(None) == len(msgs)
        ):
            by_partition = self._assign_sticky_run(msgs, n)
        else:
            by_partition = self._assign(msgs, n, bad)
        if bad:
            for msg in bad:
                self._ledger.fail([msg], PartitionOutOfRangeError(
                    f"partition {msg.partition} does not exist: topic {topic!r} has {n} "
                    f"partitions (0..{n - 1})"
                ))
        partitions = self._partitions
        for p, group in by_partition.items():
            send = await partitions.partition_inbox(TopicPartition(topic, p))
            try:
                send.send_nowait(group)
            except trio.WouldBlock:
                await send.send(group)

    def _assign_mixed(
        self, items: list[ProducerMessage], n: int, bad: list[ProducerMessage]
    ) -> dict[int, list[ProducerMessage]]:
        """A list holding runs of rows: runs are split by ``rows.assign_rows``, the
        messages between them by ``_assign``; per partition in list order."""
        by_partition: dict[int, list[Any]] = {}
        config = self._config
        cap = min(config.batch_bytes, config.max_message_bytes)
        default = type(self._partitioner) is DefaultPartitioner
        segment: list[ProducerMessage] = []
        item: Any
        for item in [*items, None]:
            if item is not None and type(item) is not RowRun:
                segment.append(item)
                continue
            if segment:
                for p, group in self._assign(segment, n, bad).items():
                    by_partition.setdefault(p, []).extend(group)
                segment = []
            if item is None:
                break
            run: RowRun = item
            if run._state != PENDING:
                # Settled on its way here: a close without flush failed it (and
                # released its bytes) after the dispatcher forwarded it, before
                # this task ran. Splitting it would release its bytes again.
                continue
            # Any partitioner but the default one is asked per row, as _assign asks it
            # per message (the default one's choices need no call per row).
            failures: dict[int, BaseException] = {}
            parts = None if default else self._partition_rows(run, n, failures)
            outcomes = run._sink.outcomes
            if outcomes is not None and (parts is not None or run.columns.keys is not None
                                         or run.columns.partitions is not None):
                outcomes.follow_wire_order(run.count)  # (split by partition, not in call order)
            runs, out_of_range = assign_rows(run, n, self._partitioner, cap=cap,
                                             max_records=config.max_batch_messages, parts=parts)
            split = [r for _, r in runs]
            refused = [] if out_of_range is None else self._refused(
                run, out_of_range, n, failures, parts)
            run._sink.runs = split + [r for r, _ in refused]
            # The chunk reserved the per-row bound; its runs hold their exact sizes.
            self._ledger.release(run._size - sum(r._size for r in split))
            for p, part_run in runs:
                part_run.partition = p
                by_partition.setdefault(p, []).append(part_run)
            for part_run, error in refused:
                self._ledger.fail([part_run], error)  # type: ignore[list-item]
        return by_partition

    def _partition_rows(self, run: RowRun, n: int, failures: dict[int, BaseException]
                        ) -> memoryview:
        """Each row's partition (int32) from the partitioner, asked per row not pinned,
        exactly as ``_assign`` asks it per message (null-key rows count their size
        bound towards ``on_new_batch``); keyed rows on murmur2 in one C loop when the
        partitioner is murmur2's. A row whose ``partition()`` raised is in
        ``failures`` (its partition past the topic's: out of range)."""
        columns, topic = run.columns, self.topic
        partitioner = self._partitioner
        partition_of = partitioner.partition
        if type(partitioner) is Murmur2Partitioner:
            parts = key_partitions(columns, n)  # pinned rows, and keyed ones: murmur2
        else:
            parts = memoryview(bytearray(b"\xff" * (4 * len(columns)))).cast("i")
            if columns.partitions is not None:
                parts[:] = columns.partitions
        keys, values = columns.keys, columns.values
        sizes = record_size_bounds(columns)
        batch_bytes = self._config.batch_bytes
        sticky_partition, sticky_bytes = self._sticky_partition, self._sticky_bytes
        for i in range(len(columns)):
            if parts[i] >= 0:
                continue  # pinned (or hashed)
            key = None if keys is None else keys[i]
            try:
                p = partition_of(topic, key, values[i], n)
            except Exception as exc:  # a user partitioner's bug fails its row only
                failures[i] = exc  # (a user's returning no partition of the topic raises)
                parts[i] = _NO_PARTITION
                continue
            if key is None:
                if p != sticky_partition:
                    sticky_partition = p
                    sticky_bytes = 0
                sticky_bytes += sizes[i]
                if sticky_bytes >= batch_bytes:
                    partitioner.on_new_batch(topic, n, p)
                    sticky_bytes = 0
            parts[i] = p
        self._sticky_partition, self._sticky_bytes = sticky_partition, sticky_bytes
        return parts

    def _refused(self, run: RowRun, out_of_range: RowRun, n: int,
                 failures: dict[int, BaseException], parts: memoryview | None
                 ) -> list[tuple[RowRun, BaseException]]:
        """The runs of rows that go nowhere, each with its error: pinned to a partition
        the topic does not have, or their partitioner raised (``failures``). A
        ``send_batch`` chunk's pinned rows fail as one run; ``send()`` rows as the
        messages they stand for: one run per partition, and one per row whose
        partitioner raised or chose no partition of the topic, each with the
        message's error; ``send_many``'s messages one run per row, in call order
        after those whose partitioner raised (the per-message path's order)."""
        topic = self.topic
        chunk = run._sink
        rows = out_of_range.rows
        if not failures and chunk.group is not None and chunk.messages is None:  # (send_batch)
            return [(out_of_range, PartitionOutOfRangeError(
                f"rows pinned to partitions the topic {topic!r} does not have: it has "
                f"{n} partitions (0..{n - 1})"))]
        chosen = run.columns.partitions if parts is None else parts
        assert chosen is not None, "a row out of range was pinned or chosen there"
        by_partition: dict[int, list[int]] = {}
        out: list[tuple[RowRun, BaseException]] = []
        # send_many's messages fail one by one, in call order, each with its own error
        # (the per-message path's order: the partitioner's failures, then the others)
        alone: list[int] | None = None if chunk.messages is None else []
        for row in rows:
            if row in failures:
                one = array("q", [row])
                out.append((out_of_range.split(one, 1, 0), failures[row]))
            elif alone is not None:
                alone.append(row)
            else:
                by_partition.setdefault(chosen[row], []).append(row)
        for row in alone or ():
            p = chosen[row]
            part = out_of_range.split(array("q", [row]), 1, 0)
            part.partition = p
            out.append((part, PartitionOutOfRangeError(
                f"partition {p} does not exist: topic {topic!r} has {n} partitions "
                f"(0..{n - 1})")))
        for p, picked in by_partition.items():
            part = out_of_range.split(array("q", picked), len(picked), 0)
            part.partition = p
            out.append((part, PartitionOutOfRangeError(
                f"partition {p} does not exist: topic {topic!r} has {n} partitions "
                f"(0..{n - 1})")))
        # Each run holds consecutive wire positions (RowOutcomes' spans), after the
        # rows that went to partitions: the refused rows' order is this list's.
        place = out_of_range.place
        for part, _ in out:
            part.place = place
            place += part.count
        return out

    def _assign(
        self, msgs: list[ProducerMessage], n: int, bad: list[ProducerMessage]
    ) -> dict[int, list[ProducerMessage]]:
        """Partition each message (keys, explicit partitions, any partitioner)."""
        topic = self.topic
        partitioner = self._partitioner
        partition_of = partitioner.partition
        # The default partitioner's null-key choice changes only in on_new_batch,
        # which this loop calls: between two calls it is cached here (sticky_now).
        cache_sticky = type(partitioner) is DefaultPartitioner
        sticky_now = -1
        sticky_partition = self._sticky_partition
        sticky_bytes = self._sticky_bytes
        by_partition: dict[int, list[ProducerMessage]] = {}
        batch_bytes = self._config.batch_bytes
        last_p = -1
        last_group: list[ProducerMessage] = []
        for msg in msgs:
            p = msg.partition
            if p is None:
                key = msg.key
                if key is None and sticky_now >= 0:
                    p = sticky_now
                else:
                    try:
                        p = partition_of(topic, key, msg.value, n)
                    except Exception as exc:  # a user partitioner's bug fails its message only
                        self._ledger.fail([msg], exc)
                        continue
                    if key is None and cache_sticky:
                        sticky_now = p
                if key is None:
                    if p != sticky_partition:
                        sticky_partition = p
                        sticky_bytes = 0
                    sticky_bytes += msg._size
                    if sticky_bytes >= batch_bytes:
                        partitioner.on_new_batch(topic, n, p)
                        sticky_bytes = 0
                        sticky_now = -1
                msg.partition = p
            elif not 0 <= p < n:
                bad.append(msg)
                continue
            if p == last_p:
                last_group.append(msg)
                continue
            group = by_partition.get(p)
            if group is None:
                group = by_partition[p] = [msg]
            else:
                group.append(msg)
            last_p = p
            last_group = group
        self._sticky_partition = sticky_partition
        self._sticky_bytes = sticky_bytes
        return by_partition

    def _assign_sticky_run(
        self, msgs: list[ProducerMessage], n: int
    ) -> dict[int, list[ProducerMessage]]:
        """The default partitioner on a run of null-key messages with no explicit
        partition: the same choices as ``_assign`` (sticky partition, a new one
        once ``batch_bytes`` went to it), found with a bisection over cumulative
        sizes instead of a per-message partitioner call."""
        topic = self.topic
        partitioner = self._partitioner
        batch_bytes = self._config.batch_bytes
        sticky_partition = self._sticky_partition
        sticky_bytes = self._sticky_bytes
        cumulative = list(accumulate(map(_size_of, msgs)))
        by_partition: dict[int, list[ProducerMessage]] = {}
        total = len(msgs)
        start = 0
        while start < total:
            p = partitioner.partition(topic, None, None, n)
            if p != sticky_partition:
                sticky_partition = p
                sticky_bytes = 0
            before = cumulative[start - 1] if start else 0
            # The first message that brings the partition to batch_bytes is the
            # last one it gets.
            crossing = bisect_left(cumulative, batch_bytes - sticky_bytes + before, start)
            end = min(crossing + 1, total)
            chunk = msgs[start:end]
            for msg in chunk:
                msg.partition = p
            group = by_partition.get(p)
            if group is None:
                by_partition[p] = chunk
            else:
                group.extend(chunk)
            if crossing < total:
                partitioner.on_new_batch(topic, n, p)
                sticky_bytes = 0
            else:
                sticky_bytes += cumulative[end - 1] - before
            start = end
        self._sticky_partition = sticky_partition
        self._sticky_bytes = sticky_bytes
        return by_partition
