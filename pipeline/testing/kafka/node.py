"""One Kafka node (combined broker + controller): its config, its log, its ``java`` process.

# Processes are never left behind

Each node is its own ``java -cp`` process, started

* in a new session (its own process group: a Ctrl-C in the terminal reaches Python, which
  stops the nodes itself, and a kill reaches the whole group);
* on Linux with ``PR_SET_PDEATHSIG = SIGKILL``, so the kernel kills it when the Python
  process dies in any way, SIGKILL included (:func:`pipeline.testing.spawn.spawn`, which
  forks from one long-lived thread: the signal follows the forking *thread*);
* with a ``weakref.finalize`` on its owner (:class:`~pipeline.testing.kafka.KafkaCluster`)
  that kills it at garbage collection and at interpreter exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.testing.kafka.dist import KafkaStartError
from pipeline.testing.spawn import spawn

__all__ = [
    "DEFAULT_JVM_OPTIONS",
    "KafkaNode",
    "NodePorts",
    "format_storage",
    "kill_process_group",
    "spawn",
    "wait_listening",
]

#: JVM options of a broker node: fast start, a small heap (tests, 2-core machines), the serial collector
#: (fewer threads, less memory than G1 on a heap this size), exit on OOM instead of limping.
DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    # C1 only: start-up is CPU-bound JIT work, and 3 nodes on 2 cores measured 29 s -> 17 s
    # with it. Peak broker throughput is lower: benchmarks may pass jvm_options without it.
    "-XX:TieredStopAtLevel=1",
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
#: JVM options of the short-lived StorageTool run: the C1 compiler only, for start-up speed.
FORMAT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xmx256m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
)

_LOG4J2 = """\
# Written by pipeline.testing.kafka: every node logs to its stdout, which is its log file.
status = warn
name = pipeline-kafka-node
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

# ----------------------------------------------------------------------------- spawning

def kill_process_group(proc: subprocess.Popen[bytes], *, wait: float = 10.0) -> None:
    """SIGKILL ``proc``'s process group (its session) and reap it. Never raises."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(OSError):
                proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        proc.wait(timeout=wait)


# ----------------------------------------------------------------------------- a node


@dataclass(frozen=True, slots=True)
class NodePorts:
    """A node's listeners on 127.0.0.1."""

    client: int  # CLIENT: what ``KafkaCluster.bootstrap`` lists
    internal: int  # INTERNAL: replication and the cluster's own admin calls, never proxied
    controller: int  # CONTROLLER: the KRaft quorum
    proxied: int | None = None  # PROXIED: listens here, advertises ``advertised``
    advertised: int | None = None  # the port a FaultProxy in front of ``proxied`` listens on


class KafkaNode:
    """One combined broker + controller node: config file, data, log file, process."""

    def __init__(
        self,
        node_id: int,
        ports: NodePorts,
        directory: Path,
        *,
        java: str,
        classpath: str,
        jvm_options: Sequence[str],
        config: Mapping[str, str],
        format_args: Sequence[str] = (),
    ) -> None:
        self.node_id = node_id
        self.format_args = tuple(format_args)  # extra StorageTool arguments (--add-scram)
        self.ports = ports
        self.directory = directory
        self.java = java
        self.classpath = classpath
        self.jvm_options = tuple(jvm_options)
        self.config = dict(config)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0  # processes started so far (restarts included)
        # True after kill()/terminate(): the process is down on purpose, not crashed.
        self.stopped_on_purpose = False

    @property
    def config_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "kafka.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None

    @property
    def tmp_dir(self) -> Path:
        """The JVM's ``java.io.tmpdir``."""
        return self.directory / "tmp"

    def write_files(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(exist_ok=True)
        lines = [f"{k}={v}" for k, v in self.config.items()]
        self.config_path.write_text(
            "# Written by pipeline.testing.kafka.KafkaCluster\n" + "\n".join(lines) + "\n"
        )
        (self.directory / "log4j2.properties").write_text(_LOG4J2)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("CLASSPATH", "JAVA_TOOL_OPTIONS")}
        env["LC_ALL"] = env.get("LC_ALL", "C.UTF-8")
        return env

    def format_command(self, cluster_id: str) -> list[str]:
        shared = [o for o in self.jvm_options if o.startswith("-XX:SharedArchiveFile=")]
        return [
            self.java, *FORMAT_JVM_OPTIONS, *shared, "-cp", self.classpath,
            "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config_path),
            *self.format_args,
        ]

    def start_format(self, cluster_id: str) -> subprocess.Popen[bytes]:
        """Start formatting the node's storage (``StorageTool format``); the caller waits."""
        self._note(f"formatting storage (cluster id {cluster_id})")
        return spawn(self.format_command(cluster_id), log_path=self.log_path,
                     cwd=self.directory, env=self._env())

    def command(self) -> list[str]:
        return [
            self.java, *self.jvm_options,
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.directory}",
            # Native libraries the JVM unpacks (lz4-java, snappy-java) go in the node's
            # directory, removed with the cluster: a SIGKILLed JVM (a chaos test's crash)
            # skips its delete-on-exit and left them in /tmp for good.
            f"-Djava.io.tmpdir={self.tmp_dir}",
            "-cp", self.classpath,
            "kafka.Kafka", str(self.config_path),
        ]

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"node {self.node_id} is already running (pid {self.pid})")
        self.starts += 1
        self.stopped_on_purpose = False
        self._note(f"starting node {self.node_id} (start #{self.starts})")
        self.proc = spawn(self.command(), log_path=self.log_path, cwd=self.directory,
                          env=self._env())

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.stopped_on_purpose = True
        if self.proc is not None:
            was_running = self.running
            kill_process_group(self.proc)
            if was_running:
                self._note(f"node {self.node_id} killed (SIGKILL)")

    def signal_stop(self) -> None:
        """Send SIGTERM (controlled shutdown) without waiting; :meth:`terminate` waits."""
        self.stopped_on_purpose = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def terminate(self, timeout: float) -> bool:
        """SIGTERM (controlled shutdown) and wait up to ``timeout`` s; True if it exited."""
        proc = self.proc
        self.stopped_on_purpose = True
        if proc is None or proc.poll() is not None:
            return True
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        self._note(f"node {self.node_id} stopped (SIGTERM), exit code {proc.returncode}")
        return True

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _note(self, what: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with contextlib.suppress(OSError), open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"---- pipeline.testing.kafka {stamp}: {what}\n")

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<KafkaNode {self.node_id} 127.0.0.1:{self.ports.client} {state}>"


def format_storage(nodes: Sequence[KafkaNode], cluster_id: str, deadline: float) -> None:
    """Format every node's storage, in parallel (``StorageTool format``, one JVM each),
    unless all of them were formatted before (a kept work dir).

    Raises:
      KafkaStartError: a format failed or ran past ``deadline`` (``time.monotonic()``); its
          log tail is in the message, and no format process is left running.
    """
    if all((node.directory / "data" / "meta.properties").exists() for node in nodes):
        return
    procs = [(node, node.start_format(cluster_id)) for node in nodes]
    try:
        for node, proc in procs:
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise KafkaStartError(
                    f"formatting node {node.node_id}'s storage did not finish in time; its "
                    f"log ({node.log_path}) ends with:\n{node.log_tail()}"
                ) from None
            if rc != 0:
                raise KafkaStartError(
                    f"formatting node {node.node_id}'s storage failed (exit {rc}); its log "
                    f"({node.log_path}) ends with:\n{node.log_tail()}"
                )
    finally:
        for _, proc in procs:
            kill_process_group(proc)


def wait_listening(nodes: Sequence[KafkaNode], check: Callable[[], None], deadline: float
                   ) -> None:
    """Until every running node accepts TCP connections on its INTERNAL listener (so an admin
    client's first connects neither fail nor log); ``check()`` raises if one died."""
    pending = {n.node_id: n for n in nodes if n.running}
    while pending:
        check()
        for node_id, node in list(pending.items()):
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", node.ports.internal), 0.5
            ):
                del pending[node_id]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise KafkaStartError(
                f"nodes {sorted(pending)} did not listen within the start-up timeout; "
                + "; ".join(f"node {n}'s log ends with:\n{node.log_tail(15)}"
                            for n, node in pending.items())
            )
        time.sleep(0.1)
