package exactly_once.copy;

import java.io.Serializable;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.List;

import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.postgresql.Driver;

/**
 * A staging write settled by the driver once Spark commits the job: only the rows of the task
 * attempts whose commit messages reached it count. An attempt that committed its COPY and then
 * failed (its executor lost before the driver heard of it) leaves rows that its retry writes
 * again; the ledger's {@code exactly_once.settle_staged} deletes them by the task column and
 * checks that the committed attempts' rows are what their messages say was written (an attempt
 * committing after this adds rows pre-commit's count finds).
 * Options: {@code checkpoint_id}, {@code attempt} (the rows' tag), {@code token} (the attempt's).
 */
record Settlement(long checkpoint, int tag, String token) implements Serializable {
  private static final String SETTLE = "SELECT exactly_once.settle_staged(?::regclass, ?, ?, ?, ?, ?)";

  static Settlement of(CaseInsensitiveStringMap options) {
    String token = options.get("token");
    if (token == null) {
      return null;
    }
    return new Settlement(Long.parseLong(CopyStatement.required(options, "checkpoint_id")),
        Integer.parseInt(CopyStatement.required(options, "attempt")), token);
  }

  /** Keeps the table's rows of the tag that these committed task attempts wrote. */
  void settle(CopyStatement statement, List<CopyWriter.Written> committed) {
    Long[] tasks = committed.stream().map(CopyWriter.Written::task).toArray(Long[]::new);
    long rows = committed.stream().mapToLong(CopyWriter.Written::rows).sum();
    try (Connection connection = new Driver().connect(statement.url(), statement.login());
         PreparedStatement settle = connection.prepareStatement(SETTLE)) {
      settle.setString(1, statement.table());
      settle.setLong(2, checkpoint);
      settle.setInt(3, tag);
      settle.setString(4, token);
      settle.setArray(5, connection.createArrayOf("bigint", tasks));
      settle.setLong(6, rows);
      settle.execute();
    } catch (SQLException failed) {
      throw new IllegalStateException(statement + ": settling the rows of checkpoint " + checkpoint + " tag " + tag
          + " failed (SQLSTATE " + failed.getSQLState() + "): " + failed.getMessage(), failed);
    }
  }
}
