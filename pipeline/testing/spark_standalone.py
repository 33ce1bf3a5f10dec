"""A Spark standalone cluster on this machine, for tests: a master and N workers started
from PySpark's own installation (``pyspark/bin/spark-class``, the jars under
``pyspark/jars``), so that a job runs in separate executor JVMs with their own Python
workers, as on a real cluster, and not in the driver's JVM as ``local[*]`` does.

    from pipeline.testing.spark_standalone import SparkStandalone, wait_for_executors

    with SparkStandalone(workers=2) as cluster:       # master + 2 workers, 1 core each
        builder = SparkSession.builder.master(cluster.master_url)
        for key, value in cluster.session_conf().items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        wait_for_executors(spark, 2)                   # both executors registered
        ...
        spark.stop()
    # every process it started (master, workers, their executors and Python workers) ended

What it guarantees:

* **Loopback only.** Every process gets ``SPARK_LOCAL_IP=127.0.0.1``; the master and the
  workers bind their RPC and web UI ports to it (ports chosen by the kernel: ``--port 0``,
  ``--webui-port 0``, read back from their logs), the master's REST submission server is
  off. The workers are *named* differently (``127.0.0.1`` and ``localhost`` by default,
  both 127.0.0.1): Spark tells hosts apart by name and never runs a speculative copy of a
  task on a host that already ran an attempt of it, so with one name for both workers a
  task that failed once on each could never be speculated.
* **Small.** Each worker offers ``cores`` cores (default 1) and ``memory`` (default 1g) to
  executors; daemons run with a 256 MiB heap and C1 only; :meth:`session_conf` asks for
  512 MiB, 1-core executors, one per worker.
* **The executors' Python** is ``python`` (default: this interpreter, the venv's, which
  imports pipeline): ``PYSPARK_PYTHON`` in the daemons' environment (the executors inherit
  it) and ``spark.pyspark.python`` in :meth:`session_conf` (which the export applies to
  the SparkContext; a driver should also set ``PYSPARK_PYTHON`` before its session).
* **Bounded start.** :meth:`start` waits up to ``start_timeout`` seconds for the master and
  for every worker to register with it (the master's ``/json/``), else raises
  :class:`SparkStandaloneError` with the tail of the logs, after stopping what it started.
* **Nothing left.** :meth:`stop` sends SIGTERM to the workers (which kill their executors)
  and the master, then SIGKILL to any process of theirs still there: every descendant
  of the processes it started, and any process whose working directory is inside the
  cluster's directory (executors and their Python workers run in the workers' work
  dirs; a driver started with ``cwd`` there counts too). It raises when one survives.
  :meth:`leftovers` lists them: empty after :meth:`stop`. The processes are also started
  with ``PR_SET_PDEATHSIG`` (:func:`pipeline.testing.spawn.spawn`): a test process that
  dies takes the master and the workers with it, and executors exit when their worker
  goes.

Needs pyspark and Java 17+ (what the Spark tests need).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.testing.spawn import spawn

__all__ = [
    "SparkStandalone",
    "SparkStandaloneError",
    "StartedProcess",
    "pyspark_home",
    "wait_for_executors",
]

#: JVM flags of the daemons and the executors: a test's JVMs live for seconds, C1 alone
#: starts faster, the serial collector keeps a small heap small.
JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: What the logs say once a daemon is listening (stable across Spark 3.x and 4.x).
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")
_WORKER_UP = re.compile(r"Successfully registered with master (spark://\S+)")


class SparkStandaloneError(RuntimeError):
    """The cluster could not start, or a process of it could not be ended."""


def pyspark_home() -> Path:
    """The installed PySpark's directory: its ``bin/spark-class`` and ``jars/``."""
    try:
        import pyspark
    except ImportError as exc:
        raise SparkStandaloneError(
            "a Spark standalone cluster needs pyspark (pip install -e '.[spark]')") from exc
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file() or not (home / "jars").is_dir():
        raise SparkStandaloneError(
            f"{home} has no bin/spark-class or jars/: not a pip-installed PySpark")
    return home


@dataclass(frozen=True)
class StartedProcess:
    """One process a cluster started: which, and its log."""

    name: str  # "master", "worker-1", ...
    proc: subprocess.Popen[bytes]
    log: Path


class SparkStandalone:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1 (module docstring).

    ``hosts``: the name each worker is known by (default: ``127.0.0.1`` and
    ``localhost`` alternating, both resolving to 127.0.0.1). ``directory``: where the
    logs and work dirs go (default: a fresh temporary directory, removed by
    :meth:`stop` unless ``keep`` is true or the start failed)."""

    def __init__(self, workers: int = 2, *, cores: int = 1, memory: str = "1g",
                 hosts: Sequence[str] | None = None, python: str | None = None,
                 start_timeout: float = 90.0, directory: Path | None = None,
                 keep: bool = False) -> None:
        if workers < 1 or cores < 1:
            raise ValueError(f"workers and cores must be >= 1 (got {workers}, {cores})")
        names = list(hosts) if hosts is not None else ["127.0.0.1", "localhost"]
        if not names:
            raise ValueError("hosts must name at least one host")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.hosts = [names[i % len(names)] for i in range(workers)]
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self._given_directory = directory
        self.keep = keep
        self.root: Path | None = None
        self.master_url = ""
        self.web_url = ""
        self.processes: list[StartedProcess] = []

    # ------------------------------------------------------------------ start
    def __enter__(self) -> SparkStandalone:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the master, then the workers; return once every worker registered."""
        if self.processes:
            raise SparkStandaloneError("this cluster is already started")
        home = pyspark_home()
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise SparkStandaloneError("a Spark standalone cluster needs java (17+) on "
                                       "PATH or JAVA_HOME")
        if self._given_directory is not None:
            self.root = self._given_directory
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            self.root = Path(tempfile.mkdtemp(prefix="pipeline-spark-"))
        deadline = time.monotonic() + self.start_timeout
        try:
            master = self._spawn("master", home, [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"])
            self.master_url = self._wait_for_log(master, _MASTER_URL, deadline)
            self.web_url = f"http://127.0.0.1:{self._wait_for_log(master, _MASTER_UI, deadline)}"
            for n, host in enumerate(self.hosts, start=1):
                work = self.root / f"worker-{n}"
                work.mkdir(exist_ok=True)
                self._spawn(f"worker-{n}", home, [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host", host, "--port", "0", "--webui-port", "0",
                    "--cores", str(self.cores), "--memory", self.memory,
                    "--work-dir", str(work), self.master_url])
            self._wait_for_workers(deadline)
        except BaseException:
            self.keep = True  # the logs say why
            with contextlib.suppress(SparkStandaloneError):
                self.stop()
            raise

    def _env(self, home: Path) -> dict[str, str]:
        assert self.root is not None
        env = dict(os.environ)
        env.update({
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(self.root / "conf"),  # empty: no spark-env.sh, no defaults
            "SPARK_LOG_DIR": str(self.root),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": JVM_FLAGS,
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=false",
            "PYSPARK_PYTHON": self.python,
        })
        return env

    def _spawn(self, name: str, home: Path, args: list[str]) -> StartedProcess:
        assert self.root is not None
        (self.root / "conf").mkdir(exist_ok=True)
        log = self.root / f"{name}.log"
        proc = spawn([str(home / "bin" / "spark-class"), *args], log_path=log, cwd=self.root,
                     env=self._env(home))
        started = StartedProcess(name, proc, log)
        self.processes.append(started)
        return started

    def _wait_for_log(self, process: StartedProcess, pattern: re.Pattern[str],
                      deadline: float) -> str:
        while True:
            text = _read(process.log)
            found = pattern.search(text)
            if found is not None:
                return found.group(1)
            if process.proc.poll() is not None:
                raise SparkStandaloneError(
                    f"Spark {process.name} exited (code {process.proc.returncode}) before "
                    f"it was up; {process.log}:\n{_tail(text)}")
            if time.monotonic() > deadline:
                raise SparkStandaloneError(
                    f"Spark {process.name} was not up within {self.start_timeout:.0f}s "
                    f"(no {pattern.pattern!r} in its log); {process.log}:\n{_tail(text)}")
            time.sleep(0.1)

    def status(self) -> dict[str, Any]:
        """The master's own view (its web UI's ``/json/``: workers, applications)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
            data: dict[str, Any] = json.load(response)
            return data

    def _wait_for_workers(self, deadline: float) -> None:
        seen = 0
        while True:
            for process in self.processes[1:]:
                if process.proc.poll() is not None:
                    raise SparkStandaloneError(
                        f"Spark {process.name} exited (code {process.proc.returncode}); "
                        f"{process.log}:\n{_tail(_read(process.log))}")
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                alive = [w for w in self.status().get("workers", [])
                         if w.get("state") == "ALIVE"]
                seen = len(alive)
                if seen >= self.workers:
                    return
            if time.monotonic() > deadline:
                logs = "\n".join(f"{p.log}:\n{_tail(_read(p.log), 8)}"
                                 for p in self.processes)
                raise SparkStandaloneError(
                    f"{seen} of {self.workers} Spark workers registered with the master "
                    f"{self.master_url} within {self.start_timeout:.0f}s\n{logs}")
            time.sleep(0.2)

    # ------------------------------------------------------------------ a driver's settings
    def session_conf(self) -> dict[str, str]:
        """Settings for a driver's SparkSession on this cluster: loopback, one 1-core
        executor of 512 MiB per worker, this cluster's Python for the workers, no UI."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": "512m",
            "spark.cores.max": str(self.cores * self.workers),
            "spark.executor.extraJavaOptions": JVM_FLAGS,
            "spark.pyspark.python": self.python,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        }

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 20.0) -> None:
        """End every process the cluster started (module docstring); raise
        :class:`SparkStandaloneError` if one could not be ended."""
        if self.root is None:
            return
        tree = self._tree()
        # the workers first (each kills its executors as it shuts down), then the master
        workers = [p for p in self.processes if p.name != "master"]
        masters = [p for p in self.processes if p.name == "master"]
        deadline = time.monotonic() + timeout
        for group in (workers, masters):
            for process in group:
                if process.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.proc.send_signal(signal.SIGTERM)
            for process in group:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            tree |= self._tree()
            if not any(_alive(pid) for pid in tree):
                break
            time.sleep(0.1)
        for pid in sorted(tree):
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.proc.wait(timeout=5)
        survivors = [pid for pid in tree if _alive(pid)]
        survivors_deadline = time.monotonic() + 5
        while survivors and time.monotonic() < survivors_deadline:
            time.sleep(0.1)
            survivors = [pid for pid in survivors if _alive(pid)]
        root = self.root
        self.processes = []
        if survivors:
            raise SparkStandaloneError(
                f"processes of the Spark cluster in {root} survived SIGKILL: {survivors}")
        if not self.keep and self._given_directory is None:
            shutil.rmtree(root, ignore_errors=True)
        self.root = None if not self.keep else root

    def _tree(self) -> set[int]:
        """The started processes, their descendants, and every process working inside
        the cluster's directory."""
        pids = {p.proc.pid for p in self.processes if p.proc.poll() is None}
        pids |= set(_descendants(pids))
        if self.root is not None:
            pids |= {pid for pid, _ in _working_in(self.root)}
        return {pid for pid in pids if pid != os.getpid()}

    def leftovers(self, root: Path | None = None) -> list[tuple[int, str]]:
        """(pid, command line) of every live process working inside the cluster's
        directory (``root``: another one, e.g. the directory of a cluster already
        stopped with ``keep=True``)."""
        where = root or self.root
        return [] if where is None else _working_in(where)


def wait_for_executors(spark: Any, count: int, timeout: float = 60.0) -> list[str]:
    """Wait until ``count`` executors (besides the driver) registered with ``spark``'s
    SparkContext; return their hosts. Raises :class:`SparkStandaloneError` on timeout."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while True:
        infos = list(tracker.getExecutorInfos())  # the driver's own block manager included
        if len(infos) - 1 >= count:
            driver = spark.sparkContext._jsc.sc().env().blockManager().blockManagerId()
            return sorted(f"{i.host()}:{i.port()}" for i in infos
                          if (i.host(), i.port()) != (driver.host(), driver.port()))
        if time.monotonic() > deadline:
            raise SparkStandaloneError(
                f"{len(infos) - 1} of {count} executors registered with the driver within "
                f"{timeout:.0f}s (is the cluster big enough for spark.executor.cores/memory?)")
        time.sleep(0.2)


# ---------------------------------------------------------------------- /proc


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name is in parentheses and may hold spaces or ')'
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has ended)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def _descendants(parents: set[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None:
            children.setdefault(stat[1], []).append(pid)
    out: list[int] = []
    todo = list(parents)
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _working_in(root: Path) -> list[tuple[int, str]]:
    """Live processes whose working directory is ``root`` or inside it."""
    base = os.path.realpath(root)
    found = []
    for pid in _pids():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if (cwd == base or cwd.startswith(base + os.sep)) and _alive(pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                cmd = b""
            found.append((pid, cmd.decode(errors="replace").strip()[:300]))
    return found
