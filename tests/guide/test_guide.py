"""The guide "Your own pipeline" (docs/guide/your-own-pipeline.md), run as written: its shell
blocks are run and its file blocks (`<!-- file: PATH -->` before a block) written, in order, in
one bash session in a scratch directory, against the local stack. Then the guide's tables equal
what the topic's records say, to the row, and the status shows the run committed."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import datetime
from decimal import Decimal
from urllib.parse import urlparse

import pytest

from exactly_once.config import PipelineConfig
from exactly_once.ledger.tables import final_table
from exactly_once_demo.oracle import committed_orders
from exactly_once_stack.settings import ROOT
from tests import oracle
from tests.benchmarks.copies import Q, execute, remove
from tests.oracle import Record

GUIDE = ROOT / "docs" / "guide" / "your-own-pipeline.md"
BLOCK = re.compile(r"(?:<!-- file: (?P<path>\S+) -->\n)?```(?P<language>\w+)\n(?P<body>.*?)```", re.DOTALL)


def guide() -> str:
    """The guide's page, the whole of it: its blocks in order are the script."""
    return GUIDE.read_text()


def script(section: str) -> str:
    """The guide as one bash script: shell blocks as they are, file blocks as heredocs."""
    steps = ["set -euo pipefail"]
    for block in BLOCK.finditer(section):
        path, language, body = block["path"], block["language"], block["body"]
        if path:
            steps.append(f"mkdir -p \"$(dirname {path})\"\ncat > {path} <<'GUIDE_FILE'\n{body}GUIDE_FILE")
        elif language == "sh":
            steps.append(f"echo '+ guide block' >&2\n{body}")
    return "\n".join(steps)


def guide_config(section: str) -> PipelineConfig:
    """The guide's pipeline, from its configuration block (it imports only the library)."""
    [block] = [b for b in BLOCK.finditer(section) if (b["path"] or "").endswith("/pipeline.py")]
    found: dict = {}
    exec(block["body"], found)
    return found["CONFIG"]


def view_row(record: Record) -> dict | None:
    """The guide's parse and transform in Python: the value's fields, the page's host, the minute."""
    view = json.loads(record.value)
    ts = datetime.fromisoformat(view["ts"].replace("Z", "+00:00"))
    return {"user_id": view["user_id"], "url": view["url"], "price": Decimal(view["price"]), "ts": ts,
            "host": urlparse(view["url"]).hostname, "minute": ts.replace(second=0, microsecond=0)}


@pytest.fixture
def fresh_guide(ledger_db, kafka_servers):
    """No topic, tables or ledger rows of the guide's pipeline left from an earlier run."""
    config = guide_config(guide())
    remove(kafka_servers, ledger_db, config, schemas=[])
    for sink in config.sinks:
        execute(ledger_db, Q["drop_table"], table=final_table(sink))
    return config


@pytest.mark.heavy  # CI: scaffolding and its preflight (tests/operate/test_scaffold.py), the demo's DAG test
def test_the_guide_runs_as_written_and_its_tables_equal_the_oracle(fresh_guide, ledger_db, kafka_servers, tmp_path):
    run = subprocess.run(["bash", "-c", script(guide())], cwd=tmp_path, capture_output=True, text=True,
                         timeout=900, env={**os.environ, "CHECKOUT": str(ROOT)})
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-6000:]
    assert "wrote:\n  plugins/page_views/__init__.py\n" in run.stdout
    assert "pipeline 'page_views': ready\n" in run.stdout
    assert "1 passed" in run.stdout

    records = [Record.of(m) for m in committed_orders(kafka_servers, "page_views")]
    assert len(records) == 300
    expected = oracle.expected(fresh_guide, records, view_row)
    oracle.assert_exact(expected, oracle.actual(ledger_db, fresh_guide))
    status = run.stdout.split("\npipeline page_views\n", 1)[1]
    assert status.startswith("last committed checkpoint: ") and "(300 records, interval end " in status
    assert "open checkpoints: none" in status
