"""tools/check_extensions.py: `make venv` fails when a C extension kept an old build."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_extensions", ROOT / "tools" / "check_extensions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[[tool.setuptools.ext-modules]]\nname = "pkg._fast"\nsources = ["pkg/_fast.c"]\n'
        'depends = ["pkg/_shared.h"]\noptional = true\n')
    (tmp_path / "pkg").mkdir()
    for name in ("_fast.c", "_shared.h"):
        (tmp_path / "pkg" / name).write_text("/* */\n")
        os.utime(tmp_path / "pkg" / name, (1000, 1000))
    return tmp_path


def _built(root: Path) -> Path:
    return root / "pkg" / ("_fast" + importlib.machinery.EXTENSION_SUFFIXES[0])


def test_a_build_newer_than_its_sources_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _built(root).write_bytes(b"\x7fELF")
    os.utime(_built(root), (2000, 2000))
    assert _tool().stale(root) == []


def test_a_missing_build_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert _tool().stale(root) == ["pkg._fast: no shared object beside pkg/_fast.c"]


def test_a_build_older_than_a_source_or_a_header_it_depends_on_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _built(root).write_bytes(b"\x7fELF")
    os.utime(_built(root), (2000, 2000))
    os.utime(root / "pkg" / "_shared.h", (3000, 3000))
    (problem,) = _tool().stale(root)
    assert problem.startswith("pkg._fast: pkg/_fast") and problem.endswith(
        "is older than pkg/_shared.h")
    os.utime(root / "pkg" / "_shared.h", (1000, 1000))
    os.utime(root / "pkg" / "_fast.c", (3000, 3000))
    (problem,) = _tool().stale(root)
    assert problem.endswith("is older than pkg/_fast.c")


def test_this_trees_extensions_are_current_when_a_compiler_is_here() -> None:
    tool = _tool()
    if tool.compiler() is None:
        pytest.skip("no C compiler: the pure-Python twins run, nothing can be stale")
    assert tool.stale() == []
