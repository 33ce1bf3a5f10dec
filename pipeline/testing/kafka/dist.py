"""The Apache Kafka jars: fetched once per machine from Maven Central, cached outside the package.

``ensure_kafka()`` returns the directory of jars for :data:`KAFKA_VERSION`, fetching them
the first time with Maven (``mvn dependency:copy-dependencies`` on the ``pom.xml`` shipped
beside this module) into ``$PIPELINE_KAFKA_CACHE/kafka-<version>/libs`` (default
``$XDG_CACHE_HOME/pipeline``, else ``~/.cache/pipeline``). Maven's own repository (``~/.m2``)
caches the downloads across versions and projects.

Several test processes (and worktrees) may race to fetch: an exclusive ``flock`` on
``kafka-<version>.lock`` serialises them, the jars land in a temporary directory that is
renamed into place, and ``complete.json`` (written last) marks a finished fetch. A fetch
killed half-way leaves only a temporary directory, removed by the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "KAFKA_VERSION",
    "KafkaClusterError",
    "KafkaSetupError",
    "KafkaStartError",
    "cache_dir",
    "ensure_kafka",
    "java_binary",
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


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    """``<cache root>/kafka-<version>``: where the jars of ``version`` live."""
    root = os.environ.get(CACHE_ENV)
    if root:
        base = Path(root).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "pipeline"
    return base / f"kafka-{version}"


def _pom_text() -> str:
    return resources.files("pipeline.testing.kafka").joinpath("pom.xml").read_text("utf-8")


def _pom_digest(version: str) -> str:
    return hashlib.sha256(f"{version}\n{_pom_text()}".encode()).hexdigest()


def _complete(home: Path, version: str) -> Path | None:
    """The libs directory if a finished fetch of this pom and version is there."""
    try:
        marker = json.loads((home / "complete.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    libs = home / "libs"
    if marker.get("pom") != _pom_digest(version):
        return None
    if not all((libs / name).is_file() for name in marker.get("jars", [])):
        return None
    return libs


def _missing_tools(*, need_mvn: bool) -> list[str]:
    missing = []
    if java_binary(required=False) is None:
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
        check_tools(need_mvn=_complete(cache_dir(version), version) is None)
    except KafkaSetupError as exc:
        return str(exc)
    return None


def java_binary(*, required: bool = True) -> str | None:
    """``$JAVA_HOME/bin/java`` if it exists, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None and required:
        check_tools(need_mvn=False)
    return found


@cache
def java_major_version() -> int:
    """The major version of :func:`java_binary` (``java -version``); 0 if unreadable."""
    java = java_binary()
    assert java is not None
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return 0
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # blocks while another process fetches
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_kafka(version: str = KAFKA_VERSION, *, timeout: float = 900.0) -> Path:
    """The directory of Kafka ``version``'s jars, fetched with Maven the first time.

    Raises:
      KafkaSetupError: java/mvn missing, or Maven failed (its output is in the message).
    """
    home = cache_dir(version)
    libs = _complete(home, version)
    if libs is not None:
        return libs
    check_tools(need_mvn=True)
    with _exclusive(home.parent / f"kafka-{version}.lock"):
        libs = _complete(home, version)  # another process may have fetched it meanwhile
        if libs is not None:
            return libs
        home.mkdir(parents=True, exist_ok=True)
        for stale in home.glob("libs.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return _fetch(home, version, timeout)


def _fetch(home: Path, version: str, timeout: float) -> Path:
    pom = home / "pom.xml"
    pom.write_text(_pom_text(), "utf-8")
    tmp = Path(tempfile.mkdtemp(prefix="libs.tmp-", dir=home))
    cmd = [
        "mvn", "-B", "-q", "-f", str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={tmp}",
        f"-Dkafka.version={version}",
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=home, check=False
        )
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise KafkaSetupError(f"fetching Kafka {version} with Maven took over {timeout:.0f}s") from exc
    jars = sorted(p.name for p in tmp.glob("*.jar"))
    broker_jar = f"kafka_2.13-{version}.jar"
    if proc.returncode != 0 or broker_jar not in jars:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise KafkaSetupError(
            f"Maven could not fetch Apache Kafka {version} (exit {proc.returncode}; "
            f"{' '.join(cmd)}):\n{tail}"
        )
    libs = home / "libs"
    if libs.exists():
        shutil.rmtree(libs)
    tmp.rename(libs)
    marker = home / "complete.json.tmp"
    marker.write_text(json.dumps({"version": version, "pom": _pom_digest(version), "jars": jars}))
    marker.replace(home / "complete.json")
    return libs
