"""The Spark frames of one attempt, from its records: parsed (by the key's and value's formats),
transformed, checked against each sink table's catalog (exactly_once.spark.row_checks), and
each sink's staging rows (by its mode) beside the dead letters.

A record goes to the dead letters, and to no sink, when it is set aside (an operator
dead-lettered its offsets, or isolation found that it fails a write), when it does not
parse or fit the schema, or when a sink table would refuse a value of its row. Only
plans are built here; the attempt (exactly_once.spark.increment) runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from exactly_once import debezium
from exactly_once.catalog import ColumnType
from exactly_once.config import NO_KEY, PipelineConfig
from exactly_once.formats import format_of
from exactly_once.kafka_columns import (KAFKA_HEADERS, KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP, KAFKA_TOMBSTONE,
                                        KAFKA_TOPIC)
from exactly_once.ledger.planning import OffsetRange
from exactly_once.ledger.tables import DEAD_LETTERS
from exactly_once.schema_registry import SchemaRegistry
from exactly_once.sinks import require_columns
from exactly_once.sinks.upsert import MODE as UPSERT
from exactly_once.spark.row_checks import first_refusal, refusals
from exactly_once.spark.transforms import load_transform

COORDINATES = (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET)
REFUSED = "_refused_because"
NOTED = "_last_row_noted"  # a column of the cached checked rows that notes where a task stopped (task_failures)
_SET_ASIDE = "_set_aside"
_TOO_LARGE, _RAW, _RAW_KEY, _TOMBSTONE = "_too_large", "_raw_value", "_raw_key", "_tombstone"
SetAside = Sequence[tuple[OffsetRange, str]]  # offsets whose records go to the dead letters, and why


def cache_level(session: SparkSession) -> StorageLevel:
    """Where an attempt caches what its passes share: in memory and spilled to disk in its
    own application; on disk only over Spark Connect, whose server's heap every job on it
    shares (at 5 M records, building the cache in memory took a 1 GiB server's heap and
    killed it, issue 63). The cache is read by every pass of the write and every probe."""
    return StorageLevel.DISK_ONLY if type(session).__module__.startswith("pyspark.sql.connect") \
        else StorageLevel.MEMORY_AND_DISK


def in_ranges(ranges: Sequence[OffsetRange], coordinates: Sequence[str] = ("topic", "partition", "offset")) -> Column:
    """Whether a Kafka record (its topic, partition and offset in the columns `coordinates`: a
    record's, or a transformed row's COORDINATES) lies in one of `ranges`. Spark SQL's text,
    each partition's ranges under one test of it, parsed once by the JVM: built from Column
    objects, each operator a call to the driver's JVM, a sweep's few dozen pieces took
    seconds (issue 63)."""
    topic, partition, offset = (_identifier(c) for c in coordinates)
    by_partition: dict[tuple[str, int], list[OffsetRange]] = {}
    for r in ranges:
        by_partition.setdefault((r.topic, r.partition), []).append(r)
    return F.expr(" OR ".join(
        f"({topic} = {sql_string(t)} AND {partition} = {int(p)} AND ("
        + " OR ".join(f"{offset} BETWEEN {int(r.start)} AND {int(r.end) - 1}" for r in held) + "))"
        for (t, p), held in by_partition.items()) or "false")


def _identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal (backslash escapes, Spark's default)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse(records: DataFrame, config: PipelineConfig, registry: SchemaRegistry | None = None,
          retry_unknown_ids: bool = False) -> DataFrame:
    """The records with `parsed` (the value's fields by its format), `parsed_key` (the key's,
    when the key is decoded), `_tombstone` (a key with a null value, kept when the source's
    `tombstones` say so) and `reason` (null when the record fits); none set aside yet. A
    record larger than `max_record_bytes` is not decoded: its reason says its size.
    `retry_unknown_ids` (a checkpoint's first attempt): a schema id the registry does not
    know fails the attempt, retryable, instead of being a dead letter (formats.Encoded)."""
    source, limit = config.source, config.max_record_bytes
    size = F.coalesce(F.octet_length("key"), F.lit(0)) + F.coalesce(F.octet_length("value"), F.lit(0))
    too_large = F.lit(None).cast("string") if limit is None else F.when(size > limit, F.format_string(
        f"record of %d bytes (key and value) is larger than max_record_bytes {limit}", size))
    raw = records.withColumns({_TOO_LARGE: too_large, _RAW_KEY: F.col("key"), _RAW: F.col("value")})
    small = F.col(_TOO_LARGE).isNull()
    shown = raw.withColumns({"key": F.when(small, F.col("key")), "value": F.when(small, F.col("value"))})

    null_value = F.col(_RAW).isNull()
    tombstone = null_value & F.col(_RAW_KEY).isNotNull()
    change_events = source.envelope == "debezium"
    kept = source.tombstones != "dead_letter" or change_events  # skipped after a delete event

    def encoded(part: str):
        return replace(source.encoded(part, registry), retry_unknown_ids=retry_unknown_ids)

    if change_events:
        read = debezium.json_events("value", source.value_schema) if source.value_format == "json" else \
            debezium.registry_events(*format_of(source.value_format).decode(shown, encoded("value")))
        value_fields, value_why_not, change_row = debezium.decode("value", source.value_schema, _delete_keys(config),
                                                                  read, source.truncates)
    else:
        value_fields, value_why_not = format_of(source.value_format).decode(shown, encoded("value"))
    decoded = {"parsed": value_fields}
    reasons = [F.col(_TOO_LARGE)]
    if source.key_format != NO_KEY:
        key_fields, key_why_not = format_of(source.key_format).decode(shown, encoded("key"))
        decoded["parsed_key"] = key_fields
        reasons.append(F.when(F.col(_RAW_KEY).isNull(), F.lit("key is null"))
                       .otherwise(key_why_not(F.col("parsed_key"))))
    reasons.append(F.when(tombstone, F.lit(None if kept else "value is null (a tombstone: source.tombstones is "
                                                             "dead_letter)").cast("string"))
                   .when(null_value, F.lit("value is null")).otherwise(value_why_not(F.col("parsed"))))
    # The fields first, then why not from their columns: each record is decoded once.
    parsed = (shown.withColumns(decoded)
              .withColumns({"reason": F.coalesce(*reasons), _TOMBSTONE: tombstone & F.lit(kept),
                            "key": F.col(_RAW_KEY), "value": F.col(_RAW), _SET_ASIDE: F.lit(False)})
              .drop(_TOO_LARGE, _RAW_KEY, _RAW))
    return parsed.withColumn("parsed", change_row(F.col("parsed"))) if change_events else parsed


def _delete_keys(config: PipelineConfig) -> list[str]:
    """The columns a delete names its row by: every upsert sink's keys."""
    return sorted({k for sink in config.sinks if sink.strategy is UPSERT for k in sink.keys})


def with_set_aside(parsed: DataFrame, set_aside: SetAside) -> DataFrame:
    """The parsed records with the set-aside ones' reason first (a cheap projection, so a
    cached parse serves every round of isolation)."""
    if not set_aside:
        return parsed
    (first, why), *rest = set_aside
    aside = F.when(in_ranges([first]), F.lit(why))  # one CASE, its first match's reason
    for offsets, why in rest:
        aside = aside.when(in_ranges([offsets]), F.lit(why))
    return parsed.withColumns({_SET_ASIDE: aside.isNotNull(), "reason": F.coalesce(aside, F.col("reason"))})


def _fitting(parsed: DataFrame, tombstones: bool) -> DataFrame:
    return parsed.where(F.col("reason").isNull() & (F.col(_TOMBSTONE) if tombstones else ~F.col(_TOMBSTONE)))


def _coordinates() -> list[Column]:
    return [F.col("topic").alias(KAFKA_TOPIC), F.col("partition").alias(KAFKA_PARTITION),
            F.col("offset").alias(KAFKA_OFFSET), F.col("timestamp").alias(KAFKA_TIMESTAMP)]


def good_rows(parsed: DataFrame) -> DataFrame:
    """Fitting records (not tombstones) as columns of the key's and value's fields, their
    headers and their Kafka coordinates."""
    key = ["parsed_key.*"] if "parsed_key" in parsed.columns else []
    return _fitting(parsed, tombstones=False).select(
        *key, "parsed.*", F.col("headers").alias(KAFKA_HEADERS), *_coordinates())


def tombstone_rows(parsed: DataFrame) -> DataFrame:
    """Kept tombstones as the key's fields and their coordinates, marked as tombstones."""
    return _fitting(parsed, tombstones=True).select("parsed_key.*", *_coordinates(),
                                                     F.lit(True).alias(KAFKA_TOMBSTONE))


def transform_of(config: PipelineConfig) -> Callable[[DataFrame], DataFrame]:
    return load_transform(config) or (lambda frame: frame)


def _read_by_sinks(config: PipelineConfig, columns: Mapping[str, list[ColumnType]]) -> set[str]:
    """The columns of the transformed rows some sink's staging rows read (the columns its mode
    takes from each row, its keys, an upsert's order_by) and the Kafka coordinates; in lower
    case, as Spark resolves names."""
    read = list(COORDINATES)
    for sink in config.sinks:
        read += sink.strategy.record_columns(sink, [c.name for c in columns[sink.name]]) + list(sink.keys)
        read += [sink.order_by] if sink.order_by else []
    if config.source.envelope == "debezium":
        read.append(debezium.OP)  # which rows an upsert sink takes (_with_deletes)
    return {name.lower() for name in read}


def checked_rows(parsed: DataFrame, config: PipelineConfig, columns: Mapping[str, list[ColumnType]]) -> DataFrame:
    """The transformed rows, only the columns a sink reads (so a column of the transform no
    sink takes is never computed, as Spark would prune it), with why a sink table would
    refuse a value of theirs (null: none would)."""
    rows = transform_of(config)(good_rows(parsed))
    read = _read_by_sinks(config, columns)
    rows = rows.drop(*(c for c in rows.columns if c.lower() not in read))  # names, not parsed as paths
    checks = []
    for sink in config.sinks:
        taken = set(sink.strategy.record_columns(sink, [c.name for c in columns[sink.name]]))
        checked = refusals(sink.name, [c for c in columns[sink.name] if c.name in taken], rows.schema)
        if sink.strategy is UPSERT and config.source.envelope == "debezium" or config.source.truncates:
            # a delete writes its key alone; a truncate its position, and a row in no other sink
            require_columns(rows, sink, [debezium.OP])
            deleting, truncating = _op_is(debezium.DELETE), _op_is(debezium.TRUNCATE)
            named = refusals(sink.name, [c for c in columns[sink.name] if c.name in {*sink.keys, sink.order_by}],
                             rows.schema) if sink.strategy is UPSERT else []
            ordered = refusals(sink.name, [c for c in columns[sink.name] if c.name == sink.order_by], rows.schema)
            whole = ~truncating & ~deleting if sink.strategy is UPSERT else ~truncating
            checked = ([F.when(whole, check) for check in checked] + [F.when(deleting, c) for c in named]
                       + [F.when(truncating, c) for c in ordered])
        checks += checked
    return rows.withColumn(REFUSED, first_refusal(checks))


def refused_records(checked: DataFrame) -> DataFrame:
    """Per record a row of which a sink table would refuse: its coordinates and why."""
    return checked.where(F.col(REFUSED).isNotNull()).groupBy(*COORDINATES).agg(F.min(REFUSED).alias("reason"))


def _op_is(op: str) -> Column:
    """Whether a change feed's transformed row is of `op` (a null op, a transform's, is none)."""
    return F.coalesce(F.col(debezium.OP) == op, F.lit(False))


def _with_deletes(accepted: DataFrame, parsed: DataFrame, config: PipelineConfig, sink) -> DataFrame:
    """The sink's rows and, for an upsert sink of a pipeline whose records delete, the deletes
    as rows marked so, which write no value: tombstones under `tombstones: delete`, which skip
    the transform and the row checks; a change feed's delete events, which the transform sees
    and this sink's checks refuse only for their key or position (a record another sink
    refuses deletes nothing either). A change feed's truncate (`on_truncate: truncate`) is an
    upsert sink's tombstone of no key, its position kept, and no other sink's row."""
    if config.source.truncates and sink.strategy is not UPSERT:
        return accepted.where(~_op_is(debezium.TRUNCATE))
    if not config.source.deletes or sink.strategy is not UPSERT:
        return accepted
    if config.source.envelope != "debezium":
        return accepted.withColumn(KAFKA_TOMBSTONE, F.lit(False)).unionByName(tombstone_rows(parsed),
                                                                             allowMissingColumns=True)
    deleting, truncating = _op_is(debezium.DELETE), _op_is(debezium.TRUNCATE)
    kept = [c for c in (*COORDINATES, KAFKA_TIMESTAMP) if c in accepted.columns]
    keys = [F.when(~truncating, F.col(k)).alias(k) for k in sink.keys]
    deletes = (accepted.where(deleting | truncating)
               .select(*keys, debezium.OP, debezium.POSITION, *kept, F.lit(True).alias(KAFKA_TOMBSTONE)))
    return (accepted.where(~deleting & ~truncating).withColumn(KAFKA_TOMBSTONE, F.lit(False))
            .unionByName(deletes, allowMissingColumns=True))


@dataclass(frozen=True)
class AttemptFrames:
    sinks: dict[str, DataFrame]     # what each sink stages
    unparsed: DataFrame             # the dead letters of records that do not parse or fit, or are set aside
    letters: DataFrame              # those and the dead letters of records a sink table would refuse
    bad: DataFrame                  # where and why records are bad (not those set aside): for `fail`
    refused: DataFrame              # cached: `release` when the frames are written
    owned: list[DataFrame]          # what the frames cached: the refusals, and the checked rows unless given

    def release(self) -> None:
        """Drops what the frames cached."""
        for frame in self.owned:
            frame.unpersist()

    def staging(self, any_refused: bool) -> dict[str, DataFrame]:
        """Every sink's frame and the dead letters under DEAD_LETTERS. Without refusals the
        dead letters skip the join of every record with the (empty) refusals."""
        return {DEAD_LETTERS: self.letters if any_refused else self.unparsed, **self.sinks}


def attempt_frames(parsed: DataFrame, config: PipelineConfig, columns: Mapping[str, list[ColumnType]],
                   checked: DataFrame | None = None) -> AttemptFrames:
    """What each sink stages from the parsed records, keyed by sink name, and the dead
    letters (with their raw key and value: a transform does not carry them). A row
    refused by one sink's table reaches no sink. `checked`: the records' checked rows, from
    caches the caller keeps (a write's rounds, exactly_once.spark.kept_rows); else computed."""
    # Cached: the transform and the row checks run once a round of the write, however many
    # sinks read them (a Python UDF of 0.15 s a record ran four times over, issue 63); the
    # refusals computed from them, once too. A transform may make several rows of one record; a
    # record with one refused row reaches no sink at all.
    level = cache_level(parsed.sparkSession)
    owned = []
    if checked is None:
        checked = checked_rows(parsed, config, columns).persist(level)
        owned.append(checked)
    refused = refused_records(checked).persist(level)
    owned.append(refused)
    try:
        return _frames(parsed, config, columns, checked, refused, owned)
    except Exception:  # a sink's rows that cannot be made (a column missing, say): nothing stays cached
        for frame in owned:
            frame.unpersist()
        raise


def _frames(parsed: DataFrame, config: PipelineConfig, columns: Mapping[str, list[ColumnType]], checked: DataFrame,
            refused: DataFrame, owned: list[DataFrame]) -> AttemptFrames:
    """attempt_frames from the cached checked rows and refusals."""
    accepted = (checked.where(F.col(REFUSED).isNull()).drop(REFUSED, NOTED)
                .join(F.broadcast(refused.select(*COORDINATES)), list(COORDINATES), "left_anti"))
    where = ["topic", "partition", "offset"]  # the records' names of the coordinates
    unparsed = parsed.where(F.col("reason").isNotNull())
    why_refused = _as_records(refused)
    bad = unparsed.where(~F.col(_SET_ASIDE)).select(*where, "reason").unionByName(why_refused)
    return AttemptFrames(
        {sink.name: sink.strategy.staging_rows(_with_deletes(accepted, parsed, config, sink), sink,
                                               [c.name for c in columns[sink.name]])
         for sink in config.sinks},
        unparsed_letters(parsed, config), every_letter(parsed, refused, config), bad, refused, owned)


def _as_records(refused: DataFrame) -> DataFrame:
    """The refusals under the records' names of the coordinates."""
    return refused.select(*(F.col(c).alias(r) for c, r in zip(COORDINATES, ("topic", "partition", "offset"))),
                          "reason")


def every_letter(parsed: DataFrame, refused: DataFrame, config: PipelineConfig) -> DataFrame:
    """The dead letters of the records that do not parse or fit, or are set aside, and of those
    a sink table would refuse (`refused`, per record), from one scan of the records (a refused
    record is one that parsed and fit)."""
    why_refused = _as_records(refused).withColumnRenamed("reason", REFUSED)
    return (parsed.join(F.broadcast(why_refused), ["topic", "partition", "offset"], "left")
            .where(F.col("reason").isNotNull() | F.col(REFUSED).isNotNull())
            .withColumn("reason", F.coalesce("reason", REFUSED)).select(*_letter(config)))


def unparsed_letters(parsed: DataFrame, config: PipelineConfig) -> DataFrame:
    """The dead letters of the parsed records that do not parse or fit, or are set aside."""
    return parsed.where(F.col("reason").isNotNull()).select(*_letter(config))


def _letter(config: PipelineConfig) -> list:
    """A dead letter's columns of a parsed record: the record's coordinates, raw key and value, and why."""
    return [F.lit(config.name).alias("pipeline"), "topic", "partition", "offset", "key", "value", "reason"]
