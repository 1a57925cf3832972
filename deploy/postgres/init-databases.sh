#!/usr/bin/env bash
# The roles and databases of docker-compose.yaml's PostgreSQL, as in the local stack
# (exactly_once_stack/postgres.py). The postgres image runs it once, on an empty data volume;
# run it again on an existing one (roles a newer release adds, passwords changed in .env):
#   docker compose exec -u postgres postgres bash /docker-entrypoint-initdb.d/init-databases.sh
#
# - the databases `pipeline` (ledger, staging and final tables) and `airflow` (Airflow's
#   metadata), each owned by the login role of its name: `pipeline` is the commit role (the
#   Airflow tasks, the migrations), `airflow` Airflow's own;
# - the group roles `exactly_once_job` and `exactly_once_read` (NOLOGIN; the ledger's
#   migrations grant their rights) and one login role in each: `pipeline_job` (the Spark job,
#   connection pipeline_db_job) and `pipeline_read` (status and the pipelines view,
#   connection pipeline_db_read);
# - CONNECT revoked from PUBLIC on these and on `postgres`: `pipeline`, `pipeline_job` and
#   `pipeline_read` may connect to `pipeline`, only its owner `airflow` to `airflow`, only
#   the superuser to `postgres`.
#
# Passwords: PIPELINE_DB_PASSWORD, PIPELINE_DB_JOB_PASSWORD, PIPELINE_DB_READ_PASSWORD,
# AIRFLOW_DB_PASSWORD, each from the environment or from the file NAME_FILE names. A login role
# that exists is given its password again. They reach psql through its environment (\getenv),
# never its command line.
set -euo pipefail

secret() {  # the value of $1, or the content of the file named by $1_FILE
  local file_var="$1_FILE"
  if [[ -n ${!file_var:-} ]]; then
    cat -- "${!file_var}"
  elif [[ -n ${!1:-} ]]; then
    printf '%s' "${!1}"
  else
    echo "init-databases.sh: set $1 (or $1_FILE)" >&2
    return 1
  fi
}

for name in PIPELINE_DB_PASSWORD PIPELINE_DB_JOB_PASSWORD PIPELINE_DB_READ_PASSWORD AIRFLOW_DB_PASSWORD; do
  value=$(secret "$name")
  export "$name=$value"
done

psql -X -q -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname postgres <<'SQL'
\getenv pipeline_password PIPELINE_DB_PASSWORD
\getenv pipeline_job_password PIPELINE_DB_JOB_PASSWORD
\getenv pipeline_read_password PIPELINE_DB_READ_PASSWORD
\getenv airflow_password AIRFLOW_DB_PASSWORD
SET client_min_messages = warning;
-- The group roles: what each duty may do is granted by the ledger's migrations.
SELECT format('CREATE ROLE %I NOLOGIN', name)
  FROM unnest(ARRAY['exactly_once_job', 'exactly_once_read']) AS name
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = name) \gexec
-- The login roles: made, or given their password again.
SELECT format('%s ROLE %I LOGIN PASSWORD %L',
              CASE WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = login) THEN 'ALTER' ELSE 'CREATE' END,
              login, password)
  FROM (VALUES ('pipeline', :'pipeline_password'), ('pipeline_job', :'pipeline_job_password'),
               ('pipeline_read', :'pipeline_read_password'), ('airflow', :'airflow_password')) AS l (login, password) \gexec
GRANT exactly_once_job TO pipeline_job;
GRANT exactly_once_read TO pipeline_read;
SELECT format('CREATE DATABASE %I OWNER %I', name, name)
  FROM unnest(ARRAY['pipeline', 'airflow']) AS name
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = name) \gexec
-- Who may connect where (an owner connects to its own database by owning it).
REVOKE CONNECT ON DATABASE pipeline, airflow, postgres FROM PUBLIC;
GRANT CONNECT ON DATABASE pipeline TO pipeline, pipeline_job, pipeline_read;
SQL
