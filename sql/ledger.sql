-- Statements of the protocol (plugins/exactly_once/protocol.py, ledger_rows.py, registration.py), by name.
-- {staging} and {final} are identifiers filled in with psycopg2.sql.

-- name: lock_pipeline
-- Serializes registration, planning and recovery of one pipeline.
SELECT pg_advisory_xact_lock(hashtextextended('exactly_once:' || %(pipeline)s, 0));

-- name: lock_commits
-- Commits of a pipeline's checkpoints run side by side: their merges commute.
SELECT pg_advisory_xact_lock_shared(hashtextextended('exactly_once:commit:' || %(pipeline)s, 0));

-- name: lock_commits_alone
-- A reprocessing's commit runs alone: it recomputes keys from every checkpoint's
-- contribution, which a commit beside it could change after it read them.
SELECT pg_advisory_xact_lock(hashtextextended('exactly_once:commit:' || %(pipeline)s, 0));

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

-- name: add_contribution_column
-- A column the final table gained (a new measure): earlier contributions have none.
ALTER TABLE {contributions} ADD COLUMN {column} {type};

-- name: column_type
SELECT format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = to_regclass(%(table)s) AND attname = %(column)s AND NOT attisdropped;

-- name: table_columns
SELECT a.attname::text
FROM pg_attribute a
WHERE a.attrelid = to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

-- name: unique_indexes
-- The column sets of the table's unique indexes (what ON CONFLICT can use).
SELECT array_agg(a.attname::text ORDER BY a.attname)
FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = to_regclass(%(table)s) AND i.indisunique AND i.indpred IS NULL
GROUP BY i.indexrelid;

-- name: create_staging
CREATE TABLE IF NOT EXISTS {staging} (LIKE {final}, checkpoint_id bigint NOT NULL, attempt int NOT NULL);
CREATE INDEX IF NOT EXISTS {staging_index} ON {staging} (checkpoint_id, attempt);

-- name: staged_summary
-- Row count of one attempt's staging rows. Writers only ever add rows (only the ledger
-- deletes them), so a count tells rows the attempt's own Spark tasks wrote twice (a task
-- retried after its write committed) or after pre-commit; a fenced attempt's rows carry
-- its own number.
SELECT count(*)
FROM {staging}
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s;

-- name: delete_staging
-- All attempts of the checkpoint when attempt is NULL.
DELETE FROM {staging}
WHERE checkpoint_id = %(checkpoint_id)s AND (%(attempt)s::int IS NULL OR attempt = %(attempt)s);

-- name: delete_stale_staging
-- Staging rows that no commit can promote: written late by a fenced (zombie) attempt,
-- left by one that crashed, or a committed checkpoint's whose clean-up did not run
-- (Ledger.commit). Live rows belong to a running checkpoint's current attempt
-- (tagged with its number, or its negative while it probes: exactly_once.staging) or
-- to the pre-committed attempt; each statement sees one snapshot of both tables, and an
-- attempt writes only after start_attempt committed, so live rows are never matched.
DELETE FROM {staging} s
USING exactly_once.checkpoints k
WHERE k.id = s.checkpoint_id AND k.pipeline = %(pipeline)s
  AND NOT (k.state = 'running' AND abs(s.attempt) = k.attempt)
  AND NOT (k.state = 'precommitted' AND s.attempt = k.precommitted_attempt);

-- name: checkpoint
SELECT id, dag_run_id, state::text, attempt, interval_start, interval_end, lease_until,
       precommitted_attempt, staged, records, reason, replays
FROM exactly_once.checkpoints
WHERE id = %(checkpoint_id)s AND pipeline = %(pipeline)s
FOR UPDATE;

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

-- name: partitions
SELECT topic, partition, start_offset, frontier FROM exactly_once.partitions WHERE pipeline = %(pipeline)s;

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
-- Ranges of aborted checkpoints not yet planned again (the next plan takes them whole).
SELECT topic, partition, from_offset, to_offset
FROM exactly_once.checkpoint_ranges
WHERE pipeline = %(pipeline)s AND released AND replanned_by IS NULL AND from_offset < to_offset
ORDER BY topic, partition, from_offset;

-- name: insert_checkpoint
INSERT INTO exactly_once.checkpoints
    (pipeline, dag_run_id, interval_start, interval_end, reach, state, lease_until, created_at, committed_at)
VALUES (%(pipeline)s, %(dag_run_id)s, %(interval_start)s, %(interval_end)s, %(reach)s,
        %(state)s, %(lease_until)s, %(now)s, CASE WHEN %(state)s = 'committed' THEN %(now)s END)
RETURNING id;

-- name: insert_range
INSERT INTO exactly_once.checkpoint_ranges (checkpoint_id, pipeline, topic, partition, from_offset, to_offset)
VALUES (%(checkpoint_id)s, %(pipeline)s, %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s);

-- name: mark_replanned
-- Exactly the released range the plan read: one released after it read them waits for the next plan.
UPDATE exactly_once.checkpoint_ranges SET replanned_by = %(checkpoint_id)s
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s
  AND from_offset = %(from_offset)s AND to_offset = %(to_offset)s AND released AND replanned_by IS NULL;

-- name: set_frontier
INSERT INTO exactly_once.partitions (pipeline, topic, partition, start_offset, frontier)
VALUES (%(pipeline)s, %(topic)s, %(partition)s, %(start_offset)s, %(frontier)s)
ON CONFLICT (pipeline, topic, partition) DO UPDATE SET frontier = EXCLUDED.frontier;

-- name: insert_gap
INSERT INTO exactly_once.gaps (pipeline, topic, partition, from_offset, to_offset, checkpoint_id, recorded_at)
VALUES (%(pipeline)s, %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s, %(checkpoint_id)s, %(now)s);

-- name: start_attempt
UPDATE exactly_once.checkpoints
SET state = 'running', attempt = attempt + 1, lease_until = %(lease_until)s, reason = NULL
WHERE id = %(checkpoint_id)s
RETURNING attempt;

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

-- name: mark_aborted
UPDATE exactly_once.checkpoints SET state = 'aborted', reason = %(reason)s WHERE id = %(checkpoint_id)s;
UPDATE exactly_once.checkpoint_ranges SET released = true WHERE checkpoint_id = %(checkpoint_id)s;

-- name: recoverable
-- Pre-committed checkpoints (to commit) and abandoned ones whose lease ran out (to abort).
SELECT id, state::text
FROM exactly_once.checkpoints
WHERE pipeline = %(pipeline)s
  AND (state = 'precommitted' OR (state IN ('planned', 'running') AND lease_until < %(now)s))
ORDER BY id;

-- name: failed_attempts
-- The checkpoint's attempts that failed (not those superseded or aborted with it), newest first.
SELECT checkpoint_id, attempt, state::text, reason, retryable
FROM exactly_once.attempts
WHERE checkpoint_id = %(checkpoint_id)s AND state = 'aborted' AND retryable IS NOT NULL
ORDER BY attempt DESC;

-- name: mark_stalled
UPDATE exactly_once.checkpoints SET state = 'stalled', reason = %(reason)s WHERE id = %(checkpoint_id)s;

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
  AND int8range(from_offset, to_offset) && int8range(%(from_offset)s, %(to_offset)s)
ORDER BY from_offset;

-- name: range_holders
-- What holds offsets [from_offset, to_offset) of one partition: committed ranges, and the
-- live ranges of checkpoints (with their state).
SELECT 'committed', checkpoint_id FROM exactly_once.committed_ranges
WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s
  AND int8range(from_offset, to_offset) && int8range(%(from_offset)s, %(to_offset)s)
UNION
SELECT c.state::text, c.id
FROM exactly_once.checkpoint_ranges r JOIN exactly_once.checkpoints c ON c.id = r.checkpoint_id
WHERE r.pipeline = %(pipeline)s AND r.topic = %(topic)s AND r.partition = %(partition)s AND NOT r.released
  AND c.state <> 'committed'
  AND int8range(r.from_offset, r.to_offset) && int8range(%(from_offset)s, %(to_offset)s)
ORDER BY 2;

-- name: pipeline_of_checkpoint
SELECT pipeline FROM exactly_once.checkpoints WHERE id = %(checkpoint_id)s;

-- name: refusing_constraints
-- Constraints and triggers of a table that can refuse rows whose values fit its columns.
SELECT (SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass(%(table)s) AND contype IN ('c', 'f', 'x'))
     + (SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(%(table)s) AND NOT tgisinternal);

-- name: refused_at_commit
-- Whether an attempt of this checkpoint, or of the one whose released ranges it plans
-- again, was sent back because a final table refused its rows at commit.
SELECT EXISTS (
    SELECT 1 FROM exactly_once.attempts a
    WHERE a.reason LIKE %(prefix)s
      AND (a.checkpoint_id = %(checkpoint_id)s
           OR a.checkpoint_id IN (SELECT r.checkpoint_id FROM exactly_once.checkpoint_ranges r
                                  WHERE r.replanned_by = %(checkpoint_id)s)));
