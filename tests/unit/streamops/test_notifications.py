"""On-call messages (streamops.notifications) through a real HTTP webhook on this host: what each
says, once per state, and that the chat tool's failure fails nothing and leaks no URL."""

from __future__ import annotations

import logging

import pytest

from streamops.app_runtime import AppRuntime
from streamops.notifications import approval_request, notify_attention, send
from tests.support.webhook import WebhookReceiver

BASE = "http://127.0.0.1:8080"


@pytest.fixture
def webhook(monkeypatch):
    receiver = WebhookReceiver()
    monkeypatch.setenv("AIRFLOW_CONN_STREAMOPS_NOTIFY", receiver.connection_json())
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", BASE)
    yield receiver
    if receiver.server.socket.fileno() != -1:
        receiver.close()


def crash_loop(app: str = "oplog-router") -> dict:
    return {"app": app, "state": "crash-loop", "evidence": "restarted 2 time(s) within 1 hour (the guard's limit is 2)",
            "action": "it stays down until an operator acts"}


def test_an_approval_request_names_the_dag_the_app_the_requester_and_links_the_approval():
    message = approval_request("recover_reset_offsets", "manual__2026-12-03T03:00:00+00:00", "olga", "oplog-router",
                               "replays 120 records", "moving an app's input position skips or repeats records", BASE)
    assert message["link"] == ("http://127.0.0.1:8080/dags/recover_reset_offsets/runs/manual__2026-12-03T03%3A00%3A00%2B00%3A00"
                               "/tasks/approve/required_actions")
    assert (message["kind"], message["app"], message["state"], message["evidence"], message["requested_by"]) == (
        "approval requested", "oplog-router", "waiting for approval", "replays 120 records", "olga")
    assert message["text"].startswith("recover_reset_offsets for oplog-router, triggered by olga, waits for an approver "
                                      "other than olga (moving an app's input position skips or repeats records): "
                                      "replays 120 records. Approve or reject: http://")


def test_an_app_that_needs_someone_pages_once_per_state_and_is_forgotten_when_fine(webhook, tmp_path):
    checkpoints = {"oplog-router": str(tmp_path / "oplog-router")}
    assert notify_attention([crash_loop()], "scheduled__1", checkpoints) == ["oplog-router"]
    message = webhook.wait_for("the crash-loop notice", app="oplog-router", state="crash-loop")
    assert message == {"path": "/hooks/on-call", "kind": "app needs attention", "dag_id": "app_status", "run_id": "scheduled__1",
                       "app": "oplog-router", "state": "crash-loop", "evidence": crash_loop()["evidence"],
                       "action": "it stays down until an operator acts", "link": f"{BASE}/streamops/apps",
                       "text": f"oplog-router is CRASH-LOOP: {crash_loop()['evidence']} Supervisor: it stays down until "
                               f"an operator acts. Apps page: {BASE}/streamops/apps"}
    assert notify_attention([crash_loop()], "scheduled__2", checkpoints) == []  # the same state: told already
    assert AppRuntime(checkpoints["oplog-router"]).last_notice().run_id == "scheduled__1"
    assert notify_attention([{**crash_loop(), "state": "healthy"}], "scheduled__3", checkpoints) == []
    assert AppRuntime(checkpoints["oplog-router"]).last_notice() is None
    assert notify_attention([crash_loop()], "scheduled__4", checkpoints) == ["oplog-router"]  # again: told again
    assert [m["run_id"] for m in webhook.messages] == ["scheduled__1", "scheduled__4"]


def test_a_failing_webhook_fails_nothing_and_its_url_stays_out_of_the_log(webhook, tmp_path, caplog):
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact

    webhook.status = 404
    caplog.set_level(logging.INFO, logger="streamops.notifications")
    assert notify_attention([crash_loop()], "scheduled__1", {"oplog-router": str(tmp_path / "r")}) == []
    assert AppRuntime(tmp_path / "r").last_notice() is None  # not told: the next run tries again
    assert "The on-call webhook (connection 'streamops_notify') refused or failed: AirflowException: 404:Not Found" in caplog.text
    # Gone: the error names the URL's path, where a webhook's token is; the suite's line does not, and
    # Airflow's masker hides both wherever it filters (every task log: the HTTP hook's own warning).
    webhook.close()
    assert send({"text": "x"}) is False
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name == "streamops.notifications")
    assert "refused or failed: ConnectionError:" in ours and "<the URL of connection streamops_notify>" in ours
    assert "/hooks/on-call" not in ours
    assert redact(f"Max retries exceeded with url: /hooks/on-call, {webhook.url}") == "Max retries exceeded with url: ***, ***"


def test_without_a_webhook_connection_nothing_is_sent_and_the_log_says_so(monkeypatch, caplog):
    monkeypatch.delenv("AIRFLOW_CONN_STREAMOPS_NOTIFY", raising=False)
    caplog.set_level(logging.INFO, logger="streamops.notifications")
    assert send({"text": "x"}) is False
    assert "No on-call webhook (Airflow connection 'streamops_notify'): not sent: x" in caplog.text


def test_a_token_in_the_webhooks_query_is_masked_too():
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact
    from airflow.sdk.log import mask_secret

    from streamops.notifications import _url_secrets

    url = "https://chat.example/v1/spaces/AAA/messages?key=k3y-0f-the-space&token=t0ken-0f-the-hook"
    for secret in _url_secrets(url):
        mask_secret(secret)
    said = redact("Max retries exceeded with url: /v1/spaces/AAA/messages?key=k3y-0f-the-space&token=t0ken-0f-the-hook")
    assert said.startswith("Max retries exceeded with url: ***") and "k3y" not in said and "t0ken" not in said
    assert "t0ken-0f-the-hook" not in redact("POST ...&token=t0ken-0f-the-hook failed")
