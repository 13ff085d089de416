"""Every relative link in README.md, docs/*.md and tests/README.md reaches a file, and every
anchor (`page.md#anchor`, `#anchor`) a heading of that page, by GitHub's slug rules.
External (http, https, mailto) links are not checked. README's "your own model" example is
the example's code, line for line, and README (the front door) stays within its length."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests" / "README.md"]
EXAMPLE = ROOT / "boost_titan" / "examples" / "own_model.py"
README_LINES = 250
"""The front door's limit: the rest belongs to docs/."""
FIRST_SCREEN = 25

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")  # a fence ends a paragraph
        elif not fenced:
            lines.append(line)
    return lines


def paragraphs(text: str) -> list[str]:
    """The page's prose in blank-line separated blocks, code spans removed (a code span or
    a link's text may wrap onto the next line)."""
    return [CODE_SPAN.sub("", block) for block in "\n".join(prose_lines(text)).split("\n\n")]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (code spans, links and emphasis rendered),
    lower-cased, punctuation other than '-' and '_' dropped, each space a '-'."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """Link targets of the page's prose (not in code blocks or code spans)."""
    return [target for block in paragraphs(page.read_text()) for target in LINK.findall(block)]


def broken_links(page: Path) -> list[str]:
    """'target: why' for each relative link of `page` that reaches no file or heading."""
    broken = []
    for target in links(page):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {os.path.relpath(dest, page.parent)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading of {dest.name} has the anchor #{anchor}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_and_anchors_resolve(page):
    assert page.exists(), f"{page.relative_to(ROOT)} is missing"
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    unlinked = [p.relative_to(ROOT).as_posix() for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"README.md links none of {unlinked}"


def test_slugs_follow_github():
    assert slug("The `[boost]` section") == "the-boost-section"
    assert slug("torch.compile with TP > 1 and activation checkpointing") == (
        "torchcompile-with-tp--1-and-activation-checkpointing"
    )
    assert slug("Forward overlap (`overlap_chunks`)") == "forward-overlap-overlap_chunks"
    assert slug("Precision: a job's TOML, fp32, bf16 and float8") == (
        "precision-a-jobs-toml-fp32-bf16-and-float8"
    )
    assert slug("`losses.jsonl` after a restart") == "lossesjsonl-after-a-restart"


def test_the_checker_finds_a_missing_file_and_a_wrong_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    good = "[x](a.md) [y](a.md#top) [z](a.md#same-1) [w](#here) [u](https://x.invalid/#nope)"
    bad = "[m](gone.md) [n](a.md#not-a-heading) [o](#nowhere) `[p](in-code.md)`"
    wrapped = "[wrapped\ntext](a.md#gone) `code\n[r](wrapped-code.md)`"
    page.write_text(f"## Here\n\n{good}\n{bad}\n{wrapped}\n\n```\n[q](fenced.md)\n```\n")
    assert broken_links(page) == [
        "gone.md: no file gone.md",
        "a.md#not-a-heading: no heading of a.md has the anchor #not-a-heading",
        "#nowhere: no heading of b.md has the anchor #nowhere",
        "a.md#gone: no heading of a.md has the anchor #gone",
    ]


def python_block(page: Path, first_line: str) -> list[str]:
    """The stripped lines of the page's ```python block that starts with `first_line`."""
    for block in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M):
        if block.startswith(first_line):
            return [line.strip() for line in block.splitlines() if line.strip()]
    raise AssertionError(f"{page.name} has no python block starting {first_line!r}")


def _shows(shown: str, code: str) -> bool:
    """`shown` is the code line, or imports some of the names the code line imports."""
    if shown == code:
        return True
    shown_from, _, shown_names = shown.partition(" import ")
    code_from, _, code_names = code.partition(" import ")
    names = {n.strip() for n in code_names.split(",")}
    return (
        shown.startswith("from ")
        and shown_from == code_from
        and ({n.strip() for n in shown_names.split(",")} <= names)
    )


@pytest.mark.parametrize("page", ["README.md", "docs/your_model.md"])
def test_the_example_shown_is_the_example_code(page):
    """Every line of the page's `ModelLayout` example is a line of
    boost_titan/examples/own_model.py, in the same order."""
    shown = python_block(ROOT / page, "from boost_titan.parallelize import")
    code = [line.strip() for line in EXAMPLE.read_text().splitlines()]
    missing, at = [], 0
    for line in shown:
        found = next((i for i in range(at, len(code)) if _shows(line, code[i])), None)
        if found is None:
            missing.append(line)
        else:
            at = found + 1
    assert not missing, f"{page} shows lines not in {EXAMPLE.name} (in order): {missing}"


def test_readme_is_a_front_door():
    """README.md holds at most README_LINES lines, and its first screen's code block is
    exactly the two set-up commands (train, test)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; move text to docs/"
    start = lines.index("```bash")
    block = lines[start + 1 : lines.index("```", start)]
    assert start < FIRST_SCREEN
    assert [line.split("#")[0].strip() for line in block] == ["./run_train.sh", "./run_tests.sh"]
