"""string: the column is UTF-8 text, the one field of its schema (e.g. a key `{"customer": "string"}`)."""

from __future__ import annotations


class String:
    needs_registry = False

    def decode(self, records, encoded):
        from pyspark.sql import functions as F

        (name, spark_type), = encoded.schema.items()  # the configuration checks it is one string field
        text = F.col(encoded.column).cast("string")
        utf8 = F.expr(f"is_valid_utf8(CAST({encoded.column} AS STRING))")
        return (F.struct(text.alias(name)),
                lambda fields: F.when(~utf8, F.lit(f"{encoded.column} is not valid UTF-8"))
                .otherwise(F.lit(None).cast("string")))

    def problems(self, encoded):
        return []


FORMAT = String()
