"""The product's promises are stated in the docs themselves (docs/promises.md), without any
service: no page sends readers to a file they do not have, every link to a numbered promise
lands on that promise's anchor, and the glossary defines the protocol's words."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PROMISES = DOCS / "promises.md"
GLOSSARY = DOCS / "glossary.md"
PAGES = sorted(DOCS.rglob("*.md"))

# A Markdown link: its text and its target (inline links, as these pages write them).
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
# "promise 4" in a link's text: one promise, by number ("promises 1–7" names several).
ONE_PROMISE = re.compile(r"\bpromise (\d+)\b", re.IGNORECASE)
# An explicit anchor on a heading (attr_list): `## 4. Idempotent commit {#promise-4}`.
ANCHOR = re.compile(r"^#+ .*\{#([\w-]+)\}\s*$", re.MULTILINE)

GLOSSARY_TERMS = ("checkpoint", "attempt", "pre-commit", "fencing", "lease", "frontier", "contribution", "stall",
                  "dead-letter")


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", [README, *PAGES], ids=name)
def test_no_page_sends_readers_to_a_file_outside_the_project(page):
    text = page.read_text()
    assert "../shared" not in text and "DESIGN.md" not in text, \
        f"{name(page)} names ../shared or DESIGN.md: link the promises (docs/promises.md) instead"


def test_every_promise_has_its_anchor():
    anchors = ANCHOR.findall(PROMISES.read_text())
    assert [a for a in anchors if a.startswith("promise-")] == [f"promise-{n}" for n in range(1, 14)]
    assert "rules-beyond-the-promises" in anchors


@pytest.mark.parametrize("page", [README, *PAGES], ids=name)
def test_a_link_to_promise_n_lands_on_its_anchor(page):
    wrong = []
    for text, target in LINK.findall(page.read_text()):
        numbers = ONE_PROMISE.findall(text)
        if not numbers or "://" in target:
            continue
        path, _, anchor = target.partition("#")
        resolved = page if not path else Path(posixpath.normpath((page.parent / path).as_posix()))
        if resolved != PROMISES or anchor not in {f"promise-{n}" for n in numbers}:
            wrong.append(f"[{text}]({target})")
    assert not wrong, f"{name(page)}: links to a promise that do not land on promises.md#promise-N: {wrong}"


def test_the_glossary_defines_the_protocols_words():
    anchors = set(ANCHOR.findall(GLOSSARY.read_text()))
    assert not [t for t in GLOSSARY_TERMS if t not in anchors], sorted(set(GLOSSARY_TERMS) - anchors)
