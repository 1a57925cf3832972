"""The Spark application of one checkpoint attempt, whatever runs it: spark-submit of a
launcher that calls `main` (`exactly_once.spark.shipping.launcher`; local, a standalone
master, YARN, Kubernetes), or a process beside the task
as a Spark Connect client (`python -m exactly_once.spark.job --connect-artifacts ARCHIVE`;
`exactly_once.spark.runners`). Both give it the same arguments:

    --pipeline NAME --checkpoint-id N --attempt T --token FILE --settings FILE --report FILE

It reads the configuration its attempt was started with and the checkpoint's frozen
ranges from the ledger and writes staging (`exactly_once.spark.increment.execute_attempt`).
The pipeline database (the job role's connection, which may write staging but no final
table and no ledger row) and the Kafka client config come from the settings FILE, which
the submitting task writes from its Airflow connections (`exactly_once.spark.settings`).
The report FILE, which the task made private, gets what the attempt staged (records,
rows per sink, seconds per phase) or how it failed and whether a retry may help: the task
records that in the ledger, pre-commit or failure (`exactly_once.spark.report`). Exit status: 0 staged,
3 fenced (a newer attempt owns the checkpoint), 1 failed.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg2
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from exactly_once.errors import JobFailure
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import Fenced
from exactly_once.spark import warm_daemon
from exactly_once.spark.increment import execute_attempt
from exactly_once.spark.report import write_failure, write_report
from exactly_once.spark.settings import JobSettings

FENCED = 3


def arguments_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="increment", description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--checkpoint-id", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True, help="the attempt's fencing token")
    parser.add_argument("--settings", type=Path, required=True,
                        help="the pipeline database and Kafka client config, from the submitting task")
    parser.add_argument("--report", type=Path, required=True,
                        help="where the attempt's report goes, for the task to pre-commit or record its failure")
    parser.add_argument("--token", type=Path, required=True,
                        help="a private file holding the attempt's token, which the ledger's staging functions ask for")
    parser.add_argument("--connect-artifacts", type=Path,
                        help="run as a Spark Connect client of the settings' spark_remote, this code archive "
                             "added as the session's artifact")
    return parser


def run(arguments: list[str]) -> int:
    """Runs the attempt in a session of its own, stopped at the end; the exit status."""
    args = arguments_parser().parse_args(arguments)
    settings = JobSettings.take(args.settings)
    ledger = Ledger.of_attempt(args.pipeline, args.checkpoint_id, args.attempt,
                               lambda: psycopg2.connect(settings.db_url))
    name = f"{args.pipeline} checkpoint {args.checkpoint_id}/{args.attempt}"
    try:
        with server_gone_is_retryable(settings.spark_remote if args.connect_artifacts else None):
            spark = submitted_session(name) if args.connect_artifacts is None else \
                connect_session(settings.spark_remote, name, args.connect_artifacts)
            try:
                report = execute_attempt(spark, ledger, args.checkpoint_id, args.attempt, args.token.read_text(),
                                         settings.kafka, settings.db_url, settings.schema_registry)
            finally:
                spark.stop()
    except Fenced as fenced:
        print(f"fenced: {fenced}", file=sys.stderr)
        return FENCED
    except JobFailure as failure:
        write_failure(args.report, failure)
        raise
    write_report(args.report, report)
    return 0


# The Connect client's default retries wait at least 10 minutes for a server that is gone (a
# server that ran out of heap and died left its job waiting until someone stopped it). These
# give up after about 35 s: back-offs of 0.05, 0.2, 0.8, 3.2 and 12.8 s, each with its jitter.
SERVER_GONE_RETRIES = 5


@contextmanager
def server_gone_is_retryable(remote: str | None) -> Iterator[None]:
    """A Spark Connect server that stops answering fails the attempt as retryable, naming its
    endpoint (never the URL's token): its retry runs on a server that answers again."""
    try:
        yield
    except Exception as error:
        if remote is None or not _unavailable(error):
            raise
        endpoint = urlsplit(remote.split(";")[0].replace("sc://", "http://", 1)).netloc
        raise JobFailure(f"the Spark Connect server at {endpoint} stopped answering (gRPC UNAVAILABLE, the "
                         f"client gave up after {SERVER_GONE_RETRIES} retries): is it running? a retry runs the "
                         "attempt again", retryable=True) from error


def _unavailable(error: Exception) -> bool:
    """Whether a Spark Connect client's error is gRPC's UNAVAILABLE: no server answered."""
    code = getattr(error, "getGrpcStatusCode", None)
    return (code is not None and str(code()).endswith("UNAVAILABLE")) or "StatusCode.UNAVAILABLE" in str(error)


def submitted_session(name: str) -> SparkSession:
    """The session of a job spark-submit started, whose settings (the master, ...) are the
    JVM's, read before the context starts: a local one's Python workers come from the warm
    daemon where they can import it (`exactly_once.spark.warm_daemon`)."""
    SparkContext._ensure_initialized()  # the gateway spark-submit started, holding its settings
    return SparkSession.builder.appName(name).config(map=warm_daemon.settings(dict(SparkConf().getAll()))) \
        .getOrCreate()


def connect_session(url: str, name: str, archive: Path) -> SparkSession:
    """A new Spark Connect session with the code archive as its artifact. SIGTERM (the task
    stopped: `ConnectRunner.on_kill`) interrupts what the session runs on the server first."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    # No option on the builder: its first request (setting them) would run with the default
    # retries. The bounded ones are set before any request; then the app name, as the builder does.
    session = SparkSession.builder.remote(url).create()
    session.client.set_retry_policies([DefaultPolicy(max_retries=SERVER_GONE_RETRIES)])
    try:
        session.conf._set_all(configs={"spark.app.name": name}, silent=True)
        session.addArtifacts(str(archive), pyfile=True)
    except BaseException:
        session.stop()
        raise

    def interrupt(signum: int, _frame) -> None:
        session.interruptAll()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, interrupt)
    return session


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
