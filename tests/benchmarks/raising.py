"""The isolation benchmark's transform (tests/benchmarks/isolation.py): the demo's `prepare`
with the revenue from a Python UDF that raises on an order whose id begins with 'raise-', as a
user's UDF raises on a record it cannot handle. With EXACTLY_ONCE_BENCH_UDF_SECONDS in the
job's environment, the UDF takes that long an order, as one calling a model or a service does.
"""

import os
import time

from pyspark.sql.functions import udf
from pyspark.sql.types import DecimalType

MARK = "raise-"
SECONDS = float(os.environ.get("EXACTLY_ONCE_BENCH_UDF_SECONDS", "0"))


def line_revenue(order_id, qty, price):  # no type hints: they would make it a pandas UDF
    if SECONDS:
        time.sleep(SECONDS)
    if order_id.startswith(MARK):
        raise ValueError(f"cannot price order {order_id}")
    return None if qty is None or price is None else qty * price


revenue = udf(line_revenue, DecimalType(22, 2))


def prepare_raising(rows):
    from pyspark.sql import functions as F

    return rows.withColumns({"minute": F.date_trunc("minute", "ts"), "revenue": revenue("order_id", "qty", "price")})
