"""Columns the library fills in from each record's Kafka metadata: append sinks are unique
on the first three, upsert sinks keep the winning record's coordinates."""

KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET = "kafka_topic", "kafka_partition", "kafka_offset"
KAFKA_TIMESTAMP = "kafka_timestamp"
