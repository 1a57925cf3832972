"""Issue 60, item 9: a Spark Connect server that is gone (a 5 M checkpoint once ran the
stack's server out of heap and it died) fails its job's attempt as retryable, naming the
server, instead of leaving the job waiting on the client's default retries (at least 10
minutes). A real Connect client, in a process of its own as the job runs, against a
loopback port where no server listens any more."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

CLIENT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from exactly_once.errors import JobFailure
    from exactly_once.spark.job import connect_session, server_gone_is_retryable

    remote = sys.argv[1]
    try:
        with server_gone_is_retryable(remote):
            connect_session(remote, "gone", Path(sys.argv[2])).range(3).collect()
    except JobFailure as failure:
        print(f"retryable={failure.retryable}: {failure.reason}")
""")


def test_a_job_whose_connect_server_is_gone_fails_its_attempt_as_retryable_naming_it(tmp_path):
    with socket.socket() as probe:  # a port that was just free: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    archive = tmp_path / "code.zip"
    archive.write_bytes(b"")
    remote = f"sc://127.0.0.1:{port}/;user_id=job;token=not-for-logs"
    # The bound of the wait is the client's; 240 s only keeps this test from hanging on the
    # default retries' 10 minutes and more.
    done = subprocess.run([sys.executable, "-c", CLIENT, remote, str(archive)], capture_output=True, text=True,
                          timeout=240)
    assert f"retryable=True: the Spark Connect server at 127.0.0.1:{port} stopped answering" in done.stdout, \
        done.stdout + done.stderr[-2000:]
    assert "not-for-logs" not in done.stdout + done.stderr
