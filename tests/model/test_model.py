"""The ledger's model (model/*.pml) agrees with the code, and spin proves it.

The agreement is read from the files, so a change to one that forgets the other fails:
the table of transitions (model/transitions.tsv) against the model's TRANSITION,
ATTEMPT_TRANSITION and end_attempts steps, against the package's sql/ledger.sql statements (and
sql/retention.sql's, which inserts the retention base), the
enums of the package's sql/migrations and of exactly_once.ledger.checkpoints, and the Python callers of
end_attempts; the fault points of the code against the model's "fault:" marks. Then spin
checks the default configurations (`./dev prove`; tests/model/prove.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exactly_once.ledger.checkpoints import AttemptState, State
from exactly_once.sqlfiles import SQL_DIR, named
from tests.model import prove

ROOT = Path(__file__).resolve().parents[2]
OWN_MODELS = ("publisher.pml", "upgrade.pml")  # models of their own, beside the ledger's
MODEL = "\n".join(p.read_text() for p in sorted((ROOT / "model").glob("*.pml"))
                  if p.name not in OWN_MODELS)  # ledger.pml and its includes
PUBLISHER = (ROOT / "model" / "publisher.pml").read_text()
LIBRARY = ROOT / "plugins" / "exactly_once"
Transition = tuple[str, str, frozenset[str], str]  # of, statement, from states, to


def table() -> set[Transition]:
    rows = set()
    for line in (ROOT / "model" / "transitions.tsv").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            of, statement, sources, to = line.split("\t")
            rows.add((of, statement, frozenset(sources.split()), to))
    return rows


def calls(name: str, text: str) -> list[list[str]]:
    """The arguments of each call of the macro or inline `name` (top-level commas split them)."""
    found = []
    for match in re.finditer(rf"\b{name}\(", text):
        depth, arguments, current = 1, [], ""
        for ch in text[match.end():]:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0 or (ch == "," and depth == 1):
                arguments.append(current.strip())
                current = ""
                if depth == 0:
                    break
                continue
            current += ch
        found.append(arguments)
    return found


def model_states() -> set[str]:
    return set(re.search(r"mtype = \{([^}]*)\}", MODEL).group(1).replace(" ", "").split(",")) - {"none"}


def model_transitions() -> set[Transition]:
    states = model_states() | {"none"}
    found = set()
    for statement, _, source, to in calls("TRANSITION", MODEL):
        if statement != "stmt":  # the macro's own definition
            found.add(("checkpoint", statement, frozenset(re.findall(r"\w+", source)) & states, to))
    for statement, _, _, source, to in calls("ATTEMPT_TRANSITION", MODEL):
        if source in states:
            found.add(("attempt", statement, frozenset([source]), to))
    for _, _, source, to in calls("end_attempts", MODEL):
        if source in states:
            found.add(("attempt", "end_attempts", frozenset([source]), to))
    return found


def enum_values(type_name: str) -> set[str]:
    text = "\n".join(p.read_text() for p in sorted((SQL_DIR / "migrations").glob("*.sql")))
    created = re.search(rf"CREATE TYPE exactly_once\.{type_name} AS ENUM \(([^)]*)\)", text).group(1)
    added = re.findall(rf"ALTER TYPE exactly_once\.{type_name} ADD VALUE IF NOT EXISTS '(\w+)'", text)
    return set(re.findall(r"'(\w+)'", created)) | set(added)


def test_the_model_has_the_states_of_the_ledger_and_of_the_code():
    assert model_states() == enum_values("checkpoint_state") == {s.value for s in State}
    attempt_states = {to for of, _, _, to in table() if of == "attempt"}
    assert attempt_states == enum_values("attempt_state") == {s.value for s in AttemptState}


def test_the_model_makes_exactly_the_transitions_of_the_table():
    assert model_transitions() == table()


def statements_of_the_ledger() -> dict[str, str]:
    """sql/ledger.sql's statements, and retention's (its base checkpoint is inserted committed)."""
    statements, retention = named("ledger.sql"), named("retention.sql")
    assert not set(statements) & set(retention), "a statement named in both files"
    return {**statements, **retention}


def test_every_statement_that_changes_a_state_is_in_the_table():
    statements = statements_of_the_ledger()
    listed = {statement for _, statement, _, _ in table()}
    assert listed <= set(statements), f"not in sql/ledger.sql or sql/retention.sql: {listed - set(statements)}"
    writers = {name for name, text in statements.items()
               if re.search(r"UPDATE exactly_once\.(checkpoints|attempts)\s+SET\s+((?!WHERE).)*\bstate\s*=", text, re.S)
               or re.search(r"INSERT INTO exactly_once\.(checkpoints|attempts)\b", text)}
    assert writers == listed


def test_each_statement_writes_the_state_the_table_says():
    statements = statements_of_the_ledger()
    for of, statement, _, to in table():
        literal = set(re.findall(r"state = '(\w+)'|'(\w+)'::exactly_once\.checkpoint_state", statements[statement]))
        literal = {a or b for a, b in literal}
        if literal:
            assert to in literal, f"{statement} writes {literal}, the table says {to}"
    protocol = (LIBRARY / "ledger" / "protocol.py").read_text()
    assert "State.COMMITTED if all(p.size == 0 for p in plans) else State.PLANNED" in protocol  # insert_checkpoint
    assert "'committed'" in statements["base"]  # the retention base: inserted committed
    migration = (SQL_DIR / "migrations" / "0001_ledger.sql").read_text()
    assert re.search(r"state\s+exactly_once\.attempt_state NOT NULL DEFAULT 'running'", migration)  # insert_attempt


def test_the_python_callers_of_end_attempts_make_the_attempt_transitions_of_the_table():
    code = "\n".join(p.read_text() for p in LIBRARY.rglob("*.py"))
    made = set(re.findall(r"end_attempts\([^)]*?AttemptState\.(\w+),\s*AttemptState\.(\w+)", code))
    assert {(AttemptState[a].value, AttemptState[b].value) for a, b in made} == {
        (next(iter(source)), to) for of, statement, source, to in table() if statement == "end_attempts"}


def fault_points(code: str) -> set[str]:
    points = set(re.findall(r"(?:faults\.point|\bfault)\(f?\"([\w.{}]+)\"\)", code))
    return {re.sub(r"\{[^}]*\}", "*", p) for p in points}


def test_every_fault_point_of_the_code_is_a_crash_point_of_the_model():
    # The publisher of kafka sinks acts after the commit, outside the ledger's protocol: its
    # fault points (the fault matrix's rows t to x, tests/faults/publishing.py) are the
    # publisher's model's.
    code = "\n".join(p.read_text() for p in LIBRARY.rglob("*.py") if "publishing" not in p.parts)
    assert fault_points(code) == set(re.findall(r"/\* fault: ([\w.*]+)", MODEL))
    publishing = "\n".join(p.read_text() for p in (LIBRARY / "publishing").rglob("*.py"))
    assert fault_points(publishing) == set(re.findall(r"/\* fault: ([\w.*]+)", PUBLISHER))


# CI's slice leaves out the reprocessing, which prune's covers beside retention (./dev test -m heavy, ./dev prove).
HEAVY = {"reprocessing"}
assert HEAVY <= {c.name for c in prove.CONFIGURATIONS}


@pytest.mark.parametrize("configuration", [pytest.param(c, marks=pytest.mark.heavy) if c.name in HEAVY else c
                                           for c in prove.CONFIGURATIONS if not c.full_only], ids=lambda c: c.name)
def test_spin_proves_the_model(configuration, tmp_path):
    result = prove.check(configuration, tmp_path)
    if configuration.finding:  # a defect of the code spin shows: once fixed, the configuration changes with it
        assert result.errors > 0, f"{configuration.name}: no longer violated; fixed? {configuration.finding}"
    else:
        assert result.errors == 0, prove.trail(configuration, tmp_path)[-20000:]
    assert result.states > configuration.min_states  # the processes ran: a model that blocks at once proves nothing
