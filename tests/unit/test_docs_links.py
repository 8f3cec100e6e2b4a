"""Every relative link in README.md and the docs' pages points at a file or folder of the
repository, or at a page the docs hook generates (docs/hooks/reference.py), and every #anchor at a
heading of the page it names (GitHub's heading ids)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)]


def generated_pages() -> set[Path]:
    """The pages the hook makes at build time (its GENERATED table), read without importing it."""
    tree = ast.parse((DOCS / "hooks/reference.py").read_text())
    table = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "GENERATED")
    return {DOCS / k.value for k in table.keys}


GENERATED = generated_pages()
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """Link targets outside fenced and indented code blocks."""
    out, fenced, prev_blank, indented = [], False, True, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        indented = line.startswith("    ") and (prev_blank or indented)
        if not (fenced or indented):
            out += LINK.findall(line)
        prev_blank = not line.strip()
    return out


def anchors(page: Path) -> set[str]:
    """GitHub's ids for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    ids = set()
    for line in page.read_text().splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            ids.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return ids


def test_pages_exist_and_link_to_each_other():
    assert (DOCS / "index.md").is_file()
    listed = set(links((DOCS / "index.md").read_text()))
    pages = {p.relative_to(DOCS).as_posix() for p in [*PAGES[1:], *GENERATED]} - {"index.md"}
    assert {"reference/cli.md", "reference/config.md", "reference/results.md", "reference/metrics.md"} <= pages
    assert pages <= listed


def broken(page: Path) -> list[str]:
    out = []
    for target in links(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if dest in GENERATED and not anchor:
            continue
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading #{anchor}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    assert broken(page) == []


def test_a_broken_link_is_caught(tmp_path):
    (tmp_path / "there.md").write_text("# A `code` heading, with punctuation\n")
    page = tmp_path / "p.md"
    page.write_text("# Top\n\n[a](missing.md) [b](#top) [c](#nowhere) [d](there.md#a-code-heading-with-punctuation)\n"
                    "[e](there.md#gone) [f](https://example.com/x)\n\n    [g](in-code.md)\n")
    assert broken(page) == ["missing.md: no such file", "#nowhere: no heading #nowhere", "there.md#gone: no heading #gone"]
