"""What the pipelines view in Airflow's UI shows, read from the ledger (and Kafka for the
lag): per pipeline its status (`exactly_once.operate.status`: stalls, last commit, lag, open
checkpoints, gaps, history), the DAG whose runs its checkpoints link to, and its dead
letters — a count per kind of reason and the newest ones with a safe preview of their bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing, nullcontext
from dataclasses import dataclass
from datetime import datetime

from confluent_kafka import KafkaException

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import UNANSWERED, KafkaOffsets, KafkaRefused
from exactly_once.ledger.migrate import pending
from exactly_once.operate.status import PipelineStatus, read_status
from exactly_once.sqlfiles import named

Q = named("overview.sql")
PREVIEW_BYTES = 64
KAFKA_TIMEOUT = 5  # seconds: the page shows the ledger without the lag rather than wait
REASON_KINDS, REASON_CHARACTERS = 20, 200  # the dead letters' reasons the page counts, and how much of each


class LedgerBehind(Exception):
    """The ledger lacks migrations of this library's version: the next run's first task applies them."""


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    reason: str
    checkpoint_id: int
    committed_at: datetime
    preview: str    # the first PREVIEW_BYTES bytes, printable ASCII as it is, any other byte as \xNN
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
                   visible: Callable[[str | None], bool]) -> list[PipelineOverview]:
    """The overview of every registered pipeline whose DAG (None: not known yet) is
    `visible`, stalled ones first. `kafka` is the client of the Kafka connection, or why
    there is none: then the lag is not shown, the rest is. Once the brokers do not answer
    or refuse the login, the next pipelines' lag is not asked for either."""
    with closing(connect()) as conn:
        behind = pending(conn)
        if behind:
            raise LedgerBehind(f"the ledger lacks migration(s) {', '.join(behind)} of this library's version; the "
                               "first task of the next pipeline run applies them (or `python -m exactly_once.ledger.migrate`)")
        with conn.cursor() as cur:
            cur.execute(Q["pipeline_dags"])
            shown = [(name, dag_id) for name, dag_id in cur.fetchall() if visible(dag_id)]
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
                                       dead_letters, lag_unknown))
    return sorted(found, key=lambda o: (not o.status.stopped, o.status.name))


def _overview(conn, status: PipelineStatus, dag_id: str | None, dead_letters: int, lag_unknown: str | None
              ) -> PipelineOverview:
    where = {"pipeline": status.name}
    with conn.cursor() as cur:
        cur.execute(Q["dead_letter_reasons"], {**where, "limit": REASON_KINDS, "characters": REASON_CHARACTERS})
        reasons = tuple(cur.fetchall())
        cur.execute(Q["newest_dead_letters"], {**where, "bytes": PREVIEW_BYTES, "limit": dead_letters})
        newest = tuple(DeadLetter(t, p, o, reason, cp, at, preview(None if value is None else bytes(value)), size)
                       for t, p, o, reason, cp, at, value, size in cur.fetchall())
    conn.rollback()  # read-only: end the transaction the reads began
    return PipelineOverview(status, dag_id, reasons, newest, lag_unknown)


def record_dag(connect: Callable, pipeline: str, dag_id: str) -> None:
    """Which DAG runs the pipeline (the first task of each run says so)."""
    with closing(connect()) as conn, conn, conn.cursor() as cur:
        cur.execute(Q["record_dag"], {"pipeline": pipeline, "dag_id": dag_id})
