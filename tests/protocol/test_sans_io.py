"""pipeline/protocol stays sans-I/O: no module under it imports I/O or clocks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROTOCOL = Path(__file__).resolve().parents[2] / "pipeline" / "protocol"
FORBIDDEN = {"trio", "socket", "time", "asyncio", "threading", "selectors", "anyio", "ssl"}
FILES = sorted(PROTOCOL.rglob("*.py"))


def test_files_found() -> None:
    names = {p.name for p in FILES}
    assert {"primitives.py", "codec.py", "framing.py", "produce.py"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PROTOCOL)))
def test_no_io_imports(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "__import__" and node.args
              and isinstance(node.args[0], ast.Constant)):
            mods = [str(node.args[0].value)]
        else:
            continue
        bad += [f"{m} (line {node.lineno})" for m in mods if m.split(".")[0] in FORBIDDEN]
    assert not bad, f"{path.name} imports I/O modules: {bad}"
