package exactly_once.protobuf;

import com.google.protobuf.CodedInputStream;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.InvalidProtocolBufferException;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.StructType;
import scala.runtime.AbstractFunction1;

/**
 * Decodes one value in the schema registry's Protobuf wire format (Confluent's: a magic byte 0, the
 * writer schema's 4-byte id, the message indexes as zigzag varints — a count, then the path, or a
 * single 0 for the first message — then the payload) into a row of {@code (fields, error)}: the
 * columns, or why the value cannot be read. The message the writer's schema and indexes name must
 * be the reader's (by full name); the payload is then read as the reader's message, as Protobuf
 * reads another version of its message (by field numbers: a field the writer lacks has the
 * reader's default, one the reader lacks is skipped), and its fields become the columns by name
 * ({@link Rows}). Serializable: a task gets the schemas' bytes and builds their descriptors once.
 */
final class ProtobufDecoder extends AbstractFunction1<Object, Object> implements Serializable {
    private static final long serialVersionUID = 1L;
    static final String NOT_FRAMED = "is not in the schema registry's Protobuf wire format (magic byte 0, a 4-byte "
        + "schema id and the message indexes, then the Protobuf payload)";

    private final Map<Long, byte[]> schemas;
    private final byte[] reader;
    private final String message;
    private final StructType columns;
    private transient Map<Long, Schema> built;
    private transient Descriptor read;

    ProtobufDecoder(Map<Long, byte[]> schemas, byte[] reader, String message, StructType columns) {
        this.schemas = new HashMap<>(schemas);
        this.reader = reader;
        this.message = message;
        this.columns = columns;
    }

    @Override
    public Object apply(Object value) {
        if (value == null) {
            return null;
        }
        byte[] bytes = (byte[]) value;
        if (bytes.length < 6 || bytes[0] != 0) {
            return failed(NOT_FRAMED);
        }
        long id = ((bytes[1] & 0xFFL) << 24) | ((bytes[2] & 0xFFL) << 16) | ((bytes[3] & 0xFFL) << 8) | (bytes[4] & 0xFFL);
        CodedInputStream in = CodedInputStream.newInstance(bytes, 5, bytes.length - 5);
        List<Integer> path = new ArrayList<>();
        try {
            int count = in.readSInt32();
            if (count < 0 || count > 64) {
                return failed(NOT_FRAMED);
            }
            if (count == 0) {
                path.add(0);
            }
            for (int i = 0; i < count; i++) {
                path.add(in.readSInt32());
            }
        } catch (IOException unreadable) {
            return failed(NOT_FRAMED);
        }
        Schema schema;
        try {
            schema = schema(id);
        } catch (IllegalArgumentException unbuildable) {
            return failed("schema id " + id + ": " + unbuildable.getMessage());
        }
        if (schema == null) {
            return failed("schema id " + id + " has no Protobuf schema to read it with");
        }
        Descriptor writer = schema.message(path);
        if (writer == null) {
            return failed("message indexes " + path + " name none of schema id " + id + "'s messages");
        }
        if (!writer.getFullName().equals(message)) {
            return failed("schema id " + id + "'s message " + path + " is " + writer.getFullName() + ", not the reader's "
                + message);
        }
        DynamicMessage decoded;
        try {
            decoded = DynamicMessage.parseFrom(readerMessage(), in);
        } catch (InvalidProtocolBufferException | IllegalArgumentException undecodable) {
            return failed("payload does not decode as " + message + " (schema id " + id + "): "
                + undecodable.getMessage());
        } catch (IOException unreadable) {
            return failed("payload does not decode as " + message + " (schema id " + id + "): " + unreadable);
        }
        try {
            return RowFactory.create(Rows.of(decoded, columns, ""), null);
        } catch (Rows.Mismatch mismatch) {
            return failed(mismatch.getMessage());
        } catch (RuntimeException unforeseen) {  // this record's, whatever it is: its dead letter says so
            return failed("payload as " + message + " (schema id " + id + ") does not become the columns: "
                + unforeseen);
        }
    }

    private Descriptor readerMessage() {
        if (read == null) {
            read = Schema.of(reader).find(message);
        }
        return read;
    }

    private Schema schema(long id) {
        if (built == null) {
            built = new HashMap<>();
        }
        if (!built.containsKey(id)) {
            byte[] set = schemas.get(id);
            built.put(id, set == null ? null : Schema.of(set));
        }
        return built.get(id);
    }

    private static Row failed(String why) {
        return RowFactory.create(null, why);
    }
}
