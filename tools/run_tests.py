"""``make test``: the whole suite as two pytest processes side by side.

One process runs every test that starts a JVM or runs a chaos schedule on one (markers
``kafka``, ``spark``, ``chaos``), one after another as a single run would: their session
clusters start once, and no two chaos schedules or Spark sessions share the machine's
cores. The other runs everything else (unit, fake-cluster, tansu tests), which is mostly
Python on its own core while the first waits on brokers. Together they are the same
tests as ``pytest`` alone (``--one`` runs that).

The JVM run's output streams; the other's is kept in a file and printed when it ends.
The exit status is the first failing run's, else 0.

    python tools/run_tests.py [--one] [pytest args...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

JVM = "kafka or spark or chaos"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        return subprocess.call([sys.executable, "-m", "pytest", "-q", *argv[1:]])
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        # (The cache plugin of two runs would write one .pytest_cache at once.)
        rest = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-m", f"not ({JVM})", *argv],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            jvm = subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", JVM, *argv])
        finally:
            others = rest.wait()
        print(f"\n==== the tests without a JVM (exit status {others}) ====", flush=True)
        log.seek(0)
        for line in log:
            sys.stdout.write(line)
    print(f"==== make test: JVM tests exit status {jvm}, the others {others} ====")
    return jvm or others


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
