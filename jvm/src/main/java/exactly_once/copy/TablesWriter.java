package exactly_once.copy;

import java.io.IOException;
import java.util.Iterator;
import java.util.List;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;

/**
 * One Spark task attempt's rows of every table of a write: field i of each row is table i's
 * row (a struct), streamed by its own COPY as it comes or folded per key and written when the
 * task commits or holds {@code maxFoldedKeys} keys (KeyedRows). Each table's COPY is a CopyWriter's, one transaction each, committed in the
 * tables' order; an attempt that fails between two leaves rows of its task attempt in the first,
 * which the job's settlement deletes (its message never reached the driver).
 */
final class TablesWriter implements DataWriter<InternalRow> {
  private final List<PassTable> tables;
  private final CopyWriter[] writers;
  private final KeyedRows[] folds;
  private final long task;
  private final int maxFoldedKeys;

  TablesWriter(List<PassTable> tables, int maxFoldedKeys, long task) {
    this.tables = tables;
    this.maxFoldedKeys = maxFoldedKeys;
    this.task = task;
    writers = new CopyWriter[tables.size()];
    folds = new KeyedRows[tables.size()];
    for (int i = 0; i < writers.length; i++) {
      writers[i] = new CopyWriter(tables.get(i).statement(), task);
      folds[i] = tables.get(i).folding();
    }
  }

  @Override
  public void write(InternalRow row) throws IOException {
    for (int i = 0; i < writers.length; i++) {
      if (row.isNullAt(i)) {
        continue;
      }
      InternalRow own = row.getStruct(i, tables.get(i).input().size());
      if (folds[i] == null) {
        writers[i].write(own);
      } else {
        folds[i].add(own);
        if (folds[i].keys() >= maxFoldedKeys) {
          flush(i);
        }
      }
    }
  }

  @Override
  public WriterCommitMessage commit() throws IOException {
    long[] rows = new long[writers.length];
    for (int i = 0; i < writers.length; i++) {
      if (folds[i] != null) {
        flush(i);
      }
      rows[i] = writers[i].commitCopy().rows();
    }
    Faults.point("copy.after_task_commit"); // every table's COPY committed
    return new Written(task, rows);
  }

  /** Writes table i's folded rows, and folds its next rows afresh. */
  private void flush(int i) throws IOException {
    for (Iterator<InternalRow> folded = folds[i].rows(); folded.hasNext(); ) {
      writers[i].write(folded.next());
    }
    folds[i] = tables.get(i).folding();
  }

  @Override
  public void abort() throws IOException {
    everyWriter(CopyWriter::abort);
  }

  @Override
  public void close() throws IOException {
    everyWriter(CopyWriter::close);
  }

  /** The step on every table's writer, each tried whatever the others did; the first failure raised. */
  private void everyWriter(Step step) throws IOException {
    IOException first = null;
    for (CopyWriter writer : writers) {
      try {
        step.on(writer);
      } catch (IOException failed) {
        first = first == null ? failed : first;
      }
    }
    if (first != null) {
      throw first;
    }
  }

  private interface Step {
    void on(CopyWriter writer) throws IOException;
  }

  /** How many rows the task attempt (Spark's task id) committed to each table. */
  record Written(long task, long[] rows) implements WriterCommitMessage {}
}
