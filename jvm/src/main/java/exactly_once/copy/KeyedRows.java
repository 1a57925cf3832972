package exactly_once.copy;

import java.util.Arrays;
import java.util.Iterator;
import java.util.stream.IntStream;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * One Spark task's rows of a keyed table folded per key in the task (Folds, Newest), written
 * when the task commits, or each time the task holds {@code TablesWriter}'s limit of keys (a
 * map that spills nothing must not grow with the task's keys): the staged rows a keyed sink's
 * Spark aggregate would make, each task's (and each flush's) apart. The commit's SQL folds a
 * checkpoint's staged rows per key again, so several rows of one key are what it already takes.
 * A key is compared by its bytes, as Spark groups values whose equality is binary: no float or
 * double (Spark groups -0.0 with 0.0, and every NaN), no string of a collation that is not.
 */
sealed interface KeyedRows permits Folds, Newest {

  /** A row of the table's input struct. */
  void add(InternalRow row);

  /** The folded rows, in the output schema. */
  Iterator<InternalRow> rows();

  /** How many keys it holds. */
  int keys();

  /** The folding for a table whose input fields have these roles, or null if none do. */
  static KeyedRows of(StructType input, StructType output, String[] roles) {
    if (roles.length != input.fields().length) {
      throw new IllegalArgumentException(roles.length + " roles for " + input.fields().length + " fields");
    }
    for (String role : roles) {
      if (role.equals("order")) {
        return new Newest(input, roles);
      }
    }
    return new Folds(input, output, roles);
  }

  /** The key fields' values of a row, a key of a hash map (values copied where a row's bytes are reused). */
  static GenericInternalRow key(InternalRow row, int[] keys, DataType[] types, boolean copied) {
    Object[] values = new Object[keys.length];
    for (int i = 0; i < keys.length; i++) {
      values[i] = value(row, keys[i], types[i], copied);
    }
    return new GenericInternalRow(values);
  }

  static Object value(InternalRow row, int field, DataType type, boolean copied) {
    Object value = row.isNullAt(field) ? null : row.get(field, type);
    return copied && value instanceof UTF8String text ? text.clone() : value;
  }

  static int[] fieldsOf(String[] roles, String role) {
    return IntStream.range(0, roles.length).filter(i -> roles[i].equals(role)).toArray();
  }

  static DataType[] typesOf(StructType schema, int[] fields) {
    StructField[] all = schema.fields();
    return Arrays.stream(fields).mapToObj(i -> all[i].dataType()).toArray(DataType[]::new);
  }

  /** The key fields' types, each one whose values are equal only when their bytes are. */
  static DataType[] keyTypes(StructType input, int[] keys) {
    DataType[] types = typesOf(input, keys);
    for (DataType type : types) {
      if (type instanceof FloatType || type instanceof DoubleType
          || type instanceof StringType text && !text.supportsBinaryEquality()) {
        throw new IllegalArgumentException("a key of " + type.simpleString() + " is not folded in a task");
      }
    }
    return types;
  }
}
