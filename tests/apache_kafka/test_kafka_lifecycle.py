"""Start failures and clean-up: a node that cannot start raises with its log; no Kafka
process outlives its KafkaCluster, whether the ``with`` block ends, raises, is interrupted
(Ctrl-C in ``pipeline broker --kafka``), or the Python process is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.testing.kafka import KafkaCluster, KafkaStartError
from pipeline.testing.kafka.settings import sweep_stale_workdirs

from .conftest import pid_alive, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _needs_kafka(kafka_unavailable: str | None) -> None:
    if kafka_unavailable is not None:
        pytest.skip(kafka_unavailable)


def test_node_that_cannot_start_raises_with_its_log_tail() -> None:
    cluster = KafkaCluster(1, jvm_options=["-Xmx1m"], startup_timeout=60)
    with pytest.raises(KafkaStartError) as info:
        cluster.start()
    message = str(info.value)
    assert "Kafka node 1 exited with code 1" in message
    assert "Too small maximum heap" in message  # the JVM's own words, from the node's log
    assert cluster.pids() == []
    assert cluster.workdir is not None and not cluster.workdir.exists()


def test_bad_broker_config_raises_with_the_log_tail() -> None:
    cluster = KafkaCluster(1, {"num.io.threads": "many"}, startup_timeout=60)
    with pytest.raises(KafkaStartError) as info:
        cluster.start()
    assert "num.io.threads" in str(info.value)
    assert "formatting node 1's storage failed" in str(info.value)
    assert cluster.pids() == []


def test_owned_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"may not set listeners, node\.id"):
        KafkaCluster(1, {"node.id": "7", "listeners": "x"})
    with pytest.raises(ValueError, match="one port per node"):
        KafkaCluster(2, advertised_ports={1: 1234})
    with pytest.raises(ValueError, match="from 1 to 9"):
        KafkaCluster(0)


def test_no_process_survives_an_exception_in_the_with_block() -> None:
    class Boom(Exception):
        pass

    seen: dict[str, object] = {}

    def fail_inside() -> None:
        with KafkaCluster(1) as cluster:
            seen["pids"], seen["workdir"] = cluster.pids(), cluster.workdir
            assert len(cluster.pids()) == 1 and pid_alive(cluster.pids()[0])
            raise Boom

    with pytest.raises(Boom):
        fail_inside()
    pids = seen["pids"]
    workdir = seen["workdir"]
    assert isinstance(pids, list) and pids and not any(pid_alive(p) for p in pids)
    assert isinstance(workdir, Path) and not workdir.exists()


_CHILD = textwrap.dedent("""
    import json, sys, time
    from pipeline.testing.kafka import KafkaCluster
    cluster = KafkaCluster(1).start()
    print(json.dumps({"pids": cluster.pids(), "workdir": str(cluster.workdir)}), flush=True)
    time.sleep(600)
""")


def test_no_process_survives_its_python_process_being_killed(tmp_path: Path) -> None:
    # SIGKILL: no finally, no atexit, no finalizer runs. The kernel's parent-death signal
    # (PR_SET_PDEATHSIG) is what ends the node.
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else "child said nothing"
        started = json.loads(line)
        pids = started["pids"]
        assert len(pids) == 1 and pid_alive(pids[0])
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        wait_until(lambda: not any(pid_alive(p) for p in pids), 10, f"nodes {pids} gone")
    finally:
        if child.poll() is None:
            child.kill()
    # The next cluster's start sweeps the dead process's temporary work dir.
    assert Path(started["workdir"]).exists()
    sweep_stale_workdirs()
    assert not Path(started["workdir"]).exists()


def test_pipeline_broker_kafka_until_ctrl_c() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "broker", "--kafka", "--nodes", "1",
         "--topic", "cli-kafka:2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("bootstrap.servers="):
                break
        text = "".join(lines)
        assert "topic cli-kafka (2 partitions): created" in text, text
        pids = [int(x.split()[3]) for x in lines if x.startswith("node ") and " pid " in x]
        assert len(pids) == 1 and pid_alive(pids[0])
        bootstrap = lines[-1].strip().split("=", 1)[1]
        from pipeline.cli import main

        assert main(["consume", "-b", bootstrap, "-t", "cli-kafka", "-e", "-q"]) == 0
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "broker stopped" in out
        assert not pid_alive(pids[0])
    finally:
        if proc.poll() is None:
            proc.kill()


def test_kafka_options_need_kafka_and_tansu_options_refuse_it() -> None:
    from pipeline.cli import main

    assert main(["broker", "--nodes", "3"]) == 2
    assert main(["broker", "--kafka", "--port", "9092"]) == 2


def test_kept_workdir_survives_and_restarts(tmp_path: Path) -> None:
    workdir = tmp_path / "kept"
    with KafkaCluster(1, workdir=workdir) as cluster:
        cluster.create_topic("kept-topic", partitions=2)
        pids = cluster.pids()
    assert not any(pid_alive(p) for p in pids)
    log = (workdir / "node-1" / "kafka.log").read_text()
    assert "stopped (SIGTERM), exit code" in log  # shut down cleanly, not killed
    # The kept data is reused (not formatted again), on new ports: the topic is still there.
    with KafkaCluster(1, workdir=workdir) as again:
        assert len(again.describe_topic("kept-topic").partitions) == 2
    assert os.path.isdir(workdir / "node-1" / "data")


def test_a_port_taken_before_the_node_binds_it_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline.testing.kafka import settings

    real = settings.free_ports
    picks: list[list[int]] = []
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]

        def first_pick_taken(count: int) -> list[int]:
            ports = real(count)
            if not picks:
                ports[0] = taken  # node 1's CLIENT listener: another process has it
            picks.append(ports)
            return ports

        monkeypatch.setattr(settings, "free_ports", first_pick_taken)
        with KafkaCluster(1) as cluster:
            assert len(picks) == 2
            assert cluster.port(1) == picks[1][0] != taken
            assert cluster.describe_topic("pipeline-ready-probe").fully_replicated


def test_records_with_old_timestamps_are_kept() -> None:
    """Tests write records with fixed CreateTimes of 2022-2023. Kafka's default 7-day
    retention deleted them at its first check (30 s after the start; every 5 min later, 1 s
    here), active segment too: a CI read-back that straddled a check found partitions
    starting at offset 18. The test kit turns time-based retention off. Here the first
    check comes 1 s after the start (``log.initial.task.delay.ms``) and then every second."""
    import time

    confluent_kafka = pytest.importorskip("confluent_kafka")
    with KafkaCluster(1, {"log.retention.check.interval.ms": "1000",
                          "log.initial.task.delay.ms": "1000"}) as cluster:
        cluster.create_topic("old-timestamps", 1)
        producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap})
        for i in range(20):
            producer.produce("old-timestamps", b"v%d" % i, timestamp=1_700_000_000_000 + i)
        assert producer.flush(30) == 0
        consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap,
                                             "group.id": "retention"})
        try:
            partition = confluent_kafka.TopicPartition("old-timestamps", 0)
            time.sleep(4)  # past several retention checks
            assert consumer.get_watermark_offsets(partition, timeout=10) == (0, 20)
        finally:
            consumer.close()
