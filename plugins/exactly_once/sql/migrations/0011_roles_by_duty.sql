-- Roles by duty (README, "Roles by duty"). The role that migrates owns the ledger and is the
-- commit role: the Airflow tasks connect as it (connection pipeline_db), plan, record the
-- attempts and their pre-commits, and promote staging into the final tables. Two group
-- roles hold the rest, and a database administrator makes login roles members of them:
--
--   exactly_once_job   the Spark job (connection pipeline_db_job). It reads where attempts
--                      stand, inserts into staging, and through the two functions below,
--                      with its attempt's token, deletes its own attempt's staged rows and
--                      tries a promotion that is always rolled back. It may not touch a
--                      final table, update or delete staging rows, or write the ledger: its
--                      task records the pre-commit.
--   exactly_once_read  status and the pipelines view (connection pipeline_db_read): reads the
--                      ledger's tables, no staging, no final table.
--
-- Roles belong to the whole server: every database of the product shares them.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'exactly_once_job') THEN
        CREATE ROLE exactly_once_job NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'exactly_once_read') THEN
        CREATE ROLE exactly_once_read NOLOGIN;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE EXCEPTION 'migration 0011 needs the group roles exactly_once_job and exactly_once_read, and role % '
                    'may not create roles', current_user
        USING HINT = 'as a database administrator: CREATE ROLE exactly_once_job NOLOGIN; '
                     'CREATE ROLE exactly_once_read NOLOGIN; (or give the migrating role CREATEROLE)';
END $$;

GRANT USAGE ON SCHEMA exactly_once TO exactly_once_job, exactly_once_read;

-- What the job reads: its attempt's configuration, its checkpoint and ranges, why earlier
-- attempts were sent back, the ranges an operator dead-lettered.
GRANT SELECT ON exactly_once.config_versions, exactly_once.checkpoints, exactly_once.checkpoint_ranges,
    exactly_once.attempts, exactly_once.operator_actions TO exactly_once_job;
-- Staging takes inserts; Spark's JDBC writer reads a table's columns before it appends.
-- Each sink's staging table gets the same grant when registration creates it (sql/ledger.sql).
GRANT SELECT, INSERT ON exactly_once.staging_dead_letters TO exactly_once_job;

GRANT SELECT ON exactly_once.pipelines, exactly_once.config_versions, exactly_once.checkpoints,
    exactly_once.checkpoint_ranges, exactly_once.attempts, exactly_once.committed_ranges, exactly_once.partitions,
    exactly_once.gaps, exactly_once.operator_actions, exactly_once.preflights, exactly_once.dead_letters,
    exactly_once.schema_migrations TO exactly_once_read;

-- The staging triggers lock the checkpoints a write touches (0009): they run with the
-- ledger owner's rights, whoever writes.
ALTER FUNCTION exactly_once.freeze_precommitted_staging() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- The promotions an attempt may try, written by start_attempt (commit role) with their
-- values bound: for the attempt's own tag and for its probes' (the tag's negative).
CREATE TABLE exactly_once.trial_promotions (
    checkpoint_id bigint NOT NULL REFERENCES exactly_once.checkpoints (id) ON DELETE CASCADE,
    tag int NOT NULL,
    position int NOT NULL,
    sink text NOT NULL,
    statement text NOT NULL,
    PRIMARY KEY (checkpoint_id, tag, position)
);

-- One job role serves every pipeline of the server, so its two functions ask for the
-- attempt's token: a secret its task hands its job (a private file), derived from this
-- key, which only the ledger's owner reads. A job cannot act on another attempt's rows.
CREATE TABLE exactly_once.job_key (key text NOT NULL);
INSERT INTO exactly_once.job_key SELECT gen_random_uuid()::text || gen_random_uuid()::text;

CREATE FUNCTION exactly_once.attempt_token(checkpoint bigint, attempt int) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT encode(sha256(convert_to(k.key || ':' || checkpoint || ':' || attempt, 'UTF8')), 'hex')
    FROM exactly_once.job_key k
$$;

-- Whether a table is one of the ledger's staging tables (registration's names, sql/ledger.sql).
CREATE FUNCTION exactly_once.is_staging(candidate regclass) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE c.oid = candidate AND n.nspname = 'exactly_once'
                     AND (c.relname ~ '^stg[0-9]*_' OR c.relname = 'staging_dead_letters'))
$$;

-- Refuses a caller that is not the running attempt `tag` (or its probe) of the checkpoint
-- with that attempt's token.
CREATE FUNCTION exactly_once.require_running_attempt(checkpoint bigint, tag int, token text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM FROM exactly_once.checkpoints k WHERE k.id = checkpoint AND k.state = 'running' AND k.attempt = abs(tag);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint %: attempt % is not its running attempt', checkpoint, abs(tag)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF token IS DISTINCT FROM exactly_once.attempt_token(checkpoint, abs(tag)) THEN
        RAISE EXCEPTION 'checkpoint %: not the token of attempt %', checkpoint, abs(tag)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- A job's own staged rows, tagged with its running attempt (or a probe's negative tag),
-- deleted: a probe's rows once tried, an attempt's before it writes again after isolating
-- records. Anything else in staging is the ledger's to delete.
CREATE FUNCTION exactly_once.discard_staged(staging regclass, checkpoint bigint, tag int, token text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    deleted bigint;
BEGIN
    IF NOT exactly_once.is_staging(staging) THEN
        RAISE EXCEPTION '% is no staging table of the ledger', staging USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM FROM exactly_once.checkpoints k WHERE k.id = checkpoint FOR SHARE;  -- no pre-commit meanwhile
    PERFORM exactly_once.require_running_attempt(checkpoint, tag, token);
    EXECUTE format('DELETE FROM %s WHERE checkpoint_id = $1 AND attempt = $2', staging) USING checkpoint, tag;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END $$;

-- The rows staged under `tag` promoted on trial into the final tables of `sinks`, in order
-- and each on top of the ones before (a foreign key between sinks sees its rows), then
-- rolled back whatever happens. Returns the first sink that refused them with the
-- database's SQLSTATE and message, or no row. It runs the statements start_attempt wrote,
-- never a statement of the caller's, with the commit role's search path and pg_temp last:
-- a temporary table of the caller's session cannot stand in for a table a final table's
-- trigger or check names.
CREATE FUNCTION exactly_once.trial_promote(checkpoint bigint, tag int, sinks text[], token text)
RETURNS TABLE (refused_by text, refused_state text, refused_message text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = "$user", public, pg_temp AS $$
DECLARE
    step record;
    trying text;
BEGIN
    PERFORM exactly_once.require_running_attempt(checkpoint, tag, token);
    BEGIN
        FOR step IN SELECT t.sink, t.statement FROM exactly_once.trial_promotions t
                    WHERE t.checkpoint_id = checkpoint AND t.tag = trial_promote.tag AND t.sink = ANY (sinks)
                    ORDER BY t.position LOOP
            trying := step.sink;
            EXECUTE step.statement;
        END LOOP;
        RAISE EXCEPTION 'trial promotion passed' USING ERRCODE = 'EO001';  -- undoes the block's work
    EXCEPTION
        WHEN SQLSTATE 'EO001' THEN
            RETURN;
        WHEN OTHERS THEN
            refused_by := trying;
            refused_state := SQLSTATE;
            refused_message := SQLERRM;
            RETURN NEXT;
    END;
END $$;

-- The staging tables registered before this migration.
DO $$
DECLARE
    staging regclass;
BEGIN
    FOR staging IN SELECT c.oid FROM pg_class c WHERE c.relkind = 'r' AND exactly_once.is_staging(c.oid) LOOP
        EXECUTE format('GRANT SELECT, INSERT ON %s TO exactly_once_job', staging);
    END LOOP;
END $$;

REVOKE EXECUTE ON FUNCTION exactly_once.attempt_token(bigint, int),
    exactly_once.require_running_attempt(bigint, int, text),
    exactly_once.discard_staged(regclass, bigint, int, text),
    exactly_once.trial_promote(bigint, int, text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION exactly_once.discard_staged(regclass, bigint, int, text),
    exactly_once.trial_promote(bigint, int, text[], text) TO exactly_once_job;
