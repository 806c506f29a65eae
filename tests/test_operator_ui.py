"""The operator's path in a real browser: Debian's Chromium, headless, driven by Playwright (no
browser download), against the suite as `streamops up` brings it up (the session's one local
stack). Logs in; sees every app on the apps page; deploys the router from its form; kills its driver and sees it
running again within 30 seconds, restarted by the supervisor's run that the driver's exit started; approves a
provision_topics plan and a recover_replay_dead_letters plan in the UI, both triggered with the forms' defaults; checks that
the apps page, Data Docs, the metrics and the REST API refuse a request without login.
Screenshots of each step: test-artifacts/operator-ui/ (kept after the run).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from urllib.parse import unquote

import httpx
import pytest

from streamops.kafka_client import KafkaClientConfig
from streamops.waiting import poll_until
from tests.support import PROJECT_ROOT
from tests.support.local_stack import LocalStack
from tests.support.oplog_events import produce_to_partitions
from tests.support.routes import wait_until_all_routed

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = PROJECT_ROOT / "test-artifacts" / "operator-ui"
APP = "oplog-router"

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (bin/setup installs it as root)")


@pytest.fixture(scope="module")
def stack(local_stack):
    """The session's one `streamops up` (tests/support/local_stack.py): the browser test is an
    operator in front of the stack the README's main command brings up."""
    return local_stack


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


class Operator:
    """One logged-in browser page, with the steps an operator takes."""

    def __init__(self, browser, stack: LocalStack):
        self.stack = stack
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.set_default_timeout(60_000)
        self.shots = 0
        ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def shot(self, name: str) -> None:
        self.shots += 1
        self.page.screenshot(path=str(ARTIFACTS / f"{self.shots:02d}-{name}.png"), full_page=True)

    def log_in(self, path: str) -> None:
        self.page.goto(self.stack.base + path)
        assert "/auth/login" in self.page.url  # sent to the login page, and back after it
        self.shot("login")
        self.page.locator("input[name=username]").fill("admin")
        self.page.locator("input[name=password]").fill(self.stack.password)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_url(re.compile(re.escape(path) + "$"))

    def app_state(self, app: str) -> tuple[str, bool]:
        """(state, red) of the app's row on a freshly loaded apps page."""
        self.page.goto(self.stack.base + "/streamops/apps")
        row = self.page.locator(f'tr[data-app="{app}"]')
        return row.get_attribute("data-state"), "attention" in (row.get_attribute("class") or "")

    def trigger(self, dag_id: str, choose: dict[str, str] | None = None) -> str:
        """Open the DAG's trigger form, pick the given multi-select values, press Trigger: the run id."""
        self.page.goto(f"{self.stack.base}/dags/{dag_id}")
        self.page.get_by_role("button", name="Trigger").first.click()
        dialog = self.page.get_by_role("dialog")
        for value in (choose or {}).values():
            box = dialog.get_by_role("combobox").first
            box.click()
            box.fill(value)
            box.press("Enter")
        self.shot(f"{dag_id}-form")
        dialog.get_by_role("button", name="Trigger").click()
        self.page.wait_for_url(re.compile(rf"/dags/{dag_id}/runs/"))
        return unquote(self.page.url.split("/runs/", 1)[1].split("/")[0])

    def approve(self, dag_id: str, run_id: str, expect_in_plan: str) -> None:
        api = self.stack.api()
        poll_until(lambda: api.task_states(dag_id, run_id).get("approve") == "awaiting_input", timeout=600,
                   what=f"{dag_id}'s plan to wait for approval")
        self.page.goto(f"{self.stack.base}/dags/{dag_id}/runs/{run_id}/tasks/approve/required_actions")
        self.page.get_by_text(expect_in_plan).first.wait_for()
        self.shot(f"{dag_id}-plan-to-approve")
        self.page.get_by_role("button", name="Approve", exact=True).click()
        assert api.wait_for_run(dag_id, run_id, timeout=600) == "success", api.run_report(dag_id, run_id)
        self.page.goto(f"{self.stack.base}/dags/{dag_id}/runs/{run_id}")
        self.shot(f"{dag_id}-applied")


def test_the_operator_path_in_a_real_browser(stack, browser):
    operator = Operator(browser, stack)
    api = stack.api()

    # Every catalog app on the apps page (inside the UI's login).
    operator.log_in("/streamops/apps")
    rows = operator.page.locator("tr[data-app]")
    assert [rows.nth(i).get_attribute("data-app") for i in range(rows.count())] == stack.catalog.app_names()
    assert operator.page.locator("#headline").inner_text() == f"All {len(stack.catalog.app_names())} apps are as they should be"
    operator.shot("apps-page")

    # Deploy the router from its form (an explicit choice: nothing is pre-selected).
    deployed = operator.trigger("deploy_apps", {"apps": APP})
    assert api.wait_for_run("deploy_apps", deployed, timeout=600) == "success", api.run_report("deploy_apps", deployed)
    poll_until(lambda: operator.app_state(APP) == ("healthy", False), timeout=300, what="the router to show healthy")
    row = operator.page.locator(f'tr[data-app="{APP}"]')
    assert "Spark UI" in row.inner_text() and "driver log" in row.inner_text() and "deploy_apps" in row.inner_text()
    operator.shot("router-deployed")
    # The deploy's asset event starts a validation of the router's outputs: a run with no data interval.
    validation = poll_until(lambda: next(iter(api.runs("validate_topic_quality", "asset_triggered")), None),
                            timeout=300, what="the deploy to trigger a validation")["dag_run_id"]
    assert api.wait_for_run("validate_topic_quality", validation, timeout=600) == "success", \
        api.run_report("validate_topic_quality", validation)
    assert api.task_states("validate_topic_quality", validation) == {"plan": "success", "validate": "success"}

    # kill -9 of the driver: the driver-exit watcher starts the supervisor's run at once, and its
    # audited task restarts the router within seconds (not at the next timed run).
    # Records before and during the outage: every one is routed after the restart (0 lost).
    kafka = KafkaClientConfig({"bootstrap.servers": f"127.0.0.1:{stack.kafka_port}"}, source="the local stack's broker")
    router = stack.catalog.app(APP)
    produce_to_partitions(kafka, router.inputs["operations"], range(1, 21))
    wait_until_all_routed(kafka, router, what="the records before the kill in the router's output")
    runtime = stack.runtime(APP)
    killed = runtime.driver().pid
    killed_at = time.monotonic()
    os.kill(killed, signal.SIGKILL)
    produce_to_partitions(kafka, router.inputs["operations"], range(21, 41))
    restarted = poll_until(lambda: runtime.is_running() and runtime.driver().pid != killed and runtime.driver(),
                           timeout=120, interval=0.2, what="the supervisor to restart the router")
    restart_s = time.monotonic() - killed_at
    assert restart_s < 30, f"restarted {restart_s:.1f}s after the kill"
    every = wait_until_all_routed(kafka, router, what="every record, before and after the kill, in the router's output")
    assert len(every.expected) == 48  # 40 operations, ADD_CONTACT routed to two categories
    print(f"\nkill -9 of the router: restarted by the driver-exit event's app_status run {restart_s:.1f}s after the kill; "
          f"{len(every.expected)} routed records, none lost, {every.duplicates} duplicates")
    (status_run,) = api.runs("app_status", "asset_triggered")
    # The run fails (it pages: the app was down when it looked) after restarting the app.
    assert api.wait_for_run("app_status", status_run["dag_run_id"], timeout=600) == "failed"
    assert restarted.launched_by == status_run["dag_run_id"]
    poll_until(lambda: operator.app_state(APP) == ("healthy", False), timeout=300, what="the router to show healthy again")
    assert operator.page.locator(f'tr[data-app="{APP}"]').get_attribute("data-restarts") == "1"
    operator.shot("router-restarted")

    # Plans approved in the UI, both runs triggered with the forms' defaults.
    provision = operator.trigger("provision_topics")
    operator.approve("provision_topics", provision, "no change")
    replay = operator.trigger("recover_replay_dead_letters")
    operator.approve("recover_replay_dead_letters", replay, "Approve applies exactly this plan")
    import json

    audit = [json.loads(line) for line in (stack.run_dir / "checkpoints" / "_audit" / "audit.jsonl").read_text().splitlines()]
    approvals = [(e["dag_id"], e["outcome"], e["approved_by"]) for e in audit
                 if e["step"] == "approve" and e["run_id"] in (provision, replay)]
    assert approvals == [("provision_topics", "approved", "admin"), ("recover_replay_dead_letters", "approved", "admin")]

    # Data Docs behind the login, styled by the suite's own assets (no validation yet: it says so).
    operator.page.goto(stack.base + "/streamops/data-docs/index.html")
    assert operator.page.locator("h1").inner_text() == "No validation has run yet"
    operator.shot("data-docs")

    # Without a login: the browser is sent to the login page; a script gets a 401.
    anonymous = browser.new_page()
    anonymous.goto(stack.base + "/streamops/apps")
    assert "/auth/login" in anonymous.url
    anonymous.close()
    for path in ("/streamops/apps", "/streamops/apps.json", "/streamops/data-docs/index.html",
                 "/streamops/data-docs/_assets/jquery@3.7.1/dist/jquery.min.js", "/streamops/metrics", "/api/v2/dags"):
        refused = httpx.get(stack.base + path, timeout=30)
        assert refused.status_code == 401, (path, refused.status_code, refused.text[:200])
