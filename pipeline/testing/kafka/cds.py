"""A class-data-sharing archive of a Kafka node's start-up classes: halves node start-up.

A JVM spends most of a Kafka node's start-up loading and verifying classes (Scala, Kafka,
Jackson). Java's dynamic CDS archive (``-XX:ArchiveClassesAtExit``) records them once; nodes
started with ``-XX:SharedArchiveFile`` map them instead (measured here: a 1-node start went
from ~7 s to ~3.5 s). The archive is made once per machine, Kafka version, JDK build and
class path, by a training run (a 1-node cluster that starts, gets ready and shuts down
cleanly, which is when the JVM writes the archive), and kept beside the jars. A JVM that
cannot use an archive (another JDK, another class path) warns in its log and starts without.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.util.maven import exclusive

__all__ = ["CDS_ENV", "cds_archive"]

log = logging.getLogger("pipeline.testing.kafka")

#: Set to 0 to start nodes without a class-data-sharing archive.
CDS_ENV = "PIPELINE_KAFKA_CDS"


def _java_build(java: str) -> str:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stderr + out.stdout


def cds_archive(
    home: Path, java: str, classpath: str,
    train: Callable[[Sequence[str]], None],
) -> Path | None:
    """The archive for this JDK and class path under ``home``, made by ``train(jvm_options)``
    (which must run a node with those options and stop it cleanly) if missing. None when
    disabled (``$PIPELINE_KAFKA_CDS=0``) or when training failed (not retried: see
    ``cds-failed-*``)."""
    if os.environ.get(CDS_ENV, "1") == "0":
        return None
    key = hashlib.sha256(f"{java}\n{_java_build(java)}\n{classpath}".encode()).hexdigest()[:16]
    archive = home / f"broker-{key}.jsa"
    failed = home / f"cds-failed-{key}"
    if archive.is_file():
        return archive
    if failed.exists():
        return None
    with exclusive(home / "cds.lock"):
        if archive.is_file():
            return archive
        fd, tmp_name = tempfile.mkstemp(prefix="broker-", suffix=".jsa.tmp", dir=home)
        os.close(fd)
        tmp = Path(tmp_name)
        tmp.unlink()
        try:
            train([f"-XX:ArchiveClassesAtExit={tmp}"])
        except Exception as exc:
            log.warning("no class-data-sharing archive (nodes start slower): %s", exc)
            failed.write_text(f"{exc}\n")
            return None
        if not tmp.is_file() or tmp.stat().st_size == 0:
            failed.write_text("the training run wrote no archive\n")
            log.warning("no class-data-sharing archive: the training run wrote none")
            return None
        tmp.replace(archive)
        return archive
