"""The Kafka connection's client config for the planner and for Spark's Kafka source (pure),
and the private file that hands the job its connections."""

from __future__ import annotations

import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.schema_registry import SchemaRegistry
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
    ({"bootstrap.servers": "b:1", "ssl.keystore.location": "/c.p12"}, "'ssl.keystore.location' has no Spark Kafka"),
    ({"bootstrap.servers": "b:1", "ssl.ca.location": "/no/such/ca.pem"},
     "ssl.ca.location '/no/such/ca.pem' cannot be read as a PEM file: FileNotFoundError"),
    ({"bootstrap.servers": "b:1", "ssl.certificate.pem": "-----BEGIN CERTIFICATE-----"},
     "a client certificate needs both ssl.certificate.location (or ssl.certificate.pem) and ssl.key.location"),
    ({"bootstrap.servers": "b:1", "enable.ssl.certificate.verification": "false"},
     "enable.ssl.certificate.verification false has no equivalent in Spark's Kafka client"),
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


def test_no_host_name_check_is_spelled_as_each_client_spells_it_and_logged(caplog):
    config = {"bootstrap.servers": "b:1", "ssl.endpoint.identification.algorithm": "none"}
    assert KafkaClient("k", config).spark_options()["kafka.ssl.endpoint.identification.algorithm"] == ""
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "connection 'k': ssl.endpoint.identification.algorithm is 'none': the brokers' certificates are not checked "
        "against their host names"]
    caplog.clear()
    KafkaClient("k", {"bootstrap.servers": "b:1", "security.protocol": "SSL"}).spark_options()
    assert not caplog.records  # checked by default: the Java client's https, librdkafka's since 2.0


CERTIFICATE = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"  # passed on as it is


def pem_key(key, password: str | None = None, form=serialization.PrivateFormat.TraditionalOpenSSL) -> str:
    encryption = serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, form, encryption).decode()


def test_a_private_ca_and_a_client_certificate_reach_spark_inline_with_the_key_as_pkcs8(tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIBca\n-----END CERTIFICATE-----\n")
    (tmp_path / "client-key.pem").write_text(pem_key(key, "k3y-pass"))  # PKCS#1, encrypted: librdkafka's usual
    config = {"bootstrap.servers": "b:1", "security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "ca.pem"),
              "ssl.certificate.pem": CERTIFICATE, "ssl.key.location": str(tmp_path / "client-key.pem"),
              "ssl.key.password": "k3y-pass"}
    options = KafkaClient("kafka_prod", config).spark_options()
    assert options["kafka.ssl.truststore.type"] == options["kafka.ssl.keystore.type"] == "PEM"
    assert options["kafka.ssl.truststore.certificates"] == (tmp_path / "ca.pem").read_text()
    assert options["kafka.ssl.keystore.certificate.chain"] == CERTIFICATE
    java_key = options["kafka.ssl.keystore.key"]
    assert java_key.startswith("-----BEGIN PRIVATE KEY-----")  # the only unencrypted PEM form Java reads
    assert serialization.load_pem_private_key(java_key.encode(), None).private_numbers() == key.private_numbers()
    assert not any("k3y-pass" in value for value in options.values())  # the password stays with the task

    portable = KafkaClient("kafka_prod", config).portable().config  # what the job's settings file holds
    assert "ssl.ca.location" not in portable and "ssl.key.location" not in portable
    assert portable["ssl.key.pem"] == (tmp_path / "client-key.pem").read_text()
    assert KafkaClient("kafka_prod", portable).spark_options() == options


def test_a_key_that_does_not_open_is_refused_naming_the_setting_never_quoting_the_key():
    key = pem_key(ec.generate_private_key(ec.SECP256R1()), "right", serialization.PrivateFormat.PKCS8)
    config = {"bootstrap.servers": "b:1", "ssl.certificate.pem": CERTIFICATE, "ssl.key.pem": key,
              "ssl.key.password": "wrong"}
    with pytest.raises(ConfigError) as refused:
        KafkaClient("kafka_prod", config).validate()
    said = str(refused.value)
    assert said.startswith("connection 'kafka_prod': the client key (ssl.key.location or ssl.key.pem) cannot be read "
                           "with ssl.key.password") and key.splitlines()[1] not in said


def test_the_jobs_environment_holds_no_airflow_variable_and_no_secret_of_its_settings():
    key = pem_key(ec.generate_private_key(ec.SECP256R1()))
    config = {**SASL, "ssl.certificate.pem": CERTIFICATE, "ssl.key.pem": key}
    settings = JobSettings("postgresql://u:db%2Fsecret@h:5432/db", KafkaClient("kafka_prod", config))
    task = {"PATH": "/usr/bin", "JAVA_HOME": "/jdk", "SPARK_CONF_DIR": "/conf", "PYTHONPATH": "/plugins",
            "AIRFLOW_CONN_KAFKA_DEFAULT": "{}", "AIRFLOW__CORE__FERNET_KEY": "f", "_AIRFLOW_PROCESS_CONTEXT": "x",
            "PIPELINE_DB_URL": "postgresql://u:db/secret@h/db", "MY_SASL": SASL["sasl.password"], "MY_KEY": key}
    assert settings.job_environment(task) == {"PATH": "/usr/bin", "JAVA_HOME": "/jdk", "SPARK_CONF_DIR": "/conf",
                                              "PYTHONPATH": "/plugins"}


def test_the_registrys_password_and_key_reach_the_job_in_its_settings_file_only():
    key = pem_key(ec.generate_private_key(ec.SECP256R1()))
    registry = SchemaRegistry("registry", "https://r:8081/apis/ccompat/v7", ("pipeline", "registry-secret"),
                              {"ssl.ca.pem": CERTIFICATE, "ssl.certificate.pem": CERTIFICATE, "ssl.key.pem": key})
    settings = JobSettings("postgresql://u:p@h/db", KafkaClient.at("b:9092"), registry)
    task = {"PATH": "/usr/bin", "MY_REGISTRY": "user:registry-secret", "MY_KEY": key}
    assert settings.job_environment(task) == {"PATH": "/usr/bin"}
    with settings.written() as file:
        assert "registry-secret" not in repr(settings) and stat.S_IMODE(file.stat().st_mode) == 0o600
        assert JobSettings.take(file).schema_registry == registry
