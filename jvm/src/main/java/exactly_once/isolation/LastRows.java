package exactly_once.isolation;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF3;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * Where in its records a task of the write's first pass failed (exactly_once.spark.rows_step):
 * its rows pass into a cache, where TaskFailures cannot read them, so a column of theirs notes
 * each row's Kafka coordinates as the task's last row. Record isolation's sweep then searches
 * a failed task's records after that row first, not its whole partition. (The row noted may be
 * some batches of a Python function before the one that raised: its rows not yet read when the
 * error came.)
 */
public final class LastRows {
  private LastRows() {}

  /** The LastRow of the task this thread runs while a TaskFailures job computes it; else none. */
  static final ThreadLocal<LastRow> NOTING = new ThreadLocal<>();

  private static final UDF3<String, Integer, Long, Boolean> NOTE = (topic, partition, offset) -> {
    LastRow last = NOTING.get();
    if (last != null && topic != null && partition != null && offset != null) {
      last.noted(topic, partition, offset);
    }
    return true;
  };

  /**
   * A column, true, that notes the row's coordinates (its topic, partition and offset) as its
   * task's last row when TaskFailures runs the task; a deterministic function of them, which
   * Spark computes where the column is, above the rows' transform.
   */
  public static Column noting(Column topic, Column partition, Column offset) {
    return functions.udf(NOTE, DataTypes.BooleanType).apply(topic, partition, offset);
  }
}
