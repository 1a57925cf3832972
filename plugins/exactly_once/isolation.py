"""Record isolation: when writing a checkpoint's rows fails because of what some record
holds — a transform that raises on it, a value of a type the row checks do not know, a
CHECK constraint, a trigger, a foreign key of a final table — find those records by
bisection over the checkpoint's offsets, so that they go to the dead letters with the
error's own message and the rest commits (promise 8).

Which failures a record can cause is told by their SQLSTATE class, PostgreSQL's and
Spark's alike: 22 data exception, 23 integrity constraint violation, 38 external
routine exception (a Python UDF raised), P0 raise_exception (PL/pgSQL's RAISE, Spark's
raise_error). Anything else (a lost connection, a killed executor) is not narrowed: a
bisection over an outage would dead-letter every record. The SQLSTATE is read from the
error of whatever ran the write: psycopg2's, the JVM's through py4j (local, spark-submit),
or what a Spark Connect server sends (exactly_once.connect_errors), for which a refused
JDBC batch is asked of the database again.

The bisection itself is pure: `narrow` asks a probe about parts of the ranges.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from exactly_once.connect_errors import refused_insert, stated_sqlstate
from exactly_once.errors import Permanent
from exactly_once.planning import OffsetRange

RECORD_SQLSTATE_CLASSES = ("22", "23", "38", "P0", "54000")  # 54000: a key too large for its index
# Python errors of the environment, not of a record, though a UDF raised them (class 38).
ENVIRONMENT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "MemoryError", "OSError", "ConnectionError",
                                "ConnectionRefusedError", "ConnectionResetError", "BrokenPipeError", "TimeoutError",
                                "PermissionError", "FileNotFoundError", "EOFError"})
# Spark error classes of the environment whose SQLSTATE is in a record's classes.
ENVIRONMENT_SPARK_ERRORS = ("[KAFKA_DATA_LOSS",)
# Beyond these, the cause is not in a few records (a wrong table, a transform failing on
# every record): the attempt fails naming the first ones, and the checkpoint stalls.
MAX_ISOLATED = 20
MAX_PROBES = 400

Probe = Callable[[Sequence[OffsetRange]], "str | None"]  # why the records of these ranges fail, or None
# The database's error for a statement run again (and rolled back), or None if it passes now.
Ask = Callable[[str], "BaseException | None"]


class NotIsolated(Permanent):
    """A failure no set of single records reproduces, or too many records fail."""


def record_failure(error: BaseException, ask: Ask | None = None) -> tuple[str, str] | None:
    """(SQLSTATE, message) of an error a record can cause; None for any other error. `ask`
    runs on the database the statement of a JDBC batch a Spark Connect error says was
    refused; without it, such an error is no record's."""
    state, message = _sqlstate(error, ask)
    if state is None or not state.startswith(RECORD_SQLSTATE_CLASSES):
        return None
    return state, message


def raised_by_user_code(state: str) -> bool:
    """Whether the SQLSTATE says a Python function (the transform's UDF) raised."""
    return state.startswith("38")


def _sqlstate(error: BaseException, ask: Ask | None = None) -> tuple[str | None, str]:
    diag = getattr(error, "diag", None)  # psycopg2
    if diag is not None:
        return getattr(error, "pgcode", None), (diag.message_primary or str(error)).strip()
    java = getattr(error, "java_exception", None)  # py4j: the JDBC driver's exception is a cause
    while java is not None:
        state = _call(java, "getSQLState")
        if state:
            server = _call(java, "getNextException") or java  # a batch's own error is its next exception
            return state, _server_message(str(_call(server, "getMessage") or ""))
        java = _call(java, "getCause")
    statement = refused_insert(str(error)) if ask is not None else None
    if statement is not None:  # Spark Connect: pgjdbc's SQLSTATE stayed on the executor
        answer = ask(statement)
        return _sqlstate(answer) if answer is not None else (None, str(error))
    # pyspark's exceptions (the transform, Spark SQL); Connect's PythonException keeps its
    # SQLSTATE only at the end of its message
    text, stated = stated_sqlstate(str(error))
    state = _call(error, "getSqlState") or stated
    if state:
        if text.startswith(ENVIRONMENT_SPARK_ERRORS):
            return None, text
        if raised_by_user_code(state):  # a Python traceback: its last line is the exception raised
            text = text.splitlines()[-1]
            if text.split(":", 1)[0].rsplit(".", 1)[-1] in ENVIRONMENT_ERRORS:
                return None, text
        return state, re.sub(r"\s*SQLSTATE: \w+.*", "", text.splitlines()[0], flags=re.S)
    return None, str(error)


def _call(obj, method: str):
    try:
        return getattr(obj, method)()
    except Exception:  # not that kind of exception (py4j raises for a missing method)
        return None


def _server_message(text: str) -> str:
    """PostgreSQL's own message from pgjdbc's text ("ERROR: …  Detail: …  Where: …")."""
    found = re.search(r"ERROR: (.*?)(?:\n|\s{2}(?:Detail|Hint|Where|Position|Call getNextException)|$)", text)
    return found.group(1).strip() if found else text.strip().splitlines()[0]


def size(ranges: Sequence[OffsetRange]) -> int:
    return sum(r.size for r in ranges)


def halves(ranges: Sequence[OffsetRange]) -> tuple[list[OffsetRange], list[OffsetRange]]:
    """The offsets split into two parts of (nearly) equal count, ranges kept in order."""
    wanted, first, second = size(ranges) // 2, [], []
    for r in ranges:
        taken = size(first)
        if taken >= wanted:
            second.append(r)
        elif taken + r.size <= wanted:
            first.append(r)
        else:
            cut = r.start + wanted - taken
            first.append(OffsetRange(r.topic, r.partition, r.start, cut))
            second.append(OffsetRange(r.topic, r.partition, cut, r.end))
    return first, second


def narrow(failing: Sequence[OffsetRange], probe: Probe, max_isolated: int = MAX_ISOLATED,
           max_probes: int = MAX_PROBES) -> dict[OffsetRange, str]:
    """The single offsets (one-offset ranges) whose records fail on their own, with why,
    found by bisecting `failing` (known to fail as a whole). Each record's probe is on its
    own, so a failure that needs two records together (two rows of one checkpoint breaking
    a unique constraint) finds none of them: the caller says so. `NotIsolated` beyond the limits."""
    found: dict[OffsetRange, str] = {}
    probes = 0

    def visit(part: list[OffsetRange]) -> None:
        nonlocal probes
        for half in halves(part):
            half = [r for r in half if r.size]
            if not half:
                continue
            probes += 1
            if probes > max_probes:
                raise NotIsolated(f"records not isolated within {max_probes} probes; found so far: "
                                  + describe(found))
            why = probe(half)
            if why is None:
                continue
            if size(half) > 1:
                visit(half)
                continue
            found[half[0]] = why
            if len(found) > max_isolated:
                raise NotIsolated(f"more than {max_isolated} records fail on their own, so the cause is not in a "
                                  "few records: " + describe(found))

    visit([r for r in failing if r.size])
    return found


def describe(found: dict[OffsetRange, str], limit: int = 5) -> str:
    shown = "; ".join(f"{r.topic}[{r.partition}]@{r.start}: {why}" for r, why in list(found.items())[:limit])
    return shown + (f" (and {len(found) - limit} more)" if len(found) > limit else "")
