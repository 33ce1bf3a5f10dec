"""Where a transactional id's coordinator is: asked of the cluster, never assumed.

* :func:`coordinator_node`: FindCoordinator (key type 1) on the INTERNAL listeners, the
  node the cluster names now;
* :func:`txn_state_partition`: the ``__transaction_state`` partition that holds the id
  (Kafka's ``Utils.abs(transactionalId.hashCode()) % partitions``); its leader is the
  coordinator, so moving that leadership moves the coordinator.
"""

from __future__ import annotations

import trio

from pipeline.cluster import Cluster
from pipeline.cluster.errors import KafkaError
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.find_coordinator import FindCoordinatorRequest

__all__ = ["TXN_STATE_TOPIC", "coordinator_node", "java_string_hash", "txn_state_partition"]

TXN_STATE_TOPIC = "__transaction_state"


async def coordinator_node(bootstrap: str, transactional_id: str, *,
                           timeout: float = 60.0,  # noqa: ASYNC109 - bounds the lookup
                           ) -> int:
    """The node coordinating ``transactional_id`` now (retrying while the cluster has
    none: a coordinator moving or loading)."""
    async with Cluster.open(bootstrap) as cluster:
        with trio.fail_after(timeout):
            while True:
                try:
                    conn = await cluster.any_connection()
                    response = await conn.request(FindCoordinatorRequest(
                        key_type=1, coordinator_keys=(transactional_id,)), version=4)
                except (KafkaError, OSError):
                    await trio.sleep(0.2)
                    continue
                (found,) = response.coordinators
                if found.error_code == ErrorCode.NONE:
                    return int(found.node_id)
                await trio.sleep(0.2)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` (a signed 32-bit int) of ``text``, over its UTF-16
    code units."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def txn_state_partition(transactional_id: str, partitions: int) -> int:
    """The ``__transaction_state`` partition of ``transactional_id`` (Kafka's
    ``Utils.abs(hashCode) % partitions``, where ``abs(Integer.MIN_VALUE)`` is 0)."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions
