"""Idempotence: producer id and epoch, per-partition sequences, epoch bumps.

Strategy. Sequences are assigned when a broker producer *seals* a batch for a
live leader (never to a message that may still fail before it is sent), so
the broker sees every partition's sequences without gaps. A retried batch is
re-sent byte for byte.

Recovery (KIP-360) happens when a partition's sequence state can no longer be
trusted: an OUT_OF_ORDER_SEQUENCE_NUMBER that no earlier failure explains,
UNKNOWN_PRODUCER_ID, or a batch whose delivery timed out while its outcome was
unknown. Then:

1. ``request_bump()``: every broker producer stops sealing new batches;
2. the bump task waits until no batch is in flight anywhere, so no answer
   under the old epoch is still to come;
3. InitProducerId with the current id and epoch (KIP-360, v3+) bumps the
   epoch; when the broker refuses that (tansu) or the epoch is exhausted
   (sarama #2178), a new producer id is obtained instead;
4. every partition's sequence restarts at 0, sealing resumes. Batches waiting
   for a retry are re-stamped lazily when they are next sent, in order; a batch
   whose fate is unknown is failed rather than re-stamped, since a re-stamped
   copy of a written batch would be a duplicate.

The producer never gets stuck: a failed InitProducerId is retried with backoff
until it succeeds, and messages keep their delivery timeouts meanwhile.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer.envelopes import TopicPartition
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.init_producer_id import InitProducerIdRequest

if TYPE_CHECKING:
    from pipeline.producer.core import ProducerCore

log = logging.getLogger("pipeline.producer")

MAX_EPOCH = 32767
SEQUENCE_WRAP = 2**31


class InitProducerIdError(KafkaError):
    """InitProducerId failed after its retries."""


class Idempotence:
    def __init__(self, core: ProducerCore) -> None:
        self.core = core
        self.producer_id = -1
        self.producer_epoch = -1
        self._next_sequence: dict[TopicPartition, int] = {}
        # Partitions where a batch of the current epoch was acknowledged. Until
        # then only one batch may be in flight: a broker accepts *any* sequence
        # from a producer it has no state for (Kafka's ProducerAppendInfo since
        # KIP-360), so a pipelined second batch could be written before a first
        # one that failed transiently.
        self.confirmed: set[TopicPartition] = set()
        # Batches on the wire across all broker producers: a bump waits for 0.
        self.in_flight = 0
        self._drained = trio.Event()
        # True from request_bump() until the new epoch is in place: no sealing.
        self.paused = True  # until the first producer id arrives
        self._bump_requested = trio.Event()
        self.bumps = 0  # epoch bumps and new producer ids (statistics, tests)
        self.new_ids = 0

    # -- sequences ---------------------------------------------------------
    def take_sequence(self, tp: TopicPartition, count: int) -> int:
        seq = self._next_sequence.get(tp, 0)
        self._next_sequence[tp] = (seq + count) % SEQUENCE_WRAP
        return seq

    # -- in-flight accounting (called by broker producers) -----------------
    def batch_sent(self) -> None:
        self.in_flight += 1

    def batch_done(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._drained.set()

    async def wait_drained(self) -> None:
        while self.in_flight:
            self._drained = trio.Event()
            await self._drained.wait()

    # -- bumps -------------------------------------------------------------
    def request_bump(self, reason: str) -> None:
        if not self._bump_requested.is_set():
            log.warning("idempotent producer: bumping the epoch (%s)", reason)
        self.paused = True
        self._bump_requested.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The bump task: obtains the first producer id, then serves bump requests."""
        await self._init(bump=False)
        task_status.started()
        while True:
            await self._bump_requested.wait()
            await self.wait_drained()
            await self._init(bump=True)
            self._bump_requested = trio.Event()

    async def _init(self, *, bump: bool) -> None:
        core = self.core
        attempt = 0
        while True:
            attempt += 1
            try:
                pid, epoch = await self._request(bump=bump)
            except (KafkaError, OSError) as exc:
                delay = core.backoff(attempt)
                log.info("InitProducerId failed (%s); retrying in %.3fs", exc, delay)
                await trio.sleep(delay)
                continue
            if bump and pid == self.producer_id:
                self.bumps += 1
            elif bump:
                self.new_ids += 1
            self.producer_id, self.producer_epoch = pid, epoch
            self._next_sequence.clear()
            self.confirmed.clear()
            self.paused = False
            for bp in core.broker_producers():
                bp.wake()
            return

    async def _request(self, *, bump: bool) -> tuple[int, int]:
        conn = await self.core.cluster.any_connection()
        version = conn.version_for(ApiKey.INIT_PRODUCER_ID)
        kip360 = bump and version >= 3 and 0 <= self.producer_epoch < MAX_EPOCH - 1
        request = InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout_ms=int(self.core.config.delivery_timeout * 1000),
            producer_id=self.producer_id if kip360 else -1,
            producer_epoch=self.producer_epoch if kip360 else -1,
        )
        response = await conn.request(request, version=version)
        code = error_code(response.error_code)
        if code != ErrorCode.NONE and kip360:
            # The broker cannot bump this id (tansu never can): a new id is the
            # other way to a fresh sequence space.
            log.info("KIP-360 epoch bump refused (%s); requesting a new producer id", code.name)
            request = InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout_ms=request.transaction_timeout_ms,
                producer_id=-1,
                producer_epoch=-1,
            )
            response = await conn.request(request, version=version)
            code = error_code(response.error_code)
        if code != ErrorCode.NONE:
            raise InitProducerIdError(f"InitProducerId v{version}: {code.name} {code.description}")
        if response.producer_id < 0:
            raise InitProducerIdError(
                f"InitProducerId v{version} returned producer id {response.producer_id}: "
                "the broker does not support idempotence at this version"
            )
        return response.producer_id, response.producer_epoch
