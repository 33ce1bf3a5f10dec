"""Every relative link in every markdown file of the repository resolves, inside it.

A link to a file must name a file or directory of the checkout; a ``#anchor`` must be a
heading of the target (GitHub's anchor rules); nothing may point outside the repository
(users have only the checkout). Absolute ``http(s)://`` and ``mailto:`` links are not
fetched. The example markers (tests/docs/markdown.py) are checked here too, so a typo in
one fails without a broker.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.docs.markdown import ROOT, MarkerError, anchors, blocks, links, markdown_files, slug

FILES = markdown_files()


def _broken(path: Path) -> list[str]:
    problems = []
    for line, target in links(path):
        where = f"{path.relative_to(ROOT)}:{line}: {target}"
        parts = urlsplit(target)
        if parts.scheme in ("http", "https", "mailto"):
            continue
        if parts.scheme or parts.netloc:
            problems.append(f"{where}: not a relative link")
            continue
        dest = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        if not dest.is_relative_to(ROOT):
            problems.append(f"{where}: points outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        if parts.fragment and dest.suffix == ".md" and parts.fragment not in anchors(dest):
            problems.append(f"{where}: no heading with anchor #{parts.fragment} in "
                            f"{dest.relative_to(ROOT)}")
    return problems


def test_there_is_markdown_to_check() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"README.md", "docs/architecture.md", "docs/testing.md"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path: Path) -> None:
    assert _broken(path) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_example_markers_are_well_formed(path: Path) -> None:
    blocks(path)  # raises MarkerError naming the line


def test_nothing_refers_to_notes_outside_the_repository() -> None:
    """The reference notes beside the checkout are not shipped: no doc, test or module
    may send a reader there."""
    outside = "../" + "shared"
    offenders = []
    for top in ("README.md", "CHANGELOG.md", "docs", "tests", "pipeline", "tools", "bench",
                "chaoslab", "demo", "Makefile", "pyproject.toml"):
        base = ROOT / top
        paths = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for p in paths:
            if p.suffix in (".so", ".png", ".pyc", ".json") or "__pycache__" in p.parts:
                continue
            if outside in p.read_text(encoding="utf-8", errors="replace"):
                offenders.append(p.relative_to(ROOT).as_posix())
    assert offenders == []


# The checker itself: each rule fails on the mistake it is for.

def test_the_checker_finds_a_missing_file_a_missing_anchor_and_an_escape() -> None:
    scratch = ROOT / "tests" / "docs" / "_scratch_links.md"
    scratch.write_text("# Title\n\n## A `code` heading, with punctuation!\n\n"
                       "[ok](#title) [ok2](#a-code-heading-with-punctuation) [ok3](markdown.py)\n"
                       "[file](nope.md) [anchor](#nope) [up](../../../etc/passwd)\n"
                       "`[in code](nope2.md)`\n\n```\n[in fence](nope3.md)\n```\n")
    try:
        problems = _broken(scratch)
    finally:
        scratch.unlink()
    assert [p.split(": ", 2)[1:] for p in problems] == [
        ["nope.md", "no such file"],
        ["#nope", "no heading with anchor #nope in tests/docs/_scratch_links.md"],
        ["../../../etc/passwd", "points outside the repository"],
    ]


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Chaos on Apache Kafka (`make chaos`)") == "chaos-on-apache-kafka-make-chaos"
    assert slug("`send()` bursts as columns") == "send-bursts-as-columns"
    assert slug("What it is, and for whom") == "what-it-is-and-for-whom"


def test_a_bad_marker_is_an_error() -> None:
    scratch = ROOT / "tests" / "docs" / "_scratch_marker.md"
    for text in ("<!-- example: skip -->\n```python\npass\n```\n",
                 "<!-- example: skipp (x) -->\n```python\npass\n```\n",
                 "<!-- example: spark -->\n\nprose\n```python\npass\n```\n"):
        scratch.write_text(text)
        try:
            with pytest.raises(MarkerError):
                blocks(scratch)
        finally:
            scratch.unlink()
