package exactly_once.copy;

import java.util.Arrays;
import java.util.Map;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.types.StructType;

/**
 * {@code frame.write.format("exactly_once_copy").mode("append")}: appends the frame's rows to a
 * PostgreSQL table with COPY, each Spark task in one transaction of its own (CopyWriter).
 * Options: {@code url}, {@code user}, {@code password} (pgjdbc's), {@code table} (quoted SQL),
 * {@code targets} (each column's PostgreSQL base type, comma-separated, in the frame's order:
 * how a value is rendered depends on the column it goes to, see TextRow).
 *
 * <p>Append only. With {@code task_column}, each row also gets the id of the Spark task attempt
 * that wrote it; with {@code checkpoint_id}, {@code attempt} and {@code token} too, the write is
 * settled when Spark commits the job (Settlement): only the rows of the task attempts Spark
 * committed stay, so a task run again after it committed its COPY adds nothing (one committing
 * after the settlement adds rows pre-commit's count finds).
 */
public final class CopySource extends WriteOnlySource {

  @Override
  public String shortName() {
    return "exactly_once_copy";
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new WriteOnlyTable(shortName(), schema, info -> new CopyBatch(CopyStatement.of(info.schema(), info.options())));
  }

  /** Sent to the executors: a writer per task. */
  private record CopyWriters(CopyStatement statement) implements DataWriterFactory {
    @Override
    public DataWriter<InternalRow> createWriter(int partition, long taskId) {
      return new CopyWriter(statement, taskId);
    }
  }

  private record CopyBatch(CopyStatement statement) implements BatchWrite {
    @Override
    public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
      return new CopyWriters(statement);
    }

    @Override
    public void commit(WriterCommitMessage[] messages) {
      // Each task committed its own transaction; the job's messages say which count.
      if (statement.settlement() != null) {
        statement.settlement().settle(statement, Arrays.stream(messages).map(m -> (CopyWriter.Written) m).toList());
      }
    }

    @Override
    public void abort(WriterCommitMessage[] messages) {
      // The tasks that committed leave rows tagged with their attempt, which the attempt's
      // abort deletes (exactly_once.ledger); the others rolled back.
    }
  }
}
