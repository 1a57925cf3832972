-- Tombstones (a key's record without a value) delete their key's row from an upsert sink
-- ordered by offset (plugins/exactly_once/sinks/upsert.py). An upsert sink's staging and
-- contributions tables mark the rows that are tombstones with `kafka_tombstone`, and its
-- promotion reads that column. Registration adds it (registration.py, at each begin), but a
-- checkpoint pre-committed before this version may be committed first, by its commit task or
-- by an operator's cleared task while the pipeline is stalled (when no begin registers): so
-- every upsert sink's existing tables gain it here, false for their rows, which are no
-- tombstones. Tables are found by the naming rule of exactly_once.ledger.tables
-- (`staging_name`), for every sink of every configuration version.
DO $$
DECLARE
    sink record;
    prefix text;
    tbl text;
BEGIN
    FOR sink IN
        SELECT DISTINCT c.pipeline, s ->> 'name' AS name
        FROM (SELECT name AS pipeline, config FROM exactly_once.pipelines
              UNION ALL SELECT pipeline, config FROM exactly_once.config_versions) c,
             json_array_elements(c.config -> 'sinks') s
        WHERE s ->> 'mode' = 'upsert'
    LOOP
        FOREACH prefix IN ARRAY ARRAY['stg', 'ctb'] LOOP
            tbl := prefix || length(sink.pipeline) || '_' || sink.pipeline || '_' || sink.name;
            -- Room for an index suffix (`_attempt`); a longer name is cut and ends with a
            -- hash of pipeline and sink (tables._fitted).
            IF length(tbl) > 63 - length('_attempt') THEN
                tbl := left(tbl, 63 - length('_attempt') - 8 - 1) || '_'
                        || left(encode(sha256(convert_to(sink.pipeline, 'UTF8') || '\x00'::bytea
                                              || convert_to(sink.name, 'UTF8')), 'hex'), 8);
            END IF;
            IF to_regclass(format('exactly_once.%I', tbl)) IS NOT NULL THEN
                EXECUTE format('ALTER TABLE exactly_once.%I ADD COLUMN IF NOT EXISTS kafka_tombstone boolean '
                               'NOT NULL DEFAULT false', tbl);
            END IF;
        END LOOP;
    END LOOP;
END $$;
