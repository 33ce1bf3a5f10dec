"""The I/O side of the wire: transports, broker connections, the cluster client.

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
