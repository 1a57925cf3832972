"""Transforms named in the test pipelines' configuration ("module:function")."""

from pyspark.sql import DataFrame, functions as F


def measures(rows: DataFrame) -> DataFrame:
    """The harness pipeline's aggregate measures, each folded from `n`."""
    return rows.withColumns({"total": F.col("n"), "smallest": F.col("n"), "largest": F.col("n")})
