"""The fault matrix's scenarios of a kafka sink (issue 42): the world's runs also publish the
demo's deltas to a topic of their own (World(publishes=True)), and the oracle reads that topic
as a read_committed consumer; a publisher killed, paused into a zombie, restarted under or
too slow for its Kafka transaction, and a commit rolled back, each ending on 0 lost,
0 duplicated, 0 wrong."""

from __future__ import annotations

import os
import signal
import time

from exactly_once_stack import kafka
from tests.faults.findings import ORDERS, Findings, restarted_during
from tests.faults.world import World
from tests.kafka_records import log_ends

PAUSE = 20  # seconds a paused publisher waits inside its transaction: longer than its successor's run
SENT_WITHIN = 30  # seconds a publisher waiting inside its transaction has to get its records to the broker


def publisher_killed_mid_transaction(world: World) -> Findings:
    """t. The publish task SIGKILLed inside its Kafka transaction, its records sent: a
    read_committed consumer sees none of them; the run fails, and the next run's begin publishes them once."""
    found = Findings()
    world.produce(ORDERS)

    def sent() -> bool:
        return sum(log_ends(world.servers, world.deltas_topic, "read_uncommitted")) > 0

    def kill(run) -> None:
        # Its records leave the client's buffer while it waits at the point (a commit would flush
        # them): killed before they reach the broker, it would test nothing (CI, 2026-11-30).
        deadline = time.monotonic() + SENT_WITHIN
        while not sent() and time.monotonic() < deadline:
            time.sleep(0.2)
        world.signal_task("publish", signal.SIGKILL)
        found.expect(sent(), "the killed publisher had sent no record")
        found.expect(world.published() == [], "the killed publisher's open transaction is visible")

    run = world.run(faults={("publish", 1): "publish.before_commit=sleep:120"},
                    when={("publish", 1): ("publish.before_commit", kill)}, retries={"publish": 0})
    found.expect(run.state == "failed" and world.state(run.checkpoint) == "committed",
                 f"run {run.state}, checkpoint {world.state(run.checkpoint)}: expected a failed publish after a commit")
    found.expect(world.outbox_rows() > 0, "the outbox no longer holds what the killed publisher did not publish")
    return found


def zombie_publisher(world: World) -> Findings:
    """u. A publish task SIGSTOPped inside its Kafka transaction; the next run's begin publishes
    (its init_transactions fences the paused one); SIGCONT: the zombie's commit is refused."""
    found = Findings()
    world.produce(ORDERS)

    def pause_and_succeed(run) -> None:
        paused, pid = time.monotonic(), world.signal_task("publish", signal.SIGSTOP)
        try:
            successor = world.run()
            found.expect(successor.state == "success", f"the successor's run {successor.run_id} {successor.state}")
            found.expect(world.outbox_rows() == 0, "the successor left the outbox unpublished")
        finally:
            time.sleep(max(0.0, PAUSE + 1 - (time.monotonic() - paused)))  # its wait over: it commits at once
            os.kill(pid, signal.SIGCONT)

    run = world.run(faults={("publish", 1): f"publish.before_commit=sleep:{PAUSE}"},
                    when={("publish", 1): ("publish.before_commit", pause_and_succeed)}, retries={"publish": 0})
    [zombie] = run.tries_of("publish")
    found.expect(zombie.returncode != 0 and "fenced" in zombie.output.lower(),
                 f"the zombie publisher exited {zombie.returncode} without saying it was fenced")
    return found


def broker_restarted_mid_publish(world: World) -> Findings:
    """v. The Kafka broker restarted while a publish task waits inside its transaction, its records sent."""
    return restarted_during(world, "publish", "publish.before_commit", kafka, 10)  # still open when it is down


def commit_rolled_back(world: World) -> Findings:
    """w. The commit task SIGKILLed inside its PostgreSQL transaction, its rows promoted into the
    outbox: PostgreSQL rolls it back; a publish task run then publishes nothing; the retry
    commits, and the run's publish publishes."""
    found = Findings()
    world.produce(ORDERS)

    def kill(run) -> None:
        world.signal_task("commit", signal.SIGKILL)
        world.wait_until_unlocked(run.checkpoint)  # the killed session's transaction rolled back
        publisher = world.task("publish", [], run, 0)  # try 0: a publisher of its own, between two tries
        published = publisher.result and publisher.result["published"]["sku_minute_deltas"]["records"]
        found.expect(publisher.returncode == 0 and published == 0,
                     f"after a rolled-back commit, a publisher exited {publisher.returncode} having published "
                     f"{published} records")
        found.expect(world.outbox_rows() == 0 and world.published() == [],
                     "a commit rolled back left rows in the outbox or records in the topic")

    run = world.run(faults={("commit", 1): "commit.before_commit=sleep:120"},
                    when={("commit", 1): ("commit.before_commit", kill)})
    found.expect(run.state == "success" and len(run.tries_of("commit")) == 2,
                 f"run {run.state} after {len(run.tries_of('commit'))} commit tries, expected a retry to commit")
    return found


def publisher_too_slow(world: World) -> Findings:
    """x. A publisher whose transactions (of 10 records: a checkpoint's deltas take several) outlast
    their timeout (3 s): the broker aborts the first, the try fails; the retry publishes every record once."""
    found = Findings()
    world.produce(ORDERS)
    run = world.run(faults={("publish", 1): "publish.before_commit=sleep:6"},
                    publish_options=("--transaction-timeout-ms", "3000", "--batch-rows", "10"))
    tries = run.tries_of("publish")
    found.expect(run.state == "success" and tries[0].returncode != 0,
                 f"run {run.state}, publish exit codes {[t.returncode for t in tries]}: expected try 1 to fail")
    split = tries[-1].result and tries[-1].result["published"]["sku_minute_deltas"]["transactions"]
    found.expect(bool(split) and split > 1, f"the retry published in {split} transactions, expected several")
    return found
