"""The demo's Python UDF (pipeline.prepare_with_udf). A function of an importable module is
pickled by reference (cloudpickle), so a Python worker runs `line_revenue` only if it can
import this module: only the job's code archive brings it to executors."""

from pyspark.sql.functions import udf
from pyspark.sql.types import DecimalType


def line_revenue(qty, price):  # no type hints: they would make it a pandas UDF
    return None if qty is None or price is None else qty * price


revenue = udf(line_revenue, DecimalType(22, 2))
