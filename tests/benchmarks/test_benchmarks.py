"""The benchmark command keeps working: a small run of its throughput part measures every
phase, limit and peer on the real services, the peers' tables equal the checkpoint's
(the run raises otherwise), and the figures land in the performance page between its markers.
No figure is asserted: speed is reported by `./dev bench`, never tested."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from exactly_once_demo.produce import MALFORMED_EVERY, POISON_EVERY, produce
from exactly_once_stack import spark_cluster
from tests.benchmarks import isolation, job_cpu, jvm_heap, run, throughput

ORDERS = 3000  # one Kafka transaction (committed)
BAD = sum(1 for i in range(ORDERS) if i % MALFORMED_EVERY == MALFORMED_EVERY - 1 or i % POISON_EVERY == POISON_EVERY - 1)


# A variant (./dev test -m variant): `./dev bench` runs it whole.
@pytest.mark.variant
def test_a_small_run_measures_the_checkpoint_its_limits_and_its_peers(kafka_servers, ledger_db, tmp_path):
    served_before = "connect" in spark_cluster.running()  # the stack's own (STACK_SPARK=connect): not profiled
    result = throughput.measure(ORDERS, kafka_servers, ledger_db, tmp_path, repetitions=1, profile=True)
    assert result.records == ORDERS
    assert BAD == 9  # 3 malformed, 6 with a NUL in the sku
    [repetition] = result.repetitions
    # the same checkpoint by spark-submit and over the warm Spark Connect server (their tables
    # equal, or the run raises)
    for checkpoint in (repetition.submitted, repetition.connected):
        assert checkpoint.job.report["rows"]["orders"] == ORDERS - BAD
        assert checkpoint.job.report["rows"]["_dead_letters"] == BAD
        assert set(checkpoint.job.report["seconds"]) == {"read", "write_staging"}  # the task pre-commits
        assert checkpoint.pre_commit > 0 and checkpoint.start_attempt > 0
        assert 0 < checkpoint.end_to_end - checkpoint.spark_start_stop < checkpoint.end_to_end
    assert repetition.staged_rows == sum(repetition.submitted.job.report["rows"].values())
    assert repetition.submitted.job.peak_jvm > 0 and repetition.submitted.job.peak_python > 0
    assert repetition.streaming.report["batches"] >= 1
    table = run.throughput_table([result])
    assert "| 3,000 orders, spark-submit | 3,000 orders, warm Spark Connect |" in table and "nan" not in table
    # --profile: each checkpoint's Spark executions with their stages, the Connect one's from the
    # server's event log (the writes of its staging tables), and PostgreSQL's statements
    for profile in ("profile.md", *(() if served_before else ("profile-connect.md",))):
        text = (tmp_path / f"bench_{ORDERS}_0" / profile).read_text()
        assert text.count("`AppendData exactly_once_copy") >= 4 and "· " in text, profile
        assert "during the increment task" in text and "during the commit task" in text, profile


@pytest.mark.heavy  # ./dev bench-isolation runs it whole; CI: tests/spark/test_isolation.py and test_poison.py
def test_the_isolation_benchmark_sets_aside_exactly_the_order_its_transform_raises_on(kafka_servers, ledger_db,
                                                                                      tmp_path, topic):
    raising = isolation.raising_at(ORDERS, 1)
    assert len(raising) == 1 and not raising & {i for i in range(ORDERS) if i % MALFORMED_EVERY == MALFORMED_EVERY - 1
                                                or i % POISON_EVERY == POISON_EVERY - 1}
    produce(kafka_servers, ORDERS, topic=topic, per_transaction=throughput.PER_TRANSACTION,
            encoded=isolation.raising_orders(raising))
    # the run raises unless the transform's dead letters are exactly the raising order
    figures = isolation.checkpoint(1, topic, 0, kafka_servers, ledger_db, tmp_path)
    assert figures["isolate"] > 0 and 0 < figures["probes"] <= 2 * 12  # a bisection of 3,003 offsets (markers too)
    assert "| · isolating (s) |" in isolation.table(ORDERS, {0: [figures], 1: [figures]})


def test_repetitions_rotate_which_job_runs_first():
    orders = [throughput.rotated(r) for r in range(len(throughput.JOBS))]
    assert all(sorted(o) == sorted(throughput.JOBS) for o in orders)
    assert {o[0] for o in orders} == set(throughput.JOBS)


def test_the_figures_replace_what_is_between_the_performance_page_markers():
    quick, full = run.markers("quick"), run.markers("full")
    page = f"# title\n{quick[0]}\nold\n{quick[1]}\n{full[0]}\nold\n{full[1]}\nrest\n"
    assert run.into_page("new", page, "quick") == f"# title\n{quick[0]}\nnew\n{quick[1]}\n{full[0]}\nold\n" \
                                                  f"{full[1]}\nrest\n"
    assert all(run.PAGE.read_text().count(marker) == 1 for marker in (*quick, *full))
    with pytest.raises(ValueError, match="needs the markers"):
        run.into_page("new figures", "# a page without them\n", "quick")


def test_the_job_cpu_is_read_per_thread_and_summed_by_what_the_threads_do():
    # a Python process of 0.5 s of CPU below a "JVM", read as a job's Python driver is
    burner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                                                     "while time.process_time() < end: pass"])
    cpu = job_cpu.JobCpu(every=0.05)
    while burner.poll() is None:
        cpu.sample(jvm=0, processes=[burner.pid])
        time.sleep(0.05)
    driver = re.search(rf"\| {job_cpu.PYTHON_DRIVER} \| ([0-9.]+) \| 100% \|", cpu.table(seconds=1.0))
    assert driver and 0.2 <= float(driver.group(1)) <= 0.6  # its last reading misses what ran after it
    # the driver JVM's threads by their names as Linux shows them (15 characters)
    assert job_cpu._jvm_group("C2 CompilerThre") == job_cpu._jvm_group("C1 CompilerThre") == job_cpu.JIT
    assert job_cpu._jvm_group("Executor task l") == job_cpu.TASKS
    assert job_cpu._jvm_group("GC Thread#0") == job_cpu._jvm_group("G1 Conc#0") == job_cpu.GC
    assert job_cpu._jvm_group("Thread-7") == job_cpu.OTHER_JVM


@pytest.mark.parametrize("collector", ["-XX:+UseParallelGC", "-XX:+UseG1GC"])
def test_a_live_jvms_heap_is_read_from_its_counters(tmp_path, collector):
    # a JVM of 64 MiB at most holding 24 MiB it allocated, read as a job's driver is
    source = tmp_path / "Hold.java"
    source.write_text("public class Hold { public static void main(String[] a) throws Exception {"
                      " byte[][] held = new byte[24][]; for (int i = 0; i < 24; i++) held[i] = new byte[1 << 20];"
                      " System.out.println(\"held\"); System.out.flush(); Thread.sleep(60_000);"
                      " System.out.println(held.length); } }")
    holder = subprocess.Popen(["java", "-Xmx64m", collector, str(source)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        peak, until = jvm_heap.HeapPeak(), time.monotonic() + 10
        while peak.used < 24 * 2**20 and time.monotonic() < until:  # the JVM updates its counters every 50 ms
            peak.sample(holder.pid)
            time.sleep(0.05)
        heap = peak.peak()
        assert heap is not None and abs(heap.most - 64 * 2**20) < 2**10  # G1 counts 24 bytes more
        assert 24 * 2**20 <= heap.used <= heap.most
    finally:
        holder.kill()
        holder.wait()
    assert jvm_heap.heap(holder.pid) is None  # gone: nothing read
