package exactly_once.isolation;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.Dependency;
import org.apache.spark.NarrowDependency;
import org.apache.spark.Partition;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.execution.ColumnarToRowExec;
import org.apache.spark.sql.execution.InputAdapter;
import org.apache.spark.sql.execution.SampleExec;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.WholeStageCodegenExec;
import org.apache.spark.sql.execution.adaptive.AdaptiveSparkPlanExec;
import org.apache.spark.sql.execution.columnar.InMemoryTableScanExec;
import org.apache.spark.sql.execution.python.MapInBatchExec;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * A write's checked rows kept across its rounds (exactly_once.spark.kept_rows): one frame whose
 * partition i is partition i of the cache that holds it. Its tasks read those cached blocks and
 * no other: a frame's filter would read every block of each cache, and compute again, from the
 * plan under it, one that is not there (a task that raised put none), which raises again.
 */
public final class KeptPartitions {
  private KeptPartitions() {}

  private static final ClassTag<InternalRow> ROW = ClassTag$.MODULE$.apply(InternalRow.class);

  /**
   * Partition i from cache `source.get(i)` of `caches`, each a cached frame of the same
   * columns (their nulls aside) and partitions; null if one is not a cache's rows as they are,
   * or has other columns or partitions.
   */
  public static Dataset<Row> of(List<Dataset<Row>> caches, List<Integer> source) {
    List<RDD<InternalRow>> rows = new ArrayList<>();
    for (Dataset<Row> cache : caches) {
      if (!cache.schema().sameType(caches.get(0).schema())) {
        return null;
      }
      SparkPlan plan = cache.queryExecution().executedPlan();
      RDD<InternalRow> read = cacheRead(plan) != null ? plan.execute() : null;
      if (read == null || read.getNumPartitions() != source.size()) {
        return null;
      }
      rows.add(read);
    }
    int[] from = source.stream().mapToInt(Integer::intValue).toArray();
    Dataset<Row> first = caches.get(0);
    // each cache's plan says which columns hold no null; the rows of several, none
    StructType columns = first.schema().asNullable();
    return ((SparkSession) first.sparkSession()).internalCreateDataFrame(new Picked(rows, from), columns, false);
  }

  /**
   * Whether the cached frame's rows are made row by row from its input's, as far as its plan
   * tells: no Python function over whole batches (`mapInPandas`, `mapInArrow`), no sample, no
   * expression that is not deterministic. Rows kept from a round before stand for those the
   * round would make again only then (a batch's function could have made them from a record set
   * aside since). Caches it reads are not looked into: their rows are fixed.
   */
  public static boolean rowByRow(Dataset<Row> cache) {
    InMemoryTableScanExec scan = cacheRead(cache.queryExecution().executedPlan());
    return scan != null && madeRowByRow(scan.relation().cachedPlan());
  }

  private static boolean madeRowByRow(SparkPlan plan) {
    if (plan instanceof AdaptiveSparkPlanExec adaptive) {
      return madeRowByRow(adaptive.inputPlan());
    }
    if (plan instanceof InMemoryTableScanExec) {
      return true;
    }
    if (plan instanceof MapInBatchExec || plan instanceof SampleExec) {
      return false;
    }
    scala.collection.Iterator<Expression> expressions = plan.expressions().iterator();
    while (expressions.hasNext()) {
      if (!expressions.next().deterministic()) {
        return false;
      }
    }
    scala.collection.Iterator<SparkPlan> children = plan.children().iterator();
    while (children.hasNext()) {
      if (!madeRowByRow(children.next())) {
        return false;
      }
    }
    return true;
  }

  /** The cache whose rows the plan reads as they are (not a plan over them), or null. */
  private static InMemoryTableScanExec cacheRead(SparkPlan plan) {
    if (plan instanceof InMemoryTableScanExec scan) {
      return scan;
    }
    boolean carries = plan instanceof WholeStageCodegenExec || plan instanceof ColumnarToRowExec
        || plan instanceof InputAdapter;
    return carries && plan.children().size() == 1 ? cacheRead(plan.children().head()) : null;
  }

  /** Partition i of parent `from[i]`'s partition i. */
  private static final class Picked extends RDD<InternalRow> {
    private final List<RDD<InternalRow>> parents;
    private final int[] from;

    Picked(List<RDD<InternalRow>> parents, int[] from) {
      super(parents.get(0).sparkContext(), dependencies(parents, from), ROW);
      this.parents = parents;
      this.from = from;
    }

    private static scala.collection.immutable.Seq<Dependency<?>> dependencies(List<RDD<InternalRow>> parents,
                                                                               int[] from) {
      List<Dependency<?>> each = new ArrayList<>();
      for (int k = 0; k < parents.size(); k++) {
        each.add(new Parent(parents.get(k), k, from));
      }
      return CollectionConverters.asScala(each).toList();
    }

    @Override
    public scala.collection.Iterator<InternalRow> compute(Partition split, TaskContext context) {
      return parents.get(from[split.index()]).iterator(((Slot) split).parent(), context);
    }

    @Override
    public Partition[] getPartitions() {  // on the driver: a task's RDDs do not know their partitions
      Partition[] each = new Partition[from.length];
      for (int i = 0; i < from.length; i++) {
        each[i] = new Slot(i, parents.get(from[i]).partitions()[i]);
      }
      return each;
    }
  }

  /** Parent k's partition i is partition i of the picked rows where they are its. */
  private static final class Parent extends NarrowDependency<InternalRow> {
    private final int k;
    private final int[] from;

    Parent(RDD<InternalRow> rdd, int k, int[] from) {
      super(rdd);
      this.k = k;
      this.from = from;
    }

    @Override
    public scala.collection.immutable.Seq<Object> getParents(int partition) {
      List<Object> parents = from[partition] == k ? List.of(partition) : List.of();
      return CollectionConverters.asScala(parents).toList();
    }
  }

  /** Partition i of the picked rows: its parent's partition i. */
  private record Slot(int index, Partition parent) implements Partition {}
}
