package exactly_once.isolation;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.io.ObjectStreamClass;
import java.util.ArrayList;
import java.util.List;

import org.apache.spark.Dependency;
import org.apache.spark.Partition;
import org.apache.spark.SparkContext;
import org.apache.spark.OneToOneDependency;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.TaskContext;
import org.apache.spark.TaskKilledException;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.rdd.RDD;
import org.apache.spark.scheduler.TaskSchedulerImpl;
import org.apache.spark.shuffle.FetchFailedException;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.adaptive.AdaptiveSparkPlanExec;
import org.apache.spark.sql.execution.columnar.InMemoryTableScanExec;
import org.apache.spark.sql.execution.exchange.ShuffleExchangeLike;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.util.Utils;

import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * Record isolation's sweep (exactly_once.spark.isolation): a frame whose tasks each hold a known
 * part of the records computed to the end of every task, the error a task's rows raise kept as
 * that task's result instead of failing the job. One job so names every task that fails, where
 * a job that fails stops at the first.
 *
 * <p>Only the last attempt Spark allows a task keeps its error (`spark.task.maxFailures`, 1 on a
 * local master): an earlier one fails, and Spark runs the task again, as before. Attempts are
 * counted as a task sees them, speculative and killed ones included, so an error may be kept
 * where Spark, which counts only failures, would have run the task once more. A lost shuffle
 * and a killed task always fail their attempt. An error Java cannot carry to the driver fails its
 * task too; one the driver cannot read back gives null, as if no task could be named. Frames are
 * planned without adaptive execution (the caller's setting), whose stages below a shuffle would
 * run, and could fail, while it is planned.
 */
public final class TaskFailures {
  private TaskFailures() {}

  /**
   * For each task of the frame whose rows raised, its index and the error; null, running
   * nothing, unless task i is piece i of the spread (exactly_once.spark.spread): the frame's
   * partitions are those of its one shuffle, each carried through one-to-one steps. With the
   * names of the frame's Kafka coordinates (topic, partition, offset: a string, an int and a
   * long column), each error comes with the coordinates of the last row its task gave before
   * it (nulls: none), which tell where in the task's records the failure came.
   */
  public static List<Object[]> of(Dataset<Row> frame, int pieces, List<String> coordinates) {
    SparkPlan plan = frame.queryExecution().executedPlan();
    if (plan instanceof AdaptiveSparkPlanExec || shuffles(plan) != 1) {
      return null;
    }
    RDD<InternalRow> rows = frame.queryExecution().toRdd();
    return rows.getNumPartitions() == pieces && below(rows, null)
        ? run(rows, maxFailures(frame), ordinals(frame, coordinates), null) : null;
  }

  /** The Kafka coordinates' types, in the order they are named. */
  private static final DataType[] COORDINATES = {DataTypes.StringType, DataTypes.IntegerType, DataTypes.LongType};

  /** The coordinates' ordinals in the frame's rows; null unless each is there, of its type. */
  private static int[] ordinals(Dataset<Row> frame, List<String> names) {
    if (names.size() != COORDINATES.length) {
      return null;
    }
    int[] found = new int[COORDINATES.length];
    for (int i = 0; i < found.length; i++) {
      scala.Option<Object> at = frame.schema().getFieldIndex(names.get(i));
      if (at.isEmpty() || !frame.schema().fields()[(Integer) at.get()].dataType().equals(COORDINATES[i])) {
        return null;
      }
      found[i] = (Integer) at.get();
    }
    return found;
  }

  /**
   * For each task of the frame whose rows raised, its index and the error; null, running
   * nothing, unless task i reads partition i of the cached records and no other: no shuffle,
   * each partition carried through one-to-one steps from the cache's. A frame itself cached
   * is computed into its cache (its batches, not read back as rows), the tasks that raise left
   * out. (A cached frame's plan was made adaptive when it was cached: a shuffle of its own is
   * seen only in its RDDs, after its stages below the shuffle ran, whose output the frame's
   * later jobs reuse; null then, or their error.)
   */
  public static List<Object[]> over(Dataset<Row> frame, Dataset<Row> cached) {
    return over(frame, cached, null);
  }

  /** `over`, running only the tasks of `partitions` (those a round of the write computes). */
  public static List<Object[]> over(Dataset<Row> frame, Dataset<Row> cached, List<Integer> partitions) {
    SparkPlan plan = frame.queryExecution().executedPlan();
    RDD<?> records = cachedBatches(cached.queryExecution().executedPlan());
    if (records == null || plan instanceof AdaptiveSparkPlanExec || shuffles(plan) != 0) {
      return null;
    }
    RDD<?> computed = cachedBatches(plan);
    RDD<?> rows = computed != null ? computed : frame.queryExecution().toRdd();
    return rows.getNumPartitions() == records.getNumPartitions() && below(rows, records)
        ? run(rows, maxFailures(frame), null, partitions) : null;
  }

  private static List<Object[]> run(RDD<?> rows, int maxFailures, int[] coordinates, List<Integer> partitions) {
    JavaRDD<Object[]> outcomes = new Outcomes(rows, maxFailures, coordinates).toJavaRDD();
    List<Object[]> results = new ArrayList<>();
    if (partitions == null) {
      results.addAll(outcomes.collect());
    } else {
      for (List<Object[]> each : outcomes.collectPartitions(partitions.stream().mapToInt(Integer::intValue).toArray())) {
        results.addAll(each);
      }
    }
    List<Object[]> failed = new ArrayList<>();
    for (Object[] result : results) {
      try {
        failed.add(new Object[] {result[0], deserialized((byte[]) result[1]), result[2], result[3], result[4]});
      } catch (IOException | ClassNotFoundException | RuntimeException unreadable) {
        return null;
      }
    }
    return failed;
  }

  /** The attempts Spark allows a task of the frame's session: its scheduler's. */
  private static int maxFailures(Dataset<Row> frame) {
    SparkContext context = frame.sparkSession().sparkContext();
    if (context.taskScheduler() instanceof TaskSchedulerImpl scheduler) {
      return scheduler.maxTaskFailures();
    }
    return context.conf().getInt("spark.task.maxFailures", 4);
  }

  /**
   * Each task's outcome: nothing, or its index, its rows' error (serialized) and the coordinates
   * of the last row it gave (nulls: none, or not asked for), read from its rows or, where they
   * pass into a cache, noted by a column of theirs (LastRows). Its own RDD, not a function of the
   * rows' iterator: a cached frame's partition is computed whole, into the cache, before its
   * iterator is handed on, and the error raised there must be caught too.
   */
  private static final class Outcomes extends RDD<Object[]> {
    private static final ClassTag<Object[]> OUTCOME = ClassTag$.MODULE$.apply(Object[].class);
    private static final ClassTag<Object> ANY = ClassTag$.MODULE$.apply(Object.class);
    private final int maxFailures;
    private final int[] coordinates;  // ordinals of the rows' topic, partition and offset, or null

    Outcomes(RDD<?> rows, int maxFailures, int[] coordinates) {
      super(rows, OUTCOME);
      this.maxFailures = maxFailures;
      this.coordinates = coordinates;
    }

    @Override
    public scala.collection.Iterator<Object[]> compute(Partition split, TaskContext context) {
      LastRow last = new LastRow(coordinates);
      LastRows.NOTING.set(last);  // where the rows pass into a cache, a column of theirs notes them
      try {
        scala.collection.Iterator<Object> rows = this.<Object>firstParent(ANY).iterator(split, context);
        while (rows.hasNext()) {
          last.saw(rows.next());
        }
        return scala.collection.Iterator$.MODULE$.empty();
      } catch (Exception error) {  // Scala code throws checked exceptions undeclared (a lost shuffle's)
        if (context.attemptNumber() + 1 < maxFailures || recovered(error, context)) {
          throw TaskFailures.<RuntimeException>unchecked(error);
        }
        try {
          return scala.collection.Iterator$.MODULE$.single(
              new Object[] {split.index(), serialized(error), last.topic(), last.partition(), last.offset()});
        } catch (IOException cannotCarry) {  // not serializable: fails the task as if not caught
          throw TaskFailures.<RuntimeException>unchecked(error);
        }
      } finally {
        LastRows.NOTING.remove();  // the thread runs other tasks next
      }
    }

    @Override
    public Partition[] getPartitions() {
      return this.<Object>firstParent(ANY).partitions();
    }
  }

  /** Whether Spark recovers from the error by running a stage again, or the task was stopped. */
  private static boolean recovered(Exception error, TaskContext task) {
    for (Throwable cause = error; cause != null; cause = cause.getCause()) {
      if (cause instanceof FetchFailedException || cause instanceof TaskKilledException
          || cause instanceof InterruptedException) {
        return true;
      }
    }
    return task.isInterrupted() || task.fetchFailed().isDefined();
  }

  /** The error rethrown as it is, checked or not. */
  @SuppressWarnings("unchecked")
  private static <E extends Exception> E unchecked(Exception error) throws E {
    throw (E) error;
  }

  /**
   * How many shuffles the plan has, those of the plans of the caches it reads included (an
   * adaptive one's, planned as it runs, are not seen: `below` finds them in its RDDs).
   */
  private static int shuffles(SparkPlan plan) {
    int found = plan instanceof ShuffleExchangeLike ? 1 : 0;
    if (plan instanceof InMemoryTableScanExec scan) {
      found += shuffles(scan.relation().cachedPlan());
    }
    scala.collection.Iterator<SparkPlan> children = plan.children().iterator();
    while (children.hasNext()) {
      found += shuffles(children.next());
    }
    return found;
  }

  /** The RDD of the cache a cached frame's plan reads, or null. */
  private static RDD<?> cachedBatches(SparkPlan plan) {
    if (plan instanceof InMemoryTableScanExec scan) {
      return scan.relation().cacheBuilder().cachedColumnBuffers();
    }
    if (plan instanceof AdaptiveSparkPlanExec adaptive) {
      return cachedBatches(adaptive.inputPlan());
    }
    return plan.children().size() == 1 ? cachedBatches(plan.children().head()) : null;
  }

  /**
   * Whether the RDD's partitions are, through one-to-one steps, those of `source`; or, with no
   * source, those of the one shuffle below it.
   */
  private static boolean below(RDD<?> rdd, RDD<?> source) {
    RDD<?> at = rdd;
    while (at.dependencies().size() == 1) {
      Dependency<?> dependency = at.dependencies().head();
      if (dependency instanceof ShuffleDependency) {
        return source == null && !hasShuffle(dependency.rdd());
      }
      if (!(dependency instanceof OneToOneDependency)) {
        return false;
      }
      at = dependency.rdd();
      if (source != null && at.id() == source.id()) {
        return true;
      }
    }
    return false;
  }

  /** Whether a shuffle is in the RDD's lineage (the records' read and cache have none). */
  private static boolean hasShuffle(RDD<?> rdd) {
    scala.collection.Iterator<Dependency<?>> below = rdd.dependencies().iterator();
    while (below.hasNext()) {
      Dependency<?> dependency = below.next();
      if (dependency instanceof ShuffleDependency || hasShuffle(dependency.rdd())) {
        return true;
      }
    }
    return false;
  }

  private static byte[] serialized(Throwable error) throws IOException {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
      out.writeObject(error);
    }
    return bytes.toByteArray();
  }

  private static Throwable deserialized(byte[] bytes) throws IOException, ClassNotFoundException {
    try (ObjectInputStream in = new ObjectInputStream(new ByteArrayInputStream(bytes)) {
      @Override
      protected Class<?> resolveClass(ObjectStreamClass described) throws IOException, ClassNotFoundException {
        try {
          return Class.forName(described.getName(), false, Utils.getContextOrSparkClassLoader());
        } catch (ClassNotFoundException notThere) {  // a primitive type's, say
          return super.resolveClass(described);
        }
      }
    }) {
      return (Throwable) in.readObject();
    }
  }
}
