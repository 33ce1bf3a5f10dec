"""brokerProducer: one per broker; accumulates batches, keeps requests in flight.

Strategy: three tasks share this object's state (one trio thread, so every
mutation between two awaits is atomic):

* ``_intake`` drains the input channel (fan-in from partition producers)
  into per-partition accumulators. It never blocks on anything but its own
  input, so partition producers always make progress.
* ``_flusher`` waits until some unmuted partition is ready (linger, batch
  bytes, batch messages, or a flush) and a request slot is free, then drains
  every unmuted partition of this broker into one ProduceRequest (like the
  Java client's drain) and writes it.
* ``_responder`` handles responses strictly in request order: settles
  messages, or bounces a failed partition back to its partition producer.

Retry state (sarama's ``currentRetries``): once a partition fails here, every
later message of it that reaches this broker producer is bounced too, until
its ``Fin`` chaser arrives. The chaser is returned only once no batch of the
partition is in flight, so it always comes back after every bounced message.

Muting: at most ``max_in_flight_per_partition`` batches of one partition are
in flight; the partition's accumulator simply keeps filling meanwhile.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from operator import attrgetter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer.envelopes import Batch, BrokerItem, Fin, RetryItem, Syn, TopicPartition
from pipeline.producer.errors import BrokerResponseError, DeliveryTimeoutError
from pipeline.producer.message import PENDING, ProducerMessage
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
)
from pipeline.protocol.records import BatchBuilder

if TYPE_CHECKING:
    from pipeline.producer.core import ProducerCore

log = logging.getLogger("pipeline.producer")
_size_of = attrgetter("_size")

# Errors after which the partition's leader may have moved.
_REFRESH_CODES = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.KAFKA_STORAGE_ERROR,
})


@dataclass(slots=True)
class _Partition:
    msgs: list[ProducerMessage] = field(default_factory=list)  # accumulated, in order
    nbytes: int = 0
    first_at: float = math.inf  # when the oldest accumulated message arrived (linger)
    in_flight: int = 0  # batches of this partition on the wire (muting)
    # Set when a batch of this partition failed retriably here: everything of
    # the partition is bounced until its Fin arrives (sarama currentRetries).
    retrying: BaseException | None = None
    parked_fins: list[Fin] = field(default_factory=list)  # waiting for in_flight == 0


@dataclass(slots=True)
class _InFlight:
    pending: Any  # PendingResponse | None (acks=0)
    batches: dict[TopicPartition, list[ProducerMessage]]
    deadline: float  # earliest delivery deadline among its messages
    expired: bool = False


class BrokerProducer:
    def __init__(self, core: ProducerCore, node_id: int) -> None:
        self.core = core
        self.node_id = node_id
        config = core.config
        self.input: trio.MemorySendChannel[BrokerItem]
        self.input, self._input = trio.open_memory_channel[BrokerItem](config.channel_capacity)
        self._parts: dict[TopicPartition, _Partition] = {}
        self._in_flight: deque[_InFlight] = deque()
        self._wake_flusher = trio.Event()
        self._wake_responder = trio.Event()
        self._per_partition = config.max_in_flight_per_partition
        self._acks = config.acks_value
        self._timeout_ms = int(config.request_timeout * 1000)
        self.requests_sent = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._intake)
            nursery.start_soon(self._flusher)
            nursery.start_soon(self._responder)
            task_status.started()

    def wake(self) -> None:
        self._wake_flusher.set()

    # -- intake ------------------------------------------------------------
    async def _intake(self) -> None:
        receive = self._input
        async for item in receive:
            self._accept(item)
            while True:
                try:
                    item = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                self._accept(item)
            self._wake_flusher.set()

    def _accept(self, item: BrokerItem) -> None:
        part = self._parts.get(item.tp)
        if part is None:
            part = self._parts[item.tp] = _Partition()
        if isinstance(item, Batch):
            if part.retrying is not None:
                self._bounce(item.tp, part, item.messages, part.retrying)
                return
            if not part.msgs:
                part.first_at = trio.current_time()
            part.msgs.extend(item.messages)
            part.nbytes += sum(map(_size_of, item.messages))
        elif isinstance(item, Fin):
            if part.in_flight:
                part.parked_fins.append(item)
            else:
                self._return_fin(item.tp, part, item)
        elif isinstance(item, Syn):
            part.retrying = None

    # -- bouncing (the retry back-edge; never blocks) ----------------------
    def _bounce(
        self,
        tp: TopicPartition,
        part: _Partition,
        msgs: list[ProducerMessage],
        cause: BaseException,
    ) -> None:
        """Send ``msgs`` and everything accumulated for ``tp`` back for a retry."""
        part.retrying = cause
        if part.msgs:
            msgs = msgs + part.msgs
            part.msgs = []
            part.nbytes = 0
            part.first_at = math.inf
        core = self.core
        limit = core.config.retries
        now = trio.current_time()
        again: list[RetryItem] = []
        exhausted: list[ProducerMessage] = []
        expired: list[ProducerMessage] = []
        for msg in msgs:
            if msg._state != PENDING:
                continue
            if msg._level >= limit:
                exhausted.append(msg)
            elif msg._deadline <= now:
                expired.append(msg)
            else:
                msg._level += 1
                again.append(msg)
        if exhausted:
            core.ledger.fail(exhausted, cause)
            if not again:
                core.partition_producer(tp).leader_changed()
        if expired:
            core.ledger.fail(expired, core.delivery_timeout_error(tp, cause))
        if again:
            core.partition_producer(tp).retry(again)

    def _return_fin(self, tp: TopicPartition, part: _Partition, fin: Fin) -> None:
        if part.msgs:  # defensive: nothing should be left, but order demands it goes first
            self._bounce(tp, part, [], part.retrying or KafkaError("partition moved"))
        part.retrying = None
        self.core.partition_producer(tp).retry([Fin(tp, fin.level + 1)])

    # -- flushing ----------------------------------------------------------
    def _ready(self, now: float) -> bool:
        config = self.core.config
        flushing = self.core.flushing > 0
        for part in self._parts.values():
            if not part.msgs or part.in_flight >= self._per_partition:
                continue
            if (
                flushing
                or part.nbytes >= config.batch_bytes
                or len(part.msgs) >= config.max_batch_messages
                or now >= part.first_at + config.linger
            ):
                return True
        return False

    def _next_wake(self) -> float:
        linger = self.core.config.linger
        wake = math.inf
        for part in self._parts.values():
            if part.msgs:
                wake = min(wake, part.msgs[0]._deadline)
                if part.in_flight < self._per_partition:
                    wake = min(wake, part.first_at + linger)
        for flight in self._in_flight:
            if not flight.expired:
                wake = min(wake, flight.deadline)
        return wake

    async def _flusher(self) -> None:
        max_in_flight = self.core.config.max_in_flight
        while True:
            now = trio.current_time()
            self._expire(now)
            if len(self._in_flight) < max_in_flight and self._ready(now):
                await self._send_one()
                continue
            with trio.move_on_at(self._next_wake()):
                await self._wake_flusher.wait()
            self._wake_flusher = trio.Event()

    def _drain(self) -> dict[TopicPartition, list[ProducerMessage]]:
        config = self.core.config
        budget = config.max_request_bytes
        taken: dict[TopicPartition, list[ProducerMessage]] = {}
        for tp, part in self._parts.items():
            if not part.msgs or part.in_flight >= self._per_partition:
                continue
            msgs = part.msgs
            if (
                part.nbytes <= config.batch_bytes
                and part.nbytes <= budget
                and len(msgs) <= config.max_batch_messages
            ):
                taken[tp] = msgs  # the common case: the whole accumulator is one batch
                part.msgs = []
                budget -= part.nbytes
                part.nbytes = 0
                part.first_at = math.inf
                part.in_flight += 1
                continue
            size = 0
            n = 0
            limit = min(config.max_batch_messages, len(msgs))
            while n < limit:
                s = msgs[n]._size
                if n and (size + s > config.batch_bytes or size + s > budget):
                    break
                size += s
                n += 1
            if size > budget and taken:
                break
            taken[tp] = msgs[:n]
            del msgs[:n]
            part.nbytes -= size
            part.first_at = trio.current_time() if msgs else math.inf
            part.in_flight += 1
            budget -= size
            if budget <= 0:
                break
        return taken

    def _build(self, taken: dict[TopicPartition, list[ProducerMessage]]) -> ProduceRequest:
        config = self.core.config
        codec = config.compression_codec
        level = config.compression_level
        topics: dict[str, list[PartitionProduceData]] = {}
        for tp, msgs in taken.items():
            builder = BatchBuilder(compression=codec, compression_level=level)
            append = builder.append
            for m in msgs:
                append(m.timestamp, m.key, m.value, m.headers)  # type: ignore[arg-type]
            records = builder.build()
            topics.setdefault(tp.topic, []).append(
                PartitionProduceData(index=tp.partition, records=records)
            )
        return ProduceRequest(
            transactional_id=None,
            acks=self._acks,
            timeout_ms=self._timeout_ms,
            topic_data=tuple(
                TopicProduceData(name=name, partition_data=tuple(parts))
                for name, parts in topics.items()
            ),
        )

    async def _send_one(self) -> None:
        core = self.core
        try:
            conn = await core.connection(self.node_id)
        except KafkaError as exc:
            # Unreachable broker: everything here goes back to its partition
            # producer, which re-resolves the leader after a backoff.
            log.info("broker %d unreachable: %s", self.node_id, exc)
            for tp, part in list(self._parts.items()):
                if part.msgs and part.in_flight < self._per_partition:
                    self._bounce(tp, part, [], exc)
                    core.request_refresh(tp.topic)
            return
        taken = self._drain()
        if not taken:
            return
        request = self._build(taken)
        deadline = min(msgs[0]._deadline for msgs in taken.values())
        flight = _InFlight(None, taken, deadline)
        self.requests_sent += 1
        try:
            flight.pending = await conn.send(request, expect_response=self._acks != 0)
        except KafkaError as exc:
            # Written or not, the outcome is unknown: retry (at-least-once).
            self._in_flight.append(flight)
            self._fail_flight(flight, exc)
            self._in_flight.remove(flight)
            return
        self._in_flight.append(flight)
        self._wake_responder.set()

    # -- responses ---------------------------------------------------------
    async def _responder(self) -> None:
        while True:
            while not self._in_flight:
                await self._wake_responder.wait()
                self._wake_responder = trio.Event()
            flight = self._in_flight[0]
            if flight.pending is None:  # acks=0: written is all we will ever know
                self._in_flight.popleft()
                self._settle_acks0(flight)
            else:
                try:
                    response = await flight.pending.wait()
                except KafkaError as exc:
                    self._in_flight.popleft()
                    self._fail_flight(flight, exc)
                else:
                    self._in_flight.popleft()
                    self._handle_response(flight, response)
            self._wake_flusher.set()

    def _unmute(self, tp: TopicPartition) -> _Partition:
        part = self._parts[tp]
        part.in_flight -= 1
        if not part.in_flight and part.parked_fins:
            fins, part.parked_fins = part.parked_fins, []
            for fin in fins:
                self._return_fin(tp, part, fin)
        return part

    def _settle_acks0(self, flight: _InFlight) -> None:
        for tp, msgs in flight.batches.items():
            if not flight.expired:
                self.core.ledger.succeed(msgs, -1, -1)
            self._unmute(tp)

    def _fail_flight(self, flight: _InFlight, exc: BaseException) -> None:
        for tp, msgs in flight.batches.items():
            if not flight.expired:
                self._bounce(tp, self._parts[tp], msgs, exc)
            self._unmute(tp)
            self.core.request_refresh(tp.topic)

    def _handle_response(self, flight: _InFlight, response: ProduceResponse) -> None:
        results: dict[TopicPartition, Any] = {}
        for topic in response.responses:
            for p in topic.partition_responses:
                results[TopicPartition(topic.name, p.index)] = p
        ledger = self.core.ledger
        for tp, msgs in flight.batches.items():
            result = results.get(tp)
            part = self._parts[tp]
            if flight.expired:
                pass
            elif result is None:
                self._bounce(tp, part, msgs, KafkaError(
                    f"broker {self.node_id} left {tp.topic}[{tp.partition}] out of its response"
                ))
            else:
                code = error_code(result.error_code)
                if code == ErrorCode.NONE:
                    ledger.succeed(msgs, result.base_offset, result.log_append_time_ms)
                elif code.retriable:
                    self._bounce(tp, part, msgs, BrokerResponseError(code, result.error_message))
                    if code in _REFRESH_CODES:
                        self.core.request_refresh(tp.topic)
                else:
                    ledger.fail(msgs, BrokerResponseError(code, result.error_message))
            self._unmute(tp)

    # -- delivery timeout --------------------------------------------------
    def _expire(self, now: float) -> None:
        for tp, part in self._parts.items():
            if part.msgs and part.msgs[0]._deadline <= now:
                alive = [m for m in part.msgs if m._deadline > now]
                dead = [m for m in part.msgs if m._deadline <= now]
                part.msgs = alive
                part.nbytes = sum(m._size for m in alive)
                if not alive:
                    part.first_at = math.inf
                self.core.ledger.fail(dead, self.core.delivery_timeout_error(tp, None))
        for flight in self._in_flight:
            if not flight.expired and flight.deadline <= now:
                # The request may still succeed: its outcome is unknown. The
                # messages fail now (nobody waits past delivery_timeout); the
                # late response only unmutes the partition.
                flight.expired = True
                for tp, msgs in flight.batches.items():
                    self.core.ledger.fail(
                        [m for m in msgs if m._state == PENDING],
                        self.core.delivery_timeout_error(tp, None, in_flight=True),
                    )
