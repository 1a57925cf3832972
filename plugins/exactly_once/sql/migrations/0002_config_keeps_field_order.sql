-- A pipeline's configuration is read back by its Spark job (Ledger.of_registered), so it
-- must come back as registered. jsonb reorders object keys (shorter keys first), and the
-- order of source.value_schema is the order of the parsed columns a transform sees and of
-- the fields a dead letter's reason names; json keeps the text as written.
ALTER TABLE exactly_once.pipelines ALTER COLUMN config TYPE json USING config::json;
