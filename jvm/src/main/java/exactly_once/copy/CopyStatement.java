package exactly_once.copy;

import java.io.Serializable;
import java.time.ZoneId;
import java.time.ZoneOffset;
import java.util.Properties;

import org.apache.spark.sql.catalyst.util.DateTimeUtils;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * One COPY of a frame's rows into a table: where, as whom, each column's target type, the
 * Spark session time zone its datetimes are shown in (read on the driver: an executor's
 * SQLConf is not the session's, and its JVM's zone is none of the writer's business), and
 * optionally the column that gets each row's Spark task attempt ({@code taskColumn}) and the
 * staged rows' settlement once the job commits ({@code settlement}).
 */
record CopyStatement(String url, String user, String password, String table, StructType schema, String[] targets,
                     String timeZone, String taskColumn, Settlement settlement, boolean binary) implements Serializable {

  static CopyStatement of(StructType schema, CaseInsensitiveStringMap options) {
    String[] targets = required(options, "targets").split(",", -1);
    if (targets.length != schema.fields().length) {
      throw new IllegalArgumentException("exactly_once_copy: " + targets.length + " targets for "
          + schema.fields().length + " columns");
    }
    Settlement settlement = Settlement.of(options);
    String taskColumn = options.get("task_column");
    if (settlement != null && taskColumn == null) {
      throw new IllegalArgumentException("exactly_once_copy settles staged rows by their task_column: name it");
    }
    CopyStatement statement = new CopyStatement(required(options, "url"), required(options, "user"),
        options.getOrDefault("password", ""), required(options, "table"), schema, targets,
        SQLConf.get().sessionLocalTimeZone(), taskColumn, settlement,
        BinaryRow.of(schema, targets, ZoneOffset.UTC, false) != null);
    statement.rowFormat(); // refuses a column it cannot render before any task runs
    return statement;
  }

  static String required(CaseInsensitiveStringMap options, String name) {
    String value = options.get(name);
    if (value == null || value.isEmpty()) {
      throw new IllegalArgumentException("exactly_once_copy needs the option " + name);
    }
    return value;
  }

  /** Binary where it carries every column (BinaryRow), else text. */
  RowFormat rowFormat() {
    ZoneId zone = DateTimeUtils.getZoneId(timeZone);
    return binary ? BinaryRow.of(schema, targets, zone, taskColumn != null)
        : new TextRow(schema, targets, zone, taskColumn != null);
  }

  String sql() {
    StringBuilder sql = new StringBuilder("COPY ").append(table).append(" (");
    StructField[] fields = schema.fields();
    for (int i = 0; i < fields.length; i++) {
      sql.append(i == 0 ? "" : ", ").append(quoted(fields[i].name()));
    }
    if (taskColumn != null) {
      sql.append(", ").append(quoted(taskColumn));
    }
    return sql.append(binary ? ") FROM STDIN (FORMAT binary)" : ") FROM STDIN").toString();
  }

  private static String quoted(String name) {
    return '"' + name.replace("\"", "\"\"") + '"';
  }

  Properties login() {
    Properties login = new Properties();
    login.setProperty("user", user);
    login.setProperty("password", password);
    return login;
  }

  @Override
  public String toString() { // never the password
    return (binary ? "binary COPY into " : "COPY into ") + table;
  }
}
