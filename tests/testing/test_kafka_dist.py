"""Fetching and caching the Kafka jars, without Maven Central: a fake ``mvn`` and ``java``.

The real fetch runs in ``make test`` (``python -m pipeline.testing.kafka --if-tools``) and
in every kafka test; these pin the cache's rules: one clear error naming what is missing,
one fetch when several processes race, nothing half-written left to be trusted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.testing.kafka import dist
from pipeline.testing.kafka.cds import CDS_ENV, cds_archive

FAKE_MVN = """#!/bin/sh
# Fake mvn: the copy-dependencies call pipeline.testing.kafka makes, without a network.
for arg in "$@"; do
  case "$arg" in
    -DoutputDirectory=*) out="${arg#-DoutputDirectory=}" ;;
    -Dkafka.version=*) version="${arg#-Dkafka.version=}" ;;
  esac
done
echo "fetch $$" >> "$FAKE_MVN_LOG"
sleep "${FAKE_MVN_SLEEP:-0}"
if [ -n "$FAKE_MVN_FAIL" ]; then echo "[ERROR] Could not resolve dependencies"; exit 1; fi
echo jar > "$out/kafka_2.13-$version.jar"
echo jar > "$out/kafka-clients-$version.jar"
"""

FAKE_JAVA = """#!/bin/sh
echo 'openjdk version "%s" 2025-04-15' >&2
"""


def _bin(tmp_path: Path, *, mvn: bool = True, java: str | None = "17.0.15") -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    tools = {"mvn": FAKE_MVN if mvn else None,
             "java": FAKE_JAVA % java if java is not None else None}
    for name, text in tools.items():
        path = bindir / name
        if path.exists():
            path.unlink()
        if text is not None:
            path.write_text(text)
            path.chmod(0o755)
    sleep = bindir / "sleep"  # the fakes' only outside command (PATH holds nothing else)
    if not sleep.exists():
        sleep.symlink_to("/bin/sleep")
    return bindir


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment whose PATH has only the fake tools, and a private jar cache."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv(dist.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_MVN_LOG", str(tmp_path / "mvn.log"))
    dist.java_major_version.cache_clear()
    yield_env = dict(os.environ)
    return yield_env


def _with_path(monkeypatch: pytest.MonkeyPatch, bindir: Path) -> None:
    monkeypatch.setenv("PATH", str(bindir))
    dist.java_major_version.cache_clear()


def test_missing_java_and_mvn_is_one_clear_error(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_path(monkeypatch, _bin(tmp_path, mvn=False, java=None))
    with pytest.raises(dist.KafkaSetupError) as info:
        dist.ensure_kafka("9.9.9")
    message = str(info.value)
    assert "needs java and mvn, not found on PATH" in message
    assert "apt-get install openjdk-17-jdk-headless maven" in message
    assert dist.missing_tools_reason("9.9.9") == message


def test_missing_mvn_alone_is_named(env: dict[str, str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _with_path(monkeypatch, _bin(tmp_path, mvn=False))
    with pytest.raises(dist.KafkaSetupError, match="needs mvn, not found on PATH: install it"):
        dist.ensure_kafka("9.9.9")


def test_old_java_is_refused(env: dict[str, str], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    _with_path(monkeypatch, _bin(tmp_path, java="11.0.2"))
    with pytest.raises(dist.KafkaSetupError, match=r"needs Java 17\+, but .* is Java 11"):
        dist.ensure_kafka("9.9.9")
    _with_path(monkeypatch, _bin(tmp_path, java="1.8.0_312"))
    with pytest.raises(dist.KafkaSetupError, match="is Java 8"):
        dist.check_tools(need_mvn=False)


def test_cached_jars_need_no_mvn(env: dict[str, str], tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _with_path(monkeypatch, _bin(tmp_path))
    libs = dist.ensure_kafka("9.9.9")
    assert sorted(p.name for p in libs.iterdir()) == [
        "kafka-clients-9.9.9.jar", "kafka_2.13-9.9.9.jar"]
    (tmp_path / "bin" / "mvn").unlink()
    assert dist.ensure_kafka("9.9.9") == libs
    assert dist.missing_tools_reason("9.9.9") is None
    assert len((tmp_path / "mvn.log").read_text().splitlines()) == 1


def test_concurrent_fetches_fetch_once(env: dict[str, str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = _bin(tmp_path)
    child_env = {**os.environ, "PATH": str(bindir), "FAKE_MVN_SLEEP": "1"}
    script = "from pipeline.testing.kafka.dist import ensure_kafka; print(ensure_kafka('9.9.9'))"
    procs = [subprocess.Popen([sys.executable, "-c", script], env=child_env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    assert len({out.strip() for out, _ in outs}) == 1
    assert len((tmp_path / "mvn.log").read_text().splitlines()) == 1  # one fetch, 3 waited
    home = dist.cache_dir("9.9.9")
    marker = json.loads((home / "complete.json").read_text())
    assert marker["jars"] == ["kafka-clients-9.9.9.jar", "kafka_2.13-9.9.9.jar"]
    assert list(home.glob("libs.tmp-*")) == []


def test_failed_fetch_leaves_nothing_trusted(env: dict[str, str], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _with_path(monkeypatch, _bin(tmp_path))
    monkeypatch.setenv("FAKE_MVN_FAIL", "1")
    with pytest.raises(dist.KafkaSetupError, match="Could not resolve dependencies"):
        dist.ensure_kafka("9.9.9")
    home = dist.cache_dir("9.9.9")
    assert not (home / "complete.json").exists()
    assert list(home.glob("libs*")) == []
    # A fetch killed half-way leaves only a temporary directory: the next one removes it.
    (home / "libs.tmp-dead").mkdir()
    monkeypatch.delenv("FAKE_MVN_FAIL")
    assert dist.ensure_kafka("9.9.9").name == "libs"
    assert not (home / "libs.tmp-dead").exists()


def test_a_changed_pom_is_fetched_again(env: dict[str, str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _with_path(monkeypatch, _bin(tmp_path))
    dist.ensure_kafka("9.9.9")
    marker = dist.cache_dir("9.9.9") / "complete.json"
    data = json.loads(marker.read_text())
    data["pom"] = "an older pom"
    marker.write_text(json.dumps(data))
    dist.ensure_kafka("9.9.9")
    assert len((tmp_path / "mvn.log").read_text().splitlines()) == 2


def test_cds_archive_is_trained_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CDS_ENV, raising=False)
    trained: list[list[str]] = []

    def train(options: list[str]) -> None:
        trained.append(list(options))
        (path,) = [o.split("=", 1)[1] for o in options if o.startswith("-XX:ArchiveClassesAt")]
        Path(path).write_bytes(b"archive")

    first = cds_archive(tmp_path, sys.executable, "a.jar:b.jar", train)
    assert first is not None and first.read_bytes() == b"archive"
    assert cds_archive(tmp_path, sys.executable, "a.jar:b.jar", train) == first
    assert len(trained) == 1
    other = cds_archive(tmp_path, sys.executable, "a.jar:c.jar", train)  # another class path
    assert other is not None and other != first and len(trained) == 2
    monkeypatch.setenv(CDS_ENV, "0")
    assert cds_archive(tmp_path, sys.executable, "a.jar:b.jar", train) is None


def test_failed_cds_training_is_not_retried(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CDS_ENV, raising=False)
    calls: list[int] = []

    def train(options: list[str]) -> None:
        calls.append(1)
        raise RuntimeError("the JVM refused")

    assert cds_archive(tmp_path, sys.executable, "x.jar", train) is None
    assert cds_archive(tmp_path, sys.executable, "x.jar", train) is None
    assert len(calls) == 1
    assert list(tmp_path.glob("*.jsa")) == []


def test_a_nodes_jvm_unpacks_native_libraries_in_its_own_directory(tmp_path: Path) -> None:
    """lz4-java and snappy-java unpack a native library into ``java.io.tmpdir`` and delete
    it on a normal exit only: a SIGKILLed node (the chaos tests' crash) left one in /tmp per
    start. The node's own directory is removed with the cluster."""
    from pipeline.testing.kafka.node import KafkaNode, NodePorts

    node = KafkaNode(0, NodePorts(1, 2, 3), tmp_path / "node-0", java="java", classpath="cp",
                     jvm_options=(), config={"node.id": "0"})
    node.write_files()
    options = [o for o in node.command() if o.startswith("-Djava.io.tmpdir=")]
    assert options == [f"-Djava.io.tmpdir={tmp_path / 'node-0' / 'tmp'}"]
    assert (tmp_path / "node-0" / "tmp").is_dir()
