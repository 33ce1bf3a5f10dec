"""Fail when a C extension did not build although a C compiler is here.

The extensions are ``optional = true`` in pyproject.toml so that an install without a
compiler still works (each has a pure-Python twin). The price: a compile error in an
install is only a warning, and the old ``.so`` from an earlier build stays in place and
is imported, so the code that runs is not the code in the tree. ``make venv`` runs this
after the install: with a compiler on PATH, every extension's shared object must exist
and be newer than its sources and the headers it depends on.

    python tools/check_extensions.py      # exit 1 and say which, 0 when all are current
"""

from __future__ import annotations

import importlib.machinery
import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compiler() -> str | None:
    """The C compiler setuptools would use, if one is on PATH."""
    configured = str(sysconfig.get_config_var("CC") or "").split()
    for name in [*configured[:1], "cc", "gcc", "clang"]:
        found = shutil.which(name)
        if found:
            return found
    return None


def stale(root: Path = ROOT) -> list[str]:
    """One line per extension whose shared object is missing or older than a source."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    problems = []
    for ext in config["tool"]["setuptools"]["ext-modules"]:
        base = root / Path(*ext["name"].split("."))
        built = [base.with_name(base.name + suffix)
                 for suffix in importlib.machinery.EXTENSION_SUFFIXES]
        built = [p for p in built if p.is_file()]
        inputs = [root / f for f in (*ext["sources"], *ext.get("depends", ()))]
        if not built:
            problems.append(f"{ext['name']}: no shared object beside {ext['sources'][0]}")
            continue
        newest = max(inputs, key=lambda p: p.stat().st_mtime)
        if max(p.stat().st_mtime for p in built) < newest.stat().st_mtime:
            problems.append(f"{ext['name']}: {built[0].relative_to(root)} is older than "
                            f"{newest.relative_to(root)}")
    return problems


def main() -> int:
    cc = compiler()
    if cc is None:
        print("check_extensions: no C compiler on PATH: the pure-Python twins run")
        return 0
    problems = stale()
    for line in problems:
        print(f"error: C extension did not build: {line}", file=sys.stderr)
    if problems:
        print(f"A C compiler is here ({cc}), so this is a compile error the install only "
              "warned about. See it with:\n    .venv/bin/pip install -v -e . 2>&1 | grep -B2 "
              "-A20 error:", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
