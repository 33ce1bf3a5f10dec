"""What the consumer raises. Every error derives from ``ConsumerError`` (a ``KafkaError``)."""

from __future__ import annotations

from pipeline.cluster.errors import KafkaError

__all__ = [
    "CommitFailedError",
    "ConsumerClosedError",
    "ConsumerError",
    "GroupError",
    "MaxPollIntervalExceededError",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "RebalanceInProgressError",
]


class ConsumerError(KafkaError):
    """The consumer cannot continue (unknown partition, a non-retriable fetch error...)."""


class ConsumerClosedError(ConsumerError):
    """The consumer was closed, or failed earlier (``__cause__`` says why)."""


class GroupError(ConsumerError):
    """The group coordinator refused us for a reason retrying cannot fix (authorization,
    an invalid session timeout, a fenced static member...). ``error_code`` is Kafka's."""

    def __init__(self, message: str, error_code: int = -1) -> None:
        super().__init__(message)
        self.error_code = error_code


class CommitFailedError(ConsumerError):
    """The commit cannot succeed: the member is no longer in the generation that owned
    these partitions (a rebalance completed without it, or it was removed). Its
    partitions may be processed by another member now; records processed since the
    last successful commit may be processed again there."""


class RebalanceInProgressError(ConsumerError):
    """The commit could not be made because the group is rebalancing. Keep iterating
    (the rebalance completes there) and commit again; partitions this member keeps
    can then be committed."""


class MaxPollIntervalExceededError(ConsumerError):
    """More than ``max_poll_interval`` passed between two iterations: the member left
    the group and its partitions were reassigned. Iterating again rejoins."""


class OffsetOutOfRangeError(ConsumerError):
    """A fetch position is outside the log and ``auto_offset_reset="none"``;
    ``partitions`` maps each partition to its position. Seek to continue."""

    def __init__(self, message: str, partitions: dict[tuple[str, int], int]) -> None:
        super().__init__(message)
        self.partitions = partitions


class NoOffsetForPartitionError(ConsumerError):
    """No committed offset for a partition and ``auto_offset_reset="none"``."""

    def __init__(self, message: str, partitions: frozenset[tuple[str, int]]) -> None:
        super().__init__(message)
        self.partitions = partitions
