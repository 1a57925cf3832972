-- Every SECURITY DEFINER function of the ledger runs with search_path = pg_catalog, pg_temp
-- and names by their schema what it uses (issue 60, item 4). trial_promote ran with the
-- commit role's search path ("$user", public, pg_temp, 0011 and 0016), so where the job role
-- may CREATE in public (PostgreSQL <= 14's default, and any database upgraded from one) a
-- function or view it made there ran with the ledger owner's rights: a view
-- public.newest_staged came before the temporary table its statement made (pg_temp was last),
-- a public.hashtextextended(text, integer) beat pg_catalog's (text, bigint) for
-- hashtextextended(..., 0) (an exact match wins over a cast, whatever the path's order).
--
-- With pg_catalog first and pg_temp last, an unqualified function or operator resolves in
-- pg_catalog alone (pg_temp is never searched for them), an unqualified table in pg_catalog
-- then in the session's own temporary tables. The statements trial_promote runs
-- (exactly_once.trial_promotions, written by start_attempt from sql/merge/*.sql) now name
-- pg_catalog.'s functions and pg_temp.'s tables themselves, and those written before this
-- migration resolve the same under the new path. A final table's trigger that names its
-- tables without their schema must set its own search_path (the trial no longer lends it
-- public).
CREATE OR REPLACE FUNCTION exactly_once.trial_promote(checkpoint bigint, tag int, sinks text[], token text)
RETURNS TABLE (refused_by text, refused_state text, refused_message text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
            SET CONSTRAINTS ALL IMMEDIATE;
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

-- The other definers were pinned when they were made (0011, 0015); pinned again here so that
-- this migration states every one. Their bodies name the ledger's tables and functions by
-- schema, and the staging table they are given as a regclass, which format prints qualified.
ALTER FUNCTION exactly_once.freeze_precommitted_staging() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION exactly_once.discard_staged(regclass, bigint, int, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION exactly_once.settle_staged(regclass, bigint, int, text, bigint[], bigint)
    SET search_path = pg_catalog, pg_temp;

-- None is left unpinned, whatever made it.
DO $$
DECLARE
    unpinned text;
BEGIN
    SELECT string_agg(p.oid::regprocedure::text, ', ') INTO unpinned
    FROM pg_catalog.pg_proc p
    WHERE p.pronamespace = 'exactly_once'::regnamespace AND p.prosecdef
      AND p.proconfig IS DISTINCT FROM ARRAY['search_path=pg_catalog, pg_temp'];
    IF unpinned IS NOT NULL THEN
        RAISE EXCEPTION 'SECURITY DEFINER functions of the ledger without search_path = pg_catalog, pg_temp: %',
            unpinned;
    END IF;
END $$;
