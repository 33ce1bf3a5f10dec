"""Which broker coordinates a group or a transactional id, and FindCoordinator.

Kafka maps a key to a partition of ``__consumer_offsets`` (groups) or
``__transaction_state`` (transactional ids), ``abs(key.hashCode()) % partitions``, and
that partition's leader is the coordinator; when the leader moves, so does the
coordinator. The fake keeps the hash (50 partitions, Kafka's default) and places
partition ``n`` on the ``n % brokers``-th broker, the next running one if that one is
stopped. ``Coordinators.move`` pins a key to a broker, as a leader election would
move it: the old broker then answers NOT_COORDINATOR, FindCoordinator names the new one,
and the coordinator epoch (written in transaction markers) goes up. Sans-I/O.

FindCoordinator (Kafka 4.1, checked by tests/testing/test_fake_vs_kafka.py): key types
0 (group) and 1 (transaction), any key, even empty; another key type is INVALID_REQUEST;
v4+ batches keys (``coordinator_keys``). With no broker running:
COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import find_coordinator as fc

from .state import FakeState

__all__ = ["GROUP", "PARTITIONS", "TRANSACTION", "Coordinators", "handle_find_coordinator",
           "java_string_hash"]

GROUP, TRANSACTION = 0, 1
#: partitions of each internal topic (offsets.topic.num.partitions,
#: transaction.state.log.num.partitions)
PARTITIONS = 50

Inject = Callable[[str | None, int | None], int | None]


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap-around)."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


class Coordinators:
    """Coordinator placement for one fake cluster (state owned by ``FakeCluster``)."""

    def __init__(self, state: FakeState) -> None:
        self._state = state
        self._pinned: dict[tuple[int, str], int] = {}
        self._epochs: dict[tuple[int, str], int] = {}

    @staticmethod
    def partition_for(key: str) -> int:
        """The internal topic's partition of ``key`` (Kafka: ``Utils.abs(hashCode) % n``)."""
        h = java_string_hash(key)
        return (0 if h == -(1 << 31) else abs(h)) % PARTITIONS

    def node_for(self, key_type: int, key: str) -> int:
        """The broker coordinating ``key`` now; -1 when no broker runs."""
        brokers = sorted(self._state.brokers)
        alive = {b.node_id for b in self._state.alive_brokers()}
        pinned = self._pinned.get((key_type, key))
        if pinned is not None and pinned in alive:
            return pinned
        start = self.partition_for(key) % len(brokers)
        for i in range(len(brokers)):
            node = brokers[(start + i) % len(brokers)]
            if node in alive:
                return node
        return -1

    def is_coordinator(self, node_id: int, key_type: int, key: str) -> bool:
        return self.node_for(key_type, key) == node_id

    def move(self, key_type: int, key: str, to: int) -> int:
        """Coordinate ``key`` from broker ``to`` from now on (its old coordinator answers
        NOT_COORDINATOR); returns the new coordinator epoch."""
        if to not in self._state.brokers:
            raise ValueError(f"no broker {to}")
        self._pinned[(key_type, key)] = to
        return self.bump_epoch(key_type, key)

    def epoch(self, key_type: int, key: str) -> int:
        """The coordinator epoch of ``key``'s partition (goes up with each move)."""
        return self._epochs.get((key_type, key), 0)

    def bump_epoch(self, key_type: int, key: str) -> int:
        self._epochs[(key_type, key)] = self.epoch(key_type, key) + 1
        return self._epochs[(key_type, key)]


def handle_find_coordinator(coordinators: Coordinators, state: FakeState, version: int,
                            request: fc.FindCoordinatorRequest, inject: Inject
                            ) -> fc.FindCoordinatorResponse:
    keys = list(request.coordinator_keys) if version >= 4 else [request.key]
    key_type = request.key_type if version >= 1 else GROUP
    answers: list[fc.Coordinator] = []
    for key in keys:
        injected = inject(None, None)
        if injected is not None:
            code = injected
        elif key_type not in (GROUP, TRANSACTION):
            code = int(ErrorCode.INVALID_REQUEST)
        else:
            node = coordinators.node_for(key_type, key)
            if node < 0:
                code = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            else:
                b = state.brokers[node]
                answers.append(fc.Coordinator(key=key, node_id=node, host=b.host, port=b.port,
                                              error_code=0, error_message=None))
                continue
        answers.append(fc.Coordinator(key=key, node_id=-1, host="", port=-1, error_code=code,
                                      error_message=ErrorCode(code).name))
    if version >= 4:
        return fc.FindCoordinatorResponse(coordinators=tuple(answers))
    (a,) = answers
    return fc.FindCoordinatorResponse(error_code=a.error_code,
                                      error_message=a.error_message if version >= 1 else None,
                                      node_id=a.node_id, host=a.host, port=a.port)
