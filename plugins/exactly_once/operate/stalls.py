"""The operator's ways out of a stall (promise 9), each recorded in the ledger
(exactly_once.operator_actions: what, when, by whom, why):

    python -m exactly_once.operate.stalls retry CHECKPOINT_ID
        after fixing the cause: the stalled checkpoint is released and its ranges go,
        exactly, to the pipeline's next run (clearing its failed increment task in
        Airflow is the other way: a new attempt of the same checkpoint)
    python -m exactly_once.operate.stalls dead-letter PIPELINE 'TOPIC[PARTITION]@FROM..TO' --reason WHY
        the records at offsets FROM..TO (TO excluded) go to the dead letters with WHY,
        reaching no sink, when the checkpoint that reads them commits; open checkpoints
        holding them are released to the next run, so the pipeline moves on

    python -m exactly_once.operate.stalls reset-partition PIPELINE 'TOPIC[PARTITION]' --to OFFSET --reason WHY
        after the partition's offsets went backwards (the topic deleted and created again,
        a failover to another cluster): the pipeline reads it again from OFFSET; its
        history there (committed ranges, gaps, dead letters, and the rows of append sinks)
        is kept under the label TOPIC@reset-N, which no Kafka topic can be named, and the
        partition takes the topic's id as Kafka gives it now. Refused unless Kafka shows
        why: the topic's id is not the one recorded, or the log ends before what was
        planned; --force resets it all the same (the reason says why)

    python -m exactly_once.operate.stalls dead-letter-output PIPELINE SINK --reason WHY
        the output record Kafka refuses to take for a kafka sink (status names it: larger than
        the topic's max.message.bytes, an invalid record) moves from the outbox to the outbox's
        dead letters (exactly_once.outbox_dead_letters) with Kafka's error and WHY; the sink's
        publishing goes on after it at the next publish (a run's begin or publish task)

Committed offsets cannot be dead-lettered (they counted already), nor offsets of a
checkpoint that is running or pre-committed (wait for it, or let it fail). A partition
cannot be reset while a checkpoint holds some of it, nor for an upsert sink without
`order_by` (its rows compare by offset, and the offsets start again). Reads the Airflow
connection pipeline_db.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from contextlib import closing

from exactly_once import connections
from exactly_once.errors import ConfigError
from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.lost_offsets import reset_label
from exactly_once.ledger.migrate import migrate_through
from exactly_once.ledger.planning import OffsetRange, OffsetSource, replaced
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger import run_refusals
from exactly_once.ledger.rows import LedgerRows, pipeline_of
from exactly_once.publishing.publisher import lock_sink
from exactly_once.sinks.upsert import by_offset
from exactly_once.sqlfiles import named

_RANGE = re.compile(r"^(?P<topic>[^\[\]]+)\[(?P<partition>\d+)\]@(?P<start>\d+)\.\.(?P<end>\d+)$")


def parse_range(text: str) -> OffsetRange:
    """`topic[partition]@from..to` (to excluded), as status and the stall message write them."""
    match = _RANGE.match(text.strip())
    if match is None or int(match["start"]) >= int(match["end"]):
        raise ConfigError(f"{text!r} is not an offset range: write TOPIC[PARTITION]@FROM..TO with FROM < TO "
                          "(TO excluded), e.g. orders[0]@120..121 for the one record at offset 120")
    return OffsetRange(match["topic"], int(match["partition"]), int(match["start"]), int(match["end"]))


def parse_partition(text: str) -> tuple[str, int]:
    """`topic[partition]`."""
    match = re.match(r"^(?P<topic>[^\[\]]+)\[(?P<partition>\d+)\]$", text.strip())
    if match is None:
        raise ConfigError(f"{text!r} is not a partition: write TOPIC[PARTITION], e.g. orders[0]")
    return match["topic"], int(match["partition"])


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


def reset_partition(ledger: Ledger, topic: str, partition: int, to_offset: int, reason: str,
                    kafka: OffsetSource | None = None, force: bool = False) -> str:
    """Plans the partition again from `to_offset`, its history kept under a label (returned).
    With `kafka` (the command line always asks it), the partition takes the topic's current id,
    and the reset is refused unless Kafka shows the offsets went back (another topic id, or a
    log that ends before the frontier) or `force` is given; without it, the partition adopts
    the topic's id at its next plan, unchecked."""
    now = None if kafka is None else kafka.offsets(topic, partition, None, None)  # asked before the lock
    config = ledger.config
    ordered_by_offset = [sink.name for sink in config.sinks if by_offset(sink)]
    if ordered_by_offset:
        raise ConfigError(f"{topic}[{partition}] cannot be reset: upsert sink(s) {ordered_by_offset} keep the row of "
                          "the highest offset, and the offsets start again; give them an order_by column first")
    with ledger.rows() as rows:
        rows.lock()
        rows.run("partition_state", pipeline=config.name, topic=topic, partition=partition)
        found = rows.cur.fetchone()
        if found is None or to_offset >= found[1]:
            raise ConfigError(f"{topic}[{partition}] cannot be reset to {to_offset}: the pipeline "
                              + ("never planned it" if found is None else f"planned it up to {found[1]} only"))
        _, frontier, recorded_id = found
        if now is not None and not force and not replaced(recorded_id, now.topic_id) and now.last_stable >= frontier:
            raise ConfigError(f"{topic}[{partition}] cannot be reset: nothing says its offsets went back: the topic's "
                              f"id is still {recorded_id or 'the one planned in (not recorded)'} and the "
                              f"partition's log ends at {now.last_stable}, not before the {frontier} planned; "
                              "--force resets it all the same")
        held = [(state, cp) for state, cp in rows.holders(OffsetRange(topic, partition, 0, found[1]))
                if state != "committed"]
        if held:
            raise ConfigError(f"{topic}[{partition}] cannot be reset: checkpoint(s) hold some of it: "
                              + ", ".join(f"{cp} ({state})" for state, cp in held) + "; retry or release them first")
        rows.run("reset_count", pipeline=config.name, topic=topic, partition=partition)
        label = reset_label(topic, rows.cur.fetchone()[0])
        evidence = "" if now is None else (
            f" (topic id {recorded_id} -> {now.topic_id}, log end {now.last_stable}, planned up to {frontier}"
            + (", forced" if force else "") + ")")
        rows.record_action("reset_partition", None, ledger.now(), f"reset to offset {to_offset}, history kept as "
                           f"{label}{evidence}: {reason}", OffsetRange(topic, partition, to_offset, found[1]))
        rows.run("reset_partition", pipeline=config.name, topic=topic, partition=partition, label=label,
                 to_offset=to_offset, topic_id=None if now is None else now.topic_id)
        for sink in config.sinks:
            if sink.mode == "append":
                rows.relabel_append_rows(sink, topic, partition, label)
    return label


def dead_letter_output(connect: Callable, pipeline: str, sink: str, reason: str) -> tuple[int, int]:
    """Moves the outbox row Kafka refuses for the sink (its recorded refusal names it) to the
    outbox's dead letters with Kafka's error and the reason, recorded as `dead_letter_output`,
    and clears the refusal, in one transaction under the sink's lock (no publisher records or
    prunes meanwhile); returns the row's (checkpoint, position). Refused when Kafka refuses no
    row of the sink."""
    q, kind = named("refusals.sql"), run_refusals.publishing(sink)
    with closing(connect()) as conn, conn, conn.cursor() as cur:
        lock_sink(cur, pipeline, sink)
        cur.execute(q["refused_row"], {"pipeline": pipeline, "sink": sink, "kind": kind})
        found = cur.fetchone()
        if found is None:
            raise ConfigError(f"pipeline {pipeline!r} sink {sink!r}: Kafka refuses no outbox row of it (status names "
                              "the row when it does): nothing to dead-letter")
        error, topic, checkpoint_id, position = found
        cur.execute(q["dead_letter_output"], {"pipeline": pipeline, "sink": sink, "checkpoint_id": checkpoint_id,
                                              "position": position, "topic": topic, "error": error, "reason": reason})
        cur.execute(q["record_output_action"], {
            "pipeline": pipeline, "checkpoint_id": checkpoint_id,
            "what": f"sink {sink}: outbox row checkpoint {checkpoint_id} row {position}, refused by Kafka for topic "
                    f"{topic}, moved to the outbox's dead letters: {reason}"})
        cur.execute(q["clear"], {"pipeline": pipeline, "kind": kind})
    return checkpoint_id, position


def _release(ledger: Ledger, act: Callable[[LedgerRows], list[int]], reason: str) -> tuple[int, ...]:
    """The operator's action and the release of the open checkpoints it names, in one
    transaction: their ranges go, exactly, to the next run's plan."""
    with ledger.rows() as rows:
        rows.lock()
        return tuple(checkpoint_id for checkpoint_id in act(rows)
                     if ledger.release(rows, checkpoint_id, reason) is Outcome.ABORTED)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m exactly_once.operate.stalls", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    retrying = commands.add_parser("retry", help="release a stalled checkpoint to the next run")
    retrying.add_argument("checkpoint_id", type=int)
    dead = commands.add_parser("dead-letter", help="dead-letter a range of offsets")
    dead.add_argument("pipeline")
    dead.add_argument("range", help="TOPIC[PARTITION]@FROM..TO, TO excluded")
    dead.add_argument("--reason", required=True, help="why (kept with each dead letter)")
    output = commands.add_parser("dead-letter-output",
                                 help="move the output record Kafka refuses for a kafka sink to the outbox's dead letters")
    output.add_argument("pipeline")
    output.add_argument("sink")
    output.add_argument("--reason", required=True, help="why (kept with the dead letter)")
    reset = commands.add_parser("reset-partition", help="read a partition whose offsets went backwards again")
    reset.add_argument("pipeline")
    reset.add_argument("partition", help="TOPIC[PARTITION]")
    reset.add_argument("--to", type=int, required=True, help="the offset to read it from")
    reset.add_argument("--reason", required=True, help="why (kept with the action)")
    reset.add_argument("--force", action="store_true",
                       help="reset even though Kafka shows no sign that the offsets went back")
    args = parser.parse_args()
    connect = connections.for_command_line(connections.connector)
    migrate_through(connect)  # an operator's way out may be the first step after an upgrade
    try:
        if args.command == "retry":
            with closing(connect()) as conn, conn, conn.cursor() as cur:
                pipeline = pipeline_of(cur, args.checkpoint_id)
            released = retry(Ledger.of_registered(pipeline, connect), args.checkpoint_id)
        elif args.command == "dead-letter-output":
            checkpoint_id, position = dead_letter_output(connect, args.pipeline, args.sink, args.reason)
            print(f"recorded; checkpoint {checkpoint_id} row {position} of sink {args.sink} is in the outbox's dead "
                  "letters; the sink's publishing goes on at the next publish (a run's begin or publish task, or "
                  f"`python -m exactly_once publish {args.pipeline}`)")
            return
        elif args.command == "dead-letter":
            released = dead_letter(Ledger.of_registered(args.pipeline, connect), parse_range(args.range),
                                   args.reason)
        else:
            topic, partition = parse_partition(args.partition)
            with KafkaOffsets(connections.for_command_line(connections.kafka_client)) as kafka:
                label = reset_partition(Ledger.of_registered(args.pipeline, connect), topic, partition, args.to,
                                        args.reason, kafka, args.force)
            print(f"recorded; {args.partition} is read again from offset {args.to}; its history is kept as {label}")
            return
    except (ConfigError, LookupError) as refused:
        raise SystemExit(f"refused: {refused}") from None
    print("recorded; released to the next run: " + (", ".join(f"checkpoint {cp}" for cp in released) or "nothing"))


if __name__ == "__main__":
    main()
