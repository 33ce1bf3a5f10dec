"""The CLI in a real terminal (a pseudo-terminal from Python's ``pty``): ``consume``
tailing a topic shows each record as it arrives (its output is not held in a buffer when
stdout is a terminal), and Ctrl-C typed at the terminal ends it with ``interrupted`` and
status 130, no traceback. Into a pipe, ``-u`` does the same."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The environment of the commands, without PYTHONUNBUFFERED (which some shells and CI
#: set): buffering is what these tests are about.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


class Terminal:
    """A child process on a pseudo-terminal (its controlling terminal: Ctrl-C works)."""

    def __init__(self, argv: list[str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: becomes the command
            os.chdir(ROOT)
            # as a shell starts a program: Ctrl-C's SIGINT at its default (a test run in
            # the background of a non-interactive shell inherits it ignored)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, [sys.executable, *argv], ENV)
        self.pid, self.fd = pid, fd
        self.screen = b""

    def wait_for(self, text: bytes, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not shown; the terminal shows {self.screen!r}"
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if ready:
                try:
                    self.screen += os.read(self.fd, 4096)
                except OSError:  # the child is gone (EIO)
                    assert text in self.screen, self.screen
                    return

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def exit_status(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.wait_for(b"\0never", timeout=0.2)
            except AssertionError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        self.kill()
        raise AssertionError(f"still running; the terminal shows {self.screen!r}")

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _produce(bootstrap: str, topic: str, line: bytes) -> None:
    proc = subprocess.run([sys.executable, "-m", "pipeline", "produce", "-b", bootstrap,
                           "-t", topic, "-q"], input=line, capture_output=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_consume_in_a_terminal_shows_records_as_they_come(kafka_bootstrap: str,
                                                           new_topic: Any) -> None:
    topic = new_topic()
    _produce(kafka_bootstrap, topic, b"first\n")
    term = Terminal(["-m", "pipeline", "consume", "-b", kafka_bootstrap, "-t", topic])
    try:
        term.wait_for(b"first\r\n")  # the terminal's line discipline: \n shown as \r\n
        _produce(kafka_bootstrap, topic, b"second\n")
        term.wait_for(b"second\r\n")  # while the consumer keeps running
        term.type(b"\x03")  # Ctrl-C at the terminal
        assert term.exit_status() == 130
    finally:
        term.kill()
    assert term.screen.endswith(b"interrupted\r\n"), term.screen
    assert b"Traceback" not in term.screen
    assert term.screen.count(b"first") == term.screen.count(b"second") == 1


@pytest.mark.parametrize("unbuffered", [True, False])
def test_unbuffered_consume_reaches_a_pipe_at_once(kafka_bootstrap: str, new_topic: Any,
                                                   unbuffered: bool) -> None:
    """Into a pipe, output is block-buffered (as kcat's) unless ``-u``: then each record
    is written as it arrives, for ``consume -u ... | grep`` while it tails."""
    topic = new_topic()
    _produce(kafka_bootstrap, topic, b"first\n")
    argv = [sys.executable, "-m", "pipeline", "consume", "-b", kafka_bootstrap, "-t", topic,
            *(["-u"] if unbuffered else [])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env=ENV)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15.0 if unbuffered else 5.0)
        assert bool(ready) == unbuffered
        if unbuffered:
            assert proc.stdout.readline() == b"first\n"
    finally:
        proc.kill()
        proc.wait()
