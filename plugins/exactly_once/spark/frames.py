"""The Spark frames of one attempt, from its records: parsed (by the value format),
transformed, checked against each sink table's catalog (exactly_once.spark.row_checks), and
each sink's staging rows (by its mode) beside the dead letters.

A record goes to the dead letters, and to no sink, when it is set aside (an operator
dead-lettered its offsets, or isolation found that it fails a write), when it does not
parse or fit the schema, or when a sink table would refuse a value of its row. Only
plans are built here; the attempt (exactly_once.spark.increment) runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from exactly_once.catalog import ColumnType
from exactly_once.config import PipelineConfig
from exactly_once.formats import format_of
from exactly_once.kafka_columns import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP, KAFKA_TOPIC
from exactly_once.ledger.planning import OffsetRange
from exactly_once.ledger.tables import DEAD_LETTERS
from exactly_once.spark.row_checks import first_refusal, refusals
from exactly_once.spark.transforms import load_transform

COORDINATES = (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET)
_REFUSED = "_refused_because"
_SET_ASIDE = "_set_aside"
_TOO_LARGE, _RAW = "_too_large", "_raw_value"
SetAside = Sequence[tuple[OffsetRange, str]]  # offsets whose records go to the dead letters, and why


def in_ranges(ranges: Sequence[OffsetRange]) -> Column:
    """Whether a Kafka record (columns topic, partition, offset) lies in one of `ranges`."""
    inside = F.lit(False)
    for r in ranges:
        inside = inside | ((F.col("topic") == r.topic) & (F.col("partition") == r.partition)
                           & F.col("offset").between(r.start, r.end - 1))
    return inside


def parse(records: DataFrame, config: PipelineConfig) -> DataFrame:
    """The records with `parsed` (the value by the schema) and `reason` (null when it fits);
    none set aside yet. A record larger than `max_record_bytes` is not parsed: its reason
    says its size."""
    value_format, schema = format_of(config.source.value_format), config.source.value_schema
    limit = config.max_record_bytes
    if limit is None:
        return value_format.parse(records, schema).withColumn(_SET_ASIDE, F.lit(False))
    size = F.coalesce(F.octet_length("key"), F.lit(0)) + F.coalesce(F.octet_length("value"), F.lit(0))
    too_large = F.when(size > limit, F.format_string(f"record of %d bytes (key and value) is larger than "
                                                     f"max_record_bytes {limit}", size))
    unparsed = records.withColumns({_TOO_LARGE: too_large, _RAW: F.col("value")})
    parsed = value_format.parse(unparsed.withColumn("value", F.when(F.col(_TOO_LARGE).isNull(), F.col("value"))),
                                schema)
    return (parsed.withColumns({"value": F.col(_RAW), "reason": F.coalesce(_TOO_LARGE, "reason"),
                                _SET_ASIDE: F.lit(False)})
            .drop(_TOO_LARGE, _RAW))


def with_set_aside(parsed: DataFrame, set_aside: SetAside) -> DataFrame:
    """The parsed records with the set-aside ones' reason first (a cheap projection, so a
    cached parse serves every round of isolation)."""
    aside = F.lit(None).cast("string")
    for offsets, why in reversed(set_aside):
        aside = F.when(in_ranges([offsets]), F.lit(why)).otherwise(aside)
    if not set_aside:
        return parsed
    return parsed.withColumns({_SET_ASIDE: aside.isNotNull(), "reason": F.coalesce(aside, F.col("reason"))})


def good_rows(parsed: DataFrame) -> DataFrame:
    """Fitting records as columns of the schema plus their Kafka coordinates."""
    return parsed.where(F.col("reason").isNull()).select(
        "parsed.*", F.col("topic").alias(KAFKA_TOPIC), F.col("partition").alias(KAFKA_PARTITION),
        F.col("offset").alias(KAFKA_OFFSET), F.col("timestamp").alias(KAFKA_TIMESTAMP))


def transform_of(config: PipelineConfig) -> Callable[[DataFrame], DataFrame]:
    return load_transform(config) or (lambda frame: frame)


def checked_rows(parsed: DataFrame, config: PipelineConfig, columns: Mapping[str, list[ColumnType]]) -> DataFrame:
    """The transformed rows with why a sink table would refuse a value of theirs (null: none would)."""
    rows = transform_of(config)(good_rows(parsed))
    checks = []
    for sink in config.sinks:
        taken = set(sink.strategy.record_columns(sink, [c.name for c in columns[sink.name]]))
        checks += refusals(sink.name, [c for c in columns[sink.name] if c.name in taken], rows.schema)
    return rows.withColumn(_REFUSED, first_refusal(checks))


def _refused(checked: DataFrame) -> DataFrame:
    """Per record a row of which a sink table would refuse: its coordinates and why."""
    return checked.where(F.col(_REFUSED).isNotNull()).groupBy(*COORDINATES).agg(F.min(_REFUSED).alias("reason"))


@dataclass(frozen=True)
class AttemptFrames:
    staging: dict[str, DataFrame]   # what each sink stages, and the dead letters under DEAD_LETTERS
    bad: DataFrame                  # where and why records are bad (not those set aside): for `fail`
    refused: DataFrame              # cached: unpersist when the frames are written


def attempt_frames(parsed: DataFrame, config: PipelineConfig,
                   columns: Mapping[str, list[ColumnType]]) -> AttemptFrames:
    """What each sink stages from the parsed records, keyed by sink name, and the dead
    letters (with their raw key and value: a transform does not carry them). A row
    refused by one sink's table reaches no sink."""
    checked = checked_rows(parsed, config, columns)
    # Cached: the dead letters and every sink read it. A transform may make several rows
    # of one record; a record with one refused row reaches no sink at all.
    refused = _refused(checked).persist(StorageLevel.MEMORY_AND_DISK)
    accepted = (checked.where(F.col(_REFUSED).isNull()).drop(_REFUSED)
                .join(F.broadcast(refused.select(*COORDINATES)), list(COORDINATES), "left_anti"))
    raw = parsed.where(F.col("reason").isNull()).select("topic", "partition", "offset", "key", "value")
    refused_raw = raw.join(F.broadcast(refused), (raw["topic"] == refused[KAFKA_TOPIC])
                           & (raw["partition"] == refused[KAFKA_PARTITION]) & (raw["offset"] == refused[KAFKA_OFFSET]))
    letter = [F.lit(config.name).alias("pipeline"), "topic", "partition", "offset", "key", "value", "reason"]
    unparsed = parsed.where(F.col("reason").isNotNull())
    bad = (unparsed.where(~F.col(_SET_ASIDE)).select("topic", "partition", "offset", "reason")
           .unionByName(refused.select(*(F.col(c).alias(r) for c, r in zip(COORDINATES, ("topic", "partition",
                                                                                          "offset"))), "reason")))
    return AttemptFrames(
        {DEAD_LETTERS: unparsed.select(*letter).unionByName(refused_raw.select(*letter)),
         **{sink.name: sink.strategy.staging_rows(accepted, sink, [c.name for c in columns[sink.name]])
            for sink in config.sinks}},
        bad, refused)
