package exactly_once.copy;

import java.math.BigDecimal;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.stream.IntStream;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.TypeUtils;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StructType;

import scala.math.Ordering;

/**
 * An aggregate sink's rows in a task: one per key (the fields whose role is {@code key}), each
 * other field folded by its role as the sink's Spark aggregate folds it: {@code count} the
 * rows, {@code sum}, {@code min}, {@code max} the field's non-null values (null if none; a sum
 * in the output's type, Spark's: a long, a decimal ten digits wider, a double, failing where
 * Spark's ANSI sum fails on overflow, here of the task's rows: a sum that overflows only over
 * the checkpoint's fails at its commit, whose refusal has every sink promoted on trial from then
 * on), {@code same} a value every row has (the rows' tag).
 */
final class Folds implements KeyedRows {
  private final String[] roles;
  private final DataType[] inputs;
  private final DataType[] outputs;
  private final Ordering<Object>[] orderings;
  private final int[] keys;
  private final DataType[] keyTypes;
  private final Map<GenericInternalRow, Object[]> folded = new HashMap<>();

  @SuppressWarnings("unchecked")
  Folds(StructType input, StructType output, String[] roles) {
    if (output.fields().length != roles.length) {
      throw new IllegalArgumentException("an aggregate's output " + output + " is not its input's fields " + input);
    }
    this.roles = roles;
    inputs = KeyedRows.typesOf(input, IntStream.range(0, roles.length).toArray());
    outputs = KeyedRows.typesOf(output, IntStream.range(0, roles.length).toArray());
    orderings = new Ordering[roles.length];
    for (int i = 0; i < roles.length; i++) {
      switch (roles[i]) {
        case "min", "max" -> orderings[i] = TypeUtils.getInterpretedOrdering(inputs[i]);
        case "sum" -> requireSum(inputs[i], outputs[i]);
        case "count" -> require(outputs[i] instanceof LongType, "a count is a long, not " + outputs[i]);
        case "key", "same" -> { }
        default -> throw new IllegalArgumentException("no fold " + roles[i]);
      }
    }
    keys = KeyedRows.fieldsOf(roles, "key");
    keyTypes = KeyedRows.keyTypes(input, keys);
  }

  @Override
  public void add(InternalRow row) {
    GenericInternalRow key = KeyedRows.key(row, keys, keyTypes, false);
    Object[] values = folded.get(key);
    boolean first = values == null;
    if (first) {
      values = new Object[roles.length];
      folded.put(KeyedRows.key(row, keys, keyTypes, true), values);
    }
    for (int i = 0; i < roles.length; i++) {
      String role = roles[i];
      if (role.equals("count")) {
        values[i] = (first ? 0L : (Long) values[i]) + 1;
        continue;
      }
      boolean firstRowsOnly = role.equals("key") || role.equals("same");
      if (row.isNullAt(i) || firstRowsOnly && !first) {
        continue;
      }
      Object value = KeyedRows.value(row, i, inputs[i], true);
      values[i] = switch (role) {
        case "sum" -> values[i] == null ? widened(value, i) : plus(values[i], value, i);
        case "min" -> values[i] == null || orderings[i].compare(value, values[i]) < 0 ? value : values[i];
        case "max" -> values[i] == null || orderings[i].compare(value, values[i]) > 0 ? value : values[i];
        default -> value; // a key's or a same field's, of the group's first row
      };
    }
  }

  @Override
  public int keys() {
    return folded.size();
  }

  @Override
  public Iterator<InternalRow> rows() {
    return folded.values().stream().map(values -> (InternalRow) new GenericInternalRow(output(values))).iterator();
  }

  private Object[] output(Object[] values) {
    Object[] row = values.clone();
    for (int i = 0; i < row.length; i++) {
      if (row[i] instanceof BigDecimal sum && outputs[i] instanceof DecimalType type) {
        // fails as Spark's ANSI sum does where the sum has more digits than the type holds
        row[i] = Decimal.apply(sum, type.precision(), type.scale());
      }
    }
    return row;
  }

  private Object widened(Object value, int field) {
    if (outputs[field] instanceof LongType) {
      return ((Number) value).longValue();
    }
    if (outputs[field] instanceof DoubleType) {
      return 0.0d + ((Number) value).doubleValue(); // Spark's sum starts at 0.0: -0.0 alone sums to 0.0
    }
    return ((Decimal) value).toJavaBigDecimal();
  }

  private Object plus(Object sum, Object value, int field) {
    if (sum instanceof Long held) {
      return Math.addExact(held, ((Number) value).longValue());
    }
    if (sum instanceof Double held) {
      return held + ((Number) value).doubleValue();
    }
    return ((BigDecimal) sum).add(((Decimal) value).toJavaBigDecimal());
  }

  private static void requireSum(DataType input, DataType output) {
    boolean integral = input instanceof ByteType || input instanceof ShortType || input instanceof IntegerType
        || input instanceof LongType;
    require(integral && output instanceof LongType
        || (input instanceof FloatType || input instanceof DoubleType) && output instanceof DoubleType
        || input instanceof DecimalType && output instanceof DecimalType, "no sum of " + input + " as " + output);
  }

  private static void require(boolean holds, String otherwise) {
    if (!holds) {
      throw new IllegalArgumentException(otherwise);
    }
  }
}
