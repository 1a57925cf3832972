-- What monitoring reads (plugins/exactly_once/operate/metrics.py) and what alerting records
-- (plugins/exactly_once/orchestration/alerting.py).

-- Seconds of each phase of a checkpoint, by name: plan (its begin task until it is planned),
-- spark (the pre-committed attempt's job, application start included), pre_commit, commit.
ALTER TABLE exactly_once.checkpoints ADD COLUMN phase_seconds jsonb NOT NULL DEFAULT '{}';

-- An alert sent for an event (a stall, a dead-letter budget exceeded, freshness beyond its
-- bound), one per event: a row while the event lasts, `cleared_at` set once it ended, so the
-- same event again (the checkpoint stalled again) is a new one. Written with the notice sent,
-- in one transaction: a notifier that fails sends it again at the next task.
CREATE TABLE exactly_once.alerts (
    id          bigserial PRIMARY KEY,
    pipeline    text NOT NULL REFERENCES exactly_once.pipelines (name),
    kind        text NOT NULL CHECK (kind IN ('stalled', 'dead_letter_budget', 'freshness')),
    subject     text NOT NULL,  -- the stalled checkpoint's id; '' for the pipeline's freshness
    message     text NOT NULL,
    raised_at   timestamptz NOT NULL DEFAULT now(),
    cleared_at  timestamptz
);
CREATE UNIQUE INDEX alerts_open ON exactly_once.alerts (pipeline, kind, subject) WHERE cleared_at IS NULL;
GRANT SELECT ON exactly_once.alerts TO exactly_once_read;
