"""The markdown the docs tests read: fenced code blocks with their example markers, and links.

A fenced block whose language is Python (``python``, ``py``) or a shell (``sh``, ``bash``,
``shell``, ``console``) is an *example*: the suite runs it (tests/docs/test_examples.py).
An HTML comment on the line right above the fence says how::

    <!-- example: skip (why it must not run) -->    never run; the reason is required
    <!-- example: kafka -->                         needs Apache Kafka (java): runs in the
                                                    ``kafka`` tests, on the session's 1-node
                                                    cluster, or starts its own
    <!-- example: spark -->                         needs PySpark and java: runs in the
                                                    ``spark`` tests

Unmarked examples run against an embedded tansu broker. In every example the address
``127.0.0.1:9092`` (or ``localhost:9092``) is replaced by the address of the broker the
test runs it against, so the docs show the usual address and still run. The examples of one
file run in document order, in one scratch directory, so a block may use what an earlier
block of its file made (a topic, a file). In a ``console`` block only the lines starting
with ``$ `` run (the rest is output).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PYTHON = frozenset({"python", "py"})
SHELL = frozenset({"sh", "bash", "shell", "console"})
KINDS = ("broker", "kafka", "spark", "skip")

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<body>.*?)\s*-->\s*$")
_MARKER_BODY = re.compile(r"^(?P<kind>skip|kafka|spark)(?:\s*\((?P<reason>[^)]*)\))?$")


class MarkerError(ValueError):
    """An ``<!-- example: ... -->`` comment that is not one of the forms above."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    kind: str  # "broker" (unmarked), "kafka", "spark" or "skip"
    reason: str = ""

    @property
    def is_example(self) -> bool:
        return self.lang in PYTHON or self.lang in SHELL

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_marker(line: str, where: str) -> tuple[str, str] | None:
    """``(kind, reason)`` of an example marker line, None for any other line."""
    m = _MARKER.match(line)
    if m is None:
        return None
    body = _MARKER_BODY.match(m.group("body"))
    if body is None:
        raise MarkerError(
            f"{where}: unknown example marker {line.strip()!r}; use "
            "'<!-- example: skip (reason) -->', '<!-- example: kafka -->' or "
            "'<!-- example: spark -->'")
    kind, reason = body.group("kind"), (body.group("reason") or "").strip()
    if kind == "skip" and not reason:
        raise MarkerError(f"{where}: 'example: skip' needs a reason in parentheses")
    return kind, reason


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` with the marker above it (a marker with no fenced
    block right below it is an error, so a marker cannot silently drift off its block)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    pending: tuple[str, str, int] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        rel = f"{path.relative_to(ROOT)}:{i + 1}"
        marker = parse_marker(line, rel)
        if marker is not None:
            pending = (marker[0], marker[1], i + 1)
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if pending is not None and line.strip():
                raise MarkerError(f"{path.relative_to(ROOT)}:{pending[2]}: an example marker "
                                  "must be the line right above a fenced block")
            i += 1
            continue
        if pending is not None and pending[2] != i:
            raise MarkerError(f"{path.relative_to(ROOT)}:{pending[2]}: an example marker "
                              "must be the line right above its fenced block")
        indent, mark = len(fence.group("indent")), fence.group("fence")
        lang = fence.group("info").strip().split(" ")[0].lower() if fence.group("info") else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(mark)
                                       and set(lines[j].strip()) == {mark[0]}):
            body.append(lines[j][indent:] if not lines[j][:indent].strip() else lines[j])
            j += 1
        if j == len(lines):
            raise MarkerError(f"{rel}: fenced block never closed")
        kind, reason = (pending[0], pending[1]) if pending else ("broker", "")
        out.append(Block(path, i + 1, lang, "\n".join(body) + "\n", kind, reason))
        pending = None
        i = j + 1
    if pending is not None:
        raise MarkerError(f"{path.relative_to(ROOT)}:{pending[2]}: example marker at the end "
                          "of the file, with no block below it")
    return out


def markdown_files() -> list[Path]:
    """Every markdown file of the repository (not the virtualenv, caches or build output)."""
    skip = {".venv", ".git", ".mutants", "build", "dist", ".pytest_cache", ".mypy_cache",
            ".ruff_cache", ".hypothesis", "node_modules", ".demo"}
    found = []
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts
        if any(part in skip or part.endswith(".egg-info") for part in parts):
            continue
        found.append(path)
    return found


def documentation_files() -> list[Path]:
    """The files whose examples run: README.md and the other top-level *.md, docs/*.md."""
    return sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")])


# ----------------------------------------------------------------------------- links

_INLINE_LINK = re.compile(r"(?<!\\)!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def links(path: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every inline link, image and reference definition outside
    fenced blocks and code spans."""
    out: list[tuple[int, str]] = []
    in_fence: str | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = _FENCE.match(line)
        if fence is not None:
            mark = fence.group("fence")
            if in_fence is None:
                in_fence = mark[0] * 3
            elif line.strip().startswith(in_fence):
                in_fence = None
            continue
        if in_fence is not None:
            continue
        text = _CODE_SPAN.sub("", line)
        out.extend((number, m.group(1)) for m in _INLINE_LINK.finditer(text))
        ref = _REFERENCE_DEF.match(text)
        if ref is not None:
            out.append((number, ref.group(1)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"`|\*\*|__|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for ``path``'s headings (duplicates get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_fence: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        fence = _FENCE.match(line)
        if fence is not None:
            in_fence = None if in_fence is not None else fence.group("fence")[0] * 3
            continue
        if in_fence is not None:
            continue
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m is None:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out
