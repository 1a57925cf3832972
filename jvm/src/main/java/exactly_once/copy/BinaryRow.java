package exactly_once.copy;

import java.math.BigDecimal;
import java.time.ZoneId;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.NullType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A row in COPY's binary format, which PostgreSQL reads without parsing text (1 M rows shaped
 * like the demo's orders staging rows into a staging-like table: 1.27 times the text format's
 * rows a second, tests/benchmarks/staging_write.py). Binary COPY applies no
 * cast: each value is sent as the column's own type, so only columns that take their value
 * exactly as TextRow's text would give it are carried: a string into text, varchar or char, an
 * integer into an integer no narrower or numeric, a float into real, a double into double
 * precision, a decimal, float or double into numeric (TextRow's rounding, then exact), a
 * boolean, binary into bytea, a timestamp, timestamp_ntz or date into its own kind (TextRow's
 * wall times). The column's receive function applies its type modifier (a varchar's length, a
 * numeric's precision and scale) and its domain's constraints, and refuses what the text
 * format's input function refuses (a NUL, a datetime out of range) with the same SQLSTATE;
 * invalid UTF-8 is replaced before either format sends it. A frame with any other column is
 * written as text.
 */
final class BinaryRow implements RowFormat {
  private static final byte[] HEADER = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', (byte) 0xff, '\r', '\n', 0,
      0, 0, 0, 0, 0, 0, 0, 0}; // the signature, no flags, no header extension
  private static final byte[] TRAILER = {(byte) 0xff, (byte) 0xff};
  private static final long EPOCH_MICROS = 946_684_800_000_000L; // PostgreSQL's epoch, 2000-01-01, in Unix µs
  private static final int EPOCH_DAYS = 10_957;
  // Sent for a datetime beyond what its type holds: out of range, so refused as such, and
  // never one of the values PostgreSQL reads as -infinity or infinity.
  private static final long TIMESTAMP_OUT_OF_RANGE = Long.MIN_VALUE + 1;
  private static final int DATE_OUT_OF_RANGE = Integer.MIN_VALUE + 1;
  private static final int COMPACT_DIGITS = 15; // times 1,000 still fits a long
  private static final long[] GROUP_PADDING = {1, 10, 100, 1000};
  private static final short NUMERIC_NEGATIVE = 0x4000;
  private static final short NUMERIC_NAN = (short) 0xC000;
  private static final short NUMERIC_INFINITY = (short) 0xD000;
  private static final short NUMERIC_MINUS_INFINITY = (short) 0xF000;

  /** Writes one non-null value: its length, then its bytes. */
  private interface Field {
    void write(SpecializedGetters from, int i, Line to);
  }

  private interface Integral {
    long get(SpecializedGetters from, int i);
  }

  private final Field[] fields;
  private final boolean taskColumn;

  private BinaryRow(Field[] fields, boolean taskColumn) {
    this.fields = fields;
    this.taskColumn = taskColumn;
  }

  /** The frame's rows in binary, or null if the binary format does not carry every column.
   *  {@code zone}: Spark's session time zone; {@code taskColumn}: each row ends with its task attempt's id. */
  static BinaryRow of(StructType schema, String[] targets, ZoneId zone, boolean taskColumn) {
    StructField[] columns = schema.fields();
    Field[] fields = new Field[columns.length];
    for (int i = 0; i < columns.length; i++) {
      fields[i] = field(columns[i].dataType(), targets[i], zone);
      if (fields[i] == null) {
        return null;
      }
    }
    return new BinaryRow(fields, taskColumn);
  }

  @Override
  public byte[] header() {
    return HEADER;
  }

  @Override
  public byte[] trailer() {
    return TRAILER;
  }

  @Override
  public void render(InternalRow row, long task, Line to) {
    to.putShort(fields.length + (taskColumn ? 1 : 0));
    for (int i = 0; i < fields.length; i++) {
      if (row.isNullAt(i)) {
        to.putInt(-1);
      } else {
        fields[i].write(row, i, to);
      }
    }
    if (taskColumn) { // writer_task bigint (sql/ledger.sql, create_staging)
      to.putInt(8);
      to.putLong(task);
    }
  }

  /** The column's writer, or null if the binary format does not carry it. */
  private static Field field(DataType type, String target, ZoneId zone) {
    if (type instanceof NullType) {
      return (from, i, to) -> { }; // every value is null
    }
    if (type instanceof StringType) {
      if (!target.equals("text") && !target.equals("varchar") && !target.equals("bpchar")) {
        return null;
      }
      return (from, i, to) -> {
        UTF8String text = from.getUTF8String(i);
        bytes((text.isValid() ? text : text.makeValid()).getBytes(), to); // U+FFFD, as TextRow
      };
    }
    if (type instanceof BooleanType) {
      return target.equals("bool") ? (from, i, to) -> {
        to.putInt(1);
        to.put((byte) (from.getBoolean(i) ? 1 : 0));
      } : null;
    }
    Integral integral = integral(type);
    if (integral != null) {
      if (target.equals("numeric")) {
        return (from, i, to) -> {
          long value = integral.get(from, i);
          if (value == Long.MIN_VALUE) { // no positive long holds its magnitude
            numeric(BigDecimal.valueOf(value), to);
          } else {
            numeric(value, 0, to);
          }
        };
      }
      int width = target.equals("int2") ? 2 : target.equals("int4") ? 4 : target.equals("int8") ? 8 : 0;
      if (width < width(type)) { // not an integer column, or a narrower one (whose input checks the range)
        return null;
      }
      return (from, i, to) -> {
        long value = integral.get(from, i);
        to.putInt(width);
        switch (width) {
          case 2 -> to.putShort((int) value);
          case 4 -> to.putInt((int) value);
          default -> to.putLong(value);
        }
      };
    }
    if (type instanceof DoubleType || type instanceof FloatType) {
      boolean single = type instanceof FloatType;
      if (target.equals("numeric")) {
        return (from, i, to) -> numeric(single ? from.getFloat(i) : from.getDouble(i), single, to);
      }
      if (single && target.equals("float4")) {
        return (from, i, to) -> {
          to.putInt(4);
          to.putInt(Float.floatToIntBits(from.getFloat(i)));
        };
      }
      if (!single && target.equals("float8")) {
        return (from, i, to) -> {
          to.putInt(8);
          to.putLong(Double.doubleToLongBits(from.getDouble(i)));
        };
      }
      return null;
    }
    if (type instanceof DecimalType decimal) {
      int precision = decimal.precision();
      int scale = decimal.scale();
      if (!target.equals("numeric")) {
        return null;
      }
      if (precision <= COMPACT_DIGITS && scale >= 0) { // as a long, even once its fraction is made whole groups
        return (from, i, to) -> numeric(from.getDecimal(i, precision, scale).toUnscaledLong(), scale, to);
      }
      return (from, i, to) -> numeric(from.getDecimal(i, precision, scale).toJavaBigDecimal(), to);
    }
    if (type instanceof DateType) {
      return target.equals("date") ? (from, i, to) -> {
        long day = (long) from.getInt(i) - EPOCH_DAYS;
        boolean inRange = day > Integer.MIN_VALUE && day < Integer.MAX_VALUE; // not -infinity or infinity
        to.putInt(4);
        to.putInt(inRange ? (int) day : DATE_OUT_OF_RANGE);
      } : null;
    }
    if (type instanceof TimestampType) {
      if (target.equals("timestamptz")) {
        return (from, i, to) -> timestamp(from.getLong(i), to);
      }
      return target.equals("timestamp") ? (from, i, to) -> timestamp(Casts.wallTime(from.getLong(i), zone), to)
          : null;
    }
    if (type instanceof TimestampNTZType) {
      if (target.equals("timestamptz")) {
        return (from, i, to) -> timestamp(Casts.instant(from.getLong(i), zone), to);
      }
      return target.equals("timestamp") ? (from, i, to) -> timestamp(from.getLong(i), to) : null;
    }
    if (type instanceof BinaryType) {
      return target.equals("bytea") ? (from, i, to) -> bytes(from.getBinary(i), to) : null;
    }
    return null;
  }

  private static Integral integral(DataType type) {
    if (type instanceof ByteType) {
      return SpecializedGetters::getByte;
    }
    if (type instanceof ShortType) {
      return SpecializedGetters::getShort;
    }
    if (type instanceof IntegerType) {
      return SpecializedGetters::getInt;
    }
    return type instanceof LongType ? SpecializedGetters::getLong : null;
  }

  private static int width(DataType type) {
    return type instanceof LongType ? 8 : type instanceof IntegerType ? 4 : 2;
  }

  private static void bytes(byte[] value, Line to) {
    to.putInt(value.length);
    to.put(value);
  }

  /** µs since 1970-01-01 as PostgreSQL's timestamp (µs since 2000-01-01). */
  private static void timestamp(long unixMicros, Line to) {
    long micros = unixMicros - EPOCH_MICROS;
    boolean overflowed = ((unixMicros ^ EPOCH_MICROS) & (unixMicros ^ micros)) < 0;
    to.putInt(8);
    to.putLong(overflowed || micros == Long.MIN_VALUE ? TIMESTAMP_OUT_OF_RANGE : micros);
  }

  /** A double or float into numeric, as float8_numeric (float4_numeric) gives it. */
  private static void numeric(double v, boolean single, Line to) {
    if (Double.isNaN(v) || Double.isInfinite(v)) {
      to.putInt(8);
      to.putShort(0); // no digits
      to.putShort(0);
      to.putShort(Double.isNaN(v) ? NUMERIC_NAN : v > 0 ? NUMERIC_INFINITY : NUMERIC_MINUS_INFINITY);
      to.putShort(0);
      return;
    }
    numeric(Casts.numeric(v, single ? Casts.FLOAT_DIGITS : Casts.DOUBLE_DIGITS), to);
  }

  /**
   * A numeric's binary form: its digits in base 10,000, the weight of the first, its sign and its
   * display scale (the digits after the point, as numeric_in counts them in the value's text).
   */
  private static void numeric(BigDecimal value, Line to) {
    int displayScale = Math.max(value.scale(), 0);
    BigDecimal exact = value.scale() < 0 ? value.setScale(0) : value;
    String digits = exact.unscaledValue().abs().toString();
    int scale = exact.scale();
    int integer = Math.max(digits.length() - scale, 0);
    int lead = (4 - integer % 4) % 4; // zeros before the digits, and after, to make groups of four
    int trail = (4 - scale % 4) % 4;
    StringBuilder text = new StringBuilder(lead + Math.max(digits.length(), scale) + trail);
    text.append("0".repeat(lead)).append("0".repeat(Math.max(scale - digits.length(), 0))).append(digits)
        .append("0".repeat(trail));
    int first = 0;
    int last = text.length() / 4;
    while (first < last && group(text, first) == 0) {
      first++;
    }
    while (last > first && group(text, last - 1) == 0) {
      last--;
    }
    int count = last - first;
    to.putInt(8 + 2 * count);
    to.putShort(count);
    to.putShort(count == 0 ? 0 : (lead + integer) / 4 - 1 - first);
    to.putShort(exact.signum() < 0 ? NUMERIC_NEGATIVE : 0);
    to.putShort(displayScale);
    for (int g = first; g < last; g++) {
      to.putShort(group(text, g));
    }
  }

  /** numeric(BigDecimal) for unscaled × 10^-scale, without a BigDecimal: |unscaled| × 1,000 fits a long. */
  private static void numeric(long unscaled, int scale, Line to) {
    int trail = (4 - scale % 4) % 4;
    long rest = Math.abs(unscaled) * GROUP_PADDING[trail];
    int fraction = (scale + trail) / 4; // groups after the point
    short[] groups = new short[5];      // least significant first: a long has at most five
    int count = 0;
    for (; rest != 0; rest /= 10_000) {
      groups[count++] = (short) (rest % 10_000);
    }
    int last = 0;
    while (last < count && groups[last] == 0) {
      last++;
    }
    to.putInt(8 + 2 * (count - last));
    to.putShort(count - last);
    to.putShort(count == 0 ? 0 : count - 1 - fraction);
    to.putShort(unscaled < 0 ? NUMERIC_NEGATIVE : 0);
    to.putShort(scale);
    for (int g = count - 1; g >= last; g--) {
      to.putShort(groups[g]);
    }
  }

  private static int group(CharSequence digits, int g) {
    return Integer.parseInt(digits, 4 * g, 4 * g + 4, 10);
  }
}
