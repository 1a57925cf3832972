"""The public API as docs/guide/api.md names it: every documented import works in a fresh
interpreter, without a DeprecationWarning of the library's; a moved name (its "Deprecated
names" table) still imports, warns naming its new place, and is the same object; every
documented command exists and each subcommand answers `--help`; the provider's information passes
Airflow's own schema, and its version has its changelog section."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from exactly_once import __version__
from exactly_once.orchestration.provider import get_provider_info
from exactly_once_stack.settings import ROOT

PAGE = (ROOT / "docs" / "guide" / "api.md").read_text()


LIBRARY_ON_PATH = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}


def fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=LIBRARY_ON_PATH)


def test_every_documented_import_works_without_a_deprecation_warning_of_the_library():
    [block] = re.findall(r"<!-- public-api -->\n```python\n(.*?)```", PAGE, re.DOTALL)
    assert "checkpoint_tasks" in block and "load_config" in block
    run = fresh("import warnings\nimport airflow\n"  # Airflow's import first (above)
                "with warnings.catch_warnings(record=True) as caught:\n    warnings.simplefilter('always')\n"
                + "".join(f"    {line}\n" for line in block.strip().splitlines())
                + "print([str(w.message) for w in caught if 'exactly_once' in str(w.message)])")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_a_moved_name_still_imports_the_same_object_and_warns_where_it_went():
    table = PAGE.split("## Deprecated names", 1)[1].split("##", 1)[0]
    moved = re.findall(r"^\| `([\w.]+)` \(`(\w+)`.*?\| `([\w.]+)` \|", table, re.MULTILINE)
    assert ("exactly_once.airflow_tasks", "checkpoint_tasks", "exactly_once.orchestration.checkpoint_tasks") in moved
    for old, name, new in moved:
        # The new module first: importing Airflow routes warnings to logging, which would
        # replace the recorder of a catch_warnings entered before.
        run = fresh("import warnings\n"
                    f"from {new} import {name} as new\n"
                    "with warnings.catch_warnings(record=True) as caught:\n"
                    "    warnings.simplefilter('always')\n"
                    f"    from {old} import {name} as old\n"
                    "print(old is new)\n"
                    "print([(w.category.__name__, str(w.message), w.filename) for w in caught])")
        assert run.returncode == 0, run.stderr[-3000:]
        same, warned = run.stdout.strip().splitlines()[-2:]
        assert same == "True"
        assert "'DeprecationWarning'" in warned and new in warned and "'<string>')" in warned  # blamed on the importer


def test_every_documented_command_exists_and_each_subcommand_answers_help():
    commands = sorted(set(re.findall(r"^\| `python -m ([\w.]+)[ `]", PAGE, re.MULTILINE)))
    assert commands == ["exactly_once", "exactly_once.ledger.migrate", "exactly_once.operate.stalls",
                        "exactly_once.operate.status"]
    for module in commands:
        assert importlib.util.find_spec(module) is not None, module
    for subcommand in re.findall(r"^\| `python -m exactly_once (\w+)", PAGE, re.MULTILINE):
        run = subprocess.run([sys.executable, "-m", "exactly_once", subcommand, "--help"], capture_output=True,
                             text=True, timeout=120, cwd=ROOT, env=LIBRARY_ON_PATH)
        assert run.returncode == 0, (subcommand, run.stderr[-2000:])


def test_the_provider_information_is_what_airflow_validates_it_against_and_the_version_has_its_changelog():
    import json

    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert f"## {__version__} " in (ROOT / "CHANGELOG.md").read_text()
