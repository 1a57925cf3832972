"""The operator's ways out of a stall (promise 9), each recorded in the ledger
(exactly_once.operator_actions: what, when, by whom, why):

    python -m exactly_once.stalls retry CHECKPOINT_ID
        after fixing the cause: the stalled checkpoint is released and its ranges go,
        exactly, to the pipeline's next run (clearing its failed increment task in
        Airflow is the other way: a new attempt of the same checkpoint)
    python -m exactly_once.stalls dead-letter PIPELINE 'TOPIC[PARTITION]@FROM..TO' --reason WHY
        the records at offsets FROM..TO (TO excluded) go to the dead letters with WHY,
        reaching no sink, when the checkpoint that reads them commits; open checkpoints
        holding them are released to the next run, so the pipeline moves on

Committed offsets cannot be dead-lettered (they counted already), nor offsets of a
checkpoint that is running or pre-committed (wait for it, or let it fail). Reads the
Airflow connection pipeline_db.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from contextlib import closing

from exactly_once import connections
from exactly_once.checkpoints import Outcome, State
from exactly_once.config import ConfigError
from exactly_once.ledger_rows import LedgerRows, pipeline_of
from exactly_once.planning import OffsetRange
from exactly_once.protocol import Ledger

_RANGE = re.compile(r"^(?P<topic>[^\[\]]+)\[(?P<partition>\d+)\]@(?P<start>\d+)\.\.(?P<end>\d+)$")


def parse_range(text: str) -> OffsetRange:
    """`topic[partition]@from..to` (to excluded), as status and the stall message write them."""
    match = _RANGE.match(text.strip())
    if match is None or int(match["start"]) >= int(match["end"]):
        raise ConfigError(f"{text!r} is not an offset range: write TOPIC[PARTITION]@FROM..TO with FROM < TO "
                          "(TO excluded), e.g. orders[0]@120..121 for the one record at offset 120")
    return OffsetRange(match["topic"], int(match["partition"]), int(match["start"]), int(match["end"]))


def retry(ledger: Ledger, checkpoint_id: int) -> tuple[int, ...]:
    """Releases a stalled checkpoint to the next run; refuses any other."""
    def act(rows: LedgerRows) -> list[int]:
        checkpoint = rows.checkpoint(checkpoint_id)
        if checkpoint.state is not State.STALLED:
            raise ConfigError(f"checkpoint {checkpoint_id} is {checkpoint.state.value}, not stalled: nothing to retry")
        rows.record_action("retry", checkpoint_id, ledger.now(), f"retried after: {checkpoint.reason}")
        return [checkpoint_id]

    return _release(ledger, act, "retried by an operator: its ranges go to the next run")


def dead_letter(ledger: Ledger, offsets: OffsetRange, reason: str) -> tuple[int, ...]:
    """Records the range as dead-lettered and releases the open checkpoints holding it."""
    def act(rows: LedgerRows) -> list[int]:
        holders = rows.holders(offsets)
        busy = [(state, cp) for state, cp in holders
                if state in ("committed", State.RUNNING.value, State.PRECOMMITTED.value)]
        if busy:
            raise ConfigError(f"{offsets.label} cannot be dead-lettered: offsets of it are held by "
                              + ", ".join(f"checkpoint {cp} ({state})" for state, cp in busy))
        rows.record_action("dead_letter", None, ledger.now(), reason, offsets)
        return [cp for _, cp in holders]

    return _release(ledger, act, f"released: an operator dead-lettered {offsets.label} ({reason})")


def _release(ledger: Ledger, act: Callable[[LedgerRows], list[int]], reason: str) -> tuple[int, ...]:
    """The operator's action and the release of the open checkpoints it names, in one
    transaction: their ranges go, exactly, to the next run's plan."""
    with ledger.rows() as rows:
        rows.lock()
        return tuple(checkpoint_id for checkpoint_id in act(rows)
                     if ledger.release(rows, checkpoint_id, reason) is Outcome.ABORTED)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m exactly_once.stalls", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    retrying = commands.add_parser("retry", help="release a stalled checkpoint to the next run")
    retrying.add_argument("checkpoint_id", type=int)
    dead = commands.add_parser("dead-letter", help="dead-letter a range of offsets")
    dead.add_argument("pipeline")
    dead.add_argument("range", help="TOPIC[PARTITION]@FROM..TO, TO excluded")
    dead.add_argument("--reason", required=True, help="why (kept with each dead letter)")
    args = parser.parse_args()
    connect = connections.for_command_line(connections.connector)
    try:
        if args.command == "retry":
            with closing(connect()) as conn, conn, conn.cursor() as cur:
                pipeline = pipeline_of(cur, args.checkpoint_id)
            released = retry(Ledger.of_registered(pipeline, connect), args.checkpoint_id)
        else:
            released = dead_letter(Ledger.of_registered(args.pipeline, connect), parse_range(args.range),
                                   args.reason)
    except (ConfigError, LookupError) as refused:
        raise SystemExit(f"refused: {refused}") from None
    print("recorded; released to the next run: " + (", ".join(f"checkpoint {cp}" for cp in released) or "nothing"))


if __name__ == "__main__":
    main()
