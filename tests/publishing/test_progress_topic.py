"""A kafka sink's progress topic against the real broker (issue 60, item 2): one created by
the publisher is compacted; an existing one whose `cleanup.policy` is `delete` (retention
would expire the progress record, and publishing would stop on `OutboxMismatch` later) is
refused by name before anything is published, with the fix; an existing compacted one is used."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.publishing.progress import ensure_topic


def cleanup_policy(servers: str, topic: str) -> str:
    """The topic's policy, once the broker's metadata knows the topic just created."""
    admin = AdminClient({"bootstrap.servers": servers})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    deadline = time.monotonic() + 30
    while True:
        try:
            return admin.describe_configs([resource])[resource].result(30)["cleanup.policy"].value
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def created(servers: str, policy: str) -> str:
    name = f"progress_{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1,
                                  config={"cleanup.policy": policy})])[name].result(30)
    return name


def test_a_progress_topic_is_created_compacted(kafka_servers):
    name = f"progress_{uuid.uuid4().hex[:10]}"
    ensure_topic(KafkaClient.at(kafka_servers), name)
    assert cleanup_policy(kafka_servers, name) == "compact"
    ensure_topic(KafkaClient.at(kafka_servers), name)  # exists, compacted: used as it is


def test_an_existing_progress_topic_with_the_delete_policy_is_refused_naming_it_and_the_fix(kafka_servers):
    name = created(kafka_servers, "delete")
    with pytest.raises(ConfigError) as refused:
        ensure_topic(KafkaClient.at(kafka_servers), name)
    print(refused.value)
    assert f"progress topic {name!r}" in str(refused.value)
    assert "cleanup.policy=delete" in str(refused.value)
    assert "kafka-configs" in str(refused.value) and "cleanup.policy=compact" in str(refused.value)
    assert cleanup_policy(kafka_servers, name) == "delete"  # told, not changed behind the operator's back


def test_an_existing_progress_topic_compacted_and_deleted_is_used(kafka_servers):
    ensure_topic(KafkaClient.at(kafka_servers), created(kafka_servers, "compact,delete"))
