"""json: a value is a JSON object in UTF-8; every field of the schema is required and must fit its type.
The key is never decoded: it is kept as bytes (in the dead letters too)."""

from __future__ import annotations

from collections.abc import Mapping


class Json:
    def parse(self, records, schema: Mapping[str, str]):
        from pyspark.sql import functions as F

        parsed = F.from_json(F.col("value").cast("string"), ", ".join(f"`{c}` {t}" for c, t in schema.items()))
        # A field that is missing or does not fit its type comes back null.
        misfits = [F.when(F.col("parsed").getField(c).isNull(), F.lit(f"{c}: missing or not {t}"))
                   for c, t in schema.items()]
        # Spark reads bytes that are not UTF-8 as U+FFFD, which would store a value the
        # producer never wrote: such a value is a bad record, kept as its bytes.
        utf8 = F.expr("is_valid_utf8(CAST(value AS STRING))")
        reason = (F.when(F.col("value").isNull(), F.lit("value is null"))
                  .when(~utf8, F.lit("value is not valid UTF-8"))
                  .when(F.expr("try_parse_json(CAST(value AS STRING)) IS NULL"), F.lit("value is not valid JSON"))
                  .otherwise(F.concat(F.lit("does not fit the schema: "), F.concat_ws("; ", *misfits))))
        fits = utf8
        for c in schema:
            fits = fits & F.col("parsed").getField(c).isNotNull()
        return (records.withColumn("parsed", parsed)
                .withColumn("reason", F.when(fits, F.lit(None).cast("string")).otherwise(reason)))


FORMAT = Json()
