-- A commit that fails for a reason no record isolation fixes (a permission, a column that
-- went, a statement timeout that persists, a clash in the ledger's own tables) stalls its
-- checkpoint instead of failing every later run with a raw error. The checkpoint keeps its
-- pre-committed attempt and staged rows (promise 6): stalled with `precommitted_attempt` set
-- means "stalled at commit", which a cleared commit task (resume) commits once the cause is
-- fixed, and `stalls retry` releases to the next run.
--
--   precommitted ──commit fails: no retry can fix it, or stall_after times for one cause──▶ stalled
--        ▲                                                                                  │
--        └─────────────── (its pre-commit kept) a cleared commit task commits it ◀──────────┘
--
-- `commit_failures` counts the failed commits of one cause in a row (a new cause starts at 1).
ALTER TABLE exactly_once.checkpoints ADD COLUMN commit_failures int NOT NULL DEFAULT 0;

-- An operator may reset a partition whose offsets went backwards (a topic deleted and
-- created again, a failover to another cluster): its history from its new start up to its
-- old frontier, [from_offset, to_offset), is kept under a label and those offsets are
-- planned again (exactly_once.operate.stalls reset-partition).
ALTER TABLE exactly_once.operator_actions DROP CONSTRAINT operator_actions_action_check;
ALTER TABLE exactly_once.operator_actions ADD CONSTRAINT operator_actions_action_check
    CHECK (action IN ('retry', 'resume', 'dead_letter', 'reset_partition'));
ALTER TABLE exactly_once.operator_actions DROP CONSTRAINT operator_actions_check;
ALTER TABLE exactly_once.operator_actions ADD CONSTRAINT operator_actions_check
    CHECK ((action IN ('dead_letter', 'reset_partition')) = (topic IS NOT NULL AND partition IS NOT NULL
                                                            AND from_offset IS NOT NULL AND to_offset > from_offset));

-- Staging is insert-only, and a pre-committed attempt's rows are frozen: no UPDATE ever,
-- no INSERT of rows of a checkpoint's pre-committed attempt once it pre-committed (nor
-- after its commit), no DELETE of them while it waits for its commit. Each statement first takes a share lock on the checkpoints it touches,
-- so a pre-commit (which locks its checkpoint for update) waits for writes in flight and
-- counts their rows, and a write after it sees the checkpoint pre-committed and fails.
-- So the rows a commit counts are the rows it promotes, in any snapshot (an executor
-- declared lost but alive cannot add to them), and nothing deletes them but the ledger
-- once the checkpoint is no longer pre-committed (committed, or sent back).
CREATE FUNCTION exactly_once.freeze_precommitted_staging() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    frozen record;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'staging table %.% is insert-only: its rows are never updated', TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM 1 FROM exactly_once.checkpoints
    WHERE id IN (SELECT DISTINCT checkpoint_id FROM changed)
    ORDER BY id
    FOR SHARE;
    SELECT k.id, k.precommitted_attempt INTO frozen
    FROM exactly_once.checkpoints k
    JOIN (SELECT DISTINCT checkpoint_id, attempt FROM changed) c
      ON c.checkpoint_id = k.id AND c.attempt = k.precommitted_attempt
    WHERE k.state IN ('precommitted', 'stalled') OR (TG_OP = 'INSERT' AND k.state = 'committed')
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'staging table %.%: attempt % of checkpoint % is pre-committed; its rows are frozen '
                        '(% refused)', TG_TABLE_SCHEMA, TG_TABLE_NAME, frozen.precommitted_attempt,
                        frozen.id, TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER frozen_inserts AFTER INSERT ON exactly_once.staging_dead_letters
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION exactly_once.freeze_precommitted_staging();
CREATE TRIGGER frozen_deletes AFTER DELETE ON exactly_once.staging_dead_letters
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION exactly_once.freeze_precommitted_staging();
CREATE TRIGGER no_updates BEFORE UPDATE ON exactly_once.staging_dead_letters
    FOR EACH STATEMENT EXECUTE FUNCTION exactly_once.freeze_precommitted_staging();
