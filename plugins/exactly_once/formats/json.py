"""json: a value is a JSON object; every field of the schema is required and must fit its type."""

from __future__ import annotations

from collections.abc import Mapping


class Json:
    def parse(self, records, schema: Mapping[str, str]):
        from pyspark.sql import functions as F

        parsed = F.from_json(F.col("value").cast("string"), ", ".join(f"`{c}` {t}" for c, t in schema.items()))
        # A field that is missing or does not fit its type comes back null.
        misfits = [F.when(F.col("parsed").getField(c).isNull(), F.lit(f"{c}: missing or not {t}"))
                   for c, t in schema.items()]
        reason = (F.when(F.col("value").isNull(), F.lit("value is null"))
                  .when(F.expr("try_parse_json(CAST(value AS STRING)) IS NULL"), F.lit("value is not valid JSON"))
                  .otherwise(F.concat(F.lit("does not fit the schema: "), F.concat_ws("; ", *misfits))))
        fits = F.lit(True)
        for c in schema:
            fits = fits & F.col("parsed").getField(c).isNotNull()
        return (records.withColumn("parsed", parsed)
                .withColumn("reason", F.when(fits, F.lit(None).cast("string")).otherwise(reason)))


FORMAT = Json()
