"""Exactly-once batch increments from Kafka into PostgreSQL.

The protocol (begin, start_attempt, pre_commit, commit, abort, recover) is in
`protocol.py`; its values and states in `checkpoints.py` (the transitions drawn in
`sql/migrations/0001_ledger.sql`); the run path of a DAG run's tasks in `tasks.py`.
"""
