-- Statements of plugins/exactly_once/operate/preflight.py, by name.

-- name: passed
SELECT 1 FROM exactly_once.preflights WHERE pipeline = %(pipeline)s AND config_version = %(version)s;

-- name: record_pass
INSERT INTO exactly_once.preflights (pipeline, config_version) VALUES (%(pipeline)s, %(version)s)
ON CONFLICT DO NOTHING;

-- name: takes
-- Parse analysis fails when the column has no assignment cast from the parameter type the JDBC
-- writer binds ("column … is of type integer but expression is of type character varying"); the
-- executor's start checks the INSERT privilege. Nothing is inserted: EXPLAIN does not run it.
EXPLAIN INSERT INTO {table} ({column}) SELECT NULL::{bound};
