package exactly_once.copy;

import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.time.LocalDate;
import java.time.ZoneId;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters;
import org.apache.spark.sql.types.ArrayType;
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
 * A row in COPY's text format. Each value is written as the text that PostgreSQL's input
 * function turns into what the column would hold had the value been sent as its Spark type's
 * own PostgreSQL type and converted by the column's assignment cast — what Spark's JDBC
 * writer stored, and what the row checks (exactly_once.spark.row_checks) judge. Where the
 * two differ the text does the cast's work: a double into numeric keeps 15 significant
 * digits (6 for a float) rounded half to even, as float8_numeric's "%.*g" does; a double
 * into an integer is rounded half to even (rint), a decimal half away from zero; a float, a
 * double or a timestamp into text is laid out as PostgreSQL's output function lays it out.
 * Datetimes mean what Spark shows in its session time zone ({@code spark.sql.session.timeZone},
 * read on the driver), whatever the executor's: a timestamp is written as the instant into a
 * timestamptz column, else as its wall time in the session time zone with that zone's offset
 * (which a timestamp or date column ignores); a timestamp_ntz or a date into a timestamptz
 * column as the instant Spark's cast to timestamp gives (its start of day for a date), else as
 * it is. None of these leaves a zone to the COPY session's TimeZone (pgjdbc sets it to the
 * executor JVM's), so issue 60's New York executor writes what a UTC one does. Spark's JDBC
 * writer used the executor JVM's zone instead (java.sql.Timestamp's wall time into a
 * timestamp column).
 * Which Spark types a column takes at all is asked of PostgreSQL before the write
 * (exactly_once.spark.staging: an assignment cast from what the JDBC writer bound).
 */
final class TextRow implements RowFormat {
  private static final long MICROS_PER_DAY = 86_400_000_000L;
  private static final byte[] NULL = {'\\', 'N'};
  private static final byte[] NOTHING = {};

  /** Writes one non-null value's text, unescaped. */
  private interface Field {
    void render(SpecializedGetters from, int i, Line to);
  }

  private final Field[] fields;
  private final ZoneId zone;
  private final boolean taskColumn;
  private final Line value = new Line();
  private final Line element = new Line();

  /** {@code zone}: Spark's session time zone, in which the frame's datetimes are shown;
   *  {@code taskColumn}: each row ends with its task attempt's id. */
  TextRow(StructType schema, String[] targets, ZoneId zone, boolean taskColumn) {
    this.zone = zone;
    this.taskColumn = taskColumn;
    StructField[] columns = schema.fields();
    fields = new Field[columns.length];
    for (int i = 0; i < columns.length; i++) {
      fields[i] = field(columns[i].name(), columns[i].dataType(), targets[i]);
    }
  }

  @Override
  public byte[] header() {
    return NOTHING;
  }

  @Override
  public byte[] trailer() {
    return NOTHING; // PostgreSQL's end of the copy ends the text
  }

  /** The row's fields, tab-separated, and a newline. */
  @Override
  public void render(InternalRow row, long task, Line to) {
    for (int i = 0; i < fields.length; i++) {
      if (i > 0) {
        to.put((byte) '\t');
      }
      if (row.isNullAt(i)) {
        to.put(NULL);
      } else {
        value.reset();
        fields[i].render(row, i, value);
        to.escaped(value);
      }
    }
    if (taskColumn) {
      to.put((byte) '\t');
      to.ascii(Long.toString(task));
    }
    to.put((byte) '\n');
  }

  private Field field(String column, DataType type, String target) {
    if (type instanceof ArrayType array && !(array.elementType() instanceof ArrayType)) {
      Field each = field(column, array.elementType(), target.startsWith("_") ? target.substring(1) : target);
      return (from, i, to) -> {
        var elements = from.getArray(i);
        to.put((byte) '{');
        for (int e = 0; e < elements.numElements(); e++) {
          if (e > 0) {
            to.put((byte) ',');
          }
          if (elements.isNullAt(e)) {
            to.ascii("NULL");
          } else {
            element.reset();
            each.render(elements, e, element);
            to.quoted(element);
          }
        }
        to.put((byte) '}');
      };
    }
    boolean integer = target.equals("int2") || target.equals("int4") || target.equals("int8");
    boolean numeric = target.equals("numeric");
    boolean real = target.equals("float4");
    if (type instanceof StringType) {
      return (from, i, to) -> {
        UTF8String text = from.getUTF8String(i);
        to.put((text.isValid() ? text : text.makeValid()).getBytes()); // U+FFFD, as the JDBC writer's String
      };
    }
    if (type instanceof BooleanType) {
      return (from, i, to) -> to.ascii(from.getBoolean(i) ? "true" : "false");
    }
    if (type instanceof ByteType) {
      return (from, i, to) -> to.ascii(Byte.toString(from.getByte(i)));
    }
    if (type instanceof ShortType) {
      return (from, i, to) -> to.ascii(Short.toString(from.getShort(i)));
    }
    if (type instanceof IntegerType) {
      return (from, i, to) -> to.ascii(Integer.toString(from.getInt(i)));
    }
    if (type instanceof LongType) {
      return (from, i, to) -> to.ascii(Long.toString(from.getLong(i)));
    }
    if (type instanceof DoubleType) {
      return (from, i, to) -> to.ascii(floating(from.getDouble(i), integer, numeric, real, Casts.DOUBLE_DIGITS, false));
    }
    if (type instanceof FloatType) {
      return (from, i, to) -> to.ascii(floating(from.getFloat(i), integer, numeric, real, Casts.FLOAT_DIGITS, true));
    }
    if (type instanceof DecimalType decimal) {
      int precision = decimal.precision();
      int scale = decimal.scale();
      return (from, i, to) -> {
        BigDecimal exact = from.getDecimal(i, precision, scale).toJavaBigDecimal();
        to.ascii((integer ? exact.setScale(0, RoundingMode.HALF_UP) : exact).toPlainString());
      };
    }
    boolean instant = target.equals("timestamptz");
    if (type instanceof DateType) {
      if (instant) { // Spark's cast to timestamp: the day's start in the session time zone
        return (from, i, to) -> to.ascii(timestamp(Casts.dayStart(from.getInt(i), zone), "+00"));
      }
      return (from, i, to) -> to.ascii(date(from.getInt(i)));
    }
    if (type instanceof TimestampType) {
      if (instant) {
        return (from, i, to) -> to.ascii(timestamp(from.getLong(i), "+00"));
      }
      return (from, i, to) -> { // as Spark shows it: the wall time in the session time zone
        long micros = from.getLong(i);
        long wall = Casts.wallTime(micros, zone);
        to.ascii(timestamp(wall, offset(Math.toIntExact((wall - micros) / 1_000_000L))));
      };
    }
    if (type instanceof TimestampNTZType) {
      if (instant) { // Spark's cast to timestamp: the wall time in the session time zone
        return (from, i, to) -> to.ascii(timestamp(Casts.instant(from.getLong(i), zone), "+00"));
      }
      return (from, i, to) -> to.ascii(timestamp(from.getLong(i), ""));
    }
    if (type instanceof NullType) {
      return (from, i, to) -> { }; // every value is null
    }
    if (type instanceof BinaryType) {
      return (from, i, to) -> to.ascii(hex(from.getBinary(i)));
    }
    throw new IllegalArgumentException("exactly_once_copy: column " + column + ": a Spark " + type.simpleString()
        + " cannot be staged into PostgreSQL's " + target);
  }

  /** A double (or a float, widened exactly) as the column's cast would take it: `digits` are
   *  those float8_numeric (float4_numeric) keeps. */
  private static String floating(double v, boolean integer, boolean numeric, boolean real, MathContext digits,
                                 boolean single) {
    if (Double.isNaN(v)) {
      return "NaN";
    }
    if (Double.isInfinite(v)) {
      return v > 0 ? "Infinity" : "-Infinity";
    }
    if (integer) {
      double rounded = Math.rint(v);
      // beyond int8 a long would saturate: the exact text lets the column's input refuse it
      return Math.abs(rounded) < 0x1p63 ? Long.toString((long) rounded) : new BigDecimal(rounded).toPlainString();
    }
    if (numeric) {
      return Casts.numeric(v, digits).toString();
    }
    if (!real) {
      return single ? shortest(shortestDigits(v, true), 6) : shortest(shortestDigits(v, false), 15);
    }
    float narrowed = (float) v; // float8 -> float4 rounds to nearest, as C's cast does
    if (Float.isInfinite(narrowed)) {
      return v > 0 ? "1e39" : "-1e39"; // the cast refuses an overflow: so does float4in
    }
    if (narrowed == 0.0f && v != 0.0) {
      return "1e-50"; // an underflow, likewise
    }
    return Float.toString(narrowed);
  }

  /**
   * The fewest significant digits that read back as the value (Java 17's Float.toString and
   * Double.toString may give more): the exact value rounded to 1, 2, ... digits, half to even.
   */
  private static String shortestDigits(double v, boolean single) {
    if (v == 0.0) {
      return Double.compare(v, 0.0) < 0 ? "-0" : "0";
    }
    BigDecimal exact = new BigDecimal(v);
    for (int precision = 1; precision < 17; precision++) {
      BigDecimal rounded = exact.round(new MathContext(precision, RoundingMode.HALF_EVEN));
      if (single ? rounded.floatValue() == (float) v : rounded.doubleValue() == v) {
        return rounded.toString();
      }
    }
    return exact.round(new MathContext(17, RoundingMode.HALF_EVEN)).toString();
  }

  /**
   * Round-trip digits of a float or double laid out as PostgreSQL's float4out and
   * float8out lay out their shortest digits (what a cast to text gives): positional for
   * exponents from -4 up to the type's digits (6, 15) as printf's %g, else "1.5e+20".
   */
  private static String shortest(String text, int positionalBelow) {
    BigDecimal digits = new BigDecimal(text).stripTrailingZeros();
    if (digits.signum() == 0) {
      return text.startsWith("-") ? "-0" : "0";
    }
    int exponent = digits.precision() - digits.scale() - 1;
    if (exponent >= -4 && exponent < positionalBelow) {
      return digits.toPlainString();
    }
    String unscaled = digits.unscaledValue().abs().toString();
    String mantissa = unscaled.length() == 1 ? unscaled : unscaled.charAt(0) + "." + unscaled.substring(1);
    return (digits.signum() < 0 ? "-" : "") + mantissa + (exponent < 0 ? "e-" : "e+")
        + String.format("%02d", Math.abs(exponent));
  }

  // Dates and timestamps are written digit by digit: with String.format the demo's rows
  // (two timestamps each) cost the append sink's write 11.3 s of task CPU per 900k rows,
  // 4.5 s without (issue 41's profile, ./dev bench --profile).
  private static String date(int epochDay) {
    StringBuilder text = new StringBuilder(16);
    if (appendDate(text, epochDay)) {
      text.append(" BC");
    }
    return text.toString();
  }

  /** Appends the day as yyyy-mm-dd (the year's digits beyond four as they are); true if it is BC. */
  private static boolean appendDate(StringBuilder to, int epochDay) {
    LocalDate day = LocalDate.ofEpochDay(epochDay);
    int year = day.getYear();
    padded(to, year > 0 ? year : 1 - year, 4).append('-');
    padded(to, day.getMonthValue(), 2).append('-');
    padded(to, day.getDayOfMonth(), 2);
    return year <= 0;
  }

  private static StringBuilder padded(StringBuilder to, long value, int width) {
    String digits = Long.toString(value);
    for (int i = digits.length(); i < width; i++) {
      to.append('0');
    }
    return to.append(digits);
  }

  /** A zone's offset east of UTC as PostgreSQL's output shows it: +hh, +hh:mm or +hh:mm:ss. */
  private static String offset(int seconds) {
    StringBuilder text = new StringBuilder(9).append(seconds < 0 ? '-' : '+');
    int east = Math.abs(seconds);
    padded(text, east / 3600, 2);
    if (east % 3600 != 0) {
      padded(text.append(':'), east / 60 % 60, 2);
      if (east % 60 != 0) {
        padded(text.append(':'), east % 60, 2);
      }
    }
    return text.toString();
  }

  /** The wall time `micros` (since 1970-01-01 00:00) followed by `zone`, as PostgreSQL's output
   *  shows a timestamp (what a cast to text gives): no fraction when it is zero, no trailing
   *  zeros in it. */
  private static String timestamp(long micros, String zone) {
    long time = Math.floorMod(micros, MICROS_PER_DAY);
    StringBuilder text = new StringBuilder(40);
    boolean bc = appendDate(text, Math.toIntExact(Math.floorDiv(micros, MICROS_PER_DAY)));
    text.append(' ');
    padded(text, time / 3_600_000_000L, 2).append(':');
    padded(text, time / 60_000_000L % 60, 2).append(':');
    padded(text, time / 1_000_000L % 60, 2);
    long fraction = time % 1_000_000L;
    if (fraction != 0) {
      int digits = 6;
      for (; fraction % 10 == 0; digits--) {
        fraction /= 10;
      }
      padded(text.append('.'), fraction, digits);
    }
    text.append(zone);
    if (bc) {
      text.append(" BC");
    }
    return text.toString();
  }

  private static String hex(byte[] bytes) {
    char[] digits = "0123456789abcdef".toCharArray();
    StringBuilder text = new StringBuilder(2 + 2 * bytes.length).append("\\x");
    for (byte b : bytes) {
      text.append(digits[(b >> 4) & 0xf]).append(digits[b & 0xf]);
    }
    return text.toString();
  }
}
