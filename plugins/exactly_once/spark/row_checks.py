"""Which rows of a sink a column of its final table would refuse, and why, as Spark
expressions: evaluated on every row before the write, they let such a record go to the dead
letters instead of failing the whole write. The rules are PostgreSQL 15's for a value on its
own (not CHECK, UNIQUE or foreign keys), each checked against PostgreSQL by
tests/spark/test_row_checks.py; the values are those Spark's JDBC writer sends (a double as
float8, a decimal as numeric, ...), converted as PostgreSQL converts them on INSERT.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (ByteType, DataType, DateType, DecimalType, DoubleType, FloatType, IntegerType, LongType,
                               ShortType, StringType, StructType, TimestampNTZType, TimestampType)

from exactly_once.catalog import ColumnType

TEXT = {"text", "varchar", "bpchar", "name"}
INTEGER_BITS = {"int2": 16, "int4": 32, "int8": 64}
SPARK_INTEGER_BITS = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}
# PostgreSQL makes a float numeric through its first 15 (real: 6) significant digits, "%.*g"
# with DBL_DIG (FLT_DIG): 9999.994999999999 does not fit numeric(6,2).
FLOAT_DIGITS = {DoubleType: 15, FloatType: 6}
# float8 -> real rounds to nearest, ties to even: to infinity from halfway between FLT_MAX and
# 2^128, to zero up to half the least denormal. PostgreSQL refuses both; infinities and NaN pass.
REAL_OVERFLOW = 2.0**128 - 2.0**103
REAL_UNDERFLOW = 2.0**-150
# Julian day 0 is PostgreSQL's first day and instant: 4714-11-24 BC, -4713 in Spark's years. The
# zone fixes a TimestampType's instant (a TimestampNTZType ignores it); a timestamp without time
# zone column is thus judged in UTC, the project's time zone. PostgreSQL's timestamps end in
# 294276, after Spark's (294247): only dates can be too late.
FIRST_INSTANT = "-4713-11-24T00:00:00Z"
FIRST_DAY, LAST_DAY = "-4713-11-24", "5874897-12-31"
EXACT = Context(prec=4000)  # numeric bounds have up to 2001 digits (precision 1000, scale -1000..1000)


def refusals(sink_name: str, columns: Sequence[ColumnType], schema: StructType) -> list[Column]:
    """For each check that applies to a column present in the rows' schema, an expression that
    is NULL when the value passes, else `sink <sink>: column <column>: <problem>`."""
    types = {f.name: f.dataType for f in schema.fields}
    return [F.when(refused, F.concat(F.lit(f"sink {sink_name}: column {c.name}: "), problem))
            for c in columns if c.name in types
            for refused, problem in _problems(c, F.col("`" + c.name.replace("`", "``") + "`"), types[c.name])
            if refused is not None]


def first_refusal(checks: Sequence[Column]) -> Column:
    """The first reason among the checks; NULL when the row passes them all."""
    return F.coalesce(*checks) if checks else F.lit(None).cast("string")


def _problems(c: ColumnType, value: Column, t: DataType) -> Iterator[tuple[Column | None, Column]]:
    """(refused, problem) for each check of column c that values of Spark type t can fail;
    refused is None when no value of t can."""
    shown = value.cast("string")
    if c.not_null:
        yield value.isNull(), F.lit("null in a NOT NULL column")
    if c.base in TEXT and isinstance(t, StringType):
        yield value.contains("\x00"), F.lit("contains NUL (0x00)")
        if c.max_length is not None:
            # Both count characters; spaces past the limit are cut off, not refused.
            yield (F.length(F.rtrim(value)) > c.max_length,
                   F.concat(F.length(value).cast("string"), F.lit(f" characters, longer than {c.type}")))
    elif c.base in INTEGER_BITS:
        low, high = -2 ** (INTEGER_BITS[c.base] - 1), 2 ** (INTEGER_BITS[c.base] - 1) - 1
        if type(t) in FLOAT_DIGITS:
            # rint rounds ties to even (the highest is odd, the lowest even); NaN is refused
            # too, and Spark orders it above every number.
            refused = (value >= float(high) + 0.5) | (value < float(low) - 0.5)
        else:  # numeric rounds ties away from zero
            refused = _beyond(value, t, Decimal(low) - Decimal("0.5"), Decimal(high) + Decimal("0.5"))
        yield refused, F.concat(shown, F.lit(f" is out of range for {c.type}"))
    elif c.base == "numeric" and c.precision is not None:
        # Rounded to the scale (ties away from zero), it must stay under 10^(precision - scale).
        limit = EXACT.subtract(Decimal(f"1e{c.precision - c.scale}"), Decimal(f"5e{-c.scale - 1}"))
        if type(t) in FLOAT_DIGITS:
            # between, not >=: NaN is stored, and Spark orders it above +Infinity (refused).
            refused = F.abs(value).between(_least_float_reaching(limit, FLOAT_DIGITS[type(t)]), math.inf)
        else:
            refused = _beyond(value, t, -limit, limit)
        yield refused, F.concat(shown, F.lit(f" does not fit {c.type}"))
    elif c.base == "float4" and isinstance(t, DoubleType):  # decimals and integers always fit
        magnitude = F.abs(value)  # between: NaN passes
        yield (magnitude.between(REAL_OVERFLOW, sys.float_info.max) | magnitude.between(math.ulp(0.0), REAL_UNDERFLOW),
               F.concat(shown, F.lit(f" is out of range for {c.type}")))
    elif c.base in ("timestamp", "timestamptz") and isinstance(t, (TimestampType, TimestampNTZType)):
        yield (value < F.lit(FIRST_INSTANT).cast(t),
               F.concat(shown, F.lit(" is outside PostgreSQL's timestamp range (-4713-11-24 to 294276-12-31)")))
    elif c.base == "date" and isinstance(t, DateType):
        yield ((value < F.lit(FIRST_DAY).cast(t)) | (value > F.lit(LAST_DAY).cast(t)),
               F.concat(shown, F.lit(f" is outside PostgreSQL's date range ({FIRST_DAY} to {LAST_DAY})")))


def _beyond(value: Column, t: DataType, low: Decimal, high: Decimal) -> Column | None:
    """value <= low or value >= high, exactly, for an integral or decimal type t (else None, as
    when no value of t gets there). The bounds move onto the values' grid (10^-scale) and are
    compared as t: Spark would widen two different decimal types, rounding past 38 digits."""
    if isinstance(t, DecimalType):
        scale, lowest, highest = t.scale, 1 - 10 ** t.precision, 10 ** t.precision - 1
    elif type(t) in SPARK_INTEGER_BITS:
        scale, highest = 0, 2 ** (SPARK_INTEGER_BITS[type(t)] - 1) - 1
        lowest = -highest - 1
    else:
        return None
    below = int(EXACT.scaleb(low, scale).to_integral_value(ROUND_FLOOR))
    above = int(EXACT.scaleb(high, scale).to_integral_value(ROUND_CEILING))

    def bound(steps: int) -> Column:
        return F.lit(EXACT.scaleb(Decimal(steps), -scale)).cast(t)

    checks = [value >= bound(above)] if above <= highest else []
    checks += [value <= bound(below)] if below >= lowest else []
    return reduce(Column.__or__, checks) if checks else None


def _least_float_reaching(limit: Decimal, digits: int) -> float:
    """The least double that PostgreSQL, keeping `digits` significant digits (rounded as
    printf does: to nearest, ties to even), turns into a decimal >= limit (inf if none)."""
    to_digits = Context(prec=digits, rounding=ROUND_CEILING)
    reached = to_digits.plus(limit)  # the least decimal of that many digits >= limit
    x = float(EXACT.divide(EXACT.add(reached, to_digits.next_minus(reached)), 2))  # halfway from the one before
    if Decimal(f"{x:.{digits - 1}e}") < limit:  # the nearest double is under halfway, or on it, rounding down
        x = math.nextafter(x, math.inf)
    return x
