"""Packaging of the C extensions (the columnar kernel, the settled-await path): ``pip``
builds them, and an install without a compiler still succeeds (both are optional) and
runs on their pure-Python twins."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _wheel(tmp_path: Path, env_extra: dict[str, str]) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "pipeline", src / "pipeline",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = {**os.environ, **env_extra}
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    return wheel


def _kernel_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return [n for n in zf.namelist() if n.startswith("pipeline/protocol/_kernel")]


def _delivery_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return [n for n in zf.namelist() if n.startswith("pipeline/producer/_speedups/_delivery")]


def _kernel_in(wheel: Path, tmp_path: Path) -> str:
    """Which kernel the wheel's package loads (unpacked, first on the path)."""
    site = tmp_path / "unpacked"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    probe = ("from pipeline.protocol import columnar; "
             "from pipeline.producer._outcomes import delivery; "
             f"assert columnar.__file__.startswith({str(site)!r}), columnar.__file__; "
             "print(columnar.KERNEL, delivery.DELIVERY_AWAIT)")
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("PIPELINE_PURE_PYTHON", None)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=60, check=True)
    return out.stdout.strip()


def test_pip_builds_the_extension(tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here")
    wheel = _wheel(tmp_path, {})
    files = _kernel_files(wheel)
    assert any(f.endswith(".so") or f.endswith(".pyd") for f in files), files
    assert "pipeline/protocol/_kernel.pyi" in files
    delivery = _delivery_files(wheel)
    assert any(f.endswith(".so") or f.endswith(".pyd") for f in delivery), delivery
    assert "pipeline/producer/_speedups/_delivery.pyi" in delivery
    assert _kernel_in(wheel, tmp_path) == "c c"  # the columnar kernel, the await path


def test_install_without_a_compiler_falls_back_to_python(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, {"CC": "false", "LDSHARED": "false"})
    files = _kernel_files(wheel)
    assert not any(f.endswith(".so") or f.endswith(".pyd") for f in files), files
    assert "pipeline/protocol/_kernel_py.py" in files
    delivery = _delivery_files(wheel)
    assert not any(f.endswith(".so") or f.endswith(".pyd") for f in delivery), delivery
    assert _kernel_in(wheel, tmp_path) == "python python"
