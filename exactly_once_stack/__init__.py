"""The local stack: real Kafka (KRaft), PostgreSQL and Airflow on loopback.

Everything lives under `.local/` in the project root. `python -m exactly_once_stack up`
starts what is not running and writes `.local/env.sh`; `python -m exactly_once_stack down`
stops, by PID, what runs from this folder.
"""
