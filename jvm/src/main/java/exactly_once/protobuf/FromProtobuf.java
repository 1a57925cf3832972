package exactly_once.protobuf;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ScalaUDF;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;

/**
 * The function's builder: its arguments after the value are constants (Spark folds them once, when
 * the query is analysed), so each task gets a decoder made of them and only the value is an input.
 * The sixth, the wire format ({@link Framing}), may be left out: Confluent's.
 */
final class FromProtobuf extends AbstractFunction1<Seq<Expression>, Expression> {
    @Override
    public Expression apply(Seq<Expression> arguments) {
        List<Expression> given = CollectionConverters.asJava(arguments);
        if (given.size() != 5 && given.size() != 6) {
            throw new IllegalArgumentException(ProtobufExtensions.NAME
                + " takes 5 or 6 arguments (value, schemas, reader, message, columns[, wire format]), got "
                + given.size());
        }
        for (Expression constant : given.subList(1, given.size())) {
            if (!constant.foldable()) {
                throw new IllegalArgumentException(ProtobufExtensions.NAME
                    + ": schemas, reader, message, columns and wire format must be constants, got " + constant.sql());
            }
        }
        Framing framing = Framing.named(given.size() == 6 ? given.get(5).eval(null).toString() : "confluent");
        MapData schemas = (MapData) given.get(1).eval(null);
        Map<Long, byte[]> byId = new LinkedHashMap<>();
        ArrayData ids = schemas.keyArray();
        ArrayData sets = schemas.valueArray();
        for (int i = 0; i < schemas.numElements(); i++) {
            byId.put(ids.getLong(i), sets.getBinary(i));
        }
        byte[] reader = (byte[]) given.get(2).eval(null);
        String message = given.get(3).eval(null).toString();
        StructType columns = StructType.fromDDL(given.get(4).eval(null).toString());
        Schema.of(reader).find(message);  // a reader that does not build fails the query, not each record
        ProtobufDecoder decoder = new ProtobufDecoder(byId, reader, message, columns, framing);
        StructType result = new StructType().add("fields", columns).add("error", DataTypes.StringType);
        return new ScalaUDF(decoder, result, CollectionConverters.asScala(List.of(given.get(0))).toList(),
            CollectionConverters.asScala(List.<Option<org.apache.spark.sql.catalyst.encoders.ExpressionEncoder<?>>>of())
                .toList(),
            Option.empty(), Option.apply(ProtobufExtensions.NAME), true, true);
    }
}
