"""Spark's local configuration: every job (spark-submit or an in-process
SparkSession) reads SPARK_CONF_DIR, so the connector jars are set once here."""

from __future__ import annotations

import re
import subprocess

from exactly_once_stack.settings import COPY_WRITER_JAR, JARS, LOOPBACK, SPARK_CONF_DIR, process_environment


def connector_jars() -> list:
    """The Kafka connector and the PostgreSQL driver, with their dependencies (poms/spark.xml)."""
    jars = sorted((JARS / "spark").glob("*.jar"))
    if not jars:
        raise RuntimeError(f"no Spark connector jars in {JARS / 'spark'}: run exactly_once_stack/setup.sh")
    return jars


def write_conf() -> None:
    if not COPY_WRITER_JAR.is_file():
        raise RuntimeError(f"no COPY staging writer at {COPY_WRITER_JAR}: run exactly_once_stack/setup.sh")
    jars = [*connector_jars(), COPY_WRITER_JAR]
    SPARK_CONF_DIR.mkdir(parents=True, exist_ok=True)
    (SPARK_CONF_DIR / "spark-defaults.conf").write_text(
        f"spark.jars {','.join(str(j) for j in jars)}\n"
        f"spark.driver.host {LOOPBACK}\n"
        f"spark.driver.bindAddress {LOOPBACK}\n"
        "spark.ui.enabled false\n"
        "spark.ui.showConsoleProgress false\n"
        "spark.sql.session.timeZone UTC\n"
        "spark.sql.shuffle.partitions 4\n"
        # The throughput collector for every JVM of a job (its driver, executors, the Connect
        # server): on 2 cores the job of 1 M demo orders peaked at a fifth less resident memory
        # than with G1 and ran about 6 % faster (docs: Performance, "The JVM's collector"). A
        # collector named in extraJavaOptions too stops the JVM: set these two to choose another.
        "spark.driver.defaultJavaOptions -XX:+UseParallelGC\n"
        "spark.executor.defaultJavaOptions -XX:+UseParallelGC\n"
        # The Protobuf decoder of the project's jar, a SQL function of every session (formats/protobuf.py).
        "spark.sql.extensions exactly_once.protobuf.ProtobufExtensions\n"
    )
    (SPARK_CONF_DIR / "log4j2.properties").write_text(
        "rootLogger.level = warn\n"
        "rootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
    )


def version() -> str:
    """The JVM side's version, as spark-submit reports it."""
    out = subprocess.run(["spark-submit", "--version"], env=process_environment(),
                         capture_output=True, text=True, check=True)
    return re.search(r"version (\d+\.\d+\.\d+\S*)", out.stdout + out.stderr).group(1)
