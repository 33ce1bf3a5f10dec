"""ConsumerConfig: Java's option names, checked once, cluster options passed through."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline import ClusterConfig, ConsumerConfig
from pipeline.cluster.errors import ConfigError
from pipeline.consumer._config import make_config


def test_defaults_are_the_java_clients() -> None:
    c = ConsumerConfig()
    assert (c.session_timeout, c.heartbeat_interval, c.max_poll_interval) == (45.0, 3.0, 300.0)
    assert c.partition_assignment_strategy == ("range", "cooperative-sticky")
    assert c.rebalance_protocol == "eager"  # range cannot cooperate
    assert (c.auto_offset_reset, c.isolation_level, c.enable_auto_commit) == ("latest", "read_uncommitted", True)
    assert (c.fetch_max_bytes, c.max_partition_fetch_bytes, c.max_poll_records) == (52428800, 1048576, 500)


def test_cluster_options_go_to_the_cluster_part() -> None:
    c = ConsumerConfig(group_id="g", request_timeout=7.0, client_id="me")
    assert (c.cluster.request_timeout, c.cluster.client_id, c.request_timeout) == (7.0, "me", 7.0)
    base = ClusterConfig(client_id="from-cluster")
    assert make_config(base, {"group_id": "g"}).cluster.client_id == "from-cluster"
    assert make_config(ConsumerConfig(group_id="a"), {"group_id": "b"}).group_id == "b"


def test_strategy_as_text_or_sequence() -> None:
    assert ConsumerConfig(partition_assignment_strategy="cooperative-sticky").rebalance_protocol == "cooperative"
    assert ConsumerConfig(partition_assignment_strategy="roundrobin, range").partition_assignment_strategy == ("roundrobin", "range")
    assert ConsumerConfig(partition_assignment_strategy=["range"]).partition_assignment_strategy == ("range",)
    assert ConsumerConfig(isolation_level="read_committed").isolation == 1


@pytest.mark.parametrize(("options", "message"), [
    ({"sesion_timeout": 1}, r"unknown consumer option\(s\) \['sesion_timeout'\]"),
    ({"partition_assignment_strategy": "sticky"}, "unknown assignor 'sticky'"),
    ({"partition_assignment_strategy": ()}, "name at least one assignor"),
    ({"heartbeat_interval": 50.0}, "must be lower than session_timeout"),
    ({"auto_offset_reset": "smallest"}, "auto_offset_reset='smallest'"),
    ({"isolation_level": "committed"}, "isolation_level"),
    ({"session_timeout": 0}, "seconds > 0"),
    ({"fetch_max_wait": -1}, "seconds >= 0"),
    ({"max_poll_records": 0}, "positive integer"),
    ({"fetch_min_bytes": -1}, ">= 0"),
    ({"enable_auto_commit": "yes"}, "True or False"),
    ({"group_id": ""}, "non-empty string"),
    ({"group_instance_id": "i"}, "static membership needs a group_id"),
    ({"group_protocol": "consumer", "session_timeout": 10.0}, "the broker sets it"),
    ({"group_protocol": "consumer", "partition_assignment_strategy": "range"},
     "group.consumer.assignors"),
    ({"group_protocol": "modern"}, "use one of"),
    ({"request_timeout": -1}, "request_timeout"),
])
def test_invalid_options_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ConsumerConfig(**options)


def test_replace_validates_again() -> None:
    c = ConsumerConfig(group_id="g")
    assert c.replace(session_timeout=30.0).session_timeout == 30.0
    with pytest.raises(ConfigError, match="heartbeat_interval"):
        c.replace(session_timeout=2.0)


def test_the_consumer_protocol_leaves_assignment_and_liveness_to_the_broker() -> None:
    c = ConsumerConfig(group_id="g", group_protocol="consumer", max_poll_interval=30.0)
    assert c.group_protocol == "consumer"
