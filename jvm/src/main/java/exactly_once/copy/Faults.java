package exactly_once.copy;

import java.io.IOException;

import org.apache.spark.TaskContext;

/**
 * The writer's named fault points, switched on as the Python ones are
 * ({@code EXACTLY_ONCE_FAULTS="copy.after_task_commit=raise"}, exactly_once.faults) and inert
 * otherwise. A point fires in the first attempt of a stage's first task (partition 0) only, so
 * that its retry can succeed and the stage's other tasks end: {@code raise} fails the task,
 * {@code exit} kills its JVM (an executor lost), {@code sleep:<seconds>} holds it (time for a
 * speculative copy to start).
 */
final class Faults {
  private static final String ENV = "EXACTLY_ONCE_FAULTS";

  private Faults() {}

  static void point(String name) throws IOException {
    TaskContext task = TaskContext.get();
    if (task == null || task.partitionId() > 0 || task.attemptNumber() > 0 || task.stageAttemptNumber() > 0) {
      return;
    }
    String switched = System.getenv(ENV);
    if (switched == null) {
      return;
    }
    for (String item : switched.split(",")) {
      String[] parts = item.trim().split("=", 2);
      if (!parts[0].equals(name) || parts.length < 2) {
        continue;
      }
      System.err.println("fault injected at " + name + ": " + parts[1]);
      System.err.flush();
      String action = parts[1];
      if (action.equals("raise")) {
        throw new IOException("fault injected at " + name);
      } else if (action.equals("exit")) {
        Runtime.getRuntime().halt(197);
      } else if (action.startsWith("sleep:")) {
        try {
          Thread.sleep((long) (Double.parseDouble(action.substring("sleep:".length())) * 1000));
        } catch (InterruptedException interrupted) { // the task killed: its commit stands
          Thread.currentThread().interrupt();
        }
      } else {
        throw new IllegalArgumentException(ENV + ": unknown action " + action + " for point " + name);
      }
    }
  }
}
