package exactly_once.copy;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.IntStream;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code frame.write.format("exactly_once_copy_tables").mode("append")}: several tables' rows
 * from one Spark job, so that the rows are computed once. Column i of the frame is a struct,
 * table i's row or null (PassTable has each table's options); the options besides are
 * {@code exactly_once_copy}'s (CopySource), the staging tag and settlement included, which
 * settles each table apart, {@code write_id} and {@code max_folded_keys} (TablesWriter). Each
 * task holds a connection per table it writes. When Spark commits the job, the session's configuration
 * {@code exactly_once.copy_tables.rows.<write_id>} gets the rows the committed task attempts
 * wrote to each table, comma-separated in the tables' order: what a Python client, over Spark
 * Connect too, reads back, as an Observation cannot count rows folded in the tasks.
 */
public final class TablesSource extends WriteOnlySource {
  static final String ROWS = "exactly_once.copy_tables.rows.";
  // A fold's keys a task holds before it writes them: about 20 MB of an upsert's rows like the demo's.
  private static final String MAX_FOLDED_KEYS = "65536";

  @Override
  public String shortName() {
    return "exactly_once_copy_tables";
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new WriteOnlyTable(shortName(), schema, info -> {
      StructField[] fields = info.schema().fields();
      List<PassTable> tables = new ArrayList<>();
      for (int i = 0; i < fields.length; i++) {
        if (!(fields[i].dataType() instanceof StructType input)) {
          throw new IllegalArgumentException(shortName() + ": column " + fields[i].name() + " is not a table's row");
        }
        tables.add(PassTable.of(i, input, info.options()));
      }
      return new TablesBatch(tables, Integer.parseInt(info.options().getOrDefault("max_folded_keys", MAX_FOLDED_KEYS)),
          CopyStatement.required(info.options(), "write_id"));
    });
  }

  private record TablesWriters(List<PassTable> tables, int maxFoldedKeys) implements DataWriterFactory {
    @Override
    public DataWriter<InternalRow> createWriter(int partition, long taskId) {
      return new TablesWriter(tables, maxFoldedKeys, taskId);
    }
  }

  private record TablesBatch(List<PassTable> tables, int maxFoldedKeys, String writeId) implements BatchWrite {
    @Override
    public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
      return new TablesWriters(tables, maxFoldedKeys);
    }

    @Override
    public void commit(WriterCommitMessage[] messages) {
      long[] rows = new long[tables.size()];
      for (int i = 0; i < tables.size(); i++) {
        List<CopyWriter.Written> committed = new ArrayList<>();
        for (WriterCommitMessage message : messages) {
          TablesWriter.Written written = (TablesWriter.Written) message;
          committed.add(new CopyWriter.Written(written.task(), written.rows()[i]));
          rows[i] += written.rows()[i];
        }
        CopyStatement statement = tables.get(i).statement();
        if (statement.settlement() != null) {
          statement.settlement().settle(statement, committed);
        }
      }
      SQLConf.get().setConfString(ROWS + writeId,
          IntStream.range(0, rows.length).mapToObj(i -> Long.toString(rows[i])).collect(Collectors.joining(",")));
    }

    @Override
    public void abort(WriterCommitMessage[] messages) {
      // As CopySource's: the committed tasks' rows carry the attempt's tag, which its abort deletes.
    }
  }
}
