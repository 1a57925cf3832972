"""A Kafka client configuration as an Airflow `kafka` connection holds it (its extra: the
librdkafka config, e.g. `kafka_default`), for the two clients that use it: the planner
(confluent-kafka, librdkafka's names as they are) and Spark's Kafka source (the Java
client's names, as `kafka.*` options; TLS material through `exactly_once.tls`). No
connection is opened here.

Only settings whose Java equivalent is known are carried to Spark; any other key is a
ConfigError naming the connection and the key, never a setting silently dropped (a
client that reads without the TLS or SASL the planner used would fail far later).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exactly_once import tls
from exactly_once.errors import ConfigError

# librdkafka settings that the Java client has under the same name and meaning.
SAME_NAME = ("bootstrap.servers", "security.protocol", "sasl.mechanism", "client.id",
             "ssl.endpoint.identification.algorithm", "socket.connection.setup.timeout.ms")
# librdkafka's alias of sasl.mechanism.
ALIASES = {"sasl.mechanisms": "sasl.mechanism"}
# Values that the two clients spell differently: no host name check is librdkafka's "none"
# and the Java client's empty string (which librdkafka refuses).
JAVA_VALUES = {("ssl.endpoint.identification.algorithm", "none"): ""}
# The Java login module that takes sasl.username/sasl.password, per SASL mechanism.
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
CREDENTIALS = ("sasl.username", "sasl.password")
# What the library sets itself: planning and Spark both read committed records only, and
# the planner commits no consumer offsets (the ledger holds them).
OWNED = ("isolation.level", "group.id", "enable.auto.commit")
# librdkafka's own log lines (`%4|…|GETPID|…`) go to Python logging rather than to stderr,
# where every command printed them: warnings and above show.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")
LIBRDKAFKA_LOG.setLevel(logging.WARNING)


@dataclass(frozen=True)
class KafkaClient:
    connection: str                                       # the Airflow connection it came from, named in errors
    config: Mapping[str, str] = field(repr=False)         # librdkafka settings; may hold a password

    @classmethod
    def at(cls, bootstrap_servers: str, connection: str = "kafka_default") -> KafkaClient:
        """A plaintext client of these brokers."""
        return cls(connection, {"bootstrap.servers": bootstrap_servers})

    @property
    def bootstrap_servers(self) -> str:
        return self.config["bootstrap.servers"]

    def portable(self) -> KafkaClient:
        """This client with its PEM files' contents inline, for a job whose driver, executors or
        Spark Connect server cannot read the task's files."""
        return KafkaClient(self.connection, tls.inline(self.connection, self.config))

    def secrets(self) -> list[str]:
        """The values of this config that are secret: the SASL password, the client key and its password."""
        return [v for v in (self.config.get("sasl.password"), *tls.secrets(self.config)) if v]

    def validate(self) -> KafkaClient:
        """Raises ConfigError naming the connection unless both clients can use this config."""
        self.spark_options()
        return self

    def librdkafka(self, **settings: Any) -> dict[str, Any]:
        """The config of a confluent-kafka client of this connection, with `settings`; its log
        lines go to the `librdkafka` logger."""
        return {**self.config, "logger": LIBRDKAFKA_LOG, **settings}

    def planner_config(self) -> dict[str, Any]:
        """confluent-kafka's config for the planner's consumer (read_committed, no group offsets)."""
        return self.librdkafka(**{"group.id": "exactly_once.planner", "isolation.level": "read_committed",
                                  "enable.auto.commit": False})

    def spark_options(self) -> dict[str, str]:
        """Spark Kafka source options (`kafka.` + the Java client's setting) of this config."""
        java: dict[str, str] = {}
        config = {ALIASES.get(key, key): str(value) for key, value in self.config.items()}
        if "bootstrap.servers" not in config:
            raise ConfigError(f"connection {self.connection!r}: its extra has no 'bootstrap.servers' (the Kafka "
                              "connection's extra is the client config, e.g. {\"bootstrap.servers\": \"host:9092\"})")
        for key, value in config.items():
            if key in SAME_NAME:
                java[key] = JAVA_VALUES.get((key, value), value)
            elif key in OWNED:
                raise ConfigError(f"connection {self.connection!r}: '{key}' is set by the library (read_committed, "
                                  "no consumer group offsets): remove it from the extra")
            elif key not in CREDENTIALS and key not in tls.SETTINGS:
                raise ConfigError(f"connection {self.connection!r}: '{key}' has no Spark Kafka source equivalent "
                                  "this library knows; it carries "
                                  f"{', '.join([*SAME_NAME, *CREDENTIALS, *tls.SETTINGS])}")
        if any(key in config for key in CREDENTIALS):
            java["sasl.jaas.config"] = self._jaas(config)
        java.update(tls.java_settings(self.connection, config))
        return {f"kafka.{key}": value for key, value in java.items()}

    def _jaas(self, config: dict[str, str]) -> str:
        mechanism = config.get("sasl.mechanism", "GSSAPI")
        module = LOGIN_MODULES.get(mechanism)
        if module is None:
            raise ConfigError(f"connection {self.connection!r}: sasl.username/sasl.password with sasl.mechanism "
                              f"{mechanism!r}; they are carried to Spark for {', '.join(LOGIN_MODULES)}")
        missing = [key for key in CREDENTIALS if key not in config]
        if missing:
            raise ConfigError(f"connection {self.connection!r}: {missing[0]} is missing beside "
                              f"{[k for k in CREDENTIALS if k not in missing][0]}")
        return (f'{module} required username="{_jaas_quoted(config["sasl.username"])}" '
                f'password="{_jaas_quoted(config["sasl.password"])}";')


def _jaas_quoted(value: str) -> str:
    """A JAAS option value inside double quotes (Kafka's JaasConfig reads it with a
    StreamTokenizer: backslash escapes)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
