"""What each node of a :class:`~pipeline.testing.kafka.KafkaCluster` is configured with: its
ports, listeners and the broker settings tests start from. Pure functions, no processes.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.testing.kafka.node import NodePorts

__all__ = [
    "HOST",
    "OWNED",
    "PROBE_TOPIC",
    "check_features",
    "check_layout",
    "feature_args",
    "free_ports",
    "new_cluster_id",
    "node_config",
    "plan_ports",
    "sweep_stale_workdirs",
    "test_kit_config",
]

HOST = "127.0.0.1"
#: Created with replication factor = nodes by start(): ready means it is fully in sync.
PROBE_TOPIC = "pipeline-ready-probe"
#: Set by KafkaCluster itself: a broker_config entry for one of these is refused.
OWNED = frozenset({
    "process.roles", "node.id", "broker.id", "controller.quorum.voters",
    "controller.quorum.bootstrap.servers", "listeners", "advertised.listeners",
    "listener.security.protocol.map", "controller.listener.names",
    "inter.broker.listener.name", "log.dirs", "log.dir", "metadata.log.dir",
})


def check_layout(nodes: int, broker_config: Mapping[str, str] | None,
                 advertised_ports: Mapping[int, int] | None) -> tuple[list[int], dict[str, str]]:
    """KafkaCluster's node count, broker settings and advertised ports checked: (the node
    ids, the settings); a ValueError says what is wrong."""
    if not isinstance(nodes, int) or isinstance(nodes, bool) or not 1 <= nodes <= 9:
        raise ValueError(f"nodes must be an int from 1 to 9, not {nodes!r}")
    config = dict(broker_config or {})
    bad = {k: v for k, v in config.items() if not isinstance(k, str) or not isinstance(v, str)}
    if bad:
        raise ValueError(f"broker_config keys and values must be strings, got {bad!r}")
    owned = sorted(set(config) & OWNED)
    if owned:
        raise ValueError(
            f"broker_config may not set {', '.join(owned)}: KafkaCluster sets listeners, "
            "node ids, the quorum and directories itself (see advertised_ports and workdir)"
        )
    ids = list(range(1, nodes + 1))
    if advertised_ports is not None and sorted(advertised_ports) != ids:
        raise ValueError(
            f"advertised_ports needs exactly one port per node {ids}, got "
            f"{dict(advertised_ports)!r}"
        )
    return ids, config


def check_features(features: Mapping[str, int] | None) -> dict[str, int]:
    """Feature levels to format the storage with, checked (names, levels 0..32767)."""
    out: dict[str, int] = {}
    for name, level in (features or {}).items():
        if (not isinstance(name, str) or not name or "=" in name or not isinstance(level, int)
                or isinstance(level, bool) or not 0 <= level <= 32767):
            raise ValueError(
                f"features maps a feature name to a level from 0 to 32767 (e.g. "
                f"{{'transaction.version': 1}}), got {name!r}: {level!r}")
        out[name] = level
    return out


def feature_args(features: Mapping[str, int]) -> list[str]:
    """``StorageTool format`` arguments setting ``features`` (``--feature name=level``)."""
    return [arg for name, level in features.items() for arg in ("--feature", f"{name}={level}")]


def test_kit_config(nodes: int) -> dict[str, str]:
    """Broker settings for tests (overridable by ``broker_config``): Kafka's own test kit
    choices (small internal topics, no rebalance delay, a small cleaner buffer), topics only
    created on purpose, failure detection within seconds, and no time-based retention."""
    rf, isr = str(min(nodes, 3)), str(min(nodes, 2))
    return {
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "3",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "share.coordinator.state.topic.num.partitions": "3",
        "group.initial.rebalance.delay.ms": "0",
        # A transaction open past its timeout is aborted within a second, not ten.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        "log.cleaner.dedupe.buffer.size": "2097152",
        "auto.create.topics.enable": "false",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        # A SIGKILLed broker is fenced (its leaderships and ISR places move) after 6 s, not 9.
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "6000",
        # Tests write records with fixed CreateTimes of 2022-2023 (BASE_TS): Kafka's default
        # 7-day retention deleted them, active segment too, at its first check (30 s after
        # the start, then every 5 min), so a read-back that straddled one found a partition
        # starting at offset 18 (a CI run of test_columnar_batches_read_back_by_librdkafka).
        "log.retention.ms": "-1",
    }


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago (all bound at once, then closed)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]


def plan_ports(nodes: Sequence[int], advertised: Mapping[int, int] | None
               ) -> dict[int, NodePorts]:
    """Free ports for every node's listeners (PROXIED too when ``advertised`` is given)."""
    per_node = 4 if advertised else 3
    ports = free_ports(per_node * len(nodes))
    plan: dict[int, NodePorts] = {}
    for i, n in enumerate(nodes):
        p = ports[i * per_node:(i + 1) * per_node]
        plan[n] = NodePorts(
            client=p[0], internal=p[1], controller=p[2],
            proxied=p[3] if advertised else None,
            advertised=advertised[n] if advertised else None,
        )
    return plan


def node_config(n: int, plan: Mapping[int, NodePorts], data_dir: Path,
                client_protocol: str = "PLAINTEXT") -> dict[str, str]:
    """Node ``n``'s identity, listeners and quorum (the settings in :data:`OWNED`); the
    CLIENT listener speaks ``client_protocol`` (the others are PLAINTEXT)."""
    ports = plan[n]
    listeners = [f"CLIENT://{HOST}:{ports.client}", f"INTERNAL://{HOST}:{ports.internal}",
                 f"CONTROLLER://{HOST}:{ports.controller}"]
    advertised = listeners[:2]
    protocols = [f"CLIENT:{client_protocol}", "INTERNAL:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    if ports.proxied is not None:
        listeners.append(f"PROXIED://{HOST}:{ports.proxied}")
        advertised.append(f"PROXIED://{HOST}:{ports.advertised}")
        protocols.append("PROXIED:PLAINTEXT")
    return {
        "process.roles": "broker,controller",
        "node.id": str(n),
        "controller.quorum.voters": ",".join(
            f"{m}@{HOST}:{plan[m].controller}" for m in sorted(plan)),
        "listeners": ",".join(listeners),
        "advertised.listeners": ",".join(advertised),
        "listener.security.protocol.map": ",".join(protocols),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "INTERNAL",
        "log.dirs": str(data_dir),
    }


def new_cluster_id() -> str:
    """A random cluster id as Kafka writes them (URL-safe base64 of 16 bytes), never starting
    with "-", which StorageTool's argument parser would take for an option (Kafka's own
    ``Uuid.randomUuid`` avoids those too)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def sweep_stale_workdirs() -> None:
    """Remove temporary work dirs (``pipeline-kafka-<pid>-*``) left by processes that died
    without cleaning up (SIGKILL)."""
    if not os.path.isdir("/proc"):
        return
    for path in Path(tempfile.gettempdir()).glob("pipeline-kafka-*-*"):
        try:
            pid = int(path.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)
