"""The library's commands for a pipeline's author:

    python -m exactly_once check DAG_FILE_OR_PIPELINE
        the preflight, without starting Spark: every problem of the pipeline(s) of a DAG
        file (or of a pipeline as registered in the ledger), exit status 1 when there is one
    python -m exactly_once new NAME --topic TOPIC --schema 'field:type,...'
        a first pipeline: its configuration module, DAG file and table DDL (exactly_once.operate.scaffold)
    python -m exactly_once reference
        the configuration reference, in Markdown, from the model (exactly_once.operate.reference)
    python -m exactly_once reprocess DAG_FILE_OR_PIPELINE CHECKPOINT_ID
        replays a committed checkpoint's frozen ranges with the DAG file's configuration (or the
        one last registered) and replaces its rows in every sink (exactly_once.orchestration.reprocessing)
    python -m exactly_once jar
        the path of the COPY staging writer's jar, which the Spark job needs on its classpath
        (`spark.jars`; docs/install.md)
    python -m exactly_once version
        the library's version
    python -m exactly_once publish DAG_FILE_OR_PIPELINE
        publishes what the pipeline's kafka sinks committed and Kafka does not have yet, as the
        pipeline's runs do (exactly_once.publishing); exit status 1 with the error otherwise

Connections are Airflow's (`pipeline_db`, `kafka_default`, `spark_default`), read from the
environment and from Airflow's metadata database (`exactly_once.connections`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import psycopg2

from exactly_once.config import PipelineConfig, load_config
from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.problems import Problem, report

PREFLIGHT_KAFKA_TIMEOUT = 10  # seconds; a broker that does not answer by then is a problem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exactly_once", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="the preflight of a DAG file's pipelines, or of a registered one")
    check.add_argument("target", metavar="DAG_FILE_OR_PIPELINE")
    new = commands.add_parser("new", help="scaffold a pipeline with one append sink")
    new.add_argument("name")
    new.add_argument("--topic", required=True)
    new.add_argument("--schema", help="the value's fields: 'name:spark_type,...' (avro, protobuf: default the "
                                      "subject's)")
    new.add_argument("--value-format", choices=("json", "avro", "protobuf"), default="json")
    new.add_argument("--subject", help="avro, protobuf: the schema registry subject of the values (its version: "
                                       "--version)")
    new.add_argument("--version", default="latest", help="avro, protobuf: the subject's version (default: its latest)")
    new.add_argument("--schema-registry", default="schema_registry_default",
                     help="avro: the registry's Airflow connection (default: schema_registry_default)")
    new.add_argument("--table", help="the final table, 'schema.table' (default: NAME)")
    new.add_argument("--dags", type=Path, default=Path("dags"), help="Airflow's DAGs folder (default: dags)")
    new.add_argument("--plugins", type=Path, default=Path("plugins"),
                     help="a folder on the workers' Python path (default: plugins)")
    commands.add_parser("reference", help="print the configuration reference (Markdown)")
    again = commands.add_parser("reprocess", help="replay a committed checkpoint with today's configuration")
    again.add_argument("target", metavar="DAG_FILE_OR_PIPELINE")
    again.add_argument("checkpoint_id", type=int)
    publish = commands.add_parser("publish", help="publish what a pipeline's kafka sinks committed")
    publish.add_argument("target", metavar="DAG_FILE_OR_PIPELINE")
    publish.add_argument("--transaction-timeout-ms", type=int, default=60_000,
                         help="each Kafka transaction's timeout (default: 60000)")
    commands.add_parser("jar", help="print the path of the COPY staging writer's jar (for spark.jars)")
    commands.add_parser("version", help="print the library's version")
    args = parser.parse_args(argv)

    if args.command == "jar":
        return print_jar()
    if args.command == "version":
        from exactly_once import __version__

        print(__version__)
        return 0
    if args.command == "check":
        return run_check(args.target)
    if args.command == "reprocess":
        return run_reprocess(args.target, args.checkpoint_id)
    if args.command == "publish":
        return run_publish(args.target, args.transaction_timeout_ms)
    if args.command == "new":
        from exactly_once.operate.scaffold import parse_schema, registry_source, scaffold

        try:
            if (args.value_format != "json") != (args.subject is not None) or not (args.schema or args.subject):
                raise ConfigError("new: give --schema (JSON values), or --value-format avro or protobuf with --subject")
            source = registry_source(args.value_format, args.subject, args.version, args.schema_registry) \
                if args.subject else {}
            if args.schema:
                source["value_schema"] = parse_schema(args.schema)
            written = scaffold(args.name, args.topic, source, args.table, args.dags, args.plugins)
        except (ConfigError, FileExistsError) as refused:
            print(refused, file=sys.stderr)
            return 1
        print("\n".join(["wrote:", *(f"  {path}" for path in written)]))
        return 0
    from exactly_once.operate.reference import markdown

    print(markdown(), end="")
    return 0


def print_jar() -> int:
    from exactly_once.packages import COPY_WRITER_JAR

    if not COPY_WRITER_JAR.is_file():
        print(f"no jar at {COPY_WRITER_JAR}: a checkout builds it with ./dev setup or ./dev build (jvm/)",
              file=sys.stderr)
        return 1
    print(COPY_WRITER_JAR)
    return 0


def run_check(target: str) -> int:
    """Prints each pipeline's report; 1 when any has a problem (or none could be loaded)."""
    from exactly_once import connections as airflow_connections
    from exactly_once.operate import privileges

    airflow_connections.read_from_metadata_database()
    connections = airflow_connections.connection_problems()
    unusable = {p.subject for p in connections}
    ledger_unreachable = f"connection {airflow_connections.PIPELINE_DB!r}" in unusable
    connect = None if ledger_unreachable else airflow_connections.connector()
    kafka = None if unusable & {f"connection {airflow_connections.KAFKA!r}", "Kafka"} \
        else airflow_connections.kafka_client()
    try:
        configs = configs_of(target, connect)
    except Unloadable as unusable:
        print(report(unusable.problem.subject, [*connections, unusable.problem]))
        return 1
    failed = False
    rights = (lambda config: []) if ledger_unreachable else \
        (lambda config: privileges.problems(config, airflow_connections.defined_connector))
    for config in configs:
        problems = [*connections, *pipeline_problems(config, kafka, connect), *rights(config)]
        print(report(f"pipeline {config.name!r}", problems))
        failed = failed or bool(problems)
    return 1 if failed else 0


def run_reprocess(target: str, checkpoint_id: int) -> int:
    import logging

    from exactly_once import connections
    from exactly_once.orchestration.reprocessing import reprocess

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    connect = connections.for_command_line(connections.connector)
    try:
        configs = configs_of(target, connect)
    except Unloadable as unusable:
        print(report(unusable.problem.subject, [unusable.problem]))
        return 1
    return reprocess(configs, checkpoint_id)


def run_publish(target: str, transaction_timeout_ms: int) -> int:
    import logging

    from exactly_once import connections
    from exactly_once.errors import PipelineError
    from exactly_once.publishing.publisher import Publisher

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    connect = connections.for_command_line(connections.connector)
    client = connections.for_command_line(connections.kafka_client)
    try:
        for config in configs_of(target, connect):
            for published in Publisher(config, connect, client,
                                       transaction_timeout_ms=transaction_timeout_ms).publish():
                print(f"pipeline {config.name}: {published}")
    except Unloadable as unusable:
        print(report(unusable.problem.subject, [unusable.problem]))
        return 1
    except PipelineError as failed:
        print(f"not published: {failed}")
        return 1
    return 0


def pipeline_problems(config: PipelineConfig, kafka: KafkaClient | None, connect) -> list[Problem]:
    """The preflight of one pipeline: its tables only with a pipeline database to ask, its
    topics only with a usable Kafka connection; an error on the way is a problem too."""
    from confluent_kafka import KafkaException

    from exactly_once import connections
    from exactly_once.ledger.kafka_offsets import KafkaOffsets
    from exactly_once.operate import preflight

    registry = connections.schema_registry_problems(config.source)
    if kafka is None:
        return [*registry, *preflight.check(config, None, connect)]
    try:
        with KafkaOffsets(kafka, timeout=PREFLIGHT_KAFKA_TIMEOUT) as offsets:
            return [*registry, *preflight.check(config, offsets, connect)]
    except (psycopg2.Error, KafkaException) as failed:
        return [*registry, Problem("preflight", f"stopped by {type(failed).__name__}: {' '.join(str(failed).split())}")]


class Unloadable(Exception):
    """No configuration could be loaded from the target: the problem says why."""

    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem


def configs_of(target: str, connect) -> list[PipelineConfig]:
    """The pipelines of a DAG file (as Airflow parses it), or one registered in the ledger."""
    if target.endswith(".py"):
        return _dag_file_configs(Path(target))
    subject = f"pipeline {target!r}"
    if connect is None:
        raise Unloadable(Problem(subject, "its registered configuration cannot be read without the ledger"))
    from exactly_once.ledger.rows import registered_config

    try:
        with contextlib.closing(connect()) as conn, conn.cursor() as cur:
            return [load_config(registered_config(cur, target))]
    except (LookupError, psycopg2.errors.UndefinedTable):
        raise Unloadable(Problem(subject, "is not registered in the ledger (it never ran): give its DAG file"))
    except ConfigError as unusable:
        raise Unloadable(Problem(subject, f"its registered configuration no longer loads: {unusable}"))


def _dag_file_configs(path: Path) -> list[PipelineConfig]:
    subject = f"DAG file {path}"
    if not path.is_file():
        raise Unloadable(Problem(subject, "does not exist"))
    from airflow.configuration import conf
    from airflow.dag_processing.dagbag import DagBag

    from exactly_once.orchestration.checkpoint_tasks import IncrementOperator

    # As Airflow parses it: its DAGs folder (the dags-folder bundle) is on the import path, so a
    # pipeline's configuration module beside the DAG file imports here as it does there.
    dags_folder = conf.get("core", "dags_folder")
    if dags_folder not in sys.path:
        sys.path.append(dags_folder)
    with _stdout_to_stderr():  # Airflow logs its parsing on stdout; the report is the command's output
        bag = DagBag(dag_folder=path)
    if bag.import_errors:  # the last line of each traceback: the error, e.g. a ConfigError naming the field
        raise Unloadable(Problem(subject, "does not import: " + "\n".join(
            error.strip().splitlines()[-1] for error in bag.import_errors.values())))
    configs = [task.config for dag in bag.dags.values() for task in dag.tasks
               if isinstance(task, IncrementOperator)]
    if not configs:
        raise Unloadable(Problem(subject, "has no pipeline DAG (no checkpoint_tasks(config) in a DAG)"))
    return configs


@contextlib.contextmanager
def _stdout_to_stderr():
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


if __name__ == "__main__":
    sys.exit(main())
