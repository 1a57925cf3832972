-- Each Kafka topic has an id (KIP-516): a topic deleted and created again under the same name
-- gets a new one, however far it is refilled. The ledger records it with each partition the
-- pipeline planned and with each frozen range, so that planning and the Spark job can tell a
-- topic created again from the one whose offsets the ledger holds (planning.OffsetsWentBack).
-- NULL: recorded before this migration (or by a broker older than Kafka 2.8); a partition
-- without one adopts the topic's current id at its next plan, and a range without one is
-- read unchecked, as before.
ALTER TABLE exactly_once.partitions ADD COLUMN IF NOT EXISTS topic_id text;
ALTER TABLE exactly_once.checkpoint_ranges ADD COLUMN IF NOT EXISTS topic_id text;
