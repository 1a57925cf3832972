-- Each staged row names the Spark task attempt that wrote it (writer_task), and a job's
-- write is settled when Spark commits it: only the rows of the task attempts Spark
-- committed stay. A task that committed its COPY and then failed (its executor lost
-- before the driver heard of it) is run again, and its first attempt's rows would count
-- twice (jvm/src/main/java/exactly_once/copy/Settlement.java).
DO $$
DECLARE
    staging regclass;
BEGIN
    FOR staging IN SELECT c.oid FROM pg_class c WHERE c.relkind = 'r' AND exactly_once.is_staging(c.oid) LOOP
        EXECUTE format('ALTER TABLE %s ADD COLUMN IF NOT EXISTS writer_task bigint', staging);
    END LOOP;
END $$;

-- The running attempt's rows tagged `tag` in `staging` (its own or its probe's), of the
-- task attempts Spark committed: the rows of any other task attempt go, and the committed
-- attempts' rows must be what they said they wrote. Returns how many rows went. A task
-- attempt that commits after this (an executor Spark gave up on, still running) adds rows
-- that pre-commit's count finds.
CREATE FUNCTION exactly_once.settle_staged(staging regclass, checkpoint bigint, tag int, token text,
                                           committed_tasks bigint[], committed_rows bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found bigint;
    deleted bigint := 0;
BEGIN
    IF NOT exactly_once.is_staging(staging) THEN
        RAISE EXCEPTION '% is no staging table of the ledger', staging USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM FROM exactly_once.checkpoints k WHERE k.id = checkpoint FOR SHARE;  -- no pre-commit meanwhile
    PERFORM exactly_once.require_running_attempt(checkpoint, tag, token);
    EXECUTE format('SELECT count(*) FROM %s WHERE checkpoint_id = $1 AND attempt = $2', staging)
        INTO found USING checkpoint, tag;
    IF found <> committed_rows THEN  -- writers only add rows: more than committed were written
        EXECUTE format('DELETE FROM %s WHERE checkpoint_id = $1 AND attempt = $2 '
                       'AND (writer_task IS NULL OR writer_task <> ALL ($3))', staging)
            USING checkpoint, tag, committed_tasks;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        EXECUTE format('SELECT count(*) FROM %s WHERE checkpoint_id = $1 AND attempt = $2 '
                       'AND writer_task = ANY ($3)', staging) INTO found USING checkpoint, tag, committed_tasks;
        IF found <> committed_rows THEN
            RAISE EXCEPTION '%: checkpoint % tag % has % rows of the Spark task attempts that committed, which wrote %',
                staging, checkpoint, tag, found, committed_rows USING ERRCODE = 'EO002';
        END IF;
    END IF;
    RETURN deleted;
END $$;

REVOKE EXECUTE ON FUNCTION exactly_once.settle_staged(regclass, bigint, int, text, bigint[], bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION exactly_once.settle_staged(regclass, bigint, int, text, bigint[], bigint)
    TO exactly_once_job;
