package exactly_once.protobuf;

import com.google.protobuf.ByteString;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Message;
import java.math.BigDecimal;
import java.time.Instant;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;

/**
 * A decoded message's fields as a row of the columns, by name, each value as Spark's Row
 * conversion takes it: integers of 32 bits as int (unsigned ones as bigint), of 64 as bigint
 * (unsigned ones as decimal(20,0)), float, double, bool, string (or a decimal column: its text,
 * exactly at the column's scale), bytes as binary, an enum as its
 * name, a message as a struct, repeated fields as arrays, maps as maps; google.protobuf.Timestamp
 * as a timestamp and the wrappers as their value. A field with presence (optional, a message, a
 * oneof's member) that is not set is null; a proto3 field without presence reads its default. A
 * column the message does not have is null (the reader's message is checked to have them all). A field whose type does not give its column's is a
 * {@link Mismatch} naming it, as is a Timestamp outside years 1 to 9999 or a decimal's text that
 * does not fit its column exactly.
 */
final class Rows {
    private static final String TIMESTAMP = "google.protobuf.Timestamp";
    private static final long MIN_SECONDS = -62_135_596_800L; // 0001-01-01T00:00:00Z
    private static final long MAX_SECONDS = 253_402_300_799L; // 9999-12-31T23:59:59Z
    private static final Set<String> WRAPPERS = Set.of("google.protobuf.DoubleValue", "google.protobuf.FloatValue",
        "google.protobuf.Int64Value", "google.protobuf.UInt64Value", "google.protobuf.Int32Value",
        "google.protobuf.UInt32Value", "google.protobuf.BoolValue", "google.protobuf.StringValue",
        "google.protobuf.BytesValue");

    static final class Mismatch extends RuntimeException {
        Mismatch(String message) {
            super(message, null, false, false);
        }
    }

    private Rows() {
    }

    static Row of(Message message, StructType columns, String prefix) {
        StructField[] fields = columns.fields();
        Object[] values = new Object[fields.length];
        for (int i = 0; i < fields.length; i++) {
            FieldDescriptor field = message.getDescriptorForType().findFieldByName(fields[i].name());
            values[i] = field == null ? null : field(message, field, fields[i].dataType(), prefix + fields[i].name());
        }
        return RowFactory.create(values);
    }

    private static Object field(Message message, FieldDescriptor field, DataType type, String path) {
        if (field.isMapField()) {
            if (!(type instanceof MapType map)) {
                throw mismatch(path, "a map", type);
            }
            FieldDescriptor key = field.getMessageType().findFieldByNumber(1);
            FieldDescriptor value = field.getMessageType().findFieldByNumber(2);
            Map<Object, Object> entries = new LinkedHashMap<>();
            for (Object entry : (List<?>) message.getField(field)) {
                Message pair = (Message) entry;
                entries.put(single(pair.getField(key), key, map.keyType(), path + ".key"),
                    single(pair.getField(value), value, map.valueType(), path + ".value"));
            }
            return entries;
        }
        if (field.isRepeated()) {
            if (!(type instanceof ArrayType array)) {
                throw mismatch(path, "repeated", type);
            }
            List<Object> elements = new ArrayList<>();
            for (Object element : (List<?>) message.getField(field)) {
                elements.add(single(element, field, array.elementType(), path + "[]"));
            }
            return elements;
        }
        if (field.hasPresence() && !message.hasField(field)) {
            return null;
        }
        return single(message.getField(field), field, type, path);
    }

    private static Object single(Object value, FieldDescriptor field, DataType type, String path) {
        switch (field.getJavaType()) {
            case INT: {
                int number = (Integer) value;
                boolean unsigned = field.getType() == FieldDescriptor.Type.UINT32
                    || field.getType() == FieldDescriptor.Type.FIXED32;
                if (type instanceof LongType) {
                    return unsigned ? Integer.toUnsignedLong(number) : (long) number;
                }
                if (type instanceof IntegerType && !unsigned) {
                    return number;
                }
                throw mismatch(path, field.getType().name().toLowerCase(), type);
            }
            case LONG: {
                long number = (Long) value;
                boolean unsigned = field.getType() == FieldDescriptor.Type.UINT64
                    || field.getType() == FieldDescriptor.Type.FIXED64;
                if (type instanceof DecimalType decimal && unsigned && decimal.precision() - decimal.scale() >= 20) {
                    return new BigDecimal(Long.toUnsignedString(number));
                }
                if (type instanceof LongType && !unsigned) {
                    return number;
                }
                throw mismatch(path, field.getType().name().toLowerCase(), type);
            }
            case FLOAT:
                if (type instanceof FloatType) {
                    return value;
                }
                if (type instanceof DoubleType) {
                    return (double) (Float) value;
                }
                throw mismatch(path, "float", type);
            case DOUBLE:
                return expect(value, type instanceof DoubleType, path, "double", type);
            case BOOLEAN:
                return expect(value, type instanceof BooleanType, path, "bool", type);
            case STRING:
                if (type instanceof DecimalType decimal) {
                    return decimal((String) value, decimal, path);
                }
                return expect(value, type instanceof StringType, path, "string", type);
            case BYTE_STRING:
                return expect(((ByteString) value).toByteArray(), type instanceof BinaryType, path, "bytes", type);
            case ENUM:
                return expect(((EnumValueDescriptor) value).getName(), type instanceof StringType, path,
                    "enum " + field.getEnumType().getFullName(), type);
            case MESSAGE:
                return message((Message) value, type, path);
            default:
                throw mismatch(path, field.getJavaType().name().toLowerCase(), type);
        }
    }

    private static Object message(Message message, DataType type, String path) {
        String name = message.getDescriptorForType().getFullName();
        if (name.equals(TIMESTAMP) && type instanceof TimestampType) {
            long seconds = (Long) message.getField(message.getDescriptorForType().findFieldByName("seconds"));
            int nanos = (Integer) message.getField(message.getDescriptorForType().findFieldByName("nanos"));
            // Protobuf's own range (years 1 to 9999), which Spark's microseconds hold
            if (seconds < MIN_SECONDS || seconds > MAX_SECONDS || nanos < 0 || nanos > 999_999_999) {
                throw new Mismatch("field " + path + ": Timestamp " + seconds + " s " + nanos
                    + " ns is outside years 1 to 9999");
            }
            return Instant.ofEpochSecond(seconds, nanos);
        }
        if (WRAPPERS.contains(name) && !(type instanceof StructType)) {
            FieldDescriptor value = message.getDescriptorForType().findFieldByName("value");
            return single(message.getField(value), value, type, path);
        }
        if (type instanceof StructType struct) {
            return of(message, struct, path + ".");
        }
        throw mismatch(path, "message " + name, type);
    }

    /**
     * A decimal's text (Protobuf has no decimal type: a string carries one) at the column's scale,
     * exactly. Its digits are compared with the column's before it is scaled: "1E+600000000" is
     * refused at once, not expanded.
     */
    private static BigDecimal decimal(String text, DecimalType type, String path) {
        try {
            BigDecimal parsed = new BigDecimal(text.strip());
            boolean fits = parsed.signum() == 0 || (parsed.precision() - parsed.scale() <= type.precision() - type.scale()
                && parsed.stripTrailingZeros().scale() <= type.scale());
            if (fits) {
                return parsed.setScale(type.scale());
            }
        } catch (NumberFormatException | ArithmeticException notExactly) {
            // said below
        }
        String shown = text.length() > 40 ? text.substring(0, 40) + "..." : text;
        throw new Mismatch("field " + path + ": '" + shown + "' is not a " + type.simpleString());
    }

    private static Object expect(Object value, boolean fits, String path, String protobuf, DataType type) {
        if (!fits) {
            throw mismatch(path, protobuf, type);
        }
        return value;
    }

    private static Mismatch mismatch(String path, String protobuf, DataType type) {
        return new Mismatch("field " + path + ": " + protobuf + " does not give " + type.simpleString());
    }
}
