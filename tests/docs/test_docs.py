"""The documentation (docs/, mkdocs.yml, README.md) holds together, without any service:
the site builds with `mkdocs build --strict` (a page missing from the nav, a broken link or
anchor fails it), and every file and command the pages name exists, so a module or a test
that moves takes its docs with it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.rglob("*.md"))

# A path of the project in backticks: the library, its SQL, the jobs, DAGs, tests and deployment.
PROJECT_PATH = re.compile(r"`((?:plugins|sql|jobs|jvm|dags|tests|deploy|exactly_once_stack)/[\w./-]*)`")
# A library module in a layer's folder, as the layout's tables name them (`ledger/protocol.py`).
LAYER_MODULE = re.compile(r"`((?:ledger|spark|operate|orchestration)/\w+\.py)`")
COMMAND = re.compile(r"python -m (exactly_once(?:\.\w+)*)(?!\.?[<\w])")
# The files a guide writes into the reader's own project (`<!-- file: PATH -->`), and the
# project it scaffolds there, exist only there.
WRITTEN = re.compile(r"<!-- file: (\S+) -->")
SCRATCH = ("page_views", "YOUR_DAG")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def named_paths(text: str) -> set[str]:
    written = set(WRITTEN.findall(text))
    paths = {p for p in PROJECT_PATH.findall(text) if not any(c in p for c in "<*…")}
    paths |= {f"plugins/exactly_once/{m}" for m in LAYER_MODULE.findall(text)}
    return {p for p in paths - written if not any(s in p for s in SCRATCH)}


def module_file(module: str) -> Path:
    base = ROOT / "plugins" / Path(*module.split("."))
    return base / "__main__.py" if base.is_dir() else base.with_suffix(".py")


def test_the_site_builds_strict_every_page_in_the_nav_every_link_and_anchor_found(tmp_path):
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                          "--site-dir", str(tmp_path / "site")],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "WARNING" not in run.stderr, run.stderr[-4000:]
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    assert {"index.html", "guide/your-own-pipeline/index.html", "internals/performance/index.html",
            "configuration/index.html"} <= built


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_files_and_commands_a_page_names_exist(page):
    text = page.read_text()
    missing = sorted(p for p in named_paths(text) if not (ROOT / p).exists())
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {missing}"
    commands = sorted(m for m in set(COMMAND.findall(text)) if not module_file(m).is_file())
    assert not commands, f"{page.relative_to(ROOT)} names commands without a module: {commands}"


def test_every_test_file_has_its_row_in_the_tests_page():
    page = (DOCS / "contributing" / "tests.md").read_text()
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    assert files and not [f for f in files if f"| `{f}` |" not in page]


def test_the_readme_is_short_and_its_links_lead_to_files():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert text.index("./dev demo") < text.index("./dev test") < text.index("\n## ")  # the two commands first
    links = [link.split("#", 1)[0] for link in LINK.findall(text) if "://" not in link]
    assert links and not [link for link in links if not (ROOT / link).exists()]
    assert {link for link in links if link.startswith("docs/")} >= {
        p.relative_to(ROOT).as_posix() for p in PAGES}, "every page is linked from the README"
