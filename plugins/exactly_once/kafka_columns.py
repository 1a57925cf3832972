"""Columns the library fills in from each record's Kafka metadata: append sinks are unique
on the first three, upsert sinks keep the winning record's coordinates. The transform also
sees each record's headers; an upsert sink's staged rows say which are tombstones."""

KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET = "kafka_topic", "kafka_partition", "kafka_offset"
KAFKA_TIMESTAMP = "kafka_timestamp"
KAFKA_HEADERS = "kafka_headers"      # array<struct<key: string, value: binary>>, as Kafka's source reads them
KAFKA_TOMBSTONE = "kafka_tombstone"  # a key's null value: under `tombstones: delete`, its row's delete
