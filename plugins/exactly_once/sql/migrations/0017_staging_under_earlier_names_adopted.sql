-- A release before issue 36 named a sink's staging and contributions tables
-- `stg_<pipeline>_<sink>` and `ctb_<pipeline>_<sink>` (two pipelines could share one); today's
-- are `stg<n>_<pipeline>_<sink>`, n the length of the pipeline's name
-- (exactly_once.ledger.tables). Registration moved a pipeline's rows at its next begin, but a
-- checkpoint pre-committed before the upgrade is committed by its commit task or by an
-- operator's cleared task first, and no begin gets past a stall to register: the commit read
-- today's name and failed (42P01). So every pipeline's rows move here, on the first migration
-- after the upgrade, which the commit task runs too (exactly_once.orchestration.tasks).
--
-- `exactly_once.ledger_table_name` is the naming rule of exactly_once.ledger.tables in SQL
-- (tests/ledger/test_upgrade_strands.py checks they agree); 0010 inlined the same rule.
CREATE OR REPLACE FUNCTION exactly_once.ledger_table_name(prefix text, pipeline text, sink text)
RETURNS text LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN length(name) <= 63 - length('_attempt') THEN name
                ELSE left(name, 63 - length('_attempt') - 8 - 1) || '_'
                     || left(encode(sha256(convert_to(pipeline, 'UTF8') || '\x00'::bytea
                                           || convert_to(sink, 'UTF8')), 'hex'), 8)
           END
    FROM (SELECT prefix || '_' || pipeline || '_' || sink AS name) n
$$;

DO $$
DECLARE
    sink record;
    kind text;
    earlier text;
    today text;
    columns text;
BEGIN
    FOR sink IN
        SELECT DISTINCT c.pipeline, s ->> 'name' AS name, s ->> 'mode' AS mode
        FROM (SELECT name AS pipeline, config FROM exactly_once.pipelines
              UNION ALL SELECT pipeline, config FROM exactly_once.config_versions) c,
             json_array_elements(c.config -> 'sinks') s
    LOOP
        FOREACH kind IN ARRAY ARRAY['stg', 'ctb'] LOOP
            earlier := exactly_once.ledger_table_name(kind, sink.pipeline, sink.name);
            today := exactly_once.ledger_table_name(kind || length(sink.pipeline), sink.pipeline, sink.name);
            CONTINUE WHEN to_regclass(format('exactly_once.%I', earlier)) IS NULL;
            EXECUTE format('LOCK TABLE exactly_once.%I IN ACCESS EXCLUSIVE MODE', earlier);
            EXECUTE format('CREATE TABLE IF NOT EXISTS exactly_once.%I (LIKE exactly_once.%I INCLUDING DEFAULTS)',
                           today, earlier);
            -- The columns both have, in the earlier table's order (today's may have been
            -- registered already, in a later shape).
            SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO columns
            FROM pg_attribute a
            WHERE a.attrelid = format('exactly_once.%I', earlier)::regclass AND a.attnum > 0
              AND NOT a.attisdropped
              AND EXISTS (SELECT FROM pg_attribute b
                          WHERE b.attrelid = format('exactly_once.%I', today)::regclass
                            AND b.attname = a.attname AND NOT b.attisdropped);
            -- Each row kept as it is: the triggers that keep writers off a pre-committed
            -- attempt's rows are off for the move.
            EXECUTE format('ALTER TABLE exactly_once.%I DISABLE TRIGGER USER', earlier);
            EXECUTE format('ALTER TABLE exactly_once.%I DISABLE TRIGGER USER', today);
            EXECUTE format('WITH moved AS (DELETE FROM exactly_once.%I e USING exactly_once.checkpoints k '
                           'WHERE k.id = e.checkpoint_id AND k.pipeline = $1 RETURNING e.*) '
                           'INSERT INTO exactly_once.%I (%s) SELECT %s FROM moved',
                           earlier, today, columns, columns) USING sink.pipeline;
            EXECUTE format('ALTER TABLE exactly_once.%I ENABLE TRIGGER USER', earlier);
            EXECUTE format('ALTER TABLE exactly_once.%I ENABLE TRIGGER USER', today);
            IF kind = 'stg' THEN
                EXECUTE format('GRANT INSERT ON exactly_once.%I TO exactly_once_job', today);
            END IF;
            -- 0010 gave upsert sinks' tables their tombstone mark under today's names only.
            IF sink.mode = 'upsert' THEN
                EXECUTE format('ALTER TABLE exactly_once.%I ADD COLUMN IF NOT EXISTS kafka_tombstone boolean '
                               'NOT NULL DEFAULT false', today);
            END IF;
            EXECUTE format('DO $drop$ BEGIN IF NOT EXISTS (SELECT FROM exactly_once.%1$I) THEN '
                           'DROP TABLE exactly_once.%1$I; END IF; END $drop$', earlier);
        END LOOP;
    END LOOP;
END $$;
