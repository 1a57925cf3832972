"""json: the column is a JSON object in UTF-8; every field of the schema is required and must fit its type."""

from __future__ import annotations


class Json:
    needs_registry = False

    def decode(self, records, encoded):
        from pyspark.sql import functions as F

        text = F.col(encoded.column).cast("string")
        # Spark reads bytes that are not UTF-8 as U+FFFD, which would store a value the
        # producer never wrote: such a value is a bad record, kept as its bytes.
        utf8 = F.expr(f"is_valid_utf8(CAST({encoded.column} AS STRING))")

        def why_not(fields):
            # A field that is missing or does not fit its type comes back null.
            misfits = [F.when(fields.getField(c).isNull(), F.lit(f"{c}: missing or not {t}"))
                       for c, t in encoded.schema.items()]
            reason = (F.when(~utf8, F.lit(f"{encoded.column} is not valid UTF-8"))
                      .when(F.try_parse_json(text).isNull(), F.lit(f"{encoded.column} is not valid JSON"))
                      .otherwise(F.concat(F.lit(f"{encoded.column} does not fit the schema: "),
                                          F.concat_ws("; ", *misfits))))
            fits = utf8
            for c in encoded.schema:
                fits = fits & fields.getField(c).isNotNull()
            return F.when(fits, F.lit(None).cast("string")).otherwise(reason)

        return F.from_json(text, ", ".join(f"`{c}` {t}" for c, t in encoded.schema.items())), why_not

    def problems(self, encoded):
        return []


FORMAT = Json()
