-- The demo pipeline's final tables (orders_exactly_once) in schema {schema}. Idempotent.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.orders (
    order_id text NOT NULL, sku text NOT NULL, qty int NOT NULL, price numeric(12, 2) NOT NULL,
    ts timestamptz NOT NULL,
    kafka_topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL,
    UNIQUE (kafka_topic, kafka_partition, kafka_offset));
CREATE TABLE IF NOT EXISTS {schema}.sku_minute_totals (
    minute timestamptz NOT NULL, sku text NOT NULL, orders bigint NOT NULL, qty bigint NOT NULL,
    revenue numeric(18, 2) NOT NULL, PRIMARY KEY (minute, sku));
CREATE TABLE IF NOT EXISTS {schema}.sku_last_price (
    sku text PRIMARY KEY, price numeric(12, 2) NOT NULL, ts timestamptz NOT NULL,
    kafka_partition int NOT NULL, kafka_offset bigint NOT NULL);
-- What the kafka sink sku_minute_deltas publishes: its columns and types, never written.
CREATE TABLE IF NOT EXISTS {schema}.sku_minute_deltas (
    minute timestamptz NOT NULL, sku text NOT NULL, orders bigint NOT NULL, qty bigint NOT NULL,
    revenue numeric(18, 2) NOT NULL);
