"""Whether a failure can be a record's, told by its SQLSTATE class, PostgreSQL's and
Spark's alike: 22 data exception, 23 integrity constraint violation, 38 external routine
exception (a Python UDF raised), P0 raise_exception (PL/pgSQL's RAISE, Spark's raise_error),
and 54000 (a key too large for an index). Anything else (a lost connection, a killed
executor, a permission) is not: record isolation (exactly_once.spark.isolation) must not
bisect over an outage, and a commit (exactly_once.ledger.promotion) must not send a
checkpoint back for one. The SQLSTATE is read from the error of whatever ran the
statement: psycopg2's, the JVM's through py4j (local, spark-submit), or what a Spark
Connect server sends (exactly_once.connect_errors), where the COPY staging writer states it.
"""

from __future__ import annotations

import re

from exactly_once.connect_errors import copy_refusal, stated_sqlstate

RECORD_SQLSTATE_CLASSES = ("22", "23", "38", "P0", "54000")  # 54000: a key too large for its index
# Python errors of the environment, not of a record, though a UDF raised them (class 38).
ENVIRONMENT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "MemoryError", "OSError", "ConnectionError",
                                "ConnectionRefusedError", "ConnectionResetError", "BrokenPipeError", "TimeoutError",
                                "PermissionError", "FileNotFoundError", "EOFError"})
# Spark error classes of the environment whose SQLSTATE is in a record's classes.
ENVIRONMENT_SPARK_ERRORS = ("[KAFKA_DATA_LOSS",)
# Beyond these, the cause is not in a few records (a wrong table, a transform failing on
# every record): the attempt fails naming the first ones, and the checkpoint stalls.


class DatabaseRefusal(Exception):
    """A statement's refusal that reached the caller as values (SQLSTATE, message) rather
    than as a driver's exception: what the trial promotion function returns."""

    def __init__(self, pgcode: str, message: str):
        super().__init__(message)
        self.pgcode, self.message = pgcode, message


def record_failure(error: BaseException) -> tuple[str, str] | None:
    """(SQLSTATE, message) of an error a record can cause; None for any other error."""
    state, message = _sqlstate(error)
    if state is None or not state.startswith(RECORD_SQLSTATE_CLASSES):
        return None
    return state, message


def raised_by_user_code(state: str) -> bool:
    """Whether the SQLSTATE says a Python function (the transform's UDF) raised."""
    return state.startswith("38")


def _sqlstate(error: BaseException) -> tuple[str | None, str]:
    if isinstance(error, DatabaseRefusal):
        return error.pgcode, error.message
    diag = getattr(error, "diag", None)  # psycopg2
    if diag is not None:
        return getattr(error, "pgcode", None), (diag.message_primary or str(error)).strip()
    java = getattr(error, "java_exception", None)  # py4j: the JDBC driver's exception is a cause
    while java is not None:
        state = _call(java, "getSQLState")
        if state:
            server = _call(java, "getNextException") or java  # a JDBC batch's own error is its next exception
            return state, _server_message(str(_call(server, "getMessage") or ""))
        java = _call(java, "getCause")
    rendered = str(error)  # once: a PySpark exception asks the driver's JVM for its text each time
    refused = copy_refusal(rendered)
    if refused is not None:  # Spark Connect: pgjdbc's exception stayed on the executor
        return refused
    # pyspark's exceptions (the transform, Spark SQL); Connect's PythonException keeps its
    # SQLSTATE only at the end of its message
    text, stated = stated_sqlstate(rendered)
    state = _call(error, "getSqlState") or stated
    if state:
        if text.startswith(ENVIRONMENT_SPARK_ERRORS):
            return None, text
        if raised_by_user_code(state):  # a Python traceback: its last line is the exception raised
            text = text.splitlines()[-1]
            if text.split(":", 1)[0].rsplit(".", 1)[-1] in ENVIRONMENT_ERRORS:
                return None, text
        return state, re.sub(r"\s*SQLSTATE: \w+.*", "", text.splitlines()[0], flags=re.S)
    return None, rendered


def _call(obj, method: str):
    try:
        return getattr(obj, method)()
    except Exception:  # not that kind of exception (py4j raises for a missing method)
        return None


def _server_message(text: str) -> str:
    """PostgreSQL's own message from pgjdbc's text ("ERROR: …  Detail: …  Where: …")."""
    found = re.search(r"ERROR: (.*?)(?:\n|\s{2}(?:Detail|Hint|Where|Position|Call getNextException)|$)", text)
    return found.group(1).strip() if found else text.strip().splitlines()[0]
