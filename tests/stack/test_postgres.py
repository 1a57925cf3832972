"""PostgreSQL: psycopg2 and Spark's JDBC writer reach the pipeline database."""

import uuid
from urllib.parse import urlsplit

import psycopg2


def test_psycopg2_round_trip(pipeline_db_url):
    with psycopg2.connect(pipeline_db_url) as conn, conn.cursor() as cur:
        cur.execute("CREATE TEMP TABLE t (id int PRIMARY KEY, name text)")
        cur.executemany("INSERT INTO t VALUES (%s, %s)", [(1, "a"), (2, "b")])
        cur.execute("SELECT id, name FROM t ORDER BY id")
        assert cur.fetchall() == [(1, "a"), (2, "b")]
        cur.execute("SELECT current_user, current_database(), inet_server_addr()::text")
        assert cur.fetchone() == ("pipeline", "pipeline", "127.0.0.1/32")


def test_spark_jdbc_write_and_read(spark, pipeline_db_url):
    url = urlsplit(pipeline_db_url)
    options = {"url": f"jdbc:postgresql://{url.hostname}:{url.port}{url.path}",
               "user": url.username, "password": url.password, "driver": "org.postgresql.Driver",
               "reWriteBatchedInserts": "true"}
    table = f"jdbc_{uuid.uuid4().hex[:8]}"
    frame = spark.range(1000).selectExpr("id", "id * 2 AS doubled")
    frame.write.format("jdbc").options(**options).option("dbtable", table).save()
    try:
        with psycopg2.connect(pipeline_db_url) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT count(*), sum(doubled) FROM {table}")
            assert cur.fetchone() == (1000, 999 * 1000)
        back = spark.read.format("jdbc").options(**options).option("dbtable", table).load()
        assert back.count() == 1000
    finally:
        with psycopg2.connect(pipeline_db_url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE {table}")
