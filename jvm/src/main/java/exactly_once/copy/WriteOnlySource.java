package exactly_once.copy;

import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A data source that only writes, its table's schema the frame's (WriteOnlyTable). */
abstract class WriteOnlySource implements TableProvider, DataSourceRegister {

  @Override
  public boolean supportsExternalMetadata() {
    return true; // the frame's schema is the table's: nothing is read to infer it
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    throw new UnsupportedOperationException(shortName() + " only writes: it has no schema to infer");
  }
}
