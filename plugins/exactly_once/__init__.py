"""Exactly-once batch increments from Kafka into PostgreSQL.

The protocol (begin, start_attempt, pre_commit, commit, abort, recover) is in
`protocol.py`; its states are in `sql/migrations/0001_ledger.sql`.
"""
