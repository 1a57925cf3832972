"""A hostile transform (issue 43): code that runs in the Spark job — the transform function on
the driver, a Python UDF on the executors — looks for database credentials the way an
attacker would and uses each one it finds to write a final table, mark a checkpoint
committed, and update or delete staging rows. Each statement is rolled back whatever
PostgreSQL answers; what was tried and the answer's SQLSTATE go to ATTACKS, one file per
process, for tests/spark/test_least_privilege.py to read. The rows pass through unchanged
(but the poison pipeline's `quantity`).

Where it looks: its environment (URLs, Airflow connections, libpq's variables), Spark's
configuration, the files it can read near it (its working directory, the job's temporary
files, SPARK_CONF_DIR, ~/.pgpass, the files its variables name) and its own memory (strings held
by live objects, where the job keeps its settings). Not the whole machine: on one host as one
OS user, a process reads all of that user's files and other processes' environments
(README, "Roles by duty", says where the boundary holds)."""

from __future__ import annotations

import gc
import json
import os
import re
import tempfile
from pathlib import Path

import psycopg2
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tests.spark.transforms import refuses_one_order

ATTACKS = Path(tempfile.gettempdir()) / "exactly_once-attacks"
URL = re.compile(r"postgres(?:ql)?://[^\s'\"<>/@:]+:[^\s'\"<>/@]+@[^\s'\"<>]+")  # with user and password
REFUSED = "42501"  # insufficient_privilege
_attacked = False  # once per process


def aim(final_tables: list[str], staging_tables: list[str], pipeline: str) -> None:
    """What the next attacks go for; earlier results are forgotten."""
    ATTACKS.mkdir(exist_ok=True)
    for old in ATTACKS.glob("*.jsonl"):
        old.unlink()
    (ATTACKS / "targets.json").write_text(json.dumps({"final": final_tables, "staging": staging_tables,
                                                      "pipeline": pipeline}))


def results() -> list[dict]:
    return [json.loads(line) for path in sorted(ATTACKS.glob("*.jsonl")) for line in path.read_text().splitlines()]


def hostile(rows: DataFrame) -> DataFrame:
    """The transform: attacks from the driver, and from each executor's Python worker."""
    attack_once("driver", spark_conf(rows))

    @F.udf("string")
    def probed(order_id: str) -> str:
        attack_once("udf", {})
        return order_id

    return refuses_one_order(rows.withColumn("id", probed("id")))


def spark_conf(rows: DataFrame) -> dict[str, str]:
    session = rows.sparkSession
    try:
        return dict(session.sparkContext.getConf().getAll())
    except Exception:  # Spark Connect has no SparkContext: its client sees the session's conf
        return dict(session.conf.getAll)


def attack_once(where: str, conf: dict[str, str]) -> None:
    global _attacked
    if _attacked:
        return
    _attacked = True
    found = credentials(conf)
    targets = json.loads((ATTACKS / "targets.json").read_text())
    outcomes = [{"where": where, "pid": os.getpid(), "source": source, **outcome}
                for source, dsn in found for outcome in attack(dsn, targets)]
    outcomes.append({"where": where, "pid": os.getpid(), "searched": sorted({source for source, _ in found})})
    with open(ATTACKS / f"{where}-{os.getpid()}.jsonl", "a") as out:
        out.write("".join(json.dumps(o) + "\n" for o in outcomes))


def attack(dsn: str, targets: dict) -> list[dict]:
    """Each write the attacker wants, as the credential's role: PostgreSQL's SQLSTATE (None if it was allowed)."""
    try:
        conn = psycopg2.connect(dsn, connect_timeout=5)
    except psycopg2.Error as refused:
        return [{"logged_in": False, "said": str(refused).strip()[:200]}]
    statements = [*(f"INSERT INTO {table} DEFAULT VALUES" for table in targets["final"]),
                  "UPDATE exactly_once.checkpoints SET state = 'committed' WHERE pipeline = %(pipeline)s",
                  *(f"UPDATE {table} SET attempt = attempt" for table in targets["staging"]),
                  *(f"DELETE FROM {table}" for table in targets["staging"])]
    outcomes = []
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_user")
            role = cur.fetchone()[0]
            for statement in statements:
                try:
                    cur.execute(statement, {"pipeline": targets["pipeline"]})
                    state, said = None, None  # allowed
                except psycopg2.Error as refused:
                    state, said = refused.pgcode, refused.diag.message_primary
                conn.rollback()
                outcomes.append({"role": role, "statement": statement, "sqlstate": state, "said": said})
    finally:
        conn.close()
    return outcomes


def credentials(conf: dict[str, str]) -> list[tuple[str, str]]:
    """(where it was found, a libpq connection string) of every database credential found."""
    found = [("memory", url) for url in _strings_in_memory()]  # first: before it holds what it found elsewhere
    for name, value in os.environ.items():
        found += [(f"environment {name}", url) for url in URL.findall(value)]
        if name.startswith("AIRFLOW_CONN_"):
            found += [(f"environment {name}", dsn) for dsn in _airflow_connection(value)]
    if "PGPASSWORD" in os.environ or "PGPASSFILE" in os.environ:
        found.append(("libpq's environment", ""))
    for key, value in conf.items():
        found += [(f"Spark conf {key}", url) for url in URL.findall(str(value))]
    for path in _readable_files():
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        found += [(f"file {path}", url) for url in URL.findall(text)]
        if path.name == ".pgpass":
            found += [(f"file {path}", _pgpass(line)) for line in text.splitlines() if line.count(":") >= 4]
    return list(dict.fromkeys(found))


def _airflow_connection(value: str) -> list[str]:
    try:
        c = json.loads(value)
    except ValueError:
        return []
    if c.get("conn_type") != "postgres":
        return []
    extra = " ".join(f"{k}={v}" for k, v in (c.get("extra") or {}).items())
    return [f"host={c.get('host')} port={c.get('port', 5432)} user={c.get('login')} password={c.get('password')} "
            f"dbname={c.get('schema')} {extra}"]


def _pgpass(line: str) -> str:
    host, port, database, user, password = line.split(":", 4)
    return f"host={host} port={port} dbname={database} user={user} password={password}"


def _readable_files(limit: int = 2000) -> list[Path]:
    places = [Path.cwd(), *Path(tempfile.gettempdir()).glob("exactly_once-*"), Path.home() / ".pgpass"]
    places += [Path(value) for value in os.environ.values() if value.startswith("/") and Path(value).is_file()]
    if os.environ.get("SPARK_CONF_DIR"):
        places.append(Path(os.environ["SPARK_CONF_DIR"]))
    files = []
    for place in places:
        if place.is_file():
            files.append(place)
        elif place.is_dir():
            for path in place.rglob("*"):
                if len(files) >= limit:
                    return files
                if path.is_file() and path.suffix != ".zip" and path.stat().st_size < 1_000_000 \
                        and os.access(path, os.R_OK):
                    files.append(path)
    return files


def _strings_in_memory() -> set[str]:
    """Database URLs held by live objects (dicts, sequences, instances' attributes), and JDBC
    options (a url with its user and password beside it) turned into URLs."""
    found = set()
    for obj in gc.get_objects():
        if isinstance(obj, dict):
            values = obj.values()
            url = obj.get("url")
            if isinstance(url, str) and url.startswith("jdbc:postgresql://") and obj.get("password"):
                found.add(f"postgresql://{obj.get('user')}:{obj['password']}@{url[len('jdbc:postgresql://'):]}")
        elif isinstance(obj, (list, tuple)):
            values = obj
        else:
            try:
                values = list(vars(obj).values())
            except Exception:  # no __dict__, or an object whose attributes refuse to be read
                continue
        for value in values:
            if isinstance(value, str) and "postgres" in value:
                found.update(URL.findall(value))
    return found
