package exactly_once.copy;

import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.time.ZoneId;
import java.time.ZoneOffset;

import org.apache.spark.sql.catalyst.util.DateTimeUtils;

/**
 * The assignment casts both row formats reproduce, for a value whose Spark type's own
 * PostgreSQL type is not the column's (TextRow says which and why).
 */
final class Casts {
  static final MathContext DOUBLE_DIGITS = new MathContext(15, RoundingMode.HALF_EVEN); // DBL_DIG
  static final MathContext FLOAT_DIGITS = new MathContext(6, RoundingMode.HALF_EVEN);   // FLT_DIG

  private Casts() {
  }

  /** A finite double (or a float, widened exactly) into numeric: the significant `digits`
   *  float8_numeric (float4_numeric) keeps, rounded half to even. */
  static BigDecimal numeric(double v, MathContext digits) {
    return new BigDecimal(v).round(digits).stripTrailingZeros();
  }

  /** A timestamp's instant (µs since 1970-01-01 UTC) as its wall time in the session time zone. */
  static long wallTime(long micros, ZoneId zone) {
    return DateTimeUtils.convertTz(micros, ZoneOffset.UTC, zone);
  }

  /** A wall time in the session time zone (a timestamp_ntz) as its instant: Spark's cast to timestamp. */
  static long instant(long wallMicros, ZoneId zone) {
    return DateTimeUtils.convertTz(wallMicros, zone, ZoneOffset.UTC);
  }

  /** A date's start in the session time zone: Spark's cast of a date to timestamp. */
  static long dayStart(int epochDay, ZoneId zone) {
    return DateTimeUtils.daysToMicros(epochDay, zone);
  }
}
