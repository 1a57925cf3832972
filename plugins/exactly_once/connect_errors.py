"""What a failure reported by a Spark Connect server tells record isolation
(exactly_once.spark.isolation). Its client holds no JVM exception to ask, as py4j's
`java_exception` is on local or spark-submit runs: only what the server sends, the error
class and SQLSTATE, the message, and the cause chain as class names and messages
(`spark.sql.connect.enrichError.enabled`, on by default). Two failures a record causes
arrive without their SQLSTATE:

- a Python UDF that raised: pyspark makes the server's PYTHON_EXCEPTION a PythonException
  and drops its SQLSTATE, but the message still ends with Spark's "SQLSTATE: 38000";
- PostgreSQL refusing a row of the COPY staging writer (jvm/): pgjdbc's exception, which holds
  the SQLSTATE, stays on the executor, so the writer states it in its own message
  ("PostgreSQL refused [binary ]COPY into <table> (SQLSTATE <state>): <message>").
"""

from __future__ import annotations

import re

_STATED = re.compile(r"\sSQLSTATE: (\w{5})$")
# The staging writer's refusal (jvm/src/main/java/exactly_once/copy/CopyWriter.java): PostgreSQL's
# SQLSTATE and primary message, on one line.
_COPY_REFUSED = re.compile(r"PostgreSQL refused (?:binary )?COPY into \S+ \(SQLSTATE (\w{5})\): ([^\n]*)")


def stated_sqlstate(message: str) -> tuple[str, str | None]:
    """A Spark error's message without the SQLSTATE it ends with, and that SQLSTATE (None
    if it ends with none)."""
    message = message.strip()
    found = _STATED.search(message)
    return (message[:found.start()].rstrip(), found.group(1)) if found else (message, None)


def copy_refusal(message: str) -> tuple[str, str] | None:
    """(SQLSTATE, PostgreSQL's message) of a row the staging writer's COPY had refused, from
    the failure's message (its cause chain), or None if it tells of no such refusal."""
    found = _COPY_REFUSED.search(message)
    return (found.group(1), found.group(2).strip()) if found else None
