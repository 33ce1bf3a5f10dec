"""Child processes that die with this one: what the test brokers (tansu, Kafka) run in.

:func:`spawn` starts a command

* in a new session (its own process group: a Ctrl-C in the terminal reaches Python, which
  stops the child itself, and a kill reaches the whole group);
* on Linux with ``PR_SET_PDEATHSIG = SIGKILL``, so the kernel kills it when the Python
  process dies in any way, SIGKILL included. The kernel sends that signal when the *thread*
  that forked the child ends, so every child is forked by one daemon thread that lives as
  long as the interpreter, never by a short-lived worker thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["spawn"]

_PR_SET_PDEATHSIG = 1
_prctl: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


_spawn_queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = (
    queue.SimpleQueue()
)
_spawner_lock = threading.Lock()
_spawner: threading.Thread | None = None


def _spawner_loop() -> None:
    while True:
        future, fn = _spawn_queue.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)


def spawn(cmd: Sequence[str], *, log_path: Path, cwd: Path, env: Mapping[str, str]
          ) -> subprocess.Popen[bytes]:
    """Start ``cmd`` (stdout and stderr appended to ``log_path``) from the spawner thread,
    in a new session, killed by the kernel if this process dies."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(
                target=_spawner_loop, name="pipeline-spawner", daemon=True
            )
            _spawner.start()
    parent = os.getpid()

    def start() -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
                preexec_fn=_die_with_parent(parent),
            )

    future: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
    _spawn_queue.put((future, start))
    return future.result()
