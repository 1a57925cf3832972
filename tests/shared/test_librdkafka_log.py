"""Issue 60 (should fix): librdkafka's own log lines (`%3|…|FAIL|…`, `%6|…|BGQUEUE|…`) went to
the terminal of every command; the library's clients route them to Python logging, where
warnings and above show. A real librdkafka client of a port where no broker listens."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

CLIENT = textwrap.dedent("""
    import logging, sys
    from confluent_kafka import Consumer
    from exactly_once.kafka_client import KafkaClient

    logging.basicConfig(level=logging.DEBUG, format="python-logging %(name)s %(levelname)s %(message)s")
    consumer = Consumer(KafkaClient.at(sys.argv[1]).planner_config())
    consumer.poll(3)
    consumer.close()
""")


def test_librdkafkas_log_lines_go_to_python_logging_at_warning_and_above():
    with socket.socket() as probe:  # nothing listens there: librdkafka logs its failed connects
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([sys.executable, "-c", CLIENT, f"127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=60)
    lines = done.stderr.splitlines()
    assert not [line for line in lines if line.startswith("%")], done.stderr
    logged = [line for line in lines if line.startswith("python-logging librdkafka ")]
    assert any(f"127.0.0.1:{port}" in line for line in logged), done.stderr
    assert all(line.split()[2] in ("WARNING", "ERROR", "CRITICAL") for line in logged), done.stderr
