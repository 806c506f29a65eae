"""Messages to on-call through a webhook: a plan waiting for approval, an app that needs someone,
the result of a reconcile or a reprocess.

The webhook is an Airflow HTTP connection, `streamops_notify` (host: the webhook's URL; Slack's
incoming webhooks, chat tools and paging tools all take a JSON POST), sent by the HTTP provider's
`HttpNotifier` (Airflow's notifier mechanism: approval tasks call it when they park, DAGs on
their success and failure). Without the connection nothing is sent and the task log says so once.
Every message is one JSON object: `text` (what a chat shows), and the fields a paging tool routes
on: kind, app, state, evidence, link, dag_id, run_id, requested_by.

A notification never fails the task it is sent from: an approval must still wait, a supervisor
run still restart apps, when the chat tool is down; the failure is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.providers.http.notifications.http import HttpNotifier
from airflow.sdk import BaseNotifier
from airflow.sdk.log import mask_secret

from streamops.access import four_eyes_reason
from streamops.app_runtime import AppRuntime
from streamops.runtime_records import OnCallNotice
from streamops.supervision import NEEDS_SOMEONE
from streamops.timestamps import now_iso

log = logging.getLogger(__name__)

NOTIFY_CONN_ID = "streamops_notify"
APPS_PAGE_PATH = "/streamops/apps"
EVIDENCE_CHARS = 1500
WEBHOOK_TIMEOUT_S = 10


def ui_base_url() -> str:
    """The Airflow UI's address as the stack serves it ([api] base_url)."""
    from airflow.configuration import conf

    return conf.get("api", "base_url", fallback="http://127.0.0.1:8080").rstrip("/")


def run_link(dag_id: str, run_id: str, base: str) -> str:
    from urllib.parse import quote

    return f"{base}/dags/{dag_id}/runs/{quote(run_id, safe='')}"


def _cut(text: Any) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + " ... (cut; the rest is in the run's log)"


def approval_request(dag_id: str, run_id: str, requester: str, app: str | None, summary: str,
                     second_person: str | None, base: str) -> dict[str, Any]:
    """A plan waits for an approval."""
    link = f"{run_link(dag_id, run_id, base)}/tasks/approve/required_actions"
    who = f"an approver other than {requester} ({second_person})" if second_person else "an approver"
    return {"kind": "approval requested", "dag_id": dag_id, "run_id": run_id, "requested_by": requester, "app": app,
            "state": "waiting for approval", "evidence": _cut(summary), "link": link,
            "text": f"{dag_id}{f' for {app}' if app else ''}, triggered by {requester}, waits for {who}: "
                    f"{_cut(summary)}. Approve or reject: {link}"}


def app_attention(health: Mapping[str, Any], run_id: str, base: str) -> dict[str, Any]:
    """An app needs someone (supervision.NEEDS_SOMEONE): its state, the evidence, what the
    supervisor did."""
    app, state = health["app"], health["state"]
    action = f" Supervisor: {health['action']}." if health.get("action") else ""
    link = f"{base}{APPS_PAGE_PATH}"
    return {"kind": "app needs attention", "dag_id": "app_status", "run_id": run_id, "app": app, "state": state,
            "evidence": _cut(health["evidence"]), "action": health.get("action"), "link": link,
            "text": f"{app} is {state.upper()}: {_cut(health['evidence'])}{action} Apps page: {link}"}


def run_result(dag_id: str, run_id: str, state: str, requester: str, app: str | None, summary: str,
               base: str) -> dict[str, Any]:
    """A reconcile's or a reprocess's outcome."""
    link = run_link(dag_id, run_id, base)
    return {"kind": "run finished", "dag_id": dag_id, "run_id": run_id, "requested_by": requester, "app": app,
            "state": state, "evidence": _cut(summary), "link": link,
            "text": f"{dag_id}{f' for {app}' if app else ''} {state} (run {run_id}, by {requester}): {_cut(summary)}. "
                    f"Run: {link}"}


def send(message: dict[str, Any], context: Any = None) -> bool:
    """POST `message` to the on-call webhook; False (logged) when there is none or it failed."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        connection = BaseHook.get_connection(NOTIFY_CONN_ID)
    except AirflowNotFoundException:
        log.info("No on-call webhook (Airflow connection %r): not sent: %s", NOTIFY_CONN_ID, message["text"])
        return False
    except Exception as exc:  # noqa: BLE001 (a secrets backend down must not fail the task either)
        log.warning("The on-call webhook's connection %r could not be read (%s); not sent: %s", NOTIFY_CONN_ID,
                    type(exc).__name__, message["text"])
        return False
    # A webhook's URL is its secret (Slack's, a pager's: the token is its path): Airflow's masker
    # keeps it out of every log line, the HTTP hook's own warnings included.
    for secret in _url_secrets(connection.host or ""):
        mask_secret(secret)
    try:
        # A bounded wait: a webhook that never answers must not hold an approval or the supervisor.
        HttpNotifier(http_conn_id=NOTIFY_CONN_ID, json=message,
                     extra_options={"timeout": WEBHOOK_TIMEOUT_S}).notify(context or {})  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 (the chat tool down must not fail an approval or a supervisor run)
        said = _without_url(str(exc), connection.host or "")  # in this line, for handlers without the masker
        log.warning("The on-call webhook (connection %r) refused or failed: %s: %s; the message was: %s",
                    NOTIFY_CONN_ID, type(exc).__name__, said, message["text"])
        return False
    log.info("Sent to on-call (%s): %s", NOTIFY_CONN_ID, message["text"])
    return True


def _url_secrets(url: str) -> list[str]:
    """The webhook's URL, its path and its query and each query value (where Slack's, chat tools'
    and pagers' tokens are), longest first."""
    from urllib.parse import parse_qsl, urlparse

    parsed = urlparse(url)
    values = {value for _, value in parse_qsl(parsed.query)}
    return sorted({url, parsed.path, parsed.query, *values} - {"", "/"}, key=len, reverse=True)


def _without_url(text: str, url: str) -> str:
    for secret in _url_secrets(url):
        text = text.replace(secret, f"<the URL of connection {NOTIFY_CONN_ID}>")
    return text


def notify_attention(healths: list[Mapping[str, Any]], run_id: str, checkpoints: Mapping[str, str]) -> list[str]:
    """A message per app that needs someone now and was not told about in that state already (each
    app's last notice in its runtime folder: a crash loop pages once, not every two minutes); an
    app back to a fine state forgets its notice. `checkpoints`: app -> checkpoint location. The
    apps told about."""
    told, base = [], ui_base_url()
    for health in healths:
        if health["app"] not in checkpoints:  # no longer in the catalog
            continue
        runtime = AppRuntime(checkpoints[health["app"]])
        last = runtime.last_notice()
        if health["state"] not in NEEDS_SOMEONE:
            if last is not None:
                runtime.record_notice(None)
            continue
        if last is not None and last.state == health["state"]:
            continue
        if send(app_attention(health, run_id, base)):
            runtime.record_notice(OnCallNotice(state=health["state"], at=now_iso(), run_id=run_id))
            told.append(health["app"])
    return told


class OnCallNotifier(BaseNotifier):
    """Airflow's notifier for the suite's DAGs: `approval` when an approval task parks (its
    `notifiers`), `result` as a DAG's success and failure callback (reconcile, reprocess): every
    failure, and the successes of runs someone triggered (a timed reconcile every 30 minutes that
    went well is in the audit log, not in on-call's chat)."""

    def __init__(self, kind: str, *, failed: bool = False):
        super().__init__()
        if kind not in ("approval", "result"):
            raise ValueError(f"kind must be approval or result, not {kind!r}")
        self.kind = kind
        self.failed = failed  # the result notifier of on_failure_callback (Airflow's reasons vary)

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Nothing of this notifier is templated; and `dag.test`'s callbacks hand a serialized DAG,
        which has no template environment."""

    def notify(self, context: Any) -> None:
        if self.kind == "result" and not self.failed and getattr(context.get("dag_run"), "run_type", None) == "scheduled":
            return  # a timed run that went well is in the audit log; on-call hears of failures and asked-for runs
        try:
            message = self.message(context)
        except Exception as exc:  # noqa: BLE001 (a message that cannot be made must not fail the task either)
            log.warning("No on-call message made (%s: %s)", type(exc).__name__, exc)
            return
        send(message, context)

    def message(self, context: Any) -> dict[str, Any]:
        # A DAG callback without a last task has only the DAG and the run id in its context.
        dag_run, params = context.get("dag_run"), context.get("params") or {}
        dag_id = dag_run.dag_id if dag_run is not None else context["dag"].dag_id
        run_id = dag_run.run_id if dag_run is not None else context["run_id"]
        requester = getattr(dag_run, "triggering_user_name", None) or "unknown"
        app = params.get("app") if isinstance(params.get("app"), str) else None
        planned = _xcom(context, "plan")
        summary = planned.get("summary") if isinstance(planned, Mapping) else None
        if self.kind == "approval":
            return approval_request(dag_id, run_id, requester, app, str(summary or "see the plan"),
                                    four_eyes_reason(dag_id, params, planned), ui_base_url())
        reason = str(context.get("reason") or "")
        state = "failed" if self.failed else "succeeded"
        last = context.get("ti")
        outcome = _xcom(context, last.task_id) if last is not None else None
        said = outcome.get("summary") if isinstance(outcome, Mapping) else None
        evidence = "; ".join(str(part) for part in (summary and f"plan: {summary}", said, reason and f"Airflow: {reason}",
                                                    last is not None and f"last step {last.task_id}") if part)
        return run_result(dag_id, run_id, state, requester, app, evidence or state, ui_base_url())


def _xcom(context: Any, task_id: str) -> Any:
    """A task's XCom from a callback's context, None when it cannot be read there."""
    if "ti" not in context:
        return None
    try:
        return context["ti"].xcom_pull(task_ids=task_id)
    except Exception:  # noqa: BLE001 (a DAG callback's context may not reach XComs)
        return None
