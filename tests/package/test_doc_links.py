"""References to the docs lead somewhere true.

Code comments, docstrings and the docs themselves point into docs/ in three ways:

* a path, ``docs/streaming.md``: the file must exist;
* a path or link followed by a quoted section name, ``docs/benchmarks.md, "The disk
  bound"``, or inside docs/ ``speculative.md, "Session 30"`` and
  ``[speculative.md](speculative.md), "Session 30"``: some heading of that file must start
  with the name (headings are often longer than the name quoted);
* a Markdown link with an anchor, ``[x](benchmarks.md#mtp-cost-model)`` or ``[x](#io)``
  within a page: the anchor must be the GitHub slug of one of the file's headings.

Pages move and headings get renamed; this keeps every such pointer honest.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Where references are written; benchmarks/results holds generated JSON only.
SCAN = ("README.md", "docs", "python", "csrc", "benchmarks", "tests", "scripts")
SKIP_DIRS = {"results", "__pycache__", "_core"}
SUFFIXES = {".md", ".py", ".pyi", ".hpp", ".cpp", ".h", ".txt", ".toml", ".sh", ".cmake"}

# docs/NAME.md anywhere; inside docs/ a Markdown link to NAME.md, NAME.md#anchor or #anchor.
DOC_PATH = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md)")
MD_LINK = re.compile(r"\]\((?:([\w-]+\.md)(?:#([\w-]+))?|#([\w-]+))\)")
# A reference followed by a quoted section: `docs/X.md, "S"`, `docs/X.md ("S")`, and in
# docs/ `[X.md](X.md#a), "S"` or `X.md, "S"`. The parts may wrap onto the next line of a
# comment; a comma or a parenthesis must come between them (not a string's own quote).
GAP = r"(?:\s|\n\s*(?:#|//|\*)?)*"
SECTION_REF = re.compile(
    r"(?:(?<![\w/.-])docs/([\w-]+\.md)|\]\(([\w-]+\.md)(?:#[\w-]+)?\)|(?<![\w/.\[-])([\w-]+\.md))"
    rf"\)?(?:,{GAP}\(?|{GAP}\()\"([^\"]{{1,120}})\""
)
WRAP = re.compile(r"\s*\n\s*(?:#|//|\*)?\s*")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCAN:
        top = ROOT / name
        if top.is_file():
            out.append(top)
            continue
        for path in sorted(top.rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            if path == Path(__file__).resolve():
                continue  # its docstring shows the forms with made-up names
            if not SKIP_DIRS.intersection(path.relative_to(ROOT).parts):
                out.append(path)
    return out


def _headings(doc: Path) -> list[str]:
    """The file's headings as text, outside fenced code blocks."""
    heads, fenced = [], False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            heads.append(m.group(1))
    return heads


def _plain(text: str) -> str:
    """Heading text as read: no backticks or emphasis, one space between words."""
    return " ".join(re.sub(r"[`*]", "", text).split())


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", _plain(heading).lower())
    return text.replace(" ", "-")


def _anchors(headings: list[str]) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings:
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _references() -> list[tuple[str, str, Path, str]]:
    """(where, kind, referenced file, section or anchor) for every reference found."""
    refs = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        in_docs = rel.startswith("docs/")
        for lineno, line in enumerate(text.splitlines(), 1):
            where = f"{rel}:{lineno}"
            for m in DOC_PATH.finditer(line):
                refs.append((where, "file", DOCS / m.group(1), ""))
            if in_docs:
                for m in MD_LINK.finditer(line):
                    if m.group(3):  # an anchor in the same page
                        refs.append((where, "anchor", path, m.group(3)))
                        continue
                    refs.append((where, "file", DOCS / m.group(1), ""))
                    if m.group(2):
                        refs.append((where, "anchor", DOCS / m.group(1), m.group(2)))
        for m in SECTION_REF.finditer(text):
            if not (in_docs or m.group(1)):
                continue  # outside docs/ only docs/NAME.md is surely a doc
            target = DOCS / (m.group(1) or m.group(2) or m.group(3))
            where = f"{rel}:{text.count(chr(10), 0, m.start()) + 1}"
            section = " ".join(WRAP.sub(" ", m.group(4)).split())
            refs.append((where, "section", target, section))
    return refs


REFS = _references()


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_references_are_found() -> None:
    kinds = {kind for _, kind, _, _ in REFS}
    assert {"file", "section", "anchor"} <= kinds, kinds


def test_every_referenced_doc_exists() -> None:
    missing = sorted({f"{where}: {_rel(doc)}" for where, _, doc, _ in REFS if not doc.is_file()})
    assert not missing, "references to missing files:\n" + "\n".join(missing)


@pytest.mark.parametrize("kind", ["section", "anchor"])
def test_every_referenced_section_exists(kind: str) -> None:
    heads: dict[Path, list[str]] = {}
    bad = []
    for where, k, doc, detail in REFS:
        if k != kind or not doc.is_file():
            continue
        names = heads.setdefault(doc, _headings(doc))
        if kind == "section":
            ok = any(_plain(h).startswith(_plain(detail)) for h in names)
        else:
            ok = detail in _anchors(names)
        if not ok:
            bad.append(f'{where}: {_rel(doc)}, "{detail}"')
    assert not bad, f"{kind} references that name no heading:\n" + "\n".join(bad)
