#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine, from the project's
# own files only: Debian packages (PostgreSQL server, JDK, Maven, spin), the Python
# environment from requirements-test.lock (the runtime lock plus the test
# packages), the Kafka broker and Spark connector jars and the schema registry
# (Apicurio Registry) from Maven Central, and the project's staging writer (jvm/).
# Idempotent: each step is skipped while the stamp of its inputs is unchanged, so
# a warm run takes about a second.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local"
STAMPS="$LOCAL/stamps"
UV_VERSION=0.13.8
# 3.0.x: later Apicurio Registry releases need Java 21, and the stack runs on Debian's Java 17.
APICURIO_VERSION=3.0.9
mkdir -p "$STAMPS"

log() { printf '[setup] %s\n' "$*" >&2; }

# up_to_date NAME FILE...: true when NAME's stamp matches the files' hash.
up_to_date() {
  local name=$1; shift
  [[ -f "$STAMPS/$name" && "$(cat "$@" | sha256sum)" == "$(cat "$STAMPS/$name")" ]]
}
stamp() { local name=$1; shift; cat "$@" | sha256sum >"$STAMPS/$name"; }

apt_install() {
  local missing=()
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
  command -v java >/dev/null || missing+=(openjdk-17-jdk-headless)
  command -v mvn >/dev/null || missing+=(maven)
  # The browser the UI tests drive with Playwright (no browser download from elsewhere).
  [[ -x /usr/bin/chromium ]] || missing+=(chromium)
  # The model checker of the ledger's protocol (./dev prove) and the compiler of its verifiers.
  command -v spin >/dev/null || missing+=(spin)
  command -v gcc >/dev/null || missing+=(gcc)
  # The monitoring of `./dev up --monitoring` and the metrics test: Prometheus, its promtool.
  command -v prometheus >/dev/null || missing+=(prometheus)
  if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || { log "missing Debian packages: ${missing[*]} (install them as root)"; exit 1; }
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # The Debian package starts a cluster of its own on 5432; this project runs
  # its own server in .local/ and needs nothing from that one.
}

python_env() {
  up_to_date venv "$ROOT/requirements-test.lock" "$0" && [[ -x "$ROOT/.venv/bin/python" ]] && return
  if [[ ! -x "$LOCAL/tools/bin/uv" ]]; then
    log "installing uv $UV_VERSION into .local/tools"
    python3.11 -m venv "$LOCAL/tools"
    "$LOCAL/tools/bin/pip" install -q "uv==$UV_VERSION"
  fi
  log "syncing .venv from requirements-test.lock"
  [[ -x "$ROOT/.venv/bin/python" ]] || "$LOCAL/tools/bin/uv" venv -q --python python3.11 "$ROOT/.venv"
  # The lock leaves out pyspark-client (pulled by the Spark provider): it
  # installs into the same pyspark/ package as pyspark and could leave the
  # Python side of Spark at another version than its jars.
  # Bytecode compiled once here: uv writes none by default, and where PYTHONDONTWRITEBYTECODE is
  # set (as on the machines this project is built on) every process would compile Airflow and the
  # rest from source again: `airflow version` took 7.5 s so, 3.7 s compiled.
  "$LOCAL/tools/bin/uv" pip sync -q --compile-bytecode --python "$ROOT/.venv/bin/python" \
    "$ROOT/requirements-test.lock"
  stamp venv "$ROOT/requirements-test.lock" "$0"
}

# maven_jars NAME [OUT]: copies the runtime classpath of poms/NAME.xml (beside this script)
# into OUT (.local/jars/NAME by default).
maven_jars() {
  local name=$1 pom="$ROOT/exactly_once_stack/poms/$1.xml" out="${2:-$LOCAL/jars/$1}"
  up_to_date "jars-$name" "$pom" && [[ -d "$out" ]] && return
  log "fetching $name jars from Maven Central"
  rm -rf "$out"
  # Maven 3.8 prints colour resets even in batch mode; strip them.
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$out" 2>&1 |
    sed 's/\x1b\[[0-9;]*m//g' >&2
  stamp "jars-$name" "$pom"
}

# copy_writer: the staging writer every Spark job gets (jvm/: a Spark data source over
# PostgreSQL's COPY), built with Maven into the library's package, where the wheel carries it
# (./dev build) and Spark's configuration names it (exactly_once_stack/spark.py).
copy_writer() {
  local jar="$ROOT/plugins/exactly_once/jars/exactly-once-copy.jar"
  local sources=("$ROOT/jvm/pom.xml" $(find "$ROOT/jvm/src" -type f | sort))
  rm -f "$LOCAL/jars/spark/exactly-once-copy.jar"  # where earlier set-ups put it
  up_to_date copy-writer "${sources[@]}" && [[ -f "$jar" ]] && return
  log "building the COPY staging writer (jvm/)"
  mvn -q -B -f "$ROOT/jvm/pom.xml" package 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2
  mkdir -p "$(dirname "$jar")"
  cp "$ROOT/jvm/target/exactly-once-copy-1.jar" "$jar"
  stamp copy-writer "${sources[@]}"
}

# schema_registry_app: Apicurio Registry's Quarkus app (its runner jar and lib/), from the
# tarball on Maven Central, into .local/jars/schema-registry. Its parent POM is not on Central:
# a project POM cannot depend on it, and dependency plugin 3.x refuses it too ("Failed to read
# artifact descriptor"); 2.8 (Maven 3.8's default) copies it without its descriptor. GNU tar
# unpacks it: the plugin's own unpack ignores the tarball's PAX headers and cuts a long jar
# name short. Unpacked beside the target and moved in whole: an interrupted run leaves no half app.
schema_registry_app() {
  local out="$LOCAL/jars/schema-registry" work="$LOCAL/jars/.schema-registry.partial"
  up_to_date schema-registry <(echo "$APICURIO_VERSION") && [[ -d "$out" ]] && return
  log "fetching Apicurio Registry $APICURIO_VERSION from Maven Central"
  rm -rf "$work"
  mkdir -p "$work/app"
  (cd "$work" && mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:2.8:copy \
    -Dartifact="io.apicurio:apicurio-registry-app:$APICURIO_VERSION:tar.gz:all" -DoutputDirectory="$work") 2>&1 |
    sed 's/\x1b\[[0-9;]*m//g' >&2
  tar -xzf "$work/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz" -C "$work/app"
  rm -rf "$out"
  mv "$work/app" "$out"
  rm -rf "$work"
  stamp schema-registry <(echo "$APICURIO_VERSION")
}

apt_install
python_env
maven_jars kafka
maven_jars spark
# Kafka Connect's worker and Debezium's PostgreSQL connector, a plugin directory of its own
# (exactly_once_stack/connect.py: `./dev up --cdc` and the change-feed tests).
maven_jars connect
maven_jars debezium "$LOCAL/jars/connect-plugins/debezium-connector-postgres"
copy_writer
schema_registry_app
