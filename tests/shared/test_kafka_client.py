"""The Kafka connection's client config for the planner and for Spark's Kafka source (pure),
and the private file that hands the job its connections."""

from __future__ import annotations

import stat

import pytest

from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.spark.settings import JobSettings

SASL = {"bootstrap.servers": "b1:9093,b2:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "pipeline", "sasl.password": 'p"a\\ss', "ssl.endpoint.identification.algorithm": "https"}


def test_sasl_settings_become_the_java_clients_with_a_jaas_login():
    options = KafkaClient("kafka_prod", SASL).spark_options()
    assert options == {
        "kafka.bootstrap.servers": "b1:9093,b2:9093", "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.ssl.endpoint.identification.algorithm": "https",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="pipeline" password="p\\"a\\\\ss";'}


def test_plain_under_librdkafkas_alias_and_a_plaintext_client():
    plain = {"bootstrap.servers": "b:9092", "sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    options = KafkaClient("k", plain).spark_options()
    assert options["kafka.sasl.mechanism"] == "PLAIN"
    assert options["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule ")
    assert KafkaClient.at("h:1").spark_options() == {"kafka.bootstrap.servers": "h:1"}


def test_the_planner_reads_committed_records_with_the_connections_settings():
    planner = KafkaClient("k", SASL).planner_config()
    assert {k: planner[k] for k in SASL} == SASL
    assert planner["isolation.level"] == "read_committed" and planner["enable.auto.commit"] is False


@pytest.mark.parametrize("config, said", [
    ({"security.protocol": "SSL"}, "its extra has no 'bootstrap.servers'"),
    ({"bootstrap.servers": "b:1", "ssl.ca.location": "/ca.pem"}, "'ssl.ca.location' has no Spark Kafka source"),
    ({"bootstrap.servers": "b:1", "isolation.level": "read_uncommitted"}, "'isolation.level' is set by the library"),
    ({"bootstrap.servers": "b:1", "sasl.mechanism": "OAUTHBEARER", "sasl.username": "u", "sasl.password": "p"},
     "sasl.mechanism 'OAUTHBEARER'"),
    ({"bootstrap.servers": "b:1", "sasl.mechanism": "PLAIN", "sasl.username": "u"}, "sasl.password is missing"),
])
def test_a_setting_spark_would_not_get_is_refused_naming_the_connection_and_the_key(config, said):
    with pytest.raises(ConfigError) as refused:
        KafkaClient("kafka_prod", config).validate()
    assert str(refused.value).startswith("connection 'kafka_prod': ") and said in str(refused.value)


def test_the_jobs_settings_travel_in_a_private_file_removed_after(tmp_path):
    settings = JobSettings("postgresql://u:secret@h:5432/db", KafkaClient("kafka_prod", SASL))
    with settings.written() as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert JobSettings.take(path) == settings
        assert not path.exists()  # the job removes it once read
    with settings.written() as path:
        pass
    assert not path.exists()  # the task removes it when the job ends, read or not
    assert "secret" not in repr(settings) and SASL["sasl.password"] not in repr(settings)


def test_no_host_name_check_is_spelled_as_each_client_spells_it():
    config = {"bootstrap.servers": "b:1", "ssl.endpoint.identification.algorithm": "none"}
    assert KafkaClient("k", config).spark_options()["kafka.ssl.endpoint.identification.algorithm"] == ""
