"""The I/O side of the wire: transports, broker connections, the cluster client.

The only layer that does network I/O; every option is one frozen ``ClusterConfig``
(``config.py``), validated once. Its seams, each a small module:

* ``pool.Cluster``: the metadata cache and single-flight refresh rounds; it owns the
  nursery the connection readers run in (``metadata.py``: the snapshots and pure rules);
* ``brokers.BrokerPool``: one lazily made connection per broker, reconnect backoff,
  bootstrap pseudo-nodes;
* ``connection.BrokerConnection``: one stream, one reader task, in-flight slots, request
  timeouts; ``pending.PendingResponse`` is one request's answer;
* ``handshake``: TLS, ApiVersions, then SASL (``sasl.py``, ``reauth.py`` for KIP-368),
  on every new connection before it is handed out; ``security.py`` checks the options
  and builds the TLS context; ``properties.py`` maps Java / librdkafka property names;
* ``transport``: ``Connector = async (host, port) -> trio.abc.Stream`` (TCP, TLS, or the
  in-memory streams of tests);
* ``errors``: what the layer raises, mapped at its boundary.

The admin client lives in :mod:`pipeline.cluster.admin` (``Admin``) and
:mod:`pipeline.cluster.admin_types` (what it takes and returns); it is not imported here, so a
producer does not load the admin messages.
"""

from __future__ import annotations

from pipeline.cluster.config import ClusterConfig as ClusterConfig
from pipeline.cluster.connection import BrokerConnection as BrokerConnection
from pipeline.cluster.connection import PendingResponse as PendingResponse
from pipeline.cluster.errors import BrokerConnectionError as BrokerConnectionError
from pipeline.cluster.errors import BrokerProtocolError as BrokerProtocolError
from pipeline.cluster.errors import ConfigError as ConfigError
from pipeline.cluster.errors import KafkaError as KafkaError
from pipeline.cluster.errors import MetadataTimeoutError as MetadataTimeoutError
from pipeline.cluster.errors import RequestTimedOutError as RequestTimedOutError
from pipeline.cluster.errors import TopicMetadataError as TopicMetadataError
from pipeline.cluster.errors import UnknownTopicError as UnknownTopicError
from pipeline.cluster.errors import UnsupportedApiError as UnsupportedApiError
from pipeline.cluster.metadata import BrokerAddress as BrokerAddress
from pipeline.cluster.metadata import ClusterMetadata as ClusterMetadata
from pipeline.cluster.metadata import PartitionInfo as PartitionInfo
from pipeline.cluster.metadata import TopicInfo as TopicInfo
from pipeline.cluster.pool import Cluster as Cluster
from pipeline.cluster.transport import Connector as Connector
from pipeline.cluster.transport import MemoryNetwork as MemoryNetwork
from pipeline.cluster.transport import tcp_connector as tcp_connector
