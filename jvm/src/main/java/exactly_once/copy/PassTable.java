package exactly_once.copy;

import java.io.Serializable;
import java.util.HashMap;
import java.util.Map;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * One table of an {@code exactly_once_copy_tables} write: the COPY of its rows (their output
 * schema and targets) and the roles of its input struct's fields, which say whether its rows
 * are written as they come (no roles) or folded per key in each task (KeyedRows).
 * Options of table {@code i}: {@code table.i}, {@code targets.i}, {@code output.i} (the output
 * schema's JSON), {@code roles.i} (comma-separated, one per input field; none for rows as they come).
 */
record PassTable(CopyStatement statement, StructType input, String[] roles) implements Serializable {

  static PassTable of(int i, StructType input, CaseInsensitiveStringMap options) {
    String roles = options.getOrDefault("roles." + i, "");
    StructType output = roles.isEmpty() ? input
        : (StructType) DataType.fromJson(CopyStatement.required(options, "output." + i));
    Map<String, String> own = new HashMap<>(options.asCaseSensitiveMap());
    own.put("table", CopyStatement.required(options, "table." + i));
    own.put("targets", CopyStatement.required(options, "targets." + i));
    PassTable table = new PassTable(CopyStatement.of(output, new CaseInsensitiveStringMap(own)), input,
        roles.isEmpty() ? new String[0] : roles.split(",", -1));
    table.folding(); // refuses roles it cannot fold before any task runs
    return table;
  }

  /** A task's folding of the table's rows, or null when they are written as they come. */
  KeyedRows folding() {
    return roles.length == 0 ? null : KeyedRows.of(input, statement.schema(), roles);
  }
}
