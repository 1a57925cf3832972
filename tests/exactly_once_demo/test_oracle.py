"""The demo's oracle reads the committed records of a topic from the real broker: every
partition the broker lists, and never for longer than its deadline."""

from __future__ import annotations

import itertools
import uuid

import pytest

from exactly_once_demo.oracle import committed_orders
from tests.kafka_records import create_topic, produce_transactions


def test_committed_orders_reads_every_partition_the_broker_lists(kafka_servers):
    topic = f"t_oracle_five_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_servers, topic, partitions=5)
    produced = produce_transactions(kafka_servers, topic, [
        (True, [(3, b"k", b"p3-a"), (4, b"k", b"p4-a"), (3, b"k", b"p3-b")]),
        (False, [(4, b"k", b"aborted")]),
        (True, [(4, b"k", b"p4-b")]),
    ])

    read = committed_orders(kafka_servers, topic)

    committed = {(r.partition, r.offset, r.value) for r in produced if r.committed}
    assert {(m.partition(), m.offset(), m.value()) for m in read} == committed
    assert len(read) == 4
    later = committed_orders(kafka_servers, topic, start={3: 1, 4: 1})
    assert {(m.partition(), m.value()) for m in later} == {(3, b"p3-b"), (4, b"p4-b")}


def test_committed_orders_gives_up_after_its_deadline_naming_what_it_did_not_read(kafka_servers, topic):
    produce_transactions(kafka_servers, topic, [(True, [(0, b"k", b"a"), (0, b"k", b"b"), (2, b"k", b"c")])])
    clock = itertools.chain([0.0], itertools.repeat(61.0)).__next__  # 61 s pass after the first look

    with pytest.raises(TimeoutError) as raised:
        committed_orders(kafka_servers, topic, clock=clock)

    message = str(raised.value)
    assert topic in message and "60 s" in message
    assert "partition 0 at offset 0 of 3" in message and "partition 2 at offset 0 of 2" in message
    assert "partition 1" not in message  # nothing to read there
