package exactly_once.copy;

import org.apache.spark.sql.catalyst.InternalRow;

/**
 * How a COPY stream carries a frame's rows: COPY's binary format where every column's value can
 * be sent exactly as the column's type (BinaryRow), else its text format (TextRow), whose input
 * functions do the casts. The two store the same values and refuse the same rows.
 */
sealed interface RowFormat permits TextRow, BinaryRow {

  /** What the stream holds before its first row. */
  byte[] header();

  /** One whole row: its values and, with a task column, {@code task}. */
  void render(InternalRow row, long task, Line to);

  /** What the stream holds after its last row. */
  byte[] trailer();
}
