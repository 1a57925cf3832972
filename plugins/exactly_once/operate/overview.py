"""What the pipelines view in Airflow's UI shows, read from the ledger (and Kafka for the
lag): per pipeline its status (`exactly_once.operate.status`: stalls, last commit, lag, open
checkpoints, gaps, history), the DAG whose runs its checkpoints link to, and its dead
letters — a count per kind of reason and the newest ones, with a safe preview of their bytes
only where the caller says the reader may see record values (`payloads`).

Error texts (a stall's last error, a dead letter's reason) are shown as `errors.error_text`
makes them: bounded, without the record values a database error quotes. Where record values
may not be shown, a dead letter's reason is shown as its kind (numbers of two digits or more
as `#`, as the counts per kind show them) and its value's bytes are not even read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import closing, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime

from confluent_kafka import KafkaException
from psycopg2 import sql

from exactly_once.errors import error_text
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import UNANSWERED, KafkaOffsets, KafkaRefused
from exactly_once.ledger.migrate import pending
from exactly_once.operate.status import PipelineStatus, read_status
from exactly_once.sqlfiles import named

Q = named("overview.sql")


def with_reason_kind(statement: str) -> sql.Composed:
    """The statement with the one expression of a dead letter's kind of reason."""
    return sql.SQL(Q[statement]).format(reason_kind=sql.SQL(Q["reason_kind"]))
PREVIEW_BYTES = 64
KAFKA_TIMEOUT = 5  # seconds: the page shows the ledger without the lag rather than wait
REASON_KINDS, REASON_CHARACTERS = 20, 200  # the dead letters' reasons the page counts, and how much of each
ERROR_CHARACTERS = 1000  # of a stall's last error, or a dead letter's reason, shown
# A row or key a database error quotes that a bound cut before its closing parenthesis (the
# kinds of reasons are cut in SQL): error_text's patterns need it whole.
_CUT_VALUES = re.compile(r"(Failing row contains \(|Key \([^)]*\)=\()(?!values not shown\)).*\Z", re.S)


class LedgerBehind(Exception):
    """The ledger lacks migrations of this library's version: the next run's first task applies them."""


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    reason: str       # bounded; its kind (numbers as #) unless previews are shown
    checkpoint_id: int
    committed_at: datetime
    preview: str | None  # the first PREVIEW_BYTES bytes, printable ASCII as it is, any other byte as \xNN;
                         # None: not shown to this reader
    size: int | None  # bytes of the value; None for a null value


@dataclass(frozen=True)
class PipelineOverview:
    status: PipelineStatus
    dag_id: str | None                         # the DAG whose runs the checkpoints link to
    dead_letter_reasons: tuple[tuple[str, int], ...]
    newest_dead_letters: tuple[DeadLetter, ...]
    lag_unknown: str | None                    # why the lag could not be read, if it could not


def preview(value: bytes | None) -> str:
    """Bytes shown safely: printable ASCII as it is, every other byte (NUL, control
    characters, invalid UTF-8, multi-byte characters) as \\xNN, so nothing is decoded."""
    if value is None:
        return ""
    return "".join(chr(b) if 0x20 <= b < 0x7f and b != 0x5c else f"\\x{b:02x}" for b in value)


def read_overviews(connect: Callable, kafka: KafkaClient | str, history: int, dead_letters: int,
                   visible: Callable[[str | None], bool],
                   payloads: Callable[[str | None], bool] = lambda _dag_id: False,
                   only: list[str] | None = None) -> list[PipelineOverview]:
    """The overview of every registered pipeline (or of those named in `only`) whose DAG
    (None: not known yet) is `visible`, stalled ones first; its dead letters' previews (and exact reasons) only if
    `payloads` says so for its DAG (by default for none). `kafka` is the client of the Kafka
    connection, or why there is none: then the lag is not shown, the rest is. Once the
    brokers do not answer or refuse the login, the next pipelines' lag is not asked for either."""
    with closing(connect()) as conn:
        refuse_if_behind(conn)
        with conn.cursor() as cur:
            cur.execute(Q["pipeline_dags"])
            shown = [(name, dag_id) for name, dag_id in cur.fetchall()
                     if (only is None or name in only) and visible(dag_id)]
        unanswered = kafka if isinstance(kafka, str) else None
        found = []
        with nullcontext() if unanswered else KafkaOffsets(kafka, timeout=KAFKA_TIMEOUT) as offsets:
            for name, dag_id in shown:
                status, lag_unknown = None, unanswered
                if unanswered is None:
                    try:
                        status = read_status(conn, offsets, name, history)
                    except (KafkaException, KafkaRefused) as error:
                        conn.rollback()
                        lag_unknown = f"Kafka did not answer: {error}"
                        if isinstance(error, KafkaRefused) or error.args[0].code() in UNANSWERED:
                            unanswered = lag_unknown
                found.append(_overview(conn, status or read_status(conn, None, name, history), dag_id,
                                       dead_letters, lag_unknown, payloads(dag_id)))
    return sorted(found, key=lambda o: (not o.status.stopped, o.status.name))


def refuse_if_behind(conn) -> None:
    """`LedgerBehind` unless every migration of this library's version is applied."""
    behind = pending(conn)
    if behind:
        raise LedgerBehind(f"the ledger lacks migration(s) {', '.join(behind)} of this library's version; the "
                           "first task of the next pipeline run applies them (or `python -m exactly_once.ledger.migrate`)")


def _overview(conn, status: PipelineStatus, dag_id: str | None, dead_letters: int, lag_unknown: str | None,
              payloads: bool) -> PipelineOverview:
    where = {"pipeline": status.name}
    with conn.cursor() as cur:
        cur.execute(with_reason_kind("dead_letter_reasons"),
                    {**where, "limit": REASON_KINDS, "characters": REASON_CHARACTERS})
        reasons = tuple((shown_error(kind), n) for kind, n in cur.fetchall())
        cur.execute(with_reason_kind("newest_dead_letters"), {**where, "bytes": PREVIEW_BYTES, "limit": dead_letters,
                                               "payloads": payloads, "characters": REASON_CHARACTERS})
        newest = tuple(DeadLetter(t, p, o, shown_error(reason), cp, at,
                                  (preview(None if value is None else bytes(value)) if payloads else None), size)
                       for t, p, o, reason, cp, at, value, size in cur.fetchall())
    conn.rollback()  # read-only: end the transaction the reads began
    stalls = tuple(replace(s, last_error=shown_error(s.last_error or "")) for s in status.stalls)
    refusals = tuple(replace(r, error=shown_error(r.error)) for r in status.refusals)
    return PipelineOverview(replace(status, stalls=stalls, refusals=refusals), dag_id, reasons, newest, lag_unknown)


def shown_error(text: str) -> str:
    """An error text as the view shows it: `error_text`'s (bounded, without the values a
    database error quotes), and a quoted row or key cut off before its end not shown either."""
    return _CUT_VALUES.sub(r"\1values not shown)", error_text(text, ERROR_CHARACTERS))


def record_dag(connect: Callable, pipeline: str, dag_id: str) -> None:
    """Which DAG runs the pipeline (the first task of each run says so)."""
    with closing(connect()) as conn, conn, conn.cursor() as cur:
        cur.execute(Q["record_dag"], {"pipeline": pipeline, "dag_id": dag_id})
