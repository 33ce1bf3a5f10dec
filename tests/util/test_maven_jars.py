"""``kafka_sink_jars()`` without Maven Central: a fake ``mvn`` and a fake PySpark jars dir.

The real fetch runs in the Spark session fixture (tests/spark/conftest.py), and
``test_spark_kafka_sink.py`` proves the jars it returns make ``format("kafka")`` work.
These pin the rules: PySpark's own jars are left out, one clear error per failure, the
cache answers without mvn. No Spark runs here.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from pipeline.spark import sink_jars
from pipeline.spark.sink_jars import KafkaSinkJarsError, kafka_sink_jars
from pipeline.util.maven import JarSet, artifact_id

FAKE_MVN = """#!/bin/sh
# Fake mvn: copy-dependencies into -DoutputDirectory, the jars named in $FAKE_MVN_JARS.
for arg in "$@"; do
  case "$arg" in
    -DoutputDirectory=*) out="${arg#-DoutputDirectory=}" ;;
    -Dspark.version=*) version="${arg#-Dspark.version=}" ;;
  esac
done
echo "fetch $version" >> "$FAKE_MVN_LOG"
if [ -n "$FAKE_MVN_MISSING" ]; then
  echo "[ERROR] Failed to execute goal on project spark-kafka-sink-jars: Could not resolve"
  echo "dependencies: org.apache.spark:spark-sql-kafka-0-10_2.13:jar:$version was not found"
  exit 1
fi
for jar in $FAKE_MVN_JARS; do echo jar > "$out/$(echo "$jar" | sed "s/VERSION/$version/")"; done
"""

#: what Maven resolves for spark-sql-kafka 4.2.0 (Hadoop excluded by the pom), as measured
RESOLVED = ("commons-pool2-2.13.1.jar jsr305-3.0.0.jar kafka-clients-3.9.2.jar "
            "lz4-java-1.10.1.jar scala-library-2.13.15.jar "
            "scala-parallel-collections_2.13-1.2.0.jar slf4j-api-1.7.36.jar "
            "snappy-java-1.1.10.5.jar spark-sql-kafka-0-10_2.13-VERSION.jar "
            "spark-tags_2.13-VERSION.jar spark-token-provider-kafka-0-10_2.13-VERSION.jar")
#: a subset of what PySpark 4.2.0 ships in pyspark/jars (other versions of some)
SHIPPED = ("jsr305-3.0.0.jar lz4-java-1.11.0.jar scala-library-2.13.17.jar "
           "scala-parallel-collections_2.13-1.2.0.jar slf4j-api-2.0.17.jar "
           "snappy-java-1.1.10.8.jar spark-tags_2.13-9.9.9.jar spark-core_2.13-9.9.9.jar "
           "zstd-jni-1.5.7-7.jar hadoop-client-runtime-3.5.0.jar")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH with only the fake mvn, a private cache, and a fake installed PySpark 9.9.9."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    mvn = bindir / "mvn"
    mvn.write_text(FAKE_MVN)
    mvn.chmod(0o755)
    for tool in ("sed",):  # the fake's only outside command
        (bindir / tool).symlink_to(f"/bin/{tool}")
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv(sink_jars.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_MVN_LOG", str(tmp_path / "mvn.log"))
    monkeypatch.setenv("FAKE_MVN_JARS", RESOLVED)
    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    for name in SHIPPED.split():
        (jars / name).write_text("jar")
    monkeypatch.setattr(sink_jars, "_installed_pyspark", lambda: ("9.9.9", jars))
    return tmp_path


def _names(paths: list[str]) -> list[str]:
    return [Path(p).name for p in paths]


def test_only_the_jars_pyspark_lacks_at_its_version(fake: Path) -> None:
    paths = kafka_sink_jars()
    assert _names(paths) == [
        "commons-pool2-2.13.1.jar", "kafka-clients-3.9.2.jar",
        "spark-sql-kafka-0-10_2.13-9.9.9.jar", "spark-token-provider-kafka-0-10_2.13-9.9.9.jar",
    ]
    assert all(os.path.isabs(p) and Path(p).is_file() for p in paths)
    assert (fake / "mvn.log").read_text().split() == ["fetch", "9.9.9"]
    cache = fake / "cache" / "spark-sql-kafka-9.9.9"
    assert (cache / "complete.json").is_file()
    # the pom shipped as package data is what Maven was given
    assert "spark-sql-kafka-0-10_2.13" in (cache / "pom.xml").read_text()


def test_cached_jars_need_no_mvn(fake: Path) -> None:
    first = kafka_sink_jars()
    (fake / "bin" / "mvn").unlink()
    assert kafka_sink_jars() == first
    assert len((fake / "mvn.log").read_text().splitlines()) == 1


def test_explicit_version_is_fetched_as_asked(fake: Path) -> None:
    assert "spark-sql-kafka-0-10_2.13-4.2.0.jar" in _names(kafka_sink_jars("4.2.0"))


def test_missing_mvn_is_one_clear_error(fake: Path) -> None:
    (fake / "bin" / "mvn").unlink()
    with pytest.raises(KafkaSinkJarsError, match=r"needs mvn .* not found on PATH: install it"):
        kafka_sink_jars()


def test_a_pyspark_without_a_connector_on_maven_central_says_what_to_do(
        fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MVN_MISSING", "1")
    with pytest.raises(KafkaSinkJarsError) as info:
        kafka_sink_jars()
    message = str(info.value)
    assert message.startswith("Maven Central has no org.apache.spark:spark-sql-kafka-0-10_2.13"
                              ":9.9.9, the connector for PySpark 9.9.9")
    assert "pyspark==4.2.0" in message
    assert not (fake / "cache" / "spark-sql-kafka-9.9.9" / "complete.json").exists()


def test_no_pyspark_and_no_version(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> tuple[str, Path]:
        raise KafkaSinkJarsError("kafka_sink_jars() needs pyspark")

    monkeypatch.setattr(sink_jars, "_installed_pyspark", missing)
    with pytest.raises(KafkaSinkJarsError, match="needs pyspark"):
        kafka_sink_jars()
    # with a version it works, and leaves nothing out (nothing known to be shipped)
    assert len(kafka_sink_jars("9.9.9")) == len(RESOLVED.split())


@pytest.mark.parametrize(("name", "artifact"), [
    ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
    ("kafka-clients-3.9.2.jar", "kafka-clients"),
    ("zstd-jni-1.5.7-7.jar", "zstd-jni"),
    ("scala-parallel-collections_2.13-1.2.0.jar", "scala-parallel-collections_2.13"),
    ("snappy-java-1.1.10.8.jar", "snappy-java"),
    ("jsr305-3.0.0.jar", "jsr305"),
    ("foo-1.0.0-M1.jar", "foo"),
    ("noversion.jar", "noversion"),
])
def test_artifact_id_of_a_jar_name(name: str, artifact: str) -> None:
    assert artifact_id(name) == artifact


def test_cache_key_keeps_the_kafka_launchers_old_digest() -> None:
    """Caches made before pipeline.util.maven existed stay valid (no refetch ping-pong
    between worktrees on older and newer code)."""
    jars = JarSet(name="kafka-4.1.2", pom="<project/>", what="x", key="4.1.2")
    assert jars.digest == hashlib.sha256(b"4.1.2\n<project/>").hexdigest()
