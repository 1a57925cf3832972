#!/usr/bin/env bash
# Writes the .env of docker-compose.yaml with fresh random secrets, mode 600 from its first byte:
#   deploy/new-env.sh          # the project's .env; refuses to replace one
#   deploy/new-env.sh FILE     # FILE instead
# Run it once per deployment: PostgreSQL keeps the roles' passwords of its first start (to
# change them later, edit .env and run deploy/postgres/init-databases.sh again; docs/deploy/compose.md).
set -euo pipefail
target=${1:-"$(cd "$(dirname "$0")/.." && pwd)/.env"}

random() {  # $1 random bytes, URL-safe base64 (letters, digits, - and _; 32 bytes end in one =)
  head -c "$1" /dev/urandom | base64 | tr -d '\n' | tr '+/' '-_'
}

umask 077
# Made empty first, refusing an existing file (nor one made meanwhile: noclobber), then filled.
if ! (set -o noclobber; : > "$target") 2>/dev/null; then
  echo "new-env.sh: $target exists: left as it is (its passwords are those PostgreSQL was started with)" >&2
  exit 1
fi
{
  echo "# docker-compose.yaml's secrets, written by deploy/new-env.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)."
  echo "# Keep this file private (it is ignored by git). Names and what uses each: .env.example."
  echo "POSTGRES_PASSWORD=$(random 24)"
  echo "PIPELINE_DB_PASSWORD=$(random 24)"
  echo "PIPELINE_DB_JOB_PASSWORD=$(random 24)"
  echo "PIPELINE_DB_READ_PASSWORD=$(random 24)"
  echo "AIRFLOW_DB_PASSWORD=$(random 24)"
  echo "AIRFLOW_ADMIN_PASSWORD=$(random 18)"
  echo "AIRFLOW_FERNET_KEY=$(random 32)"
  echo "AIRFLOW_JWT_SECRET=$(random 32)"
  echo "METRICS_SCRAPER_TOKEN=$(random 24)"
  echo "AIRFLOW_UI_PORT=8080"
} >> "$target"
echo "new-env.sh: wrote $target"
