-- A checkpoint whose attempts keep failing for one cause is `stalled`: it keeps its
-- ranges (no lease expiry releases them) and every later run of the pipeline fails
-- naming it, until an operator acts. (ADD VALUE may run in a transaction from
-- PostgreSQL 12 on; nothing here uses the new value before it commits.)
--
--   planned ──start_attempt──▶ running ──abort_attempt: N failures of one cause,──▶ stalled
--      ▲                                              or one no retry can fix          │
--      └──────────── start_attempt (a cleared task) or `operator retry` ◀─────────────┘
ALTER TYPE exactly_once.checkpoint_state ADD VALUE IF NOT EXISTS 'stalled' AFTER 'running';

-- What operators did, when and why: a stalled checkpoint retried (its ranges released
-- to the next run) or resumed by a cleared task, and offset ranges dead-lettered by
-- hand. A dead-lettered range's records go to the dead letters with the operator's
-- reason when the checkpoint that reads them commits; they reach no sink. Ranges never
-- overlap, and never cover committed offsets (the command refuses).
CREATE TABLE exactly_once.operator_actions (
    id            bigserial PRIMARY KEY,
    pipeline      text NOT NULL REFERENCES exactly_once.pipelines,
    action        text NOT NULL CHECK (action IN ('retry', 'resume', 'dead_letter')),
    checkpoint_id bigint REFERENCES exactly_once.checkpoints,
    topic         text,
    partition     int,
    from_offset   bigint,
    to_offset     bigint,
    reason        text NOT NULL,
    acted_at      timestamptz NOT NULL DEFAULT now(),
    acted_by      text NOT NULL DEFAULT current_user,
    CHECK ((action = 'dead_letter') = (topic IS NOT NULL AND partition IS NOT NULL
                                        AND from_offset IS NOT NULL AND to_offset > from_offset)),
    EXCLUDE USING gist (pipeline WITH =, topic WITH =, partition WITH =,
                        int8range(from_offset, to_offset) WITH &&) WHERE (action = 'dead_letter')
);
