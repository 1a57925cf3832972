"""Exactly-once batch increments from Kafka into PostgreSQL.

Layers, each importing only those below it:

    orchestration/   the Airflow adapter: checkpoint_tasks, the run path (tasks.py), outcomes
    operate/         status, stalls, the pipelines view, preflight, scaffold, reference
    spark/           the worker: the Spark job of one attempt, staging writes, record isolation
    ledger/          the coordinator's state: the protocol (ledger/protocol.py), its states
                     (ledger/checkpoints.py, sql/migrations/), planning, registration
    (this package)   shared values and clients: configuration, errors, sink modes (sinks/),
                     value formats (formats/), Spark types, the catalog, SQLSTATEs, the
                     database and Kafka clients, Airflow connections, SQL files, fault points

`python -m exactly_once` (__main__.py) is the command line above them all. What DAGs and
transforms may import is named in docs/guide/api.md; the rest may change in any release.
"""

__version__ = "0.2.0"  # the wheel's and the provider's version (CHANGELOG.md)
