"""What a failure reported by a Spark Connect server tells record isolation
(exactly_once.spark.isolation). Its client holds no JVM exception to ask, as py4j's
`java_exception` is on local or spark-submit runs: only what the server sends, the error
class and SQLSTATE, the message, and the cause chain as class names and messages
(`spark.sql.connect.enrichError.enabled`, on by default). Two failures a record causes
arrive without their SQLSTATE:

- a Python UDF that raised: pyspark makes the server's PYTHON_EXCEPTION a PythonException
  and drops its SQLSTATE, but the message still ends with Spark's "SQLSTATE: 38000";
- PostgreSQL refusing a batch of Spark's JDBC writer: pgjdbc's message leaves out the
  SQLSTATE, which only its exception object holds, on the executor. The message does hold
  the refused statement, values and all ("Batch entry N INSERT … was aborted: ERROR: …"),
  so the database can be asked again what it refuses in it.
"""

from __future__ import annotations

import re

_STATED = re.compile(r"\sSQLSTATE: (\w{5})$")
# pgjdbc's text of a batch entry (BatchResultHandler.handleError) of Spark's JDBC writer: an
# INSERT whose every value is NULL or a quoted literal with pgjdbc's cast, bare or in
# parentheses. Nothing outside this shape is taken, so what the database is asked is that
# one INSERT, never other SQL; and the shape parses one way only, so a message that does
# not fit it fails to match at once.
_CAST = r"::[a-z][a-z0-9_]*(?: (?:with|without|time|zone|precision|varying))*(?:\[\])?"
_LITERAL = rf"(?:NULL|'[^']*(?:''[^']*)*'(?:{_CAST})?)"
_VALUE = rf"(?:\({_LITERAL}\)|{_LITERAL})"
_ROW = rf"\({_VALUE}(?:,{_VALUE})*\)"
_REFUSED_ENTRY = re.compile(rf'java\.sql\.BatchUpdateException: Batch entry \d+ (INSERT INTO [\w.]+ '
                            rf'\("[^"]+"(?:,"[^"]+")*\) VALUES {_ROW}(?:,{_ROW})*) was aborted: ')


def stated_sqlstate(message: str) -> tuple[str, str | None]:
    """A Spark error's message without the SQLSTATE it ends with, and that SQLSTATE (None
    if it ends with none)."""
    message = message.strip()
    found = _STATED.search(message)
    return (message[:found.start()].rstrip(), found.group(1)) if found else (message, None)


def refused_insert(message: str) -> str | None:
    """The INSERT of a batch PostgreSQL refused to Spark's JDBC writer, from the failure's
    message (its cause chain), or None if it names no such INSERT."""
    found = _REFUSED_ENTRY.search(message)
    return found.group(1) if found else None
