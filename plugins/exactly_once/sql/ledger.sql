-- Statements of the ledger (plugins/exactly_once/ledger/: protocol.py, commit.py, rows.py, registration.py, holders.py), by name.
-- {staging} and {final} are identifiers filled in with psycopg2.sql.
-- Functions are named pg_catalog.'s: the commit role's search path holds public, where another
-- role may have made a function that matches a call better (hashtextextended(text, integer)
-- beats pg_catalog's (text, bigint) for a 0); the preflight refuses such a role (issue 60).

-- name: lock_pipeline
-- Serializes registration, planning and recovery of one pipeline.
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('exactly_once:' || %(pipeline)s, 0));

-- name: lock_commits
-- Commits of a pipeline's checkpoints run side by side: their merges commute.
SELECT pg_catalog.pg_advisory_xact_lock_shared(
    pg_catalog.hashtextextended('exactly_once:commit:' || %(pipeline)s, 0));

-- name: lock_commits_alone
-- A reprocessing's commit runs alone: it recomputes keys from every checkpoint's
-- contribution, which a commit beside it could change after it read them.
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('exactly_once:commit:' || %(pipeline)s, 0));

-- name: register_pipeline
-- json has no equality: configurations compare as text (field order included, on purpose).
INSERT INTO exactly_once.pipelines (name, config) VALUES (%(pipeline)s, %(config)s)
ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config
WHERE exactly_once.pipelines.config::text IS DISTINCT FROM EXCLUDED.config::text;

-- name: register_version
INSERT INTO exactly_once.config_versions (pipeline, version, config) VALUES (%(pipeline)s, %(version)s, %(config)s)
ON CONFLICT DO NOTHING;

-- name: pipeline_config
SELECT config FROM exactly_once.pipelines WHERE name = %(pipeline)s;

-- name: attempt_config
-- The configuration the attempt was started with.
SELECT v.config
FROM exactly_once.attempts a
JOIN exactly_once.checkpoints k ON k.id = a.checkpoint_id
JOIN exactly_once.config_versions v ON v.pipeline = k.pipeline AND v.version = a.config_version
WHERE k.pipeline = %(pipeline)s AND a.checkpoint_id = %(checkpoint_id)s AND a.attempt = %(attempt)s;

-- name: create_contributions
CREATE TABLE IF NOT EXISTS {contributions} AS SELECT {columns}, 0::bigint AS checkpoint_id FROM {final} WITH NO DATA;
CREATE INDEX IF NOT EXISTS {by_checkpoint} ON {contributions} (checkpoint_id);
CREATE INDEX IF NOT EXISTS {by_keys} ON {contributions} ({keys});

-- name: add_tombstone_mark
-- An upsert sink's staging or contributions table marks its rows that are tombstones
-- (plugins/exactly_once/sinks/upsert.py). Its default stays: the rows already there, and a
-- writer that names no such column (an earlier library's job), have none.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} boolean NOT NULL DEFAULT false;

-- name: tombstone_mark_default
ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT false;

-- name: create_tombstones_index
-- A merge's lookup of a key's tombstones among the contributions (sql/merge/upsert.sql).
CREATE INDEX IF NOT EXISTS {index} ON {contributions} ({keys}) WHERE kafka_tombstone;

-- name: index_ready
SELECT pg_catalog.to_regclass(%(index)s) IS NOT NULL;

-- name: table_columns
SELECT a.attname::text
FROM pg_attribute a
WHERE a.attrelid = pg_catalog.to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

-- name: unique_indexes
-- The column sets of the table's unique indexes (what ON CONFLICT can use).
SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attname)
FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = pg_catalog.to_regclass(%(table)s) AND i.indisunique AND i.indpred IS NULL
GROUP BY i.indexrelid;

-- name: job_needs_schema_usage
-- Whether the job role still needs the schema's USAGE, and the commit role owns the schema and can grant it.
SELECT NOT pg_catalog.has_schema_privilege('exactly_once_job', n.oid, 'USAGE')
       AND pg_catalog.pg_has_role(n.nspowner, 'USAGE')
FROM pg_namespace n WHERE n.nspname = %(schema)s;

-- name: grant_schema_usage
-- The job role reads a final table's columns and constraints from the catalog by its name,
-- which takes the schema's USAGE; it holds no right on the table itself.
GRANT USAGE ON SCHEMA {schema} TO exactly_once_job;

-- name: create_staging
-- Insert-only, a pre-committed attempt's rows frozen (sql/migrations/0009_commit_stalls_and_frozen_staging.sql).
-- writer_task: the Spark task attempt that wrote the row (sql/migrations/0015_staging_writer_tasks.sql).
CREATE TABLE IF NOT EXISTS {staging} (LIKE {final}, checkpoint_id bigint NOT NULL, attempt int NOT NULL,
                                      writer_task bigint);
CREATE INDEX IF NOT EXISTS {staging_index} ON {staging} (checkpoint_id, attempt);
CREATE OR REPLACE TRIGGER frozen_inserts AFTER INSERT ON {staging} REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION exactly_once.freeze_precommitted_staging();
CREATE OR REPLACE TRIGGER frozen_deletes AFTER DELETE ON {staging} REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION exactly_once.freeze_precommitted_staging();
CREATE OR REPLACE TRIGGER no_updates BEFORE UPDATE ON {staging}
    FOR EACH STATEMENT EXECUTE FUNCTION exactly_once.freeze_precommitted_staging();
-- The job role inserts, and reads none of it (sql/migrations/0014_job_inserts_into_staging_only.sql).
GRANT INSERT ON {staging} TO exactly_once_job;

-- name: add_writer_task
ALTER TABLE {staging} ADD COLUMN IF NOT EXISTS writer_task bigint;

-- name: staged_summary
-- Row count of one attempt's staging rows. Writers only ever add rows (only the ledger
-- deletes them: the job's settle_staged those of its Spark task attempts Spark did not
-- commit), so a count tells rows written twice (a task attempt that committed after its
-- write was settled) or after pre-commit; a fenced attempt's rows carry its own number.
SELECT pg_catalog.count(*)
FROM {staging}
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s;

-- name: delete_staging
-- All attempts of the checkpoint when attempt is NULL.
DELETE FROM {staging}
WHERE checkpoint_id = %(checkpoint_id)s AND (%(attempt)s::int IS NULL OR attempt = %(attempt)s);

-- name: lock_staging_now
-- A committed checkpoint's clean-up (exactly_once.ledger.clean_up): the table, unless anyone
-- holds a lock on it (a job writing, a commit or a probe reading), in which case it fails at
-- once (55P03) and the clean-up deletes instead.
LOCK TABLE {staging} IN ACCESS EXCLUSIVE MODE NOWAIT;

-- name: staged_by_others
-- Whether the table holds rows of any other checkpoint (its index leads with checkpoint_id).
SELECT EXISTS (SELECT FROM {staging} WHERE checkpoint_id < %(checkpoint_id)s)
    OR EXISTS (SELECT FROM {staging} WHERE checkpoint_id > %(checkpoint_id)s);

-- name: truncate_staging
-- Only the committed checkpoint's rows are in it, and the table is locked: no trigger needs
-- to see them (its rows are no longer frozen).
TRUNCATE {staging};

-- name: delete_stale_staging
-- Staging rows that no commit can promote: written late by a fenced (zombie) attempt,
-- left by one that crashed, or a committed checkpoint's whose clean-up did not run
-- (Ledger.commit). Live rows belong to a running checkpoint's current attempt
-- (tagged with its number, or its negative while it probes: exactly_once.spark.staging) or
-- to the pre-committed attempt; each statement sees one snapshot of both tables, and an
-- attempt writes only after start_attempt committed, so live rows are never matched. A
-- checkpoint stalled at commit keeps its pre-committed rows.
DELETE FROM {staging} s
USING exactly_once.checkpoints k
WHERE k.id = s.checkpoint_id AND k.pipeline = %(pipeline)s
  AND NOT (k.state = 'running' AND pg_catalog.abs(s.attempt) = k.attempt)
  AND NOT (k.state IN ('precommitted', 'stalled') AND s.attempt = coalesce(k.precommitted_attempt, 0));

-- name: lock_checkpoint
-- For the rest of the transaction (the Spark job's role reads a checkpoint without it).
SELECT FROM exactly_once.checkpoints WHERE id = %(checkpoint_id)s FOR UPDATE;

-- name: checkpoint
SELECT id, dag_run_id, state::text, attempt, interval_start, interval_end, lease_until,
       precommitted_attempt, staged, records, reason, replays, commit_failures, stalled_at
FROM exactly_once.checkpoints
WHERE id = %(checkpoint_id)s AND pipeline = %(pipeline)s;

-- name: attempt
SELECT checkpoint_id, attempt, state::text, reason, retryable
FROM exactly_once.attempts
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s;

-- name: checkpoint_of_run
SELECT id FROM exactly_once.checkpoints
WHERE pipeline = %(pipeline)s AND dag_run_id = %(dag_run_id)s AND replays IS NULL;

-- name: open_reprocessing
SELECT id FROM exactly_once.checkpoints
WHERE replays = %(checkpoint_id)s AND state IN ('planned', 'running', 'stalled', 'precommitted');

-- name: latest_processing
-- Whose rows the sinks hold for a checkpoint's ranges: the checkpoint's own commit or its
-- latest committed reprocessing, with the configuration version its attempt ran.
SELECT k.id, a.config_version
FROM exactly_once.checkpoints k
LEFT JOIN exactly_once.attempts a ON a.checkpoint_id = k.id AND a.attempt = k.precommitted_attempt
WHERE (k.id = %(checkpoint_id)s OR k.replays = %(checkpoint_id)s) AND k.state = 'committed'
ORDER BY k.committed_at DESC, k.id DESC
LIMIT 1;

-- name: replaced
SELECT replaced FROM exactly_once.checkpoints WHERE id = %(checkpoint_id)s AND pipeline = %(pipeline)s;

-- name: contributions_not_kept
-- Committed checkpoints with records whose contribution to the keyed sinks was not kept
-- (committed before migration 0008).
SELECT k.id FROM exactly_once.checkpoints k
WHERE k.pipeline = %(pipeline)s AND k.state = 'committed' AND NOT k.contributions_kept
  AND EXISTS (SELECT FROM exactly_once.committed_ranges c WHERE c.checkpoint_id = k.id)
ORDER BY k.id;

-- name: insert_reprocessing
INSERT INTO exactly_once.checkpoints
    (pipeline, dag_run_id, interval_start, interval_end, reach, state, lease_until, created_at, replays)
SELECT pipeline, %(dag_run_id)s, interval_start, interval_end, reach, 'planned', %(lease_until)s, %(now)s, id
FROM exactly_once.checkpoints WHERE id = %(checkpoint_id)s
RETURNING id;

-- name: checkpoint_ranges
-- A reprocessing reads the ranges of the checkpoint it replays.
SELECT topic, partition, from_offset, to_offset
FROM exactly_once.checkpoint_ranges
WHERE checkpoint_id = coalesce((SELECT replays FROM exactly_once.checkpoints WHERE id = %(checkpoint_id)s),
                               %(checkpoint_id)s)
ORDER BY topic, partition, from_offset;

-- name: checkpoint_topic_ids
-- The ids of the topics a checkpoint's ranges (a reprocessing's: the replayed checkpoint's)
-- were planned in, where recorded (migration 0019): what its job checks before it reads.
SELECT DISTINCT topic, partition, topic_id
FROM exactly_once.checkpoint_ranges
WHERE checkpoint_id = coalesce((SELECT replays FROM exactly_once.checkpoints WHERE id = %(checkpoint_id)s),
                               %(checkpoint_id)s)
  AND topic_id IS NOT NULL AND from_offset < to_offset
ORDER BY topic, partition;

-- name: partitions
SELECT topic, partition, start_offset, frontier, topic_id FROM exactly_once.partitions WHERE pipeline = %(pipeline)s;

-- name: taken_ranges
-- Live ranges and gaps reaching past their partition's frontier (below it every offset
-- is planned): what a new plan must leave out.
SELECT r.topic, r.partition, r.from_offset, r.to_offset
FROM exactly_once.checkpoint_ranges r
JOIN exactly_once.partitions s USING (pipeline, topic, partition)
WHERE r.pipeline = %(pipeline)s AND NOT r.released AND r.to_offset > s.frontier
UNION ALL
SELECT g.topic, g.partition, g.from_offset, g.to_offset
FROM exactly_once.gaps g
JOIN exactly_once.partitions s USING (pipeline, topic, partition)
WHERE g.pipeline = %(pipeline)s AND g.to_offset > s.frontier;

-- name: released_ranges
-- Ranges of aborted checkpoints not yet planned again (the next plan takes them whole); not
-- those of a reset partition's history (kept under a label, no partition of the pipeline).
SELECT r.topic, r.partition, r.from_offset, r.to_offset
FROM exactly_once.checkpoint_ranges r
JOIN exactly_once.partitions s USING (pipeline, topic, partition)
WHERE r.pipeline = %(pipeline)s AND r.released AND r.replanned_by IS NULL AND r.from_offset < r.to_offset
ORDER BY r.topic, r.partition, r.from_offset;

-- name: insert_checkpoint
INSERT INTO exactly_once.checkpoints
    (pipeline, dag_run_id, interval_start, interval_end, reach, state, lease_until, created_at, committed_at)
VALUES (%(pipeline)s, %(dag_run_id)s, %(interval_start)s, %(interval_end)s, %(reach)s,
        %(state)s, %(lease_until)s, %(now)s, CASE WHEN %(state)s = 'committed' THEN %(now)s END)
RETURNING id;

-- name: insert_range
-- With the id of the topic it was planned in (KIP-516), which the job checks before it reads.
INSERT INTO exactly_once.checkpoint_ranges
    (checkpoint_id, pipeline, topic, partition, from_offset, to_offset, topic_id)
VALUES (%(checkpoint_id)s, %(pipeline)s, %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s, %(topic_id)s);

-- name: mark_replanned
-- Exactly the released range the plan read: one released after it read them waits for the next plan.
UPDATE exactly_once.checkpoint_ranges SET replanned_by = %(checkpoint_id)s
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s
  AND from_offset = %(from_offset)s AND to_offset = %(to_offset)s AND released AND replanned_by IS NULL;

-- name: set_frontier
-- A partition recorded without its topic's id (before migration 0019, or after a reset that
-- did not know it) adopts the one planned with; planning refused a different one.
INSERT INTO exactly_once.partitions (pipeline, topic, partition, start_offset, frontier, topic_id)
VALUES (%(pipeline)s, %(topic)s, %(partition)s, %(start_offset)s, %(frontier)s, %(topic_id)s)
ON CONFLICT (pipeline, topic, partition) DO UPDATE
SET frontier = EXCLUDED.frontier, topic_id = coalesce(EXCLUDED.topic_id, exactly_once.partitions.topic_id);

-- name: insert_gap
INSERT INTO exactly_once.gaps (pipeline, topic, partition, from_offset, to_offset, checkpoint_id, recorded_at)
VALUES (%(pipeline)s, %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s, %(checkpoint_id)s, %(now)s);

-- name: start_attempt
UPDATE exactly_once.checkpoints
SET state = 'running', attempt = attempt + 1, lease_until = %(lease_until)s, reason = NULL
WHERE id = %(checkpoint_id)s
RETURNING attempt;

-- name: forget_trial_promotions
-- An attempt's trial promotions, once a new attempt starts or the checkpoint is committed or released.
DELETE FROM exactly_once.trial_promotions WHERE checkpoint_id = %(checkpoint_id)s;

-- name: insert_trial_promotion
INSERT INTO exactly_once.trial_promotions (checkpoint_id, tag, position, sink, statement)
VALUES (%(checkpoint_id)s, %(tag)s, %(position)s, %(sink)s, %(promotion)s);

-- name: trial_promote
SELECT refused_by, refused_state, refused_message
FROM exactly_once.trial_promote(%(checkpoint_id)s, %(tag)s, %(sinks)s, %(token)s);

-- name: discard_staged
SELECT exactly_once.discard_staged(%(staging)s::regclass, %(checkpoint_id)s, %(tag)s, %(token)s);

-- name: attempt_token
-- The secret the attempt's job shows the ledger's staging functions (sql/migrations/0011_roles_by_duty.sql).
SELECT exactly_once.attempt_token(%(checkpoint_id)s, %(attempt)s);

-- name: insert_attempt
INSERT INTO exactly_once.attempts (checkpoint_id, attempt, started_at, config_version)
VALUES (%(checkpoint_id)s, %(attempt)s, %(now)s, %(config_version)s);

-- name: end_attempts
-- Ends the checkpoint's attempts still in `from_state` (one attempt, or all when attempt is NULL).
UPDATE exactly_once.attempts
SET state = %(state)s, ended_at = %(now)s, reason = %(reason)s, retryable = %(retryable)s
WHERE checkpoint_id = %(checkpoint_id)s AND state = %(from_state)s
  AND (%(attempt)s::int IS NULL OR attempt = %(attempt)s);

-- name: mark_precommitted
UPDATE exactly_once.checkpoints
SET state = 'precommitted', precommitted_attempt = %(attempt)s, staged = %(staged)s,
    records = %(records)s, precommitted_at = %(now)s
WHERE id = %(checkpoint_id)s;

-- name: mark_planned
-- Back to be run again: a failed attempt, or staged data that changed after pre-commit.
UPDATE exactly_once.checkpoints
SET state = 'planned', precommitted_attempt = NULL, staged = NULL, records = NULL,
    precommitted_at = NULL, reason = %(reason)s, lease_until = %(lease_until)s
WHERE id = %(checkpoint_id)s;

-- name: promote_ranges
INSERT INTO exactly_once.committed_ranges (pipeline, topic, partition, from_offset, to_offset, checkpoint_id, committed_at)
SELECT pipeline, topic, partition, from_offset, to_offset, checkpoint_id, %(now)s
FROM exactly_once.checkpoint_ranges
WHERE checkpoint_id = %(checkpoint_id)s AND from_offset < to_offset;

-- name: mark_committed
-- Its contribution to the keyed sinks is kept now. (A reprocessing's commit leaves the row of
-- the checkpoint it replays alone: a request to reprocess that one locks the two rows the other way round.)
UPDATE exactly_once.checkpoints
SET state = 'committed', committed_at = %(now)s, replaced = %(replaced)s, contributions_kept = true
WHERE id = %(checkpoint_id)s;

-- name: claim_announcements
-- The pipeline's committed checkpoints no task announced yet, or this task's try generation did
-- (sql/migrations/0023_announcements.sql), claimed by it (exactly_once.ledger.announcements): the
-- configuration version their attempt ran and, for a reprocessing, the rows it replaced. Empty
-- checkpoints and the retention's base were never pre-committed: nothing to announce. Locked in
-- the order retention's fold locks them (sql/retention.sql, foldable): neither waits on the
-- other in a cycle.
WITH claimed AS (
    SELECT id FROM exactly_once.checkpoints
    WHERE pipeline = %(pipeline)s AND state = 'committed' AND precommitted_attempt IS NOT NULL
      AND (announced_by IS NULL OR announced_by = %(announcer)s)
    ORDER BY committed_at, id
    FOR UPDATE)
UPDATE exactly_once.checkpoints k SET announced_by = %(announcer)s
FROM claimed
WHERE k.id = claimed.id
RETURNING k.id, k.replaced, (SELECT a.config_version FROM exactly_once.attempts a
                             WHERE a.checkpoint_id = k.id AND a.attempt = k.precommitted_attempt);

-- name: record_phase_seconds
-- Seconds of phases of the checkpoint (sql/migrations/0012_phase_seconds_and_alerts.sql), by name.
UPDATE exactly_once.checkpoints SET phase_seconds = phase_seconds || %(seconds)s::jsonb
WHERE id = %(checkpoint_id)s;

-- name: mark_aborted
UPDATE exactly_once.checkpoints SET state = 'aborted', reason = %(reason)s WHERE id = %(checkpoint_id)s;
UPDATE exactly_once.checkpoint_ranges SET released = true WHERE checkpoint_id = %(checkpoint_id)s;

-- name: recoverable
-- Pre-committed checkpoints (to commit) and abandoned ones whose lease ran out (to abort),
-- but for those of the run that recovers (a cleared run resumes its own checkpoint).
SELECT id, state::text
FROM exactly_once.checkpoints
WHERE pipeline = %(pipeline)s
  AND (state = 'precommitted'
       OR (state IN ('planned', 'running') AND lease_until < %(now)s AND dag_run_id <> %(own_run)s))
ORDER BY id;

-- name: failed_attempts
-- The checkpoint's attempts that failed (not those superseded or aborted with it), newest first.
SELECT checkpoint_id, attempt, state::text, reason, retryable
FROM exactly_once.attempts
WHERE checkpoint_id = %(checkpoint_id)s AND state = 'aborted' AND retryable IS NOT NULL
ORDER BY attempt DESC;

-- name: mark_stalled
UPDATE exactly_once.checkpoints SET state = 'stalled', reason = %(reason)s, stalled_at = %(now)s
WHERE id = %(checkpoint_id)s;

-- name: record_commit_failure
-- A failed commit of a pre-committed checkpoint, which keeps its pre-commit: stalled when
-- %(stalled)s, else left pre-committed for a retry or the next recovery.
UPDATE exactly_once.checkpoints
SET reason = %(reason)s, commit_failures = %(failures)s,
    state = CASE WHEN %(stalled)s THEN 'stalled'::exactly_once.checkpoint_state ELSE state END,
    stalled_at = CASE WHEN %(stalled)s THEN %(now)s ELSE stalled_at END
WHERE id = %(checkpoint_id)s;

-- name: renew_lease
-- The heartbeat of a running attempt: its lease is extended while its task lives.
UPDATE exactly_once.checkpoints SET lease_until = %(lease_until)s
WHERE id = %(checkpoint_id)s AND state = 'running' AND attempt = %(attempt)s;

-- name: lease_expiries
-- How many checkpoints of the pipeline a lease expiry aborted whose ranges overlap these
-- offsets [from_offset, to_offset) of one partition.
SELECT pg_catalog.count(DISTINCT k.id)
FROM exactly_once.checkpoint_ranges r
JOIN exactly_once.checkpoints k ON k.id = r.checkpoint_id
WHERE r.pipeline = %(pipeline)s AND r.topic = %(topic)s AND r.partition = %(partition)s AND r.released
  AND k.state = 'aborted' AND k.reason LIKE %(prefix)s
  AND pg_catalog.int8range(r.from_offset, r.to_offset) && pg_catalog.int8range(%(from_offset)s, %(to_offset)s);

-- name: split_released
-- A plan takes the first part of a released range (the per-run cap): the rest, from
-- %(cut)s, stays released under the aborted checkpoint, for a later plan.
INSERT INTO exactly_once.checkpoint_ranges
    (checkpoint_id, pipeline, topic, partition, from_offset, to_offset, released)
SELECT checkpoint_id, pipeline, topic, partition, %(cut)s, to_offset, true
FROM exactly_once.checkpoint_ranges
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s
  AND from_offset = %(from_offset)s AND to_offset = %(to_offset)s AND released AND replanned_by IS NULL;
UPDATE exactly_once.checkpoint_ranges SET to_offset = %(cut)s
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s
  AND from_offset = %(from_offset)s AND to_offset = %(to_offset)s AND released AND replanned_by IS NULL;

-- name: stalled
-- The pipeline's stalled checkpoints, oldest first.
SELECT id FROM exactly_once.checkpoints WHERE pipeline = %(pipeline)s AND state = 'stalled' ORDER BY id;

-- name: insert_operator_action
INSERT INTO exactly_once.operator_actions
    (pipeline, action, checkpoint_id, topic, partition, from_offset, to_offset, reason, acted_at)
VALUES (%(pipeline)s, %(action)s, %(checkpoint_id)s, %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s,
        %(reason)s, %(now)s);

-- name: dead_lettered_ranges
-- Ranges an operator dead-lettered that overlap [from_offset, to_offset) of one partition.
SELECT topic, partition, from_offset, to_offset, reason, acted_at
FROM exactly_once.operator_actions
WHERE pipeline = %(pipeline)s AND action = 'dead_letter' AND topic = %(topic)s AND partition = %(partition)s
  AND pg_catalog.int8range(from_offset, to_offset) && pg_catalog.int8range(%(from_offset)s, %(to_offset)s)
ORDER BY from_offset;

-- name: range_holders
-- What holds offsets [from_offset, to_offset) of one partition: committed ranges, and the
-- live ranges of checkpoints (with their state).
SELECT 'committed', checkpoint_id FROM exactly_once.committed_ranges
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s
  AND pg_catalog.int8range(from_offset, to_offset) && pg_catalog.int8range(%(from_offset)s, %(to_offset)s)
UNION
SELECT c.state::text, c.id
FROM exactly_once.checkpoint_ranges r JOIN exactly_once.checkpoints c ON c.id = r.checkpoint_id
WHERE r.pipeline = %(pipeline)s AND r.topic = %(topic)s AND r.partition = %(partition)s AND NOT r.released
  AND c.state <> 'committed'
  AND pg_catalog.int8range(r.from_offset, r.to_offset) && pg_catalog.int8range(%(from_offset)s, %(to_offset)s)
ORDER BY 2;

-- name: pipeline_of_checkpoint
SELECT pipeline FROM exactly_once.checkpoints WHERE id = %(checkpoint_id)s;

-- name: refusing_constraints
-- Constraints and triggers of a table that can refuse rows whose values fit its columns.
SELECT (SELECT pg_catalog.count(*) FROM pg_constraint
        WHERE conrelid = pg_catalog.to_regclass(%(table)s) AND contype IN ('c', 'f', 'x'))
     + (SELECT pg_catalog.count(*) FROM pg_trigger
        WHERE tgrelid = pg_catalog.to_regclass(%(table)s) AND NOT tgisinternal);

-- name: references_table
-- Whether a table has a foreign key to another: a trial promotes the referenced table's
-- sink too, so that the key sees the checkpoint's new rows there, and registration wants
-- the referenced sink listed first (a trial checks even a deferred key after each sink).
SELECT EXISTS (SELECT FROM pg_constraint WHERE conrelid = pg_catalog.to_regclass(%(table)s) AND contype = 'f'
                                          AND confrelid = pg_catalog.to_regclass(%(referenced)s));

-- name: refused_at_commit
-- Whether an attempt of this checkpoint, or of the one whose released ranges it plans
-- again, was sent back because a final table refused its rows at commit.
SELECT EXISTS (
    SELECT 1 FROM exactly_once.attempts a
    WHERE a.reason LIKE %(prefix)s
      AND (a.checkpoint_id = %(checkpoint_id)s
           OR a.checkpoint_id IN (SELECT r.checkpoint_id FROM exactly_once.checkpoint_ranges r
                                  WHERE r.replanned_by = %(checkpoint_id)s)));

-- name: column_shapes
-- Each column of a table as a staging or contributions table copies it from its final
-- table: its type (as ALTER … TYPE takes it), NOT NULL, and its default's expression (none
-- for a generated column, whose expression is no default).
SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
       CASE WHEN a.attgenerated = '' THEN pg_catalog.pg_get_expr(d.adbin, d.adrelid) END
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = pg_catalog.to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

-- name: follow_added_column
-- A column the final table gained: the rows already there (a pre-committed checkpoint's,
-- committed contributions) take the final's default, as its own rows did ({default} is
-- `DEFAULT <expression>` or nothing); the ledger table keeps no default, since whatever
-- writes to it names every column.
ALTER TABLE {table} ADD COLUMN {column} {type} {default};
ALTER TABLE {table} ALTER COLUMN {column} DROP DEFAULT;

-- name: follow_dropped_column
ALTER TABLE {table} DROP COLUMN {column};

-- name: follow_type
-- No USING: the values convert as the promotion's INSERT would convert them (an assignment
-- cast, which refuses a value too long for a shorter varchar rather than cutting it).
ALTER TABLE {table} ALTER COLUMN {column} TYPE {type};

-- name: follow_nullability
-- {change} is SET or DROP.
ALTER TABLE {table} ALTER COLUMN {column} {change} NOT NULL;

-- name: before_change_rows_may_refuse
SAVEPOINT following_final_table;

-- name: change_refused
ROLLBACK TO SAVEPOINT following_final_table;

-- name: change_made
RELEASE SAVEPOINT following_final_table;

-- name: create_like_earlier_table
-- A sink's table under the earlier naming rule (no length prefix), which two pipelines could share,
-- locked so that their registrations take their rows out of it one after the other; the
-- table of the current rule starts with its shape, so the rows move as they are.
LOCK TABLE {earlier} IN ACCESS EXCLUSIVE MODE;
CREATE TABLE IF NOT EXISTS {table} (LIKE {earlier});

-- name: move_from_earlier_table
-- The rows of the pipeline's checkpoints (a row's checkpoint says whose it is), each one
-- kept as it is: the triggers that keep writers off a pre-committed attempt's rows are off
-- for the move.
ALTER TABLE {earlier} DISABLE TRIGGER USER;
ALTER TABLE {table} DISABLE TRIGGER USER;
WITH moved AS (
    DELETE FROM {earlier} e
    USING exactly_once.checkpoints k
    WHERE k.id = e.checkpoint_id AND k.pipeline = %(pipeline)s
    RETURNING e.*
)
INSERT INTO {table} ({columns}) SELECT {columns} FROM moved;
ALTER TABLE {earlier} ENABLE TRIGGER USER;
ALTER TABLE {table} ENABLE TRIGGER USER;

-- name: drop_table_if_empty
-- An earlier table goes once no pipeline's rows are left in it.
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM {table}) THEN
        DROP TABLE {table};
    END IF;
END $$;

-- name: partition_state
SELECT start_offset, frontier, topic_id FROM exactly_once.partitions
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s
FOR UPDATE;

-- name: reset_partition
-- An operator's reset of a partition whose offsets went backwards: the partition's history
-- (committed ranges, gaps, checkpoints' ranges, dead letters, dead-lettered ranges) is kept
-- under %(label)s, which no Kafka topic can be named ('@' is not allowed there), so the
-- offsets of the records the partition holds now are free to plan from %(to_offset)s on.
UPDATE exactly_once.committed_ranges SET topic = %(label)s
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s;
UPDATE exactly_once.gaps SET topic = %(label)s
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s;
UPDATE exactly_once.checkpoint_ranges SET topic = %(label)s
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s;
UPDATE exactly_once.dead_letters SET topic = %(label)s
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s;
UPDATE exactly_once.operator_actions SET topic = %(label)s
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s AND action = 'dead_letter';
-- The partition takes the topic's id as Kafka gives it now (NULL: adopted at the next plan).
UPDATE exactly_once.partitions SET start_offset = %(to_offset)s, frontier = %(to_offset)s, topic_id = %(topic_id)s
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s;

-- name: relabel_append_rows
-- An append sink's rows of a reset partition, kept under the same label as its history:
-- the records the partition holds now take their offsets.
UPDATE {final} SET kafka_topic = %(label)s WHERE kafka_topic = %(topic)s AND kafka_partition = %(partition)s;

-- name: reset_count
SELECT pg_catalog.count(*) FROM exactly_once.operator_actions
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s AND action = 'reset_partition';

-- name: staging_ready
-- Whether a staging table exists with its index and triggers (registration then runs no DDL).
SELECT pg_catalog.to_regclass(%(table)s) IS NOT NULL AND pg_catalog.to_regclass(%(index)s) IS NOT NULL
   AND (SELECT pg_catalog.count(*) FROM pg_trigger WHERE tgrelid = pg_catalog.to_regclass(%(table)s)
          AND tgname IN ('frozen_inserts', 'frozen_deletes', 'no_updates')) = 3;

-- name: contributions_ready
SELECT pg_catalog.to_regclass(%(table)s) IS NOT NULL AND pg_catalog.to_regclass(%(by_checkpoint)s) IS NOT NULL
   AND pg_catalog.to_regclass(%(by_keys)s) IS NOT NULL;

-- name: holders
-- Checkpoints whose live ranges hold some of the offsets [from_offset, to_offset).
SELECT DISTINCT c.id, c.state::text, c.dag_run_id
FROM exactly_once.checkpoint_ranges r
JOIN exactly_once.checkpoints c ON c.id = r.checkpoint_id
WHERE r.pipeline = %(pipeline)s AND r.topic = %(topic)s AND r.partition = %(partition)s AND NOT r.released
  AND pg_catalog.int8range(r.from_offset, r.to_offset) && pg_catalog.int8range(%(from_offset)s, %(to_offset)s)
ORDER BY c.id;
