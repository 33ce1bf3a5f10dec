"""API keys, the version ranges this client speaks, and key -> class lookup.

``ApiKey`` is the one place an API key is named: no module or test redefines one.
``CLIENT_VERSIONS`` is the range of each API *we* speak (negotiated against the
broker's by :mod:`~pipeline.protocol.versions`); ``request_class`` /
``response_class`` map a key to its generated class.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from pipeline.protocol.base import Request, Response
from pipeline.protocol.messages import REQUESTS, RESPONSES

__all__ = [
    "CLIENT_VERSIONS",
    "ApiKey",
    "request_class",
    "response_class",
]


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69


def request_class(api_key: int) -> type[Request[Any]]:
    """The generated request class for ``api_key`` (``KeyError`` if we don't know it)."""
    return REQUESTS[int(api_key)]


def response_class(api_key: int) -> type[Response]:
    """The generated response class for ``api_key`` (``KeyError`` if we don't know it)."""
    return RESPONSES[int(api_key)]


def _full(key: ApiKey) -> tuple[int, int]:
    cls = REQUESTS[int(key)]
    return (cls.MIN_VERSION, cls.MAX_VERSION)


#: The version range *we* speak for each API (inclusive). Negotiation picks the
#: highest version in the intersection with the broker's range.
CLIENT_VERSIONS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.METADATA: (1, 12),
    ApiKey.PRODUCE: (3, 12),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.FETCH: (4, _full(ApiKey.FETCH)[1]),
    ApiKey.LIST_OFFSETS: _full(ApiKey.LIST_OFFSETS),
    ApiKey.CREATE_TOPICS: _full(ApiKey.CREATE_TOPICS),
    ApiKey.DELETE_TOPICS: _full(ApiKey.DELETE_TOPICS),
    ApiKey.SASL_HANDSHAKE: _full(ApiKey.SASL_HANDSHAKE),
    ApiKey.SASL_AUTHENTICATE: _full(ApiKey.SASL_AUTHENTICATE),
    # Admin APIs (pipeline.cluster.admin); each version proven against Kafka 4.1.
    ApiKey.DESCRIBE_CONFIGS: _full(ApiKey.DESCRIBE_CONFIGS),
    ApiKey.ELECT_LEADERS: _full(ApiKey.ELECT_LEADERS),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _full(ApiKey.INCREMENTAL_ALTER_CONFIGS),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _full(ApiKey.ALTER_PARTITION_REASSIGNMENTS),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: _full(ApiKey.LIST_PARTITION_REASSIGNMENTS),
    # Transactions. AddPartitionsToTxn v4+ batches several transactional ids and is
    # broker-to-broker (KIP-890's verification): a client speaks v0-3.
    ApiKey.FIND_COORDINATOR: _full(ApiKey.FIND_COORDINATOR),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3),
    ApiKey.ADD_OFFSETS_TO_TXN: _full(ApiKey.ADD_OFFSETS_TO_TXN),
    ApiKey.END_TXN: _full(ApiKey.END_TXN),
    ApiKey.TXN_OFFSET_COMMIT: _full(ApiKey.TXN_OFFSET_COMMIT),
    ApiKey.DESCRIBE_TRANSACTIONS: _full(ApiKey.DESCRIBE_TRANSACTIONS),
    ApiKey.LIST_TRANSACTIONS: _full(ApiKey.LIST_TRANSACTIONS),
    # Consumer groups. OffsetCommit v10 / OffsetFetch v10 (topic ids) are unstable in
    # Kafka 4.1, which serves up to v9; the stable ranges are what Kafka 4.1 lists.
    ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 9),
    ApiKey.JOIN_GROUP: _full(ApiKey.JOIN_GROUP),
    ApiKey.HEARTBEAT: _full(ApiKey.HEARTBEAT),
    ApiKey.LEAVE_GROUP: _full(ApiKey.LEAVE_GROUP),
    ApiKey.SYNC_GROUP: _full(ApiKey.SYNC_GROUP),
    ApiKey.DESCRIBE_GROUPS: _full(ApiKey.DESCRIBE_GROUPS),
    ApiKey.LIST_GROUPS: _full(ApiKey.LIST_GROUPS),
    ApiKey.DELETE_GROUPS: _full(ApiKey.DELETE_GROUPS),
    ApiKey.OFFSET_DELETE: _full(ApiKey.OFFSET_DELETE),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _full(ApiKey.CONSUMER_GROUP_HEARTBEAT),
    ApiKey.CONSUMER_GROUP_DESCRIBE: _full(ApiKey.CONSUMER_GROUP_DESCRIBE),
}
