package exactly_once.copy;

import java.util.EnumSet;
import java.util.Set;
import java.util.function.Function;

import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;

/** A data source's table that only takes batch appends, each the batch write `batch` plans from the write's info. */
record WriteOnlyTable(String name, StructType schema, Function<LogicalWriteInfo, BatchWrite> batch)
    implements SupportsWrite {

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_WRITE);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    BatchWrite planned = batch.apply(info); // on the driver, before any task: its options checked now
    return new WriteBuilder() {
      @Override
      public Write build() {
        return new Write() {
          @Override
          public BatchWrite toBatch() {
            return planned;
          }
        };
      }
    };
  }
}
