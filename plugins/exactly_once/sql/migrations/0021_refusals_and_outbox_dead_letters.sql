-- Issue 60, items 3 and 8. Refusals that leave no checkpoint behind, kept where stalls are
-- seen (plugins/exactly_once/ledger/run_refusals.py): a run's begin refused before it planned
-- (a preflight problem, the planner's refusal), and a kafka sink's publishing refused (an
-- output record Kafka keeps refusing, a topic gone, an ACL). One row per (pipeline, kind):
-- kind 'begin' or 'publish:<sink>'; count is how often in a row; a begin that succeeds, or a
-- publish of the sink that passes, deletes it. No foreign key to the pipelines: a first run
-- refused before registration is recorded too.
CREATE TABLE exactly_once.refusals (
    pipeline      text NOT NULL,
    kind          text NOT NULL CHECK (kind = 'begin' OR kind LIKE 'publish:_%'),
    first_at      timestamptz NOT NULL DEFAULT now(),
    last_at       timestamptz NOT NULL DEFAULT now(),
    count         int NOT NULL DEFAULT 1,
    retryable     boolean NOT NULL,
    error         text NOT NULL,  -- bounded, without record values (errors.error_text)
    topic         text,           -- publishing: the sink's topic
    checkpoint_id bigint,         -- publishing: the outbox row Kafka refuses, when one row is at fault
    position      bigint,
    PRIMARY KEY (pipeline, kind),
    CHECK ((checkpoint_id IS NULL) = (position IS NULL))
);
GRANT SELECT ON exactly_once.refusals TO exactly_once_read;

-- The outbox's dead letters: rows an operator moved out of the outbox after Kafka refused them
-- (`python -m exactly_once.operate.stalls dead-letter-output`), with Kafka's error and the
-- operator's reason; publishing goes on past them. Record values: not for the read role.
CREATE TABLE exactly_once.outbox_dead_letters (
    pipeline         text   NOT NULL REFERENCES exactly_once.pipelines (name),
    sink             text   NOT NULL,
    checkpoint_id    bigint NOT NULL,
    position         bigint NOT NULL,
    epoch            uuid   NOT NULL,
    replaces         bigint,
    key              jsonb  NOT NULL,
    record           jsonb  NOT NULL,
    topic            text   NOT NULL,
    error            text   NOT NULL,
    reason           text   NOT NULL,
    dead_lettered_at timestamptz NOT NULL DEFAULT now(),
    dead_lettered_by text NOT NULL DEFAULT current_user,
    PRIMARY KEY (pipeline, sink, checkpoint_id, position)
);

ALTER TABLE exactly_once.operator_actions DROP CONSTRAINT operator_actions_action_check;
ALTER TABLE exactly_once.operator_actions ADD CONSTRAINT operator_actions_action_check
    CHECK (action IN ('retry', 'resume', 'dead_letter', 'reset_partition', 'dead_letter_output'));
