package exactly_once.copy;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

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
public final class CopySource implements TableProvider, DataSourceRegister {

  @Override
  public String shortName() {
    return "exactly_once_copy";
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true; // the frame's schema is the table's: nothing is read to infer it
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    throw new UnsupportedOperationException("exactly_once_copy only writes: it has no schema to infer");
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new CopyTable(schema);
  }

  private record CopyTable(StructType schema) implements SupportsWrite {
    @Override
    public String name() {
      return "exactly_once_copy";
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_WRITE);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
      CopyStatement statement = CopyStatement.of(info.schema(), info.options());
      return new WriteBuilder() {
        @Override
        public Write build() {
          return new Write() {
            @Override
            public BatchWrite toBatch() {
              return new CopyBatch(statement);
            }
          };
        }
      };
    }
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
        statement.settlement().settle(statement, messages);
      }
    }

    @Override
    public void abort(WriterCommitMessage[] messages) {
      // The tasks that committed leave rows tagged with their attempt, which the attempt's
      // abort deletes (exactly_once.ledger); the others rolled back.
    }
  }
}
