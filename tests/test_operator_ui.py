"""The operator's path in a real browser: Debian's Chromium, headless, driven by Playwright (no
browser download), against the suite as `streamops up` brings it up (the session's one local
stack), with its users of different roles (streamops.access). The operator logs in; sees every app
on the apps page; deploys the router from its form; kills its driver and sees it running again
within 30 seconds, restarted by the supervisor's run that the driver's exit started; triggers a
provision_topics plan and a recover_replay_dead_letters plan with the forms' defaults, which the
approver approves in the UI. Then four eyes on a reset: the operator cannot approve it, the
approver does and the apply runs, a plan approved by its own requester is refused by the apply;
the viewer sees the apps page and Data Docs, and cannot trigger (Airflow's UI shows its Trigger
button to every reader; the API refuses the viewer's run); each page refuses a role that may not
see it (403) and a request without login (401).
Screenshots of each step: test-artifacts/operator-ui/ (kept after the run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from urllib.parse import quote, unquote

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


class UiUser:
    """One user's browser page (a context of its own: its own login), with the steps they take."""

    shots = 0  # numbered across users: the screenshots read as the story

    def __init__(self, browser, stack: LocalStack, user: str):
        self.stack = stack
        self.user = user
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.set_default_timeout(60_000)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def shot(self, name: str) -> None:
        UiUser.shots += 1
        self.page.screenshot(path=str(ARTIFACTS / f"{UiUser.shots:02d}-{self.user}-{name}.png"), full_page=True)

    def log_in(self, path: str) -> None:
        self.page.goto(self.stack.base + path)
        assert "/auth/login" in self.page.url  # sent to the login page, and back after it
        self.shot("login")
        self.page.locator("input[name=username]").fill(self.user)
        self.page.locator("input[name=password]").fill(self.stack.password(self.user))
        self.page.get_by_role("button", name="Sign In").click()
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

    def open_approval(self, dag_id: str, run_id: str, expect_in_plan: str) -> None:
        """The run's approval page, once the plan waits for it."""
        api = self.stack.api()
        poll_until(lambda: api.task_states(dag_id, run_id).get("approve") == "awaiting_input"
                   or api.run_state(dag_id, run_id) in ("success", "failed"), timeout=600,
                   what=f"{dag_id}'s plan to wait for approval")
        assert api.task_states(dag_id, run_id).get("approve") == "awaiting_input", api.run_report(dag_id, run_id)
        self.page.goto(f"{self.stack.base}/dags/{dag_id}/runs/{run_id}/tasks/approve/required_actions")
        self.page.get_by_text(expect_in_plan).first.wait_for()
        self.shot(f"{dag_id}-plan-to-approve")

    def approve(self, dag_id: str, run_id: str, expect_in_plan: str, outcome: str = "success") -> None:
        self.open_approval(dag_id, run_id, expect_in_plan)
        self.page.get_by_role("button", name="Approve", exact=True).click()
        api = self.stack.api()
        assert api.wait_for_run(dag_id, run_id, timeout=600) == outcome, api.run_report(dag_id, run_id)
        self.page.goto(f"{self.stack.base}/dags/{dag_id}/runs/{run_id}")
        self.shot(f"{dag_id}-{'applied' if outcome == 'success' else outcome}")


def audit_of(stack: LocalStack, *run_ids: str) -> list[dict]:
    path = stack.run_dir / "checkpoints" / "_audit" / "audit.jsonl"
    return [entry for line in path.read_text().splitlines() if (entry := json.loads(line))["run_id"] in run_ids]


def test_the_operator_path_in_a_real_browser(stack, browser):
    operator = UiUser(browser, stack, "operator")
    approver = UiUser(browser, stack, "approver")
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
    killed, killed_app = runtime.driver().pid, runtime.driver().application_id
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

    # The killed driver's history opens on the Spark History Server, its jobs up to the kill, linked
    # from the router's row as crashed (it died without recording a stop).
    def history_of_killed() -> dict | None:
        answer = httpx.get(f"{stack.history_url}/api/v1/applications/{killed_app}/jobs", timeout=30)
        return answer.json() if answer.status_code == 200 and answer.json() else None

    jobs = poll_until(history_of_killed, timeout=120, what="the History Server to show the killed driver's jobs")
    assert {job["status"] for job in jobs} <= {"SUCCEEDED", "RUNNING", "FAILED", "UNKNOWN"} and len(jobs) >= 1
    application = httpx.get(f"{stack.history_url}/api/v1/applications/{killed_app}", timeout=30).json()
    assert application["name"] == f"streamops-{APP}"

    def crashed_link():
        operator.page.goto(stack.base + "/streamops/apps")
        link = operator.page.locator(f'tr[data-app="{APP}"] a.history[data-app-id="{killed_app}"]')
        return link if link.count() and link.get_attribute("data-how") == "crashed" else None

    link = poll_until(crashed_link, timeout=60, what="the apps page to link the killed driver as crashed")
    operator.page.goto(link.get_attribute("href"))
    assert killed_app in operator.page.content() and operator.page.get_by_text("Spark Jobs").first.is_visible()
    operator.shot("killed-driver-history")

    # Plans the operator triggers with the forms' defaults and the approver approves in the UI.
    approver.log_in("/streamops/apps")
    provision = operator.trigger("provision_topics")
    approver.approve("provision_topics", provision, "no change")
    replay = operator.trigger("recover_replay_dead_letters")
    approver.approve("recover_replay_dead_letters", replay, "Approve applies exactly this plan")
    approvals = [(e["dag_id"], e["outcome"], e["user"], e["approved_by"]) for e in audit_of(stack, provision, replay)
                 if e["step"] == "approve"]
    assert approvals == [("provision_topics", "approved", "operator", "approver"),
                         ("recover_replay_dead_letters", "approved", "operator", "approver")]

    # Data Docs behind the login, styled by the suite's own assets (no validation yet: it says so).
    operator.page.goto(stack.base + "/streamops/data-docs/index.html")
    assert operator.page.locator("h1").inner_text() == "No validation has run yet"
    operator.shot("data-docs")


def test_four_eyes_and_each_role_in_a_real_browser(stack, browser):
    """A reset can lose or repeat records: the operator who triggers it cannot approve it, an
    approver does; a plan approved by its own requester is refused by the apply itself."""
    api = stack.api()
    runtime = stack.runtime(APP)
    if runtime.is_running():  # a reset moves a stopped app's input position, then starts it
        stopped = stack.api("operator").trigger("stop_apps", {"apps": [APP]})
        assert api.wait_for_run("stop_apps", stopped, timeout=600) == "success", api.run_report("stop_apps", stopped)
    operator, approver, admin = (UiUser(browser, stack, user) for user in ("operator", "approver", "admin"))
    for user in (operator, approver, admin):
        user.log_in("/streamops/apps")

    # Self-approval: the admin may approve plans, but not one they triggered; nothing changes.
    history_before = runtime.history()
    own = admin.trigger("recover_reset_offsets")
    admin.approve("recover_reset_offsets", own, "Needs an approver other than admin", outcome="failed")
    assert api.task_states("recover_reset_offsets", own) == {"plan": "success", "approve": "success", "apply": "failed",
                                                             "verify": "upstream_failed"}
    refusal = ("Apply refused: admin approved a plan they triggered themselves, and this one needs a second person "
               "(moving an app's input position skips or repeats records). Nothing was changed.")
    assert refusal in api.task_log("recover_reset_offsets", own, "apply")
    assert [(e["step"], e["outcome"], e["user"]) for e in audit_of(stack, own)] == [
        ("plan", "done", "admin"),
        ("approve", "approved by its own requester (the apply refuses it: this plan needs a second person)", "admin"),
        ("apply", "refused", "admin")]
    assert not runtime.is_running() and runtime.history() == history_before  # not started, not reset

    # The operator triggers a reset and cannot approve it (the UI's answer is refused by the API).
    reset = operator.trigger("recover_reset_offsets")
    operator.open_approval("recover_reset_offsets", reset, "Needs an approver other than operator")
    answer = stack.api("operator").client.patch(
        f"/dags/recover_reset_offsets/dagRuns/{reset}/taskInstances/approve/-1/hitlDetails",
        json={"chosen_options": ["Approve"], "params_input": {}})
    assert answer.status_code == 403, answer.text
    assert api.task_states("recover_reset_offsets", reset)["approve"] == "awaiting_input"
    # On-call heard of the request: which DAG, app and requester, what it does, where to answer.
    asked = stack.webhook.wait_for("the reset's approval request", kind="approval requested", run_id=reset)
    assert (asked["dag_id"], asked["app"], asked["requested_by"], asked["state"]) == (
        "recover_reset_offsets", APP, "operator", "waiting for approval")
    assert asked["link"] == f"{stack.base}/dags/recover_reset_offsets/runs/{quote(reset, safe='')}/tasks/approve/required_actions"
    assert asked["evidence"] == api.xcom("recover_reset_offsets", reset, "plan")["summary"]
    assert "waits for an approver other than operator (moving an app's input position skips or repeats records)" in asked["text"]
    # The approver approves; the apply restarts the router from the earliest offsets.
    approver.approve("recover_reset_offsets", reset, "Needs an approver other than operator")
    assert runtime.is_running()
    assert [(e["step"], e["outcome"], e["user"], e.get("approved_by")) for e in audit_of(stack, reset)] == [
        ("plan", "done", "operator", None), ("approve", "approved", "operator", "approver"),
        ("apply", "done", "operator", None), ("verify", "done", "operator", None)]

    # The viewer sees the apps page and Data Docs, and triggers nothing.
    viewer = UiUser(browser, stack, "viewer")
    viewer.log_in("/streamops/apps")
    rows = viewer.page.locator("tr[data-app]")
    assert rows.count() == len(stack.catalog.app_names())
    viewer.page.goto(stack.base + "/streamops/data-docs/index.html")
    assert viewer.page.locator("h1").inner_text() == "No validation has run yet"
    viewer.page.goto(f"{stack.base}/dags/recover_reset_offsets")
    viewer.page.get_by_text("recover_reset_offsets").first.wait_for()
    viewer.shot("dag-page")
    # Airflow 3.3's UI shows its Trigger button to every reader; the API refuses the viewer's run.
    refused = stack.api("viewer").client.post("/dags/recover_reset_offsets/dagRuns", json={"logical_date": None, "conf": {}})
    assert refused.status_code == 403, refused.text
    assert [r["dag_run_id"] for r in api.runs("recover_reset_offsets")] == [own, reset]

    # Each page answers 403 to a role that may not see it, 401 without a login.
    tokens = {user: stack.api(user).client.headers["Authorization"] for user in ("viewer", "operator", "approver")}
    forbidden_to_viewer = ("/streamops/metrics", f"/streamops/apps/{APP}/driver-log")
    for path in ("/streamops/apps", "/streamops/apps.json", "/streamops/data-docs/index.html", "/streamops/messages",
                 *forbidden_to_viewer):
        for user, token in tokens.items():
            answer = httpx.get(stack.base + path, headers={"Authorization": token}, timeout=60)
            expected = 403 if user == "viewer" and path in forbidden_to_viewer else 200
            assert answer.status_code == expected, (path, user, answer.status_code, answer.text[:300])
            if expected == 403:
                assert answer.json()["detail"].startswith("Forbidden: ") and "viewer has none of them" in answer.json()["detail"]
    # An app's state: not for the viewer (raw values, no masking); the operator's read runs Spark
    # beside the API server and answers (the notifier has not run on this stack: no state).
    state = "/streamops/apps/presence-notifier/state.json"
    refused = httpx.get(stack.base + state, headers={"Authorization": tokens["viewer"]}, timeout=60)
    assert refused.status_code == 403 and refused.json()["detail"].startswith("Forbidden: ") and \
        "viewer has none of them" in refused.json()["detail"], refused.text
    answered = httpx.get(stack.base + state + "?key=u1", headers={"Authorization": tokens["operator"]}, timeout=300)
    assert answered.status_code == 400 and "presence-notifier has no state in " in answered.json()["detail"], answered.text
    anonymous = browser.new_page()
    anonymous.goto(stack.base + "/streamops/apps")
    assert "/auth/login" in anonymous.url
    anonymous.close()
    for path in ("/streamops/apps", "/streamops/apps.json", "/streamops/data-docs/index.html",
                 "/streamops/data-docs/_assets/jquery@3.7.1/dist/jquery.min.js", "/streamops/metrics", "/api/v2/dags",
                 "/streamops/messages", "/streamops/messages.json?topic=x", "/streamops/messages/plan/recover_skip_records",
                 "/streamops/apps/presence-notifier/state", "/streamops/apps/presence-notifier/state.json"):
        refused = httpx.get(stack.base + path, timeout=30)
        assert refused.status_code == 401, (path, refused.status_code, refused.text[:200])


def test_on_call_finds_a_poison_record_and_its_dead_letter_in_the_message_browser(stack, browser):
    """The router refuses a record that is not JSON: on-call finds it by its offset and its dead
    letter by reason in the message browser, and opens recover_skip_records from the selection with
    the record filled in; its run plans as the operator (and refuses: the router dead-lettered that
    record already). A viewer sees the same records with the user ids masked."""
    from streamops.kafka_offsets import end_offsets
    from streamops.kafka_records import produce, read_all

    api = stack.api()
    router = stack.catalog.app(APP)
    operations, dead_letters = router.inputs["operations"], router.dead_letter_topic
    if not stack.runtime(APP).is_running():
        deployed = stack.api("operator").trigger("deploy_apps", {"apps": [APP]})
        assert api.wait_for_run("deploy_apps", deployed, timeout=600) == "success", api.run_report("deploy_apps", deployed)
    kafka = KafkaClientConfig({"bootstrap.servers": f"127.0.0.1:{stack.kafka_port}"}, source="the local stack's broker")
    first = end_offsets(kafka, operations)[0][1]
    poison = f"poison-{time.time_ns()}"
    good = json.dumps({"seq": 1, "user_id": "u-browse", "op_type": "SEND_MESSAGE", "event_time": "2026-12-03T03:00:00Z"})
    produce(kafka, operations, [("u-browse", good), ("u-browse", f"not json: {poison}")], partition=0)
    letter = poll_until(lambda: next((r for r in read_all(kafka, dead_letters) if poison.encode() in (r.value or b"")),
                                     None), timeout=300, what="the router's dead letter of the poison record")

    operator = UiUser(browser, stack, "operator")
    operator.log_in(f"/streamops/messages?topic={operations}&partition=0&offset={first}")
    rows = operator.page.locator("tr[data-offset]")
    assert [rows.nth(i).get_attribute("data-offset") for i in range(rows.count())][:2] == [str(first), str(first + 1)]
    poison_row = operator.page.locator(f'tr[data-offset="{first + 1}"]')
    assert f"not json: {poison}" in poison_row.inner_text()
    assert '"user_id": "u-browse"' in operator.page.locator(f'tr[data-offset="{first}"]').inner_text()  # may see it
    operator.shot("messages-poison-record")
    # The dead letter, found by its reason: decoded, with the original and where it came from.
    operator.page.goto(f"{stack.base}/streamops/messages?topic={dead_letters}&partition={letter.partition}"
                       f"&offset={letter.offset}&reason=not+valid+JSON&limit=1")
    decoded = operator.page.locator(".dl").first
    assert decoded.get_attribute("data-source") == f"{operations}/0/{first + 1}"
    assert "value is not valid JSON" in decoded.locator(".reason").inner_text() and poison in decoded.inner_text()
    operator.shot("messages-dead-letter")
    # From the selection, the skip form filled in; its Trigger plans and waits for an approver.
    operator.page.goto(f"{stack.base}/streamops/messages?topic={operations}&partition=0&offset={first + 1}&limit=1")
    operator.page.locator("input.pick").first.check()
    operator.page.get_by_role("button", name="Plan a skip…").click()
    records = operator.page.locator("textarea[name=records]")
    assert records.input_value() == f"{operations}:0:{first + 1}"
    operator.page.locator("input[name=note]").fill("poison record found in the browser")
    operator.shot("messages-skip-form")
    operator.page.get_by_role("button", name="Trigger: plan it and wait for an approver").click()
    operator.page.wait_for_url(re.compile(r"/dags/recover_skip_records/runs/"))
    skip = unquote(operator.page.url.split("/runs/", 1)[1].split("/")[0])
    run = stack.api("operator").client.get(f"/dags/recover_skip_records/dagRuns/{quote(skip, safe='')}").json()
    assert run["conf"]["records"] == [f"{operations}:0:{first + 1}"] and run["conf"]["approve_in_ui"] is True
    assert run["triggering_user_name"] == "operator"
    # The router has dead-lettered it already: the plan says so and nothing is applied.
    assert api.wait_for_run("recover_skip_records", skip, timeout=600) == "failed"
    assert api.task_states("recover_skip_records", skip)["plan"] == "failed"
    assert f"record '{operations}:0:{first + 1}' was already processed" in api.task_log("recover_skip_records", skip, "plan")

    # The viewer: the same records, user ids and keys masked; no filter by the masked key.
    viewer = UiUser(browser, stack, "viewer")
    viewer.log_in(f"/streamops/messages?topic={operations}&partition=0&offset={first}&limit=1")
    masked = viewer.page.locator(f'tr[data-offset="{first}"]').inner_text()
    assert '"user_id": "•••"' in masked and "u-browse" not in masked
    assert viewer.page.locator("#masked-note").is_visible()
    viewer.page.goto(f"{stack.base}/streamops/messages?topic={operations}&partition=0&key=u-browse")
    assert "the keys of" in viewer.page.locator("#error").inner_text()
    viewer.shot("messages-masked")
