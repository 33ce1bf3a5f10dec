"""The jars of Spark's own Kafka sink, so it can run beside ``export_dataframe``.

    from pipeline.spark import kafka_sink_jars
    spark = (SparkSession.builder.config("spark.jars", ",".join(kafka_sink_jars()))
             .getOrCreate())                      # before the JVM starts
    df.write.format("kafka").option("kafka.bootstrap.servers", b).option("topic", t).save()

PySpark ships no Kafka connector. :func:`kafka_sink_jars` fetches
``org.apache.spark:spark-sql-kafka-0-10_2.13`` at the installed PySpark's version with its
runtime dependencies from Maven Central, once per machine (``kafka-sink-pom.xml`` shipped
beside this module; cache, lock and completeness marker from :mod:`pipeline.util.maven`),
into ``$PIPELINE_SPARK_JARS_CACHE/spark-sql-kafka-<version>/libs`` (default
``~/.cache/pipeline``). It returns only the jars PySpark lacks: a jar whose artifact
PySpark already ships (scala-library, slf4j-api, snappy-java, lz4-java, ...; in other
versions, sometimes older ones) is left out, so each class has one copy on the class path,
PySpark's. Local jar paths through ``spark.jars`` are deterministic where
``spark.jars.packages`` resolves through Ivy on every cold cache.
"""

from __future__ import annotations

import importlib.util
import os
from importlib import metadata, resources
from pathlib import Path

from pipeline.util.maven import JarSet, MavenError, artifact_id, cache_root, ensure_jars

__all__ = ["CACHE_ENV", "SINK_ARTIFACT", "KafkaSinkJarsError", "kafka_sink_jars"]

#: The connector, for Scala 2.13 (PySpark 4 is built for 2.13 only).
SINK_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
#: Overrides the cache root (jars go to ``$PIPELINE_SPARK_JARS_CACHE/spark-sql-kafka-<v>/libs``).
CACHE_ENV = "PIPELINE_SPARK_JARS_CACHE"
_INSTALL_HINT = (
    "(Debian/Ubuntu: `apt-get install maven`; elsewhere Apache Maven 3.6+ on PATH)"
)


class KafkaSinkJarsError(RuntimeError):
    """The sink's jars could not be had: no pyspark, no mvn, or no such version on Maven
    Central (the message says which and what to do)."""


def _root() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else cache_root()


def _installed_pyspark() -> tuple[str, Path]:
    """The installed PySpark's version and its ``jars`` directory (without importing it)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise KafkaSinkJarsError(
            "kafka_sink_jars() needs pyspark (pip install -e '.[spark]'), or an explicit "
            "spark_version="
        )
    return metadata.version("pyspark"), Path(spec.origin).parent / "jars"


def _jar_set(version: str) -> JarSet:
    pom = resources.files("pipeline.spark").joinpath("kafka-sink-pom.xml").read_text("utf-8")
    return JarSet(
        name=f"spark-sql-kafka-{version}", pom=pom, key=version,
        what=f"Spark's Kafka sink ({SINK_ARTIFACT}:{version})",
        properties={"spark.version": version},
        required=(f"spark-sql-kafka-0-10_2.13-{version}.jar",),
    )


def kafka_sink_jars(spark_version: str | None = None, *, timeout: float = 900.0) -> list[str]:
    """Absolute paths of the jars Spark's ``format("kafka")`` sink needs beside PySpark's own.

    ``spark_version``: default the installed PySpark's (the connector must match it
    exactly). Fetched from Maven Central the first time (needs ``mvn``), then read from
    the cache; safe to call from several processes at once.

    Raises:
      KafkaSinkJarsError: pyspark is not installed (and no version given), ``mvn`` is
        missing while the jars are not cached, or Maven Central has no connector for the
        version (then pin PySpark to one that has it).
    """
    shipped: set[str] = set()
    try:
        installed, jars_dir = _installed_pyspark()
    except KafkaSinkJarsError:
        if spark_version is None:
            raise
    else:
        if jars_dir.is_dir():
            shipped = {artifact_id(p.name) for p in jars_dir.glob("*.jar")}
    version = spark_version or installed
    jars = _jar_set(version)
    try:
        libs = ensure_jars(jars, _root(), timeout=timeout)
    except MavenError as exc:
        raise KafkaSinkJarsError(_explain(str(exc), version)) from exc
    return sorted(
        str(p.resolve()) for p in libs.glob("*.jar") if artifact_id(p.name) not in shipped
    )


def _explain(error: str, version: str) -> str:
    if "needs mvn" in error:
        return f"{error}: install it {_INSTALL_HINT}"
    missing = f"spark-sql-kafka-0-10_2.13:jar:{version}"
    if missing in error and ("not found" in error or "Could not find" in error):
        return (
            f"Maven Central has no {SINK_ARTIFACT}:{version}, the connector for PySpark "
            f"{version}: install a PySpark release that has one (this project pins "
            f"pyspark==4.2.0) or pass spark_version=. Maven said:\n{error}"
        )
    return error
