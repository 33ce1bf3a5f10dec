"""What every stage shares: services, never neighbours.

``StageContext`` bundles the producer-wide services a stage uses (the config,
the cluster client, the ledger, the idempotence state, the retry backoff,
the partitions' last retry errors and the flush state). It holds no stage:
a stage reaches a neighbour only through the one lookup protocol it is given
(``ports.py``), so no stage module imports another, or the core.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.cluster.errors import KafkaError
from pipeline.producer._config import ProducerConfig
from pipeline.producer._errors import DeliveryTimeoutError
from pipeline.producer._stages.counters import Counters
from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.util.backoff import Backoff

if TYPE_CHECKING:
    from pipeline.cluster.pool import Cluster
    from pipeline.producer._outcomes.ledger import Ledger
    from pipeline.producer._stages.idempotence import Idempotence
    from pipeline.producer._stages.transactions import TransactionManager


class FlushState:
    """``depth`` > 0 while ``flush()`` or close waits: linger is ignored, so
    everything accumulated is sent now (the Java client's flush semantics).
    Broker producers read it when they decide what is ready; whoever raises
    it wakes them (``ProducerCore.start_flushing``)."""

    __slots__ = ("depth",)

    def __init__(self) -> None:
        self.depth = 0


class RetryErrors:
    """The error that last sent each partition's messages back for a retry,
    until a batch of it succeeds, so a delivery timeout can say why a message
    retried until it ran out of time ("last error: NOT_ENOUGH_REPLICAS").
    Written by broker producers, read by both them and partition producers."""

    __slots__ = ("_delivery_timeout", "abort", "last")

    def __init__(self, delivery_timeout: float) -> None:
        self._delivery_timeout = delivery_timeout
        self.last: dict[TopicPartition, BaseException] = {}
        #: While a transaction cannot commit any more, or is aborted (``ProducerCore.purge``):
        #: the outcome of every record of it that has none yet, given by the
        #: delivery-deadline path in its stead. Meanwhile every stage takes each deadline
        #: as passed (``expiry_horizon``), so it fails what it holds or receives.
        self.abort: KafkaError | None = None

    def expiry_horizon(self, now: float) -> float:
        """What a stage fails as expired: deadlines up to ``now``, every one while a
        transaction cannot commit (nothing of it may be sent or retried any more)."""
        return now if self.abort is None else math.inf

    def delivery_timeout_error(
        self, tp: TopicPartition, cause: BaseException | None, *, in_flight: bool = False,
        fate_unknown: bool = False,
    ) -> KafkaError:
        """``cause`` None: the partition's last retry error, if any. ``in_flight``: its
        request is still out; ``fate_unknown``: its last request got no answer, or one
        Kafka also gives after appending (``SealedBatch.fate_unknown``). While a
        transaction cannot commit or is aborted: its error."""
        if self.abort is not None:
            return self.abort
        if in_flight:
            what = "its request was still in flight, so it may or may not have been written"
        elif fate_unknown:
            what = "its last request got no clear answer, so it may or may not have been written"
        else:
            what = "it was never acknowledged"
        if cause is None:
            cause = self.last.get(tp)
        last = f"; last error: {cause}" if cause is not None else ""
        return DeliveryTimeoutError(
            f"delivery_timeout={self._delivery_timeout}s expired for "
            f"{tp.topic}[{tp.partition}]: {what}{last}"
        )


def retry_backoff(config: ProducerConfig, rng: random.Random) -> Callable[[int], float]:
    """The producer's retry delay for a retry level (or an attempt): the one
    ``Backoff`` formula, 0 when ``retry_backoff`` is 0."""
    cluster = config.cluster
    if cluster.retry_backoff == 0:
        return lambda level: 0.0
    backoff = Backoff(
        cluster.retry_backoff,
        cluster.retry_backoff_max,
        jitter=cluster.retry_backoff_jitter,
        rng=rng,
    )
    return lambda level: backoff.delay(max(level, 1))


@dataclass(frozen=True, slots=True, eq=False)
class StageContext:
    config: ProducerConfig
    cluster: Cluster
    ledger: Ledger
    idempotence: Idempotence | None
    backoff: Callable[[int], float]
    retry_errors: RetryErrors
    flush: FlushState
    transactions: TransactionManager | None = None
    # Per topic and partition: batches sealed, delivered, retried (counters.py).
    counters: Counters = field(default_factory=Counters)
