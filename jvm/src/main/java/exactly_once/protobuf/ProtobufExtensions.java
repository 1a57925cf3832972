package exactly_once.protobuf;

import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import scala.Tuple3;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * Registers {@code exactly_once_from_protobuf} in every session of a Spark application whose
 * {@code spark.sql.extensions} names this class: local, a standalone cluster's driver and a Spark
 * Connect server alike, so a job calls it by name (a Connect client has no JVM of its own).
 */
public final class ProtobufExtensions extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    public static final String NAME = "exactly_once_from_protobuf";

    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        ExpressionInfo info = new ExpressionInfo(FromProtobuf.class.getName(), null, NAME,
            "_FUNC_(value, schemas, reader, message, columns) - the struct<fields, error> of a Protobuf value in "
                + "the schema registry's wire format whose schema id (schemas: a map of id to a serialized "
                + "FileDescriptorSet) and message indexes name the reader's message, decoded as that message of "
                + "the reader's FileDescriptorSet into the columns (a DDL struct).",
            "", "", "", "", "", "", "");
        extensions.injectFunction(new Tuple3<>(FunctionIdentifier.apply(NAME), info, new FromProtobuf()));
        return BoxedUnit.UNIT;
    }
}
