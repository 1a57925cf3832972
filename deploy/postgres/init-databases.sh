#!/usr/bin/env bash
# Run once by the postgres image on an empty data volume: the pipeline database
# (ledger, staging and final tables) and Airflow's metadata database, each owned by a
# role of the same name, as in the local stack. Passwords come from the environment.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v pipeline_password="$PIPELINE_DB_PASSWORD" -v airflow_password="$AIRFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE pipeline LOGIN PASSWORD :'pipeline_password';
CREATE DATABASE pipeline OWNER pipeline;
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
SQL
