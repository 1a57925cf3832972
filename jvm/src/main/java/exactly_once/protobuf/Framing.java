package exactly_once.protobuf;

import com.google.protobuf.CodedInputStream;
import com.google.protobuf.Descriptors.Descriptor;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

/**
 * A schema registry's Protobuf wire format: after a magic byte 0, the writer schema's id, then what
 * names the message, then the payload.
 * <ul>
 * <li>{@code confluent}: a 4-byte id, then the message indexes as zigzag varints (a count, then the
 * path of a top-level message and nested ones, or a single 0 for the first message);</li>
 * <li>{@code apicurio}: Apicurio Registry 3's serializer by default, a 4-byte id (its content id),
 * then its {@code Ref} message ({@code string name = 1}: the message's simple name, a top-level
 * one), length-delimited;</li>
 * <li>{@code apicurio_8_byte_ids}: the same with an 8-byte id (Apicurio 2's global id in the
 * value).</li>
 * </ul>
 */
enum Framing {
    CONFLUENT(4, "a 4-byte schema id and the message indexes"),
    APICURIO(4, "a 4-byte schema id and Apicurio's Ref"),
    APICURIO_8_BYTE_IDS(8, "an 8-byte schema id and Apicurio's Ref");

    private static final int MOST_INDEXES = 64;
    private static final int LONGEST_REF = 1024;

    private final int idBytes;
    private final String layout;

    Framing(int idBytes, String layout) {
        this.idBytes = idBytes;
        this.layout = layout;
    }

    static Framing named(String name) {
        for (Framing framing : values()) {
            if (framing.name().equalsIgnoreCase(name)) {
                return framing;
            }
        }
        throw new IllegalArgumentException(ProtobufExtensions.NAME + ": no wire format " + name
            + " (confluent, apicurio or apicurio_8_byte_ids)");
    }

    int idBytes() {
        return idBytes;
    }

    String notFramed() {
        return "is not in the schema registry's Protobuf wire format (magic byte 0, " + layout
            + ", then the Protobuf payload)";
    }

    /** What names the message, read from {@code in} (left at the payload), or null if unreadable. */
    Named messageOf(CodedInputStream in) {
        try {
            if (this == CONFLUENT) {
                int count = in.readSInt32();
                if (count < 0 || count > MOST_INDEXES) {
                    return null;
                }
                List<Integer> path = new ArrayList<>();
                if (count == 0) {
                    path.add(0);
                }
                for (int i = 0; i < count; i++) {
                    path.add(in.readSInt32());
                }
                return new Indexes(path);
            }
            int length = in.readRawVarint32();
            if (length <= 0 || length > LONGEST_REF) {
                return null;
            }
            CodedInputStream ref = CodedInputStream.newInstance(in.readRawBytes(length));
            String name = null;
            for (int tag = ref.readTag(); tag != 0; tag = ref.readTag()) {
                if (tag == (1 << 3 | 2)) {  // field 1, length-delimited: the name
                    name = ref.readStringRequireUtf8();
                } else if (!ref.skipField(tag)) {
                    break;
                }
            }
            return name == null || name.isEmpty() ? null : new Ref(name);
        } catch (IOException unreadable) {
            return null;
        }
    }

    /** How a value names its message, which a writer schema resolves. */
    interface Named {
        /** The message it names in the schema, or null. */
        Descriptor in(Schema schema);

        /** As a dead letter shows it. */
        String shown();

        /** Why a schema of that id has none of it. */
        String namesNone(long id);
    }

    private record Indexes(List<Integer> path) implements Named {
        @Override
        public Descriptor in(Schema schema) {
            return schema.message(path);
        }

        @Override
        public String shown() {
            return path.toString();
        }

        @Override
        public String namesNone(long id) {
            return "message indexes " + path + " name none of schema id " + id + "'s messages";
        }
    }

    private record Ref(String name) implements Named {
        @Override
        public Descriptor in(Schema schema) {
            return schema.topLevel(name);
        }

        @Override
        public String shown() {
            return name;
        }

        @Override
        public String namesNone(long id) {
            return "Apicurio's Ref " + name + " names none of schema id " + id + "'s top-level messages";
        }
    }
}
