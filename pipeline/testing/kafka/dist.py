"""The Apache Kafka jars: fetched once per machine from Maven Central, cached outside the package.

``ensure_kafka()`` returns the directory of jars for :data:`KAFKA_VERSION`, fetching them
the first time with Maven (``mvn dependency:copy-dependencies`` on the ``pom.xml`` shipped
beside this module) into ``$PIPELINE_KAFKA_CACHE/kafka-<version>/libs`` (default
``$XDG_CACHE_HOME/pipeline``, else ``~/.cache/pipeline``). The fetching, the lock that
makes racing processes fetch once and the cache's completeness marker are
:mod:`pipeline.util.maven`'s (Spark's Kafka sink jars use the same); this module adds the
Kafka specifics: the pom, the version, and the Java/Maven checks with their wording.
"""

from __future__ import annotations

import os
import shutil
from importlib import resources
from pathlib import Path

from pipeline.util.maven import (
    JarSet,
    MavenError,
    cache_root,
    cached_jars,
    ensure_jars,
    java_major_version,
)
from pipeline.util.maven import java_binary as _java_binary

__all__ = [
    "CACHE_ENV",
    "KAFKA_VERSION",
    "KafkaClusterError",
    "KafkaSetupError",
    "KafkaStartError",
    "cache_dir",
    "ensure_kafka",
    "java_binary",
    "java_major_version",
    "missing_tools_reason",
]

#: The Apache Kafka release the test cluster runs (KRaft; Java 17+).
KAFKA_VERSION = "4.1.2"
#: Overrides the cache root (jars go to ``$PIPELINE_KAFKA_CACHE/kafka-<version>/libs``).
CACHE_ENV = "PIPELINE_KAFKA_CACHE"
MIN_JAVA = 17
_INSTALL_HINT = (
    "(Debian/Ubuntu: `apt-get install openjdk-17-jdk-headless maven`; elsewhere a JDK 17+ and "
    "Apache Maven 3.6+, on PATH)"
)


class KafkaClusterError(RuntimeError):
    """A Kafka test cluster could not do what was asked (base of this package's errors)."""


class KafkaSetupError(KafkaClusterError):
    """Java or Maven is missing, or the Kafka jars could not be fetched."""


class KafkaStartError(KafkaClusterError):
    """A node did not start (its log's tail is in the message) or the cluster never got ready."""


def _root() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else cache_root()


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    """``<cache root>/kafka-<version>``: where the jars of ``version`` live."""
    return _root() / f"kafka-{version}"


def _jar_set(version: str) -> JarSet:
    pom = resources.files("pipeline.testing.kafka").joinpath("pom.xml").read_text("utf-8")
    return JarSet(
        name=f"kafka-{version}", pom=pom, what=f"Apache Kafka {version}", key=version,
        properties={"kafka.version": version}, required=(f"kafka_2.13-{version}.jar",),
    )


def _missing_tools(*, need_mvn: bool) -> list[str]:
    missing = []
    if _java_binary() is None:
        missing.append("java")
    if need_mvn and shutil.which("mvn") is None:
        missing.append("mvn")
    return missing


def check_tools(*, need_mvn: bool) -> None:
    """Raise one :class:`KafkaSetupError` naming every missing tool (and a too-old Java)."""
    missing = _missing_tools(need_mvn=need_mvn)
    if missing:
        raise KafkaSetupError(
            f"Apache Kafka for the tests needs {' and '.join(missing)}, not found on PATH: "
            f"install {'it' if len(missing) == 1 else 'them'} {_INSTALL_HINT}"
        )
    major = java_major_version()
    if major < MIN_JAVA:
        raise KafkaSetupError(
            f"Apache Kafka {KAFKA_VERSION} needs Java {MIN_JAVA}+, but {java_binary()} is Java "
            f"{major}: install a newer one {_INSTALL_HINT}, or point $JAVA_HOME at one"
        )


def missing_tools_reason(version: str = KAFKA_VERSION) -> str | None:
    """Why Kafka cannot run here (java missing or too old; mvn missing while the jars are not
    cached yet), or None. Cheap: never fetches."""
    try:
        check_tools(need_mvn=cached_jars(_jar_set(version), _root()) is None)
    except KafkaSetupError as exc:
        return str(exc)
    return None


def java_binary(*, required: bool = True) -> str | None:
    """``$JAVA_HOME/bin/java`` if it exists, else ``java`` on PATH (``required``: else
    :class:`KafkaSetupError`)."""
    found = _java_binary()
    if found is None and required:
        check_tools(need_mvn=False)
    return found


def ensure_kafka(version: str = KAFKA_VERSION, *, timeout: float = 900.0) -> Path:
    """The directory of Kafka ``version``'s jars, fetched with Maven the first time.

    Raises:
      KafkaSetupError: java/mvn missing, or Maven failed (its output is in the message).
    """
    jars = _jar_set(version)
    libs = cached_jars(jars, _root())
    if libs is not None:
        return libs
    check_tools(need_mvn=True)
    try:
        return ensure_jars(jars, _root(), timeout=timeout)
    except MavenError as exc:
        raise KafkaSetupError(str(exc)) from exc
