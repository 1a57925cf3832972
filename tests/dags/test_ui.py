"""Backfill and clear-task from the Airflow UI, as a person does them, in Debian's chromium
driven by Playwright (no browser download): a backfill over two past intervals started
from the DAG's Trigger dialog, a failed commit task cleared from its task page, and the
same backfill again with "All Runs", a later transform deployed, with the DAG's `reprocess`
parameter (the runs' checkpoints replayed with it) — each checked against the oracle.
("All Runs" without the parameter changes nothing: tests/dags/test_backfill.py, through the
same API.) Screenshots of every step go to .local/artifacts/ui/.

The DAG is the demo pipeline on 1-minute intervals (tests/dags/window.py): the dialog's
time fields have minute precision.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from playwright.sync_api import Page, expect

from exactly_once.ledger.planning import OffsetRange
from exactly_once_demo.oracle import checkpoints, reprocessed_ranges, reprocessings
from exactly_once_demo.produce import produce
from exactly_once_stack import airflow
from exactly_once_stack.settings import ROOT, environment, passwords
from tests.dags.window import next_boundary, wait_until
from tests.dags.window import window as window_dag
from tests.exactly_once_demo.oracle import assert_each_run_took_its_interval, assert_tables_equal_the_oracle

INTERVAL = timedelta(minutes=1)
RUNS = 2  # intervals in the window: two runs at a time show a backfill's runs in parallel
SHOTS = ROOT / ".local" / "artifacts" / "ui"
FAULT = {"EXACTLY_ONCE_FAULTS": "commit_task.try1=raise"}


class Ui:
    """The steps a person takes in the Airflow UI, each ending on a screenshot."""

    def __init__(self, page: Page, dag_id: str):
        self.page, self.dag_id, self.base = page, dag_id, environment()["AIRFLOW__API__BASE_URL"]
        SHOTS.mkdir(parents=True, exist_ok=True)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=SHOTS / f"{name}.png", full_page=True)

    def login(self) -> None:
        self.page.goto(self.base)
        self.page.locator("input[name=username]").fill("admin")
        self.page.locator("input[name=password]").fill(passwords()["airflow_admin"])
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_url(lambda url: "/auth/login" not in url)

    def backfill(self, start: datetime, last: datetime, reprocess: str, shot: str, reprocess_param: bool = False
                 ) -> None:
        """Trigger → Backfill, the date range (minutes, UTC), `reprocess` (a label of the
        dialog), three runs at a time; the DAG stays paused (the test unpauses it after).
        `reprocess_param`: the DAG's `reprocess` parameter on, under Run Parameters, and
        "Override parameters on existing runs" (else a reused run keeps its conf)."""
        self.page.goto(f"{self.base}/dags/{self.dag_id}")
        self.page.get_by_role("button", name="Trigger").first.click()
        dialog = self.page.get_by_role("dialog")
        dialog.get_by_text("Backfill", exact=True).click()
        for index, when in enumerate((start, last)):
            dialog.get_by_test_id("datetime-input").nth(index).click()
            picker = self.page.locator("[data-scope=popover][data-part=content]:visible").last  # the one just opened
            picker.get_by_placeholder("YYYY/MM/DD").fill(when.strftime("%Y/%m/%d"))
            picker.get_by_placeholder("HH:mm").fill(when.strftime("%H:%M"))
            dialog.get_by_text("Date Range").click()  # closes the picker
        dialog.get_by_text(reprocess, exact=True).click()
        dialog.locator("input[name=max_active_runs]").fill("3")
        unpause = dialog.get_by_role("checkbox", name=re.compile("on trigger"))
        if unpause.count() and unpause.is_checked():
            dialog.get_by_text(re.compile("on trigger$")).click()  # the label: the box itself is covered
            expect(unpause).not_to_be_checked()
        expect(dialog.get_by_text(f"{RUNS} runs will be triggered.")).to_be_visible()
        if reprocess_param:
            dialog.get_by_text("Override parameters on existing runs").click()
            dialog.get_by_role("button", name="Run Parameters").click()
            switch = dialog.locator("[id='switch:element_reprocess']")  # the switch's label
            switch.click()
            expect(dialog.locator("input[name=element_reprocess]")).to_be_checked()
            self.page.wait_for_timeout(1000)  # the form settles (its sections may close again)
            if not switch.is_visible():  # shown open for the screenshot
                dialog.get_by_role("button", name="Run Parameters").click()
            expect(switch).to_be_visible()
            expect(dialog.locator("input[name=element_reprocess]")).to_be_checked()
            self.page.wait_for_timeout(1000)  # the section's opening animation
        self.shot(shot)
        dialog.get_by_role("button", name="Run Backfill").click()
        expect(dialog).to_be_hidden()

    def clear_task(self, run_id: str, task_id: str, shot: str) -> None:
        self.page.goto(f"{self.base}/dags/{self.dag_id}/runs/{run_id}/tasks/{task_id}")
        self.page.get_by_role("button", name="Clear").first.click()
        dialog = self.page.get_by_role("dialog")
        expect(dialog.get_by_text("Affected Tasks: 1")).to_be_visible()
        self.shot(shot)
        dialog.get_by_role("button", name="Confirm").click()
        expect(dialog).to_be_hidden()

    def show(self, path: str, shot: str, text: str) -> None:
        self.page.goto(f"{self.base}/dags/{self.dag_id}{path}")
        expect(self.page.get_by_text(text).first).to_be_visible()
        self.shot(shot)


@pytest.fixture
def ui_window(tmp_path, stack_env, fresh_demo, kafka_servers):
    """The window's first interval is the current minute (the next, if it ends within 10 s):
    its batch goes in before the services start, so the first minute is not waited for."""
    start = next_boundary(INTERVAL, lead=timedelta(seconds=10) - INTERVAL)
    last = start + (RUNS - 1) * INTERVAL
    wait_until(start + timedelta(seconds=1))
    produce(kafka_servers, 300, seed=0)
    with window_dag(tmp_path, INTERVAL, start, last, commit_retries=0) as (api, dag):
        yield api, dag, start, last, tmp_path


# A variant (./dev test -m variant): tests/dags/test_backfill.py (heavy) proves the same backfills and
# clears through the REST API, and tests/dags/test_pipelines_view.py drives the UI in chromium in CI.
@pytest.mark.variant
def test_backfill_and_clear_from_the_ui_count_every_record_once(fresh_demo, kafka_servers, ui_window, page):
    api, dag, start, last, dags_folder = ui_window
    ui = Ui(page, api.dag_id)
    for i in range(1, RUNS):  # one batch inside each interval (the first's: ui_window)
        wait_until(start + i * INTERVAL + timedelta(seconds=2))
        produce(kafka_servers, 300, seed=i)
    wait_until(last + INTERVAL + timedelta(seconds=2))

    ui.login()
    ui.shot("01-logged-in")
    ui.backfill(start, last, "Missing Runs", "02-backfill-dialog")
    api.call("PATCH", f"/dags/{api.dag_id}", json={"is_paused": False})
    runs = api.finished_runs(api.latest_backfill(), start, last)
    assert sorted(r["state"] for r in runs) == ["success"] * RUNS, runs
    ui.show("/runs", "03-backfill-succeeded", "backfill")
    assert_each_run_took_its_interval(fresh_demo, kafka_servers, runs)  # whatever order they began in
    after_backfill = assert_tables_equal_the_oracle(fresh_demo, kafka_servers)

    # A commit task that fails (its only try, by the fault hook), cleared from the UI.
    airflow.stop_services(["scheduler"])
    airflow.start_services(AIRFLOW__CORE__DAGS_FOLDER=str(dags_folder), **FAULT)
    produce(kafka_servers, 300, seed=RUNS)
    # A logical date inside the window (past its end_date a run gets no task instances),
    # its interval from the window's end to now: this batch.
    run_id = api.call("POST", f"/dags/{api.dag_id}/dagRuns", json={
        "logical_date": (last - INTERVAL / 2).isoformat(), "data_interval_start": (last + INTERVAL).isoformat(),
        "data_interval_end": datetime.now(timezone.utc).isoformat()})["dag_run_id"]
    api.wait("the run with the failing commit", lambda: api.run_state(run_id) == "failed")
    assert "fault injected at commit_task.try1" in api.task_log(run_id, "commit", 1)
    assert {run: state for _, run, state, _ in checkpoints(fresh_demo)}[run_id] == "precommitted"
    ui.show(f"/runs/{run_id}/tasks/commit", "04-commit-failed", "Failed")
    ui.clear_task(run_id, "commit", "05-clear-commit-dialog")
    api.wait("the cleared run", lambda: api.run_state(run_id) == "success")
    assert "committed now" in api.task_log(run_id, "commit", 2)
    ui.show(f"/runs/{run_id}/tasks/commit", "06-commit-cleared-and-committed", "Success")
    after_clear = assert_tables_equal_the_oracle(fresh_demo, kafka_servers)
    assert after_clear["orders"] > after_backfill["orders"]

    # A later transform deployed, the same backfill with the `reprocess` parameter: the runs'
    # checkpoints are replayed with it, and their rows replaced.
    replace(dag, transform="exactly_once_demo.pipeline:prepare_with_returns").write(dags_folder)
    previous = api.latest_backfill()
    ui.backfill(start, last, "All Runs", "07-reprocess-parameter-dialog", reprocess_param=True)
    fixed = api.wait("the reprocessing backfill", lambda: api.latest_backfill() > previous and api.latest_backfill())
    runs = api.finished_runs(fixed, start, last)
    assert sorted(r["state"] for r in runs) == ["success"] * RUNS, runs
    assert sorted(run_id for _, run_id, state, *_ in reprocessings(fresh_demo) if state == "committed") == sorted(
        r["dag_run_id"] for r in runs)
    assert_tables_equal_the_oracle(fresh_demo, kafka_servers,
                                   reprocessed=[OffsetRange(*r) for r in reprocessed_ranges(fresh_demo)])
