package exactly_once.protobuf;

import com.google.protobuf.AnyProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DurationProto;
import com.google.protobuf.EmptyProto;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.StructProto;
import com.google.protobuf.TimestampProto;
import com.google.protobuf.WrappersProto;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * A writer schema: its file's descriptor, built from a FileDescriptorSet whose files come
 * dependencies first (the schema's references, then the schema itself, last). Imports of
 * Protobuf's well-known types are taken from protobuf-java when the set does not hold them.
 */
final class Schema {
    private static final List<FileDescriptor> WELL_KNOWN = List.of(TimestampProto.getDescriptor(),
        DurationProto.getDescriptor(), WrappersProto.getDescriptor(), AnyProto.getDescriptor(),
        EmptyProto.getDescriptor(), StructProto.getDescriptor());

    private final FileDescriptor file;

    private Schema(FileDescriptor file) {
        this.file = file;
    }

    static Schema of(byte[] serializedSet) {
        FileDescriptorSet set;
        try {
            set = FileDescriptorSet.parseFrom(serializedSet);
        } catch (InvalidProtocolBufferException unreadable) {
            throw new IllegalArgumentException("its descriptors do not read: " + unreadable.getMessage());
        }
        if (set.getFileCount() == 0) {
            throw new IllegalArgumentException("it has no file");
        }
        Map<String, FileDescriptor> known = new HashMap<>();
        for (FileDescriptor wellKnown : WELL_KNOWN) {
            known.put(wellKnown.getName(), wellKnown);
        }
        FileDescriptor last = null;
        for (FileDescriptorProto proto : set.getFileList()) {
            FileDescriptor[] dependencies = new FileDescriptor[proto.getDependencyCount()];
            for (int i = 0; i < dependencies.length; i++) {
                dependencies[i] = known.get(proto.getDependency(i));
                if (dependencies[i] == null) {
                    throw new IllegalArgumentException(proto.getName() + " imports " + proto.getDependency(i)
                        + ", which is none of its references");
                }
            }
            try {
                last = FileDescriptor.buildFrom(proto, dependencies);
            } catch (DescriptorValidationException invalid) {
                throw new IllegalArgumentException(proto.getName() + " is no valid Protobuf file: "
                    + invalid.getMessage());
            }
            known.put(proto.getName(), last);
        }
        return new Schema(last);
    }

    /** The message of that full name in the schema's file; IllegalArgumentException if none. */
    Descriptor find(String fullName) {
        String prefix = file.getPackage().isEmpty() ? "" : file.getPackage() + ".";
        Descriptor found = fullName.startsWith(prefix) ? file.findMessageTypeByName(fullName.substring(prefix.length()))
            : null;
        if (found == null) {
            throw new IllegalArgumentException("the reader schema has no message " + fullName);
        }
        return found;
    }

    /** The top-level message of that simple name (Apicurio's Ref), or null. */
    Descriptor topLevel(String name) {
        return name.contains(".") ? null : file.findMessageTypeByName(name);
    }

    /** The message the indexes name (a top-level message, then nested ones), or null. */
    Descriptor message(List<Integer> path) {
        List<Descriptor> candidates = file.getMessageTypes();
        Descriptor found = null;
        for (int index : path) {
            if (index < 0 || index >= candidates.size()) {
                return null;
            }
            found = candidates.get(index);
            candidates = found.getNestedTypes();
        }
        return found;
    }
}
