"""Idempotence: producer id and epoch, per-partition sequences, recovery.

Strategy. Sequences are assigned when a broker producer *seals* a batch for a
live leader (never to a message that may still fail before it is sent), so
the broker sees every partition's sequences without gaps. A retried batch is
re-sent byte for byte.

Recovery happens when a partition's sequence state can no longer be trusted:
an OUT_OF_ORDER_SEQUENCE_NUMBER that no earlier failure explains,
UNKNOWN_PRODUCER_ID (Kafka < 2.5), a sealed batch that failed for good
(``batch_failed``: its delivery timed out, in flight or waiting for a retry,
its retries ran out, or the broker refused it for good; its sequences are a gap
the broker waits for forever), or a broker fencing the current epoch. Then:

1. ``request_bump()``: every broker producer stops sealing new batches;
2. the bump task waits until no batch is in flight anywhere, so no answer
   under the old epoch is still to come;
3. the producer bumps its own epoch (KIP-360, what the Java client does for an
   idempotent producer). No request is needed: a broker accepts a higher epoch
   whose first sequence is 0, and from then on fences the old epoch on that
   partition (INVALID_PRODUCER_EPOCH), so a stale request of the old epoch
   still queued somewhere can never be written after the new epoch's batches.
   A *new producer id* (InitProducerId with -1/-1) is taken instead when the
   epoch is exhausted (32767, sarama #2178) or a broker fenced the current
   epoch; once a broker refused a locally bumped epoch (tansu answers
   PRODUCER_FENCED to it), every later recovery takes a new id directly.
   InitProducerId is never sent with the current id and epoch: for a producer
   without a transactional id Kafka ignores them and allocates a new id anyway
   (``TransactionCoordinator.handleInitProducerId``);
4. every partition's sequence restarts at 0, sealing resumes. Batches waiting
   for a retry are re-stamped lazily when they are next sent, in order; a batch
   whose fate is unknown is failed rather than re-stamped, since a re-stamped
   copy of a written batch would be a duplicate.

The producer never gets stuck: a failed InitProducerId is retried with backoff
until it succeeds, and messages keep their delivery timeouts meanwhile.

A *transactional* producer (``transactions.py``) obtains its id from the transaction
coordinator (``obtain_id``) and never bumps its epoch itself: a recovery request only
pauses sealing and makes the open transaction abortable (``on_recovery``); a fenced
epoch makes it abortable or the producer fatal (``on_fenced``), and the refused batch
fails at once instead of waiting for an epoch; the transaction manager sets the next
epoch at the abort (``restart``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer._stages.envelopes import SEQUENCE_WRAP, SealedBatch, TopicPartition
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.init_producer_id import InitProducerIdRequest

if TYPE_CHECKING:
    from pipeline.cluster.pool import Cluster
    from pipeline.producer._config import ProducerConfig

log = logging.getLogger("pipeline.producer")

MAX_EPOCH = 32767  # int16: the last epoch a batch can carry (the Java client's Short.MAX_VALUE)
__all__ = ["MAX_EPOCH", "SEQUENCE_WRAP", "Idempotence", "InitProducerIdError"]


class InitProducerIdError(KafkaError):
    """InitProducerId failed after its retries."""


class Idempotence:
    def __init__(
        self,
        config: ProducerConfig,
        cluster: Cluster,
        backoff: Callable[[int], float],
        on_new_epoch: Callable[[], None],
    ) -> None:
        #: Set by a transactional producer: where the producer id comes from (the
        #: transaction coordinator), and whom a recovery request is for.
        self.obtain_id: Callable[[], Awaitable[tuple[int, int]]] | None = None
        self.on_recovery: Callable[[str], None] | None = None
        self.on_fenced: Callable[[ErrorCode, str, BaseException | None], KafkaError] | None = None
        self._config = config
        self._cluster = cluster
        self._backoff = backoff
        # Called when sealing may resume: wakes every broker producer.
        self._on_new_epoch = on_new_epoch
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
        # Statistics, true on every broker: epochs bumped by the producer itself,
        # and producer ids obtained in a recovery (the first id is not counted).
        self.bumps = 0
        self.new_ids = 0
        # False once a broker refused an epoch this producer bumped itself (tansu
        # fences it): recoveries then take a new producer id straight away.
        self.local_bumps = True
        # The current epoch was bumped here (no broker has vouched for it yet).
        self._bumped_locally = False
        # The next recovery must take a new producer id (the current one is fenced).
        self._need_new_id = False
        # (producer id, epoch) of local bumps a broker refused: no batch of them was
        # ever written (tansu refuses every batch of such an epoch), so one whose
        # answer was lost may still be re-stamped under the new id.
        self._refused: set[tuple[int, int]] = set()

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

    # -- recovery ----------------------------------------------------------
    def request_bump(self, reason: str) -> None:
        """Start a recovery (a new epoch, or a new id when that is impossible)."""
        self.paused = True
        if self.on_recovery is not None:  # transactional: the abort bumps the epoch
            self.on_recovery(reason)
            return
        if not self._bump_requested.is_set():
            log.warning("idempotent producer: starting a new epoch (%s)", reason)
        self._bump_requested.set()

    def batch_failed(self, batch: SealedBatch, reason: str) -> None:
        """A sealed batch failed for good (expired, retries exhausted, refused). Its
        sequences were taken: the broker waits for them (or has them, if its fate is
        unknown), so every later batch of its partition would be out of order. Unless
        it belongs to an older epoch, recover."""
        if (batch.producer_id, batch.producer_epoch) == (self.producer_id, self.producer_epoch):
            tp = batch.tp
            self.request_bump(f"{reason} on {tp.topic}[{tp.partition}] after the batch took "
                              f"sequences {batch.base_sequence}..")

    def never_written(self, batch: SealedBatch) -> bool:
        """True if ``batch`` belongs to a locally bumped epoch that a broker refused."""
        return (batch.producer_id, batch.producer_epoch) in self._refused

    def epoch_fenced(self, producer_id: int, producer_epoch: int, code: ErrorCode,
                     cause: BaseException | None = None) -> KafkaError | None:
        """A broker answered INVALID_PRODUCER_EPOCH / PRODUCER_FENCED (``cause``) to a
        batch of (producer_id, producer_epoch). The batch was not written. If that is the
        current epoch, it is unusable: recover with a new producer id (None: the batch is
        re-sent then). A transactional producer cannot recover by itself (only its
        coordinator gives epochs): the transaction fails, and so does the batch, at once,
        with the error returned (``on_fenced``)."""
        if (producer_id, producer_epoch) != (self.producer_id, self.producer_epoch):
            return None  # an older epoch: the recovery that replaced it is done or under way
        if self.on_fenced is not None:  # transactional: only the coordinator gives epochs
            self.paused = True
            return self.on_fenced(
                code, f"{code.name} for producer id {producer_id} epoch {producer_epoch}", cause)
        if self._bumped_locally:
            if self.local_bumps:
                log.warning("the broker refused the epoch this producer bumped itself (%s); "
                            "recovering with new producer ids from now on", code.name)
            self.local_bumps = False
            self._refused.add((producer_id, producer_epoch))
        self._need_new_id = True
        self.request_bump(f"{code.name} for producer id {producer_id} epoch {producer_epoch}")
        return None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The recovery task: obtains the first producer id, then serves bump requests
        (a transactional producer's recoveries are its transaction manager's)."""
        if self.obtain_id is not None:
            self._start_epoch(*await self.obtain_id(), bumped_locally=False)
            task_status.started()
            return
        self._start_epoch(*await self._obtain_id(), bumped_locally=False)
        task_status.started()
        while True:
            await self._bump_requested.wait()
            await self.wait_drained()
            if self._need_new_id or not self.local_bumps or self.producer_epoch >= MAX_EPOCH:
                pid, epoch = await self._obtain_id()
                self.new_ids += 1
                self._start_epoch(pid, epoch, bumped_locally=False)
            else:
                self.bumps += 1
                self._start_epoch(self.producer_id, self.producer_epoch + 1, bumped_locally=True)
            self._bump_requested = trio.Event()

    def restart(self, pid: int, epoch: int) -> None:
        """A transactional producer's next epoch (from EndTxn or InitProducerId), at a
        transaction boundary: nothing of the old one is in flight."""
        assert self.in_flight == 0
        self._start_epoch(pid, epoch, bumped_locally=False)

    def _start_epoch(self, pid: int, epoch: int, *, bumped_locally: bool) -> None:
        self.producer_id, self.producer_epoch = pid, epoch
        self._bumped_locally = bumped_locally
        self._need_new_id = False
        self._next_sequence.clear()
        self.confirmed.clear()
        self.paused = False
        self._on_new_epoch()

    async def _obtain_id(self) -> tuple[int, int]:
        """A new producer id (InitProducerId -1/-1), retried with backoff until it works."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._request()
            except (KafkaError, OSError) as exc:
                delay = self._backoff(attempt)
                log.info("InitProducerId failed (%s); retrying in %.3fs", exc, delay)
                await trio.sleep(delay)

    async def _request(self) -> tuple[int, int]:
        conn = await self._cluster.any_connection()
        # Some brokers only serve InitProducerId properly from v3 (tansu); any
        # version works with -1/-1, so the highest both sides speak is used.
        version = conn.version_for(ApiKey.INIT_PRODUCER_ID)
        request = InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout_ms=int(self._config.delivery_timeout * 1000),
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
