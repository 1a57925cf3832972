#!/usr/bin/env bash
# Refuses docker-compose.yaml's secrets unless each is set and at least 16 characters long, none
# is a value this repository once published (an older .env.example's), the Fernet key is one,
# the database roles' passwords are URL-safe (they go into connection URIs and JSON as they
# are) and no two roles share one. The compose service check-secrets runs it before PostgreSQL
# starts, and everything else starts after PostgreSQL: nothing runs with a refused secret.
# deploy/new-env.sh writes values it accepts. Exits 1 naming each variable to set in .env.
set -uo pipefail

# The database roles' passwords: postgres (superuser), pipeline (owner, the commit role),
# pipeline_job (the Spark job), pipeline_read (status and the view), airflow (Airflow's metadata).
PASSWORDS=(POSTGRES_PASSWORD PIPELINE_DB_PASSWORD PIPELINE_DB_JOB_PASSWORD PIPELINE_DB_READ_PASSWORD AIRFLOW_DB_PASSWORD)
OTHERS=(AIRFLOW_ADMIN_PASSWORD AIRFLOW_JWT_SECRET AIRFLOW_FERNET_KEY METRICS_SCRAPER_TOKEN)
# What .env.example held up to issue 43: public, so refused.
PUBLISHED=(local-only-postgres local-only-pipeline local-only-airflow local-only-admin local-only-jwt-secret
           bG9jYWwtb25seS1mZXJuZXQta2V5LWNoYW5nZS1tZSE=)

problems=()
declare -A owner_of=()
for name in "${PASSWORDS[@]}" "${OTHERS[@]}"; do
  value=${!name-}
  if [[ -z $value ]]; then
    problems+=("$name is not set")
    continue
  fi
  for published in "${PUBLISHED[@]}"; do
    if [[ $value == "$published" ]]; then
      problems+=("$name is a value this repository published (an older .env.example's)")
      continue 2
    fi
  done
  if (( ${#value} < 16 )); then
    problems+=("$name is shorter than 16 characters")
  fi
  if [[ $name == AIRFLOW_FERNET_KEY ]]; then
    [[ $value =~ ^[A-Za-z0-9_-]{43}=$ ]] || problems+=("$name is not a Fernet key (32 bytes, URL-safe base64)")
  elif [[ " ${PASSWORDS[*]} " == *" $name "* ]]; then
    [[ $value =~ ^[A-Za-z0-9._~-]+$ ]] || problems+=("$name has characters other than letters, digits and . _ ~ -")
    if [[ -n ${owner_of[$value]-} ]]; then
      problems+=("$name is the same as ${owner_of[$value]}: each role has a password of its own")
    fi
    owner_of[$value]=$name
  fi
done

if (( ${#problems[@]} )); then
  echo "check-secrets: refusing to start; set these in .env (deploy/new-env.sh writes fresh random ones):" >&2
  printf '  %s\n' "${problems[@]}" >&2
  exit 1
fi
echo "check-secrets: the deployment's ${#PASSWORDS[@]} passwords and ${#OTHERS[@]} other secrets are acceptable"
