"""Every example in README.md and docs/*.md runs, so the docs cannot rot.

The blocks and their markers: tests/docs/markdown.py. Each file's examples run in document
order, each in its own process (``python`` blocks as a script, shell blocks with ``bash -e``,
the virtualenv's ``bin`` first on PATH so ``pipeline`` and ``python`` are this checkout's, and
the checkout on PYTHONPATH so ``python -m bench`` works as from its root),
in one scratch directory per file, with ``127.0.0.1:9092`` replaced by the broker's address.
A block that exits non-zero or runs past its time fails the test, naming the file and line
and showing the block's output.

* unmarked blocks: a private embedded tansu broker, one per module (``integration``);
* ``kafka`` blocks: the session's 1-node Apache Kafka (``kafka``; skipped without java);
* ``spark`` blocks: the same tansu broker, a Spark session of their own (``spark``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.testing.broker import EmbeddedBroker
from tests.docs.markdown import PYTHON, ROOT, Block, blocks, documentation_files

DEFAULT_ADDRESSES = ("127.0.0.1:9092", "localhost:9092")
TIMEOUT = {"broker": 120.0, "kafka": 180.0, "spark": 420.0}


def _examples(kind: str) -> list[Path]:
    return [p for p in documentation_files()
            if any(b.is_example and b.kind == kind for b in blocks(p))]


def _id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def shell_script(block: Block) -> str:
    if block.lang != "console":
        return block.code
    lines, take = [], False
    for line in block.code.splitlines():
        if line.startswith("$ "):
            lines.append(line[2:])
            take = line.endswith("\\")
        elif take:
            lines.append(line)
            take = line.endswith("\\")
    return "\n".join(lines) + "\n"


def run_block(block: Block, bootstrap: str, workdir: Path, timeout: float) -> None:
    """Run one example; raise AssertionError naming it when it fails or hangs."""
    code = block.code if block.lang in PYTHON else shell_script(block)
    for address in DEFAULT_ADDRESSES:
        code = code.replace(address, bootstrap)
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_BOOTSTRAP"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if block.lang in PYTHON:
        script = workdir / f"example_{block.line}.py"
        script.write_text(code, encoding="utf-8")
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", code]
    try:
        done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{block.where}: still running after {timeout:.0f} s\n"
                             f"--- output ---\n{_tail(exc.stdout)}{_tail(exc.stderr)}") from None
    if done.returncode != 0:
        raise AssertionError(f"{block.where}: exit status {done.returncode}\n--- block ---\n"
                             f"{code}--- stdout ---\n{_tail(done.stdout)}--- stderr ---\n"
                             f"{_tail(done.stderr)}")


def _tail(text: str | bytes | None, lines: int = 40) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "".join((text or "").splitlines(keepends=True)[-lines:])


def run_examples(path: Path, kind: str, bootstrap: str, workdir: Path) -> int:
    """Run ``path``'s examples of ``kind`` in order; the number run."""
    ran = 0
    for block in blocks(path):
        if block.is_example and block.kind == kind:
            run_block(block, bootstrap, workdir, TIMEOUT[kind])
            ran += 1
    return ran


@pytest.fixture(scope="module")
def docs_broker() -> Iterator[str]:
    """A private tansu broker: the examples' topics never meet other tests' topics."""
    broker = EmbeddedBroker().start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.mark.integration
@pytest.mark.parametrize("path", _examples("broker"), ids=_id)
def test_examples_run_on_the_embedded_broker(path: Path, docs_broker: str,
                                             tmp_path: Path) -> None:
    assert run_examples(path, "broker", docs_broker, tmp_path) > 0


@pytest.mark.kafka
@pytest.mark.parametrize("path", _examples("kafka"), ids=_id)
def test_examples_that_need_apache_kafka(path: Path, kafka_single: object,
                                         tmp_path: Path) -> None:
    bootstrap = kafka_single.bootstrap  # type: ignore[attr-defined]
    assert run_examples(path, "kafka", bootstrap, tmp_path) > 0


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("path", _examples("spark"), ids=_id)
def test_examples_that_need_spark(path: Path, docs_broker: str, tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    assert run_examples(path, "spark", docs_broker, tmp_path) > 0


# The runner itself, without a broker: a broken example fails, naming its place.

def test_a_failing_example_fails_the_run_naming_its_file_and_line(tmp_path: Path) -> None:
    scratch = ROOT / "tests" / "docs" / "_scratch_examples.md"
    scratch.write_text("# t\n\n```python\nprint('ok')\n```\n\n<!-- example: skip (a demo) -->\n"
                       "```sh\nexit 3\n```\n\n```sh\necho 127.0.0.1:9092 > seen\n```\n\n"
                       "```python\nraise SystemExit('broken example')\n```\n")
    try:
        with pytest.raises(AssertionError) as failed:
            run_examples(scratch, "broker", "example-broker:1", tmp_path)
    finally:
        scratch.unlink()
    text = str(failed.value)
    assert text.startswith("tests/docs/_scratch_examples.md:16: exit status 1")
    assert "broken example" in text
    # the blocks before it ran, in order, in the shared directory, with the address replaced
    assert (tmp_path / "seen").read_text() == "example-broker:1\n"


def test_a_console_block_runs_only_its_commands(tmp_path: Path) -> None:
    block = Block(ROOT / "README.md", 1, "console",
                  "$ echo one \\\n  two > out\nsome output\n$ cat out\none two\n", "broker")
    assert shell_script(block) == "echo one \\\n  two > out\ncat out\n"
    run_block(block, "b:1", tmp_path, 30)
    assert (tmp_path / "out").read_text() == "one two\n"
