package exactly_once.copy;

import java.io.IOException;
import java.sql.SQLException;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.postgresql.Driver;
import org.postgresql.PGConnection;
import org.postgresql.copy.PGCopyOutputStream;
import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

/**
 * One Spark task attempt's rows, streamed to PostgreSQL by COPY (binary or text: RowFormat) and committed in
 * one transaction when Spark lets the attempt commit: a failed or aborted attempt leaves no row
 * behind, unless it fails after its commit (then its rows carry its task attempt's id in the
 * statement's task column, and the job's Settlement deletes them).
 */
final class CopyWriter implements DataWriter<InternalRow> {
  private static final int BUFFER_BYTES = 1 << 20;

  private final CopyStatement statement;
  private final RowFormat format;
  private final Line line = new Line();
  private final long task;
  private java.sql.Connection connection;
  private PGCopyOutputStream copy;
  private long rows;

  CopyWriter(CopyStatement statement, long task) {
    this.statement = statement;
    this.format = statement.rowFormat();
    this.task = task;
  }

  @Override
  public void write(InternalRow row) throws IOException {
    if (copy == null) {
      open();
    }
    line.reset();
    format.render(row, task, line);
    send(line.bytes(), line.size());
    rows++;
  }

  @Override
  public WriterCommitMessage commit() throws IOException {
    Written written = commitCopy();
    Faults.point("copy.after_task_commit");
    return written;
  }

  /** Ends the COPY and commits its transaction: the rows written. */
  Written commitCopy() throws IOException {
    if (copy != null) {
      send(format.trailer(), format.trailer().length);
      try {
        copy.endCopy();
        connection.commit();
      } catch (SQLException failed) {
        throw refused(failed);
      }
    }
    return new Written(task, rows);
  }

  @Override
  public void abort() throws IOException {
    if (connection == null) {
      return;
    }
    try {
      if (copy != null && copy.isActive()) {
        copy.cancelCopy();
      }
      connection.rollback();
    } catch (SQLException failed) {
      throw new IOException(statement + ": abort failed", failed); // closing the connection rolls back
    }
  }

  @Override
  public void close() throws IOException {
    if (connection != null) {
      try {
        connection.close();
      } catch (SQLException failed) {
        throw new IOException(statement + ": close failed", failed);
      }
    }
  }

  private void open() throws IOException {
    try {
      // pgjdbc's Driver itself, not DriverManager: Spark adds the jars to a class loader
      // DriverManager does not search.
      connection = new Driver().connect(statement.url(), statement.login());
      if (connection == null) {
        throw new SQLException("not a PostgreSQL JDBC URL");
      }
      connection.setAutoCommit(false);
      copy = new PGCopyOutputStream(connection.unwrap(PGConnection.class), statement.sql(), BUFFER_BYTES);
    } catch (SQLException failed) {
      throw new IOException(statement + ": " + failed.getMessage(), failed);
    }
    send(format.header(), format.header().length);
  }

  private void send(byte[] bytes, int length) throws IOException {
    try {
      copy.write(bytes, 0, length);
    } catch (IOException failed) {
      throw refused(failed);
    }
  }

  /**
   * The failure as Spark reports it: PostgreSQL's SQLSTATE and primary message in the text,
   * which is all a Spark Connect client receives (exactly_once.connect_errors reads it), and
   * pgjdbc's exception as the cause, which py4j's clients ask. Never the row's values beyond
   * what the primary message says (COPY's context line quotes the whole value).
   */
  private IOException refused(Exception failed) {
    for (Throwable cause = failed; cause != null; cause = cause.getCause()) {
      if (cause instanceof PSQLException refusal) {
        ServerErrorMessage server = refusal.getServerErrorMessage();
        String message = server == null ? refusal.getMessage() : server.getMessage();
        return new IOException("PostgreSQL refused " + statement + " (SQLSTATE " + refusal.getSQLState() + "): "
            + message, refusal);
      }
    }
    return failed instanceof IOException io ? io : new IOException(statement + ": " + failed.getMessage(), failed);
  }

  /** How many rows the task attempt (Spark's task id) committed. */
  record Written(long task, long rows) implements WriterCommitMessage {}
}
