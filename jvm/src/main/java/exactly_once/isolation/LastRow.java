package exactly_once.isolation;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The Kafka coordinates of the last row a task gave: read as its rows pass (a row's memory is
 * reused for the next: the topic is copied only when it changes), or noted by a column of
 * theirs (LastRows) where they pass into a cache instead.
 */
final class LastRow {
  private final int[] at;  // the ordinals of the rows' topic, partition and offset, or null
  private UTF8String topic;  // null until a row is seen
  private String name;  // the topic as a column noted it
  private int partition;
  private long offset;

  LastRow(int[] at) {
    this.at = at;
  }

  void saw(Object row) {
    if (at == null || !(row instanceof InternalRow values) || values.isNullAt(at[0]) || values.isNullAt(at[1])
        || values.isNullAt(at[2])) {
      return;
    }
    UTF8String seen = values.getUTF8String(at[0]);
    if (!seen.equals(topic)) {
      topic = seen.clone();
      name = null;
    }
    partition = values.getInt(at[1]);
    offset = values.getLong(at[2]);
  }

  void noted(String topicName, int partitionNumber, long offsetNumber) {
    if (!topicName.equals(name)) {
      name = topicName;
      topic = UTF8String.fromString(topicName);
    }
    partition = partitionNumber;
    offset = offsetNumber;
  }

  String topic() {
    return topic == null ? null : topic.toString();
  }

  Integer partition() {
    return topic == null ? null : partition;
  }

  Long offset() {
    return topic == null ? null : offset;
  }
}
