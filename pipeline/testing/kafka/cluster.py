"""``KafkaCluster``: 1..n Apache Kafka nodes (KRaft, combined broker + controller) on 127.0.0.1.

# Listeners

Every node has three listeners, four with ``advertised_ports``:

* CLIENT: for the code under test; :attr:`KafkaCluster.bootstrap` lists these; the only one
  that may be secured (TLS, SASL, mTLS: :mod:`pipeline.testing.kafka.security`);
* INTERNAL: replication between brokers and the cluster's own admin calls
  (:attr:`KafkaCluster.internal_bootstrap`), so neither ever goes through a fault proxy;
* CONTROLLER: the static KRaft quorum (``controller.quorum.voters``);
* PROXIED (only with ``advertised_ports={node: port}``): listens on a port of its own and
  advertises ``port``, where the caller runs a :class:`~pipeline.testing.proxy.FaultProxy`
  forwarding to :meth:`KafkaCluster.proxy_upstream`. Clients that bootstrap from
  :attr:`KafkaCluster.proxied_bootstrap` only ever learn proxy addresses.

# Waiting

Blocking methods wait for what they did to be visible: ``start()`` until every broker is
registered and a probe topic with replication factor = nodes has a full ISR; ``start(n)``
until node n is registered and every running broker sees it back in the ISR of every
partition it replicates;
``create_topic`` until every running broker's metadata has a leader for every partition;
``move_leader`` until every running broker's metadata names the new leader. Admin calls run
:class:`~pipeline.cluster.admin.Admin` on a private trio loop in a worker thread, so they
also work when called from a trio test (whose loop blocks meanwhile: use :meth:`call`, or
:meth:`admin` for the async API, to keep it running).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import trio

from pipeline.cluster.admin import Admin
from pipeline.cluster.admin_types import (
    NewTopic,
    TopicDescription,
    raise_errors,
)
from pipeline.testing._threads import run_trio
from pipeline.testing.kafka import settings, waits
from pipeline.testing.kafka.cds import cds_archive
from pipeline.testing.kafka.dist import (
    KAFKA_VERSION,
    KafkaClusterError,
    KafkaStartError,
    check_tools,
    ensure_kafka,
    java_binary,
)
from pipeline.testing.kafka.node import (
    DEFAULT_JVM_OPTIONS,
    KafkaNode,
    format_storage,
    wait_listening,
)
from pipeline.testing.kafka.security import SecuredClient
from pipeline.testing.kafka.settings import HOST, PROBE_TOPIC

__all__ = ["KafkaCluster", "KafkaStartError"]

log = logging.getLogger("pipeline.testing.kafka")
T = TypeVar("T")

# Ports are picked free, then bound by Java a few seconds later: another process may take
# one meanwhile (the machine is shared). Such a start is retried on new ports.
_START_ATTEMPTS = 3


def _lost_a_port(error: KafkaStartError) -> bool:
    return "Address already in use" in str(error)


def _cleanup(nodes: list[KafkaNode], workdir: Path | None) -> None:
    """Finalizer and close(): kill every node process, remove a temporary work dir."""
    for node in nodes:
        node.kill()
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


class KafkaCluster(SecuredClient):
    """Apache Kafka :data:`~pipeline.testing.kafka.dist.KAFKA_VERSION` on 127.0.0.1: ``nodes``
    combined broker + controller nodes (ids 1..n), a static KRaft quorum.

    Args:
      nodes: how many nodes (1..9).
      broker_config: broker settings on top of :func:`test_kit_config` (listeners, ids,
          quorum and directories are the cluster's own and refused here).
      advertised_ports: ``{node id: port}`` for every node: adds the PROXIED listener (see
          the module doc) advertising that port.
      workdir: keep data and logs here (not removed on exit); default: a temporary
          directory removed on exit.
      jvm_options: replaces :data:`~pipeline.testing.kafka.node.DEFAULT_JVM_OPTIONS`.
      startup_timeout: seconds for the whole cluster to become ready.
      class_data_sharing: start nodes from a CDS archive of their start-up classes (made
          once per machine: see :mod:`pipeline.testing.kafka.cds`).
      features: ``{feature: level}`` the storage is formatted with (``StorageTool format
          --feature``), over the release's defaults; e.g. ``{"transaction.version": 1}``
          for a Kafka 4.x cluster on the transactions v1 protocol (a fresh 4.1 cluster
          finalizes ``transaction.version`` 2, KIP-890). Clients read the finalized levels
          from ApiVersions.
      security_protocol, scram_users, sasl_mechanisms, ssl_client_auth: see ``security.py``.
    """

    def __init__(
        self,
        nodes: int = 1,
        broker_config: Mapping[str, str] | None = None,
        *,
        advertised_ports: Mapping[int, int] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        jvm_options: Sequence[str] | None = None,
        startup_timeout: float = 180.0,
        version: str = KAFKA_VERSION,
        class_data_sharing: bool = True,
        security_protocol: str = "PLAINTEXT",
        scram_users: Mapping[str, str] | None = None,
        sasl_mechanisms: Sequence[str] | None = None,
        ssl_client_auth: str = "none",
        features: Mapping[str, int] | None = None,
    ) -> None:
        ids, config = settings.check_layout(nodes, broker_config, advertised_ports)
        self.features = settings.check_features(features)
        self._init_security(security_protocol, scram_users, sasl_mechanisms, ssl_client_auth)
        self._ids = ids
        self.broker_config = config
        self.advertised_ports = dict(advertised_ports) if advertised_ports else None
        self.version = version
        self.jvm_options = tuple(DEFAULT_JVM_OPTIONS if jvm_options is None else jvm_options)
        self.startup_timeout = startup_timeout
        self.class_data_sharing = class_data_sharing
        self._user_workdir = Path(workdir) if workdir is not None else None
        self.workdir: Path | None = None
        self._nodes: dict[int, KafkaNode] = {}
        self._lock = threading.RLock()
        self._finalizer: weakref.finalize[Any, KafkaCluster] | None = None
        self.cluster_id = settings.new_cluster_id()
        self.start_seconds: float | None = None  # how long start() took (wall clock)

    # ------------------------------------------------------------------ names

    @property
    def nodes(self) -> list[int]:
        """The node ids, ``[1, ..., n]``."""
        return list(self._ids)

    @property
    def bootstrap(self) -> str:
        """The CLIENT listeners: ``"127.0.0.1:p1,127.0.0.1:p2,..."``."""
        return ",".join(f"{HOST}:{self._node(n).ports.client}" for n in self._ids)

    @property
    def internal_bootstrap(self) -> str:
        """The INTERNAL listeners (never proxied): for readers that judge what was written."""
        return ",".join(f"{HOST}:{self._node(n).ports.internal}" for n in self._ids)

    @property
    def proxied_bootstrap(self) -> str:
        """The advertised proxy addresses (needs ``advertised_ports``)."""
        if self.advertised_ports is None:
            raise KafkaClusterError("this cluster was started without advertised_ports")
        return ",".join(f"{HOST}:{self.advertised_ports[n]}" for n in self._ids)

    def proxy_upstream(self, node: int) -> tuple[str, int]:
        """Where a proxy for ``node`` forwards to: its PROXIED listener."""
        port = self._node(node).ports.proxied
        if port is None:
            raise KafkaClusterError("this cluster was started without advertised_ports")
        return HOST, port

    def port(self, node: int) -> int:
        """Node ``node``'s CLIENT port."""
        return self._node(node).ports.client

    def running(self, node: int) -> bool:
        return self._node(node).running

    def pid(self, node: int) -> int | None:
        return self._node(node).pid

    def pids(self) -> list[int]:
        """The process ids of the running nodes."""
        return [p for p in (self._node(n).pid for n in self._ids) if p is not None]

    def log_path(self, node: int) -> Path:
        return self._node(node).log_path

    def log_tail(self, node: int, lines: int = 40) -> str:
        return self._node(node).log_tail(lines)

    def _node(self, node: int) -> KafkaNode:
        try:
            return self._nodes[node]
        except KeyError:
            if not self._nodes:
                raise KafkaClusterError("the cluster is not started") from None
            raise ValueError(f"no node {node!r}; the nodes are {self._ids}") from None

    # -------------------------------------------------------------- lifecycle

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self, node: int | None = None, *, timeout: float | None = None) -> KafkaCluster:
        """Start the cluster, or with ``node``, restart that node.

        ``start()``: fetch the jars if needed, format and start every node, wait (up to
        ``startup_timeout``) until every broker is registered and a probe topic with
        replication factor = nodes has a full ISR.

        ``start(n)``: restart node n with its data; wait (up to ``timeout``, default 120 s)
        until it is registered and back in the ISR of every partition it replicates.

        Raises:
          KafkaSetupError: java/mvn missing or the fetch failed.
          KafkaStartError: a node exited (its log tail is in the message) or the cluster was
              not ready within ``startup_timeout``. Nothing is left running.
        """
        if node is not None:
            self._start_node(node, timeout=120.0 if timeout is None else timeout)
            return self
        with self._lock:
            if self._nodes:
                raise KafkaClusterError("the cluster is already started")
            t0 = time.monotonic()
            libs = ensure_kafka(self.version)
            check_tools(need_mvn=False)
            java = java_binary()
            assert java is not None
            # Explicit and sorted (a "libs/*" wildcard's order is unspecified): a CDS archive
            # only serves the class path it was made with.
            classpath = ":".join(str(j) for j in sorted(libs.glob("*.jar")))
            jvm_options = self.jvm_options
            if self.class_data_sharing:
                archive = cds_archive(libs.parent, java, classpath, self._train)
                if archive is not None:
                    jvm_options = (*jvm_options, f"-XX:SharedArchiveFile={archive}")
            for attempt in range(1, _START_ATTEMPTS + 1):
                try:
                    self._launch(java, classpath, jvm_options, t0 + self.startup_timeout)
                    break
                except KafkaStartError as exc:
                    if attempt == _START_ATTEMPTS or not _lost_a_port(exc):
                        raise
                    log.warning("a Kafka port was taken by another process; retrying on new "
                                "ports (attempt %d)", attempt + 1)
            self.start_seconds = time.monotonic() - t0
            log.info("Kafka %s: %d node(s) ready in %.1fs at %s", self.version,
                     len(self._ids), self.start_seconds, self.bootstrap)
            return self

    def _launch(self, java: str, classpath: str, jvm_options: Sequence[str],
                deadline: float) -> None:
        """One attempt at starting every node; on failure nothing is left running."""
        self._nodes = {}
        if self._user_workdir is None:
            settings.sweep_stale_workdirs()
            self.workdir = Path(tempfile.mkdtemp(prefix=f"pipeline-kafka-{os.getpid()}-"))
        else:
            self.workdir = self._user_workdir
            self.workdir.mkdir(parents=True, exist_ok=True)
        self._build_nodes(java, classpath, jvm_options)
        self._finalizer = weakref.finalize(
            self, _cleanup, list(self._nodes.values()),
            self.workdir if self._user_workdir is None else None,
        )
        try:
            format_storage(list(self._nodes.values()), self.cluster_id, deadline)
            for each in self._nodes.values():
                each.start()
            wait_listening(list(self._nodes.values()), self._check_running, deadline)
            self._run(waits.wait_ready, self._ids, PROBE_TOPIC,
                      timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill every node and remove the temporary work dir. Idempotent."""
        with self._lock:
            if self._user_workdir is not None:  # kept data: shut down cleanly, all at once
                running = [node for node in self._nodes.values() if node.running]
                for node in running:
                    node.signal_stop()
                deadline = time.monotonic() + 20.0
                for node in running:
                    if not node.terminate(timeout=max(0.1, deadline - time.monotonic())):
                        node.kill()
            if self._finalizer is not None:
                self._finalizer()  # kills, removes a temporary workdir; runs once
                self._finalizer = None

    def _build_nodes(self, java: str, classpath: str, jvm_options: Sequence[str]) -> None:
        assert self.workdir is not None
        plan = settings.plan_ports(self._ids, self.advertised_ports)
        self._ensure_pki(self.workdir / "pki")
        for n in self._ids:
            directory = self.workdir / f"node-{n}"
            config = settings.node_config(n, plan, directory / "data", self.security.protocol)
            config |= settings.test_kit_config(len(self._ids)) | self.security.broker_config(self.pki)
            config.update(self.broker_config)
            self._nodes[n] = KafkaNode(n, plan[n], directory, java=java, classpath=classpath,
                                       jvm_options=jvm_options, config=config,
                                       format_args=[*self.security.format_args(),
                                                    *settings.feature_args(self.features)])
            self._nodes[n].write_files()

    def _train(self, extra_jvm_options: Sequence[str]) -> None:
        """The CDS training run: a 1-node cluster, started, ready, cleanly stopped."""
        with tempfile.TemporaryDirectory(prefix="pipeline-kafka-cds-") as tmp:
            trainee = KafkaCluster(
                1, workdir=tmp, version=self.version, class_data_sharing=False,
                jvm_options=(*self.jvm_options, *extra_jvm_options),
                startup_timeout=self.startup_timeout,
            )
            with trainee:
                trainee.create_topic("pipeline-cds-training", partitions=2)

    # ---------------------------------------------------------------- failures

    def kill(self, node: int) -> None:
        """SIGKILL node ``node`` (a crash: no controlled shutdown) and reap it.

        Returns at once: the controller fences the node after ``broker.session.timeout.ms``
        (6 s here); until then metadata may still name it leader."""
        with self._lock:
            self._node(node).kill()

    def stop(self, node: int, *, timeout: float = 60.0) -> None:
        """SIGTERM node ``node`` (controlled shutdown: its leaderships move first) and wait
        for it to exit.

        Raises:
          KafkaClusterError: it had not exited after ``timeout`` s (it is SIGKILLed then).
        """
        with self._lock:
            target = self._node(node)
            if not target.terminate(timeout):
                target.kill()
                raise KafkaClusterError(
                    f"node {node} did not exit within {timeout:.0f}s of SIGTERM; killed. Its log "
                    f"ends with:\n{target.log_tail()}"
                )

    def _start_node(self, node: int, *, timeout: float) -> None:
        with self._lock:
            target = self._node(node)
            target.start()
            try:
                wait_listening([target], self._check_running, time.monotonic() + timeout)
                self._run(waits.wait_rejoined, node, self._running_ids(), timeout=timeout)
            except KafkaClusterError as exc:
                raise KafkaStartError(f"{exc}\nnode {node}'s log ends with:\n"
                                      f"{target.log_tail()}") from exc

    def start_all(self, *, timeout: float = 120.0) -> list[int]:
        """Restart every node that is not running (a test's cleanup); returns their ids."""
        with self._lock:
            stopped = [n for n in self._ids if not self._node(n).running]
            for n in stopped:
                self._start_node(n, timeout=timeout)
            return stopped

    # ----------------------------------------------------------------- topics

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
        *,
        timeout: float = 60.0,
    ) -> TopicDescription:
        """Create a topic and wait until every running broker sees a leader for each of its
        partitions. ``replication_factor`` defaults to min(nodes, 3).

        Raises:
          AdminError: the broker refused (TOPIC_ALREADY_EXISTS, INVALID_CONFIG, ...).
        """
        rf = min(len(self._ids), 3) if replication_factor is None else replication_factor
        topic = NewTopic(name, partitions, rf, dict(config or {}))

        async def create(admin: Admin) -> TopicDescription:
            raise_errors(await admin.create_topics([topic]))
            return await waits.wait_leaders_everywhere(
                admin, name, self._running_ids(), self._check_running, timeout)

        return self._with_admin(create, timeout)

    def delete_topic(self, name: str, *, timeout: float = 60.0) -> None:
        async def delete(admin: Admin) -> None:
            raise_errors(await admin.delete_topics([name]))

        self._with_admin(delete, timeout)

    def describe_topic(self, name: str, *, timeout: float = 30.0) -> TopicDescription:
        """The topic (replicas, ISR, leaders) as a running broker sees it now."""
        async def describe(admin: Admin) -> TopicDescription:
            return (await admin.describe_topics([name]))[name]

        return self._with_admin(describe, timeout)

    def leader(self, topic: str, partition: int, *, timeout: float = 30.0) -> int:
        """The node id of the partition's leader, as a running broker sees it now (waiting
        up to ``timeout`` s while it has none)."""
        return self._run(waits.current_leader, topic, partition, timeout=timeout)

    def move_leader(self, topic: str, partition: int, *, to_node: int,
                    timeout: float = 60.0) -> None:
        """Make ``to_node`` the partition's leader: reassign it as the first replica (swapped
        in for the last replica if it was not one), run a preferred election, and wait until
        every running broker names it leader."""
        if not self._node(to_node).running:
            raise KafkaClusterError(f"node {to_node} is not running; start it first")
        self._run(waits.move_leader, topic, partition, to_node, self._running_ids(),
                  timeout=timeout)

    # ------------------------------------------------------------ async access

    @contextlib.asynccontextmanager
    async def admin(
        self, *, timeout: float = 30.0  # noqa: ASYNC109 - bounds each admin call
    ) -> AsyncIterator[Admin]:
        """An :class:`~pipeline.cluster.admin.Admin` on the INTERNAL listeners (never
        proxied), for trio code."""
        async with Admin.open(self.internal_bootstrap, timeout=timeout,
                              client_id="pipeline-kafka-cluster") as admin:
            yield admin

    async def call(self, method: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run one of the blocking methods in a trio worker thread, so the calling trio loop
        keeps running: ``await cluster.call(cluster.kill, 2)``."""
        result: T = await trio.to_thread.run_sync(functools.partial(method, *args, **kwargs))
        return result

    # ---------------------------------------------------------------- helpers

    def _running_ids(self) -> list[int]:
        return [n for n in self._ids if self._node(n).running]

    def _check_running(self) -> None:
        """Raise if a node died that nobody killed or stopped (a crash, a failed start)."""
        for n in self._ids:
            node = self._node(n)
            if node.proc is not None and not node.running and not node.stopped_on_purpose:
                raise KafkaStartError(
                    f"Kafka node {n} exited with code {node.proc.returncode}; its log "
                    f"({node.log_path}) ends with:\n{node.log_tail()}"
                )

    def _with_admin(self, fn: Callable[[Admin], Awaitable[T]], timeout: float) -> T:
        bootstrap = ",".join(f"{HOST}:{self._node(n).ports.internal}"
                             for n in (self._running_ids() or self._ids))

        async def run() -> T:
            async with Admin.open(bootstrap, timeout=min(timeout, 30.0),
                                  client_id="pipeline-kafka-cluster") as admin:
                with trio.move_on_after(timeout + 5.0):
                    return await fn(admin)
            raise KafkaClusterError(f"no answer from the cluster within {timeout + 5.0:.0f}s")

        return run_trio(run)

    def _run(self, wait: Callable[..., Awaitable[T]], *args: Any, timeout: float) -> T:
        """``wait(admin, *args, check, timeout)`` on a fresh admin client."""
        return self._with_admin(lambda admin: wait(admin, *args, self._check_running, timeout),
                                timeout)

    def __repr__(self) -> str:
        state = ", ".join(repr(self._nodes[n]) for n in self._ids) if self._nodes else "not started"
        return f"<KafkaCluster {self.version} nodes={len(self._ids)}: {state}>"
