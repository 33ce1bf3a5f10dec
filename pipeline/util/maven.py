"""Jars from Maven Central, fetched once per machine into a cache outside the package.

Two users: the Apache Kafka test cluster (``pipeline.testing.kafka``) and Spark's own
Kafka sink (``pipeline.spark.kafka_sink_jars``). Each describes what it needs as a
:class:`JarSet`: a pom shipped as package data, the ``-D`` properties that fill it in, the
cache directory's name and the jars a good fetch must contain. :func:`ensure_jars` returns
the directory of jars, running ``mvn dependency:copy-dependencies`` the first time;
Maven's own repository (``~/.m2``) caches the downloads across versions and projects.

The cache's rules, which both users rely on:

* several processes (test sessions, worktrees, Spark drivers) may race to fetch: an
  exclusive ``flock`` on ``<root>/<name>.lock`` serialises them and the losers find the
  winner's jars;
* the jars land in a temporary directory renamed into place, and ``complete.json``
  (written last) marks a finished fetch of *this* pom with *these* properties: a fetch
  killed half-way leaves only a temporary directory (removed by the next fetch), and a
  changed pom is fetched again;
* a missing ``mvn`` or a failed fetch is one :class:`MavenError` whose message says what
  was missing or shows Maven's output; callers map it to their own error type.

This module imports nothing else of the library (the util layer).
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

__all__ = [
    "JarSet",
    "MavenError",
    "artifact_id",
    "cache_root",
    "cached_jars",
    "ensure_jars",
    "exclusive",
    "java_binary",
    "java_major_version",
    "mvn_binary",
]


class MavenError(RuntimeError):
    """``mvn`` is missing, or Maven could not fetch a :class:`JarSet` (its output inside)."""


@dataclass(frozen=True)
class JarSet:
    """What to fetch: ``pom`` (the text of a pom whose runtime dependencies are the jars),
    ``properties`` passed as ``-Dname=value``, cached under ``<root>/<name>/libs``.
    ``key`` is what besides the pom makes two fetches differ (the version the properties
    select); ``required``: jar file names a complete fetch must contain (a pom that
    resolved to nothing useful is an error, not a cache entry). ``what`` names it in
    errors."""

    name: str
    pom: str
    what: str
    key: str
    properties: Mapping[str, str] = field(default_factory=dict)
    required: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        """Identifies the pom and its key: a cache entry made from another one is stale.
        (The same formula the Kafka launcher used before this module: caches it made stay
        valid, so worktrees on older code and newer code never refetch in turn.)"""
        return hashlib.sha256(f"{self.key}\n{self.pom}".encode()).hexdigest()


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/pipeline``, else ``~/.cache/pipeline``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "pipeline"


def java_binary() -> str | None:
    """``$JAVA_HOME/bin/java`` if it exists, else ``java`` on PATH, else None."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("java")


@cache
def java_major_version() -> int:
    """The major version of :func:`java_binary` (``java -version``); 0 if there is no java
    or its answer is unreadable. Cached: ``java_major_version.cache_clear()`` after
    changing PATH or JAVA_HOME."""
    java = java_binary()
    if java is None:
        return 0
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


def mvn_binary() -> str | None:
    return shutil.which("mvn")


def artifact_id(jar_name: str) -> str:
    """The artifact id in a Maven jar file name ``<artifactId>-<version>.jar``.

    The version is the last ``-``-separated part that starts with a digit and has a dot,
    with whatever follows it (``zstd-jni-1.5.6-4.jar`` -> ``zstd-jni``,
    ``spark-sql-kafka-0-10_2.13-4.2.0.jar`` -> ``spark-sql-kafka-0-10_2.13``); a name
    without one is returned without ``.jar``.
    """
    stem = jar_name.removesuffix(".jar")
    parts = stem.split("-")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i][:1].isdigit() and "." in parts[i]:
            return "-".join(parts[:i])
    return stem


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing); blocks meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached_jars(jars: JarSet, root: Path) -> Path | None:
    """The libs directory if a finished fetch of exactly this ``jars`` is under ``root``."""
    home = root / jars.name
    try:
        marker = json.loads((home / "complete.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    libs = home / "libs"
    if not isinstance(marker, dict) or marker.get("pom") != jars.digest:
        return None
    if not all((libs / name).is_file() for name in marker.get("jars", [])):
        return None
    return libs


def ensure_jars(jars: JarSet, root: Path, *, timeout: float = 900.0) -> Path:
    """The directory of ``jars``, fetched with Maven into ``root/<name>/libs`` the first
    time (one fetch however many processes ask at once).

    Raises:
      MavenError: ``mvn`` is not on PATH, Maven failed or timed out, or a required jar
        is not among what it fetched.
    """
    libs = cached_jars(jars, root)
    if libs is not None:
        return libs
    if mvn_binary() is None:
        raise MavenError(f"fetching {jars.what} needs mvn (Apache Maven 3.6+), not found on PATH")
    with exclusive(root / f"{jars.name}.lock"):
        libs = cached_jars(jars, root)  # another process may have fetched meanwhile
        if libs is not None:
            return libs
        home = root / jars.name
        home.mkdir(parents=True, exist_ok=True)
        for stale in home.glob("libs.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return _fetch(jars, home, timeout)


def _fetch(jars: JarSet, home: Path, timeout: float) -> Path:
    pom = home / "pom.xml"
    pom.write_text(jars.pom, "utf-8")
    tmp = Path(tempfile.mkdtemp(prefix="libs.tmp-", dir=home))
    cmd = [
        "mvn", "-B", "-q", "-f", str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={tmp}",
        *(f"-D{k}={v}" for k, v in sorted(jars.properties.items())),
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=home, check=False
        )
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise MavenError(f"fetching {jars.what} with Maven took over {timeout:.0f}s") from exc
    names = sorted(p.name for p in tmp.glob("*.jar"))
    missing = [name for name in jars.required if name not in names]
    if proc.returncode != 0 or missing:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        why = f"exit {proc.returncode}" if proc.returncode else f"no {', '.join(missing)}"
        raise MavenError(f"Maven could not fetch {jars.what} ({why}; {' '.join(cmd)}):\n{tail}")
    libs = home / "libs"
    if libs.exists():
        shutil.rmtree(libs)
    tmp.rename(libs)
    marker = home / "complete.json.tmp"
    marker.write_text(json.dumps({"what": jars.what, "pom": jars.digest, "jars": names}))
    marker.replace(home / "complete.json")
    return libs
