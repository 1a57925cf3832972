"""The benchmark command keeps working: a small run of its throughput part measures every
phase, limit and peer on the real services, the peers' tables equal the checkpoint's
(the run raises otherwise), and the figures land in the README between its markers.
No figure is asserted: speed is reported by `./dev bench`, never tested."""

from __future__ import annotations

import pytest

from exactly_once_demo.produce import MALFORMED_EVERY, POISON_EVERY
from tests.benchmarks import run, throughput

ORDERS = 3000  # one Kafka transaction (committed)
BAD = sum(1 for i in range(ORDERS) if i % MALFORMED_EVERY == MALFORMED_EVERY - 1 or i % POISON_EVERY == POISON_EVERY - 1)


def test_a_small_run_measures_the_checkpoint_its_limits_and_its_peers(kafka_servers, ledger_db, tmp_path):
    result = throughput.measure(ORDERS, kafka_servers, ledger_db, tmp_path)
    assert result.records == ORDERS
    assert BAD == 9  # 3 malformed, 6 with a NUL in the sku
    assert result.append_rows == ORDERS - BAD
    assert set(result.job.report["seconds"]) == {"read", "write_staging", "pre_commit"}
    assert result.job.report["rows"]["_dead_letters"] == BAD
    assert result.job.peak_jvm > 0 and result.job.peak_python > 0
    assert result.streaming.report["batches"] >= 1
    assert 0 < result.end_to_end - result.spark_start_stop < result.end_to_end
    table = run.throughput_table([result])
    assert "| 3,000 orders |" in table and "nan" not in table


def test_the_figures_replace_what_is_between_the_readme_markers():
    readme = f"# title\n{run.BEGIN}\nold figures\n{run.END}\nrest\n"
    assert run.into_readme("new figures", readme) == f"# title\n{run.BEGIN}\nnew figures\n{run.END}\nrest\n"
    assert run.README.read_text().count(run.BEGIN) == 1
    with pytest.raises(ValueError, match="needs the markers"):
        run.into_readme("new figures", "# a README without them\n")
