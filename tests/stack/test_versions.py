"""One Spark version on both sides, and a version report for bug reports."""

import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pyspark
import pytest

from exactly_once_stack.settings import ROOT


def test_python_and_jvm_sides_of_spark_agree(spark):
    assert spark.version == pyspark.__version__
    for pom in (ROOT / "exactly_once_stack" / "poms" / "spark.xml", ROOT / "jvm" / "pom.xml"):
        assert re.search(r"<spark.version>([^<]+)<", pom.read_text()).group(1) == pyspark.__version__, pom
    kafka_jar = sorted(Path(ROOT / ".local" / "jars" / "spark").glob("spark-sql-kafka-0-10_2.13-*.jar"))
    assert [j.name for j in kafka_jar] == [f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar"]


def test_pyspark_client_is_not_installed_over_pyspark():
    # pyspark-client writes into the same pyspark/ package; the lock leaves it out.
    with pytest.raises(PackageNotFoundError):
        distribution("pyspark-client")


def test_versions_command_reports_every_component(stack_env):
    out = subprocess.run([sys.executable, "-m", "exactly_once_stack", "versions"], env=stack_env, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    report = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines())
    assert report["kafka broker"].startswith("4.")
    assert report["spark (JVM)"] == report["pyspark"] == pyspark.__version__
    assert report["airflow"] == "3.3.2"
    assert report["postgresql"].startswith(("15", "16", "17"))
