"""The coordinator's state in PostgreSQL: the exactly-once protocol (protocol.py: begin,
start attempt, pre-commit, commit, abort, recover), its phase two (commit.py, promotion.py),
leases, the ledger's rows and checkpoints, planning, registration, migrations, invariants,
replays, tables and their names, configuration versions. Imports only the shared modules
beside this package."""
