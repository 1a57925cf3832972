"""The user pages (docs/ but docs/contributing/ and docs/internals/) name no test file or
folder, without any service: which test proves what is the contributors' business
(docs/contributing/tests.md), and a page for users reads the same whatever the tests
are called. Files a guide writes into the reader's own project (`<!-- file: PATH -->`,
such as the guide's own unit test) are the reader's, not the project's tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FOR_CONTRIBUTORS = ("contributing", "internals")
USER_PAGES = sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] not in FOR_CONTRIBUTORS)

WRITTEN = re.compile(r"<!-- file: (\S+) -->")
TEST_NAMES = (re.compile(r"\btests/[\w./*-]*"),               # a path in the tests folder: tests/dags/test_ui.py
              re.compile(r"\btest_\w+\.py\b"),                # a test file by its name alone: test_guide.py
              re.compile(r"\btests\.(?!md\b)[a-z_][\w.]*"))  # a test module by its dotted name: tests.spark.transforms


def named_tests(text: str) -> list[str]:
    for written in WRITTEN.findall(text):
        text = text.replace(written, "")
    return sorted({m.group(0) for pattern in TEST_NAMES for m in pattern.finditer(text)})


def test_the_check_finds_test_names_and_leaves_written_files_alone():
    assert named_tests("proven by `tests/dags/test_ui.py`; see tests/ledger/ and test_guide.py, "
                       "tests.spark.transforms:prepare") == [
        "test_guide.py", "test_ui.py", "tests.spark.transforms", "tests/dags/test_ui.py", "tests/ledger/"]
    assert named_tests("<!-- file: tests/test_mine.py -->\n`pytest tests/test_mine.py`; "
                       "[Tests](contributing/tests.md); the tests. Then") == []


def test_there_are_user_pages():
    names = {p.relative_to(DOCS).as_posix() for p in USER_PAGES}
    assert {"index.md", "demo.md", "configuration.md", "guide/your-own-pipeline.md"} <= names
    assert not [n for n in names if n.startswith(FOR_CONTRIBUTORS)]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_user_page_names_no_test_file_or_folder(page):
    named = named_tests(page.read_text())
    assert not named, (f"{page.relative_to(ROOT)} names tests {named}: say what is proven without the path, "
                       "and put the file's part in docs/contributing/tests.md")
