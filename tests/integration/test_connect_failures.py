"""Connection failures on real sockets: fast, quiet and precise.

A bootstrap nobody answers fails ``open_producer``, the reader, the admin client and the
CLI within ``connect_timeout`` (+1 s), with one error naming each address and its cause:
a refused port, a name that does not resolve, a listener that accepts and never
answers, TLS spoken to a plaintext port (on tansu, which never answers a ClientHello, and
on Apache Kafka, which closes the connection). Retries are DEBUG: one WARNING per
address. Wall times are asserted loosely (a shared machine); the exact ones are in
tests/cluster/test_bootstrap.py on virtual time.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from pipeline import Admin, BootstrapError, BrokerConnectionError, open_producer
from pipeline.consumer import consume

CONNECT_TIMEOUT = 2.0
#: the acceptance bound: connect_timeout + 1 s
BOUND = CONNECT_TIMEOUT + 1.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def closed_port() -> int:
    """A port nobody listens on (bound, then closed: connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener that never accepts: the kernel completes the TCP handshake (backlog),
    nothing ever answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


def _pipeline_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("pipeline") and r.levelno >= logging.WARNING]


async def _open_producer_error(bootstrap: str, **options: Any) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError) as info:
        async with open_producer(bootstrap, connect_timeout=CONNECT_TIMEOUT, **options):
            pass
    return info.value, time.monotonic() - started


async def test_refused_everywhere_fails_open_producer_fast_naming_each_address(
    closed_port: int, caplog: pytest.LogCaptureFixture,
) -> None:
    """The producer path, through the public API only."""
    caplog.set_level(logging.DEBUG, logger="pipeline")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        other = int(s.getsockname()[1])
    bootstrap = f"127.0.0.1:{closed_port},127.0.0.1:{other}"
    error, elapsed = await _open_producer_error(bootstrap)
    assert elapsed < BOUND
    text = str(error)
    assert f"127.0.0.1:{closed_port}: connection refused" in text
    assert f"127.0.0.1:{other}: connection refused" in text
    # Quiet: one WARNING per address, every retry at DEBUG.
    warnings = _pipeline_warnings(caplog)
    assert len(warnings) == 2, warnings
    assert all("connection refused" in w and "further failures" in w for w in warnings)
    retries = [r for r in caplog.records if r.levelno == logging.DEBUG
               and r.getMessage().startswith("cannot connect")]
    assert len(retries) >= 4  # it did retry (0.1, 0.2, 0.4 ... apart)


async def test_a_name_that_does_not_resolve(caplog: pytest.LogCaptureFixture) -> None:
    error, elapsed = await _open_producer_error("no-such-host.invalid:9092")
    assert elapsed < BOUND
    assert "no-such-host.invalid:9092: name not resolved (" in str(error)


async def test_a_listener_that_accepts_and_never_answers(silent_port: int) -> None:
    error, elapsed = await _open_producer_error(f"127.0.0.1:{silent_port}")
    assert elapsed < BOUND
    assert (f"127.0.0.1:{silent_port}: timed out: connected, but no answer to ApiVersions "
            f"within {CONNECT_TIMEOUT}s") in str(error)


async def test_tls_to_a_plaintext_port(any_broker: Any) -> None:
    """tansu waits for the 369 MB its reads the ClientHello as (the TLS handshake times
    out); Kafka closes the connection (EOF in the handshake). Both: "TLS handshake
    failed", and what to set."""
    error, elapsed = await _open_producer_error(any_broker.bootstrap, security_protocol="SSL")
    assert elapsed < BOUND
    text = str(error)
    address = any_broker.bootstrap.split(",")[0]
    assert f"{address}: TLS handshake failed" in text
    assert "use security_protocol PLAINTEXT or SASL_PLAINTEXT" in text
    expected = "timed out" if any_broker.kind != "kafka" else "closed the connection"
    assert expected in text


@pytest.mark.parametrize("request_timeout", [None, 1.0])
def test_the_reader_fails_fast_too(closed_port: int, request_timeout: float | None) -> None:
    """Also when its own request_timeout (which bounds its metadata wait) is the shorter:
    the error still names the cause."""
    started = time.monotonic()
    with pytest.raises(BootstrapError) as info:
        consume(f"127.0.0.1:{closed_port}", "t", connect_timeout=CONNECT_TIMEOUT,
                request_timeout=request_timeout)
    assert time.monotonic() - started < BOUND
    assert info.value.causes == {f"127.0.0.1:{closed_port}": "connection refused"}


async def test_the_admin_client_fails_fast_too(closed_port: int) -> None:
    """An admin call (timeout 60 s) does not retry a bootstrap that nobody answers."""
    started = time.monotonic()
    with pytest.raises(BootstrapError, match="connection refused"):
        async with Admin.open(f"127.0.0.1:{closed_port}", connect_timeout=CONNECT_TIMEOUT,
                              timeout=60.0) as admin:
            await admin.describe_cluster()
    assert time.monotonic() - started < BOUND


@pytest.mark.parametrize("command", [["consume", "-t", "x"], ["produce", "-t", "x"],
                                     ["-L"], ["topics", "list"]])
def test_the_cli_fails_fast_with_one_error_line(closed_port: int, command: list[str]) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", *command, "-b", f"127.0.0.1:{closed_port}",
         "-X", f"socket.connection.setup.timeout.ms={int(CONNECT_TIMEOUT * 1000)}"],
        input=b"x\n", capture_output=True, timeout=60, cwd=ROOT,
    )
    elapsed = time.monotonic() - started
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert err.splitlines() == [
        f"error: cannot connect to any bootstrap broker (connect_timeout={CONNECT_TIMEOUT}s): "
        f"127.0.0.1:{closed_port}: connection refused"]
    assert elapsed < BOUND + 5  # the interpreter's start-up is in there too


def test_an_established_cluster_does_not_fail_fast(any_broker: Any,
                                                   any_new_topic: Any) -> None:
    """The fail-fast is for the bootstrap only: a reader whose broker answered reads on
    (here: to the end of an empty topic) however short connect_timeout is."""
    topic = any_new_topic()
    assert consume(any_broker.bootstrap, topic, connect_timeout=0.5) == []


def test_trio_runs_clean_after_a_failed_bootstrap(closed_port: int) -> None:
    """No task or socket is left behind: a second run in the same process is clean."""
    async def twice() -> None:
        for _ in range(2):
            with pytest.raises(BootstrapError):
                async with Admin.open(f"127.0.0.1:{closed_port}", connect_timeout=0.3) as a:
                    await a.describe_cluster()

    trio.run(twice)
