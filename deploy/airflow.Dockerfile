# Airflow 3.3 with the project's locked Python packages, a JDK for spark-submit and
# Spark's Kafka connector + PostgreSQL JDBC driver from the same pom as the local stack, and
# the project's COPY staging writer (jvm/) built as the local stack builds it.
FROM maven:3.9.11-eclipse-temurin-17 AS jars
COPY exactly_once_stack/poms/spark.xml /build/pom.xml
RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/jars
COPY jvm /build/jvm
RUN mvn -q -B -f /build/jvm/pom.xml package && cp /build/jvm/target/exactly-once-copy-1.jar /jars/exactly-once-copy.jar

FROM apache/airflow:3.3.2-python3.11
USER root
# Spark 4 needs a JDK (not only a JRE) on the driver, which runs in the Airflow worker.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
COPY --from=jars /jars /opt/spark-jars
COPY deploy/spark/spark-defaults.conf /opt/spark-conf/spark-defaults.conf
USER airflow
COPY requirements.lock /tmp/requirements.lock
# The runtime lock only (the test packages are in requirements-test.lock). It pins
# apache-airflow itself at the image's version, so nothing is upgraded behind its back.
RUN pip install --no-cache-dir -r /tmp/requirements.lock
