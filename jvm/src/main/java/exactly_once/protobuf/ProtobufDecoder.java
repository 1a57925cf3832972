package exactly_once.protobuf;

import com.google.protobuf.CodedInputStream;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.InvalidProtocolBufferException;
import java.io.IOException;
import java.io.Serializable;
import java.util.HashMap;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.StructType;
import scala.runtime.AbstractFunction1;

/**
 * Decodes one value in a schema registry's Protobuf wire format ({@link Framing}: Confluent's or
 * Apicurio's) into a row of {@code (fields, error)}: the columns, or why the value cannot be read.
 * The message the writer's schema and the framing name must
 * be the reader's (by full name); the payload is then read as the reader's message, as Protobuf
 * reads another version of its message (by field numbers: a field the writer lacks has the
 * reader's default, one the reader lacks is skipped), and its fields become the columns by name
 * ({@link Rows}). Serializable: a task gets the schemas' bytes and builds their descriptors once.
 */
final class ProtobufDecoder extends AbstractFunction1<Object, Object> implements Serializable {
    private static final long serialVersionUID = 1L;
    private final Map<Long, byte[]> schemas;
    private final byte[] reader;
    private final String message;
    private final StructType columns;
    private final Framing framing;
    private transient Map<Long, Schema> built;
    private transient Descriptor read;

    ProtobufDecoder(Map<Long, byte[]> schemas, byte[] reader, String message, StructType columns, Framing framing) {
        this.schemas = new HashMap<>(schemas);
        this.reader = reader;
        this.message = message;
        this.columns = columns;
        this.framing = framing;
    }

    @Override
    public Object apply(Object value) {
        if (value == null) {
            return null;
        }
        byte[] bytes = (byte[]) value;
        int idBytes = framing.idBytes();
        if (bytes.length < 2 + idBytes || bytes[0] != 0) {
            return failed(framing.notFramed());
        }
        long id = 0;
        for (int i = 1; i <= idBytes; i++) {
            id = (id << 8) | (bytes[i] & 0xFFL);
        }
        if (id < 0) {  // an 8-byte id beyond a bigint: the driver found no schema by it either
            return failed(framing.notFramed());
        }
        CodedInputStream in = CodedInputStream.newInstance(bytes, 1 + idBytes, bytes.length - 1 - idBytes);
        Framing.Named named = framing.messageOf(in);
        if (named == null) {
            return failed(framing.notFramed());
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
        Descriptor writer = named.in(schema);
        if (writer == null) {
            return failed(named.namesNone(id));
        }
        if (!writer.getFullName().equals(message)) {
            return failed("schema id " + id + "'s message " + named.shown() + " is " + writer.getFullName()
                + ", not the reader's " + message);
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
