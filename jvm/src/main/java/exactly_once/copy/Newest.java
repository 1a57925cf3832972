package exactly_once.copy;

import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.stream.IntStream;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.TypeUtils;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;

import scala.math.Ordering;

/**
 * An upsert sink's rows in a task: per key (the fields whose role is {@code key}), the row
 * highest in its {@code order} field (a struct, compared as Spark compares it, as
 * {@code max_by} does), written without that field; ties keep the first. Every other field
 * (role {@code value}, or {@code same}: the tag) is the newest row's.
 */
final class Newest implements KeyedRows {
  private final int[] keys;
  private final DataType[] keyTypes;
  private final int order;
  private final int[] written;
  private final DataType[] types;
  private final StructType orderType;
  private final Ordering<Object> ordering;
  private final Map<GenericInternalRow, InternalRow> newest = new HashMap<>();

  Newest(StructType input, String[] roles) {
    keys = KeyedRows.fieldsOf(roles, "key");
    keyTypes = KeyedRows.keyTypes(input, keys);
    int[] orders = KeyedRows.fieldsOf(roles, "order");
    if (orders.length != 1 || !(input.fields()[orders[0]].dataType() instanceof StructType)) {
      throw new IllegalArgumentException("an upsert's input has one order field, a struct: " + input);
    }
    order = orders[0];
    orderType = (StructType) input.fields()[order].dataType();
    ordering = TypeUtils.getInterpretedOrdering(orderType);
    written = IntStream.range(0, roles.length).filter(i -> i != order).toArray();
    types = KeyedRows.typesOf(input, written);
  }

  @Override
  public void add(InternalRow row) {
    GenericInternalRow key = KeyedRows.key(row, keys, keyTypes, false);
    InternalRow held = newest.get(key);
    if (held == null || ordering.compare(row.getStruct(order, orderType.size()),
                                         held.getStruct(order, orderType.size())) > 0) {
      newest.put(held == null ? KeyedRows.key(row, keys, keyTypes, true) : key, row.copy());
    }
  }

  @Override
  public int keys() {
    return newest.size();
  }

  @Override
  public Iterator<InternalRow> rows() {
    return newest.values().stream().map(row -> (InternalRow) new GenericInternalRow(
        IntStream.range(0, written.length).mapToObj(i -> KeyedRows.value(row, written[i], types[i], false))
            .toArray())).iterator();
  }
}
