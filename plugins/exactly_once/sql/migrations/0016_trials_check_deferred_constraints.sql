-- A promotion trial checks a final table's deferred constraints too (a foreign key or unique
-- constraint DEFERRABLE INITIALLY DEFERRED), after each sink's promotion: the trial rolls back
-- before any commit, where PostgreSQL would check them, so without this a record such a key
-- refuses passed every trial and was refused by each commit, and the checkpoint stalled
-- instead of setting it aside. SET CONSTRAINTS is undone with the block's subtransaction.
CREATE OR REPLACE FUNCTION exactly_once.trial_promote(checkpoint bigint, tag int, sinks text[], token text)
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
