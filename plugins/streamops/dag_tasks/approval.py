"""Approve the plan in one run: a mutating DAG plans, waits for an operator to approve that
exact plan in the Airflow UI (Airflow 3's human-in-the-loop approval from the standard provider:
the run shows "Required actions"), then applies the plan it showed. The apply reads the plan's
XCom, so what runs is what was approved, not a second plan against a broker that moved on.

    approve_in_ui  True (default): plan, wait for Approve / Reject, then apply (Reject: nothing changes)
                   False: apply at once (the API, schedules, `streamops up`)
    dry_run        True: plan only (the approval is skipped and so is the apply)

A decision is audited (who, when, approved or rejected). With no answer within
APPROVAL_TIMEOUT the plan counts as rejected: a forgotten run changes nothing. The apply checks
the approval itself (`check_approved`): an approval task marked success or skipped by hand in the
UI releases nothing.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator

from streamops.access import four_eyes_reason
from streamops.catalog import load_catalog
from streamops.dag_tasks import is_dry_run, trail
from streamops.notifications import OnCallNotifier
from streamops.refusals import OneLineRefused

log = logging.getLogger(__name__)

APPROVE_PARAM = "approve_in_ui"
# The DAGs run one at a time: a forgotten approval must not hold the next run (an on-call
# recovery at 3 a.m.) for long. No answer counts as Reject.
APPROVAL_TIMEOUT = timedelta(hours=1)
BODY_MAX_CHARS = 20_000


def approval_param():
    from airflow.sdk import Param

    return Param(True, type="boolean", title="Wait for approval",
                 description="Plan, then wait for an operator to approve exactly that plan in the UI (the run's "
                             "'Required actions') before anything changes; Reject changes nothing. Off: apply the "
                             "plan at once (for the API and scheduled runs).")


def approval_skip_reason(params: dict, plan: Any = None) -> str | None:
    """Why this run needs no approval (None: it waits for one). `plan`: the plan task's XCom; a
    plan that says nothing in it waits for an approval (`approval_not_needed`, made by the plan
    task from the catalog's policies, never from a trigger's params) skips it."""
    if "dry_run" in params and is_dry_run(params):  # roll_restart_apps has no dry run
        return "Dry run: nothing will be applied, so there is nothing to approve. The plan is in the 'plan' task's log."
    if params.get(APPROVE_PARAM, True) is False:
        return "Approval turned off for this run ('Wait for approval' off): the plan is applied as planned."
    if isinstance(plan, dict) and isinstance(plan.get("approval_not_needed"), str):
        return plan["approval_not_needed"]
    return None


def markdown_table(text: str) -> str | None:
    """A tabulate "simple" table (header, dashes, rows) as a Markdown table: the approval page
    renders Markdown and folds a code block's lines into one. None if `text` is not one."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or not re.fullmatch(r"[- ]+", lines[1]):
        return None
    spans: list[tuple[int, int | None]] = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[1])]
    # The last column runs to the end of its line (a long value may pass the dashes).
    spans[-1] = (spans[-1][0], None)

    def cells(line: str) -> list[str]:
        return [code_span(cell.replace("|", "\\|")) if (cell := line[start:end].strip()) else " " for start, end in spans]

    rows = [cells(lines[0]), ["---"] * len(spans), *(cells(line) for line in lines[2:])]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


FIELD_MAX_CHARS = 600


def code_span(text: str) -> str:
    """`text` as a Markdown code span that nothing in it can close (record keys and values from
    Kafka reach a plan: a backtick must not turn the rest into Markdown)."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"


def markdown_fields(content: Any) -> str:
    """A plan without a table: one bullet per field, its value as compact JSON."""
    if not isinstance(content, dict):
        content = {"plan": content}
    items = []
    for key, value in content.items():
        text = json.dumps(value, default=str)
        cut = f" (cut at {FIELD_MAX_CHARS} characters; the whole field is in the 'plan' task's XCom)" \
            if len(text) > FIELD_MAX_CHARS else ""
        items.append(f"- {code_span(str(key))}: {code_span(text[:FIELD_MAX_CHARS])}{cut}")
    return "\n".join(items) or "- (empty plan)"


def _plain(text: Any) -> str:
    """A one-line text with Markdown's own characters escaped."""
    return re.sub(r"([\\`*_{}\[\]<>()#+!|~])", r"\\\1", " ".join(str(text).split()))


def plan_body(plan: Any, request: dict | None = None) -> str:
    """The approval's text (Markdown): the plan's summary and its table (a plan XCom's "table"),
    or its fields as the apply task will read them; then the form's values it came from."""
    summary = plan.get("summary") if isinstance(plan, dict) else None
    table = plan.get("table") if isinstance(plan, dict) else None
    detail = (markdown_table(table) if isinstance(table, str) else None) or markdown_fields(
        {k: v for k, v in plan.items() if k not in ("summary", "table", "downstream")} if isinstance(plan, dict) else plan)
    if len(detail) > BODY_MAX_CHARS:
        detail = detail[:BODY_MAX_CHARS] + "\n\n... (cut; the whole plan is in the 'plan' task's log and XCom)"
    head = f"**{_plain(summary)}**\n\n" if summary else ""
    # What the teams reading the app's outputs will see (streamops.downstream), before the details.
    downstream = plan.get("downstream") if isinstance(plan, dict) else None
    lines = downstream.get("lines") if isinstance(downstream, dict) else None
    if isinstance(lines, list) and lines:
        head += ("**What the readers of the outputs see** (consumer groups outside the suite):\n\n"
                 + "".join(f"- {_plain(line)}\n" for line in lines[:50]) + "\n")
    asked = {k: v for k, v in (request or {}).items() if k not in ("dry_run", APPROVE_PARAM)}
    asked_text = f"\n\nRequested with:\n\n{markdown_fields(asked)}" if asked else ""
    return (f"{head}Approve applies exactly this plan (as planned by this run; nothing is planned again). "
            f"Reject changes nothing.\n\n{detail}{asked_text}")


class PlanApproval(ApprovalOperator):
    """The approval task of a DAG: skipped on a dry run or with approval off (the apply still
    runs after it: give the apply trigger_rule='none_failed'); else it shows the plan task's XCom
    and waits. Reject (or no answer in time) skips the apply."""

    def __init__(self, *, plan_task_id: str = "plan", what: str = "plan", **kwargs) -> None:
        kwargs.setdefault("task_id", "approve")
        # On-call hears of the request (streamops.notifications) as the task parks.
        kwargs.setdefault("notifiers", [OnCallNotifier("approval")])
        super().__init__(subject=f"Apply this {what}?", body="(the plan is shown when the run reaches this step)",
                         defaults="Reject", response_timeout=APPROVAL_TIMEOUT, retries=0, **kwargs)
        self.plan_task_id = plan_task_id
        self.what = what

    def execute(self, context):
        from airflow.sdk.exceptions import AirflowSkipException

        planned = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        reason = approval_skip_reason(context["params"], planned)
        if reason:
            raise AirflowSkipException(reason)
        self.body = plan_body(planned, dict(context["params"]))
        # The plan shown, by its digest: the apply refuses a plan made again after this (a cleared
        # plan task), which nobody approved.
        context["ti"].xcom_push(key=PLAN_DIGEST_KEY, value={"task": self.plan_task_id, "digest": plan_digest(planned)})
        second_person = four_eyes_reason(context["dag_run"].dag_id, context["params"], planned)
        requester = trail(context).user
        if second_person:
            self.body = (f"**Needs an approver other than {_plain(requester)}**, who triggered this run "
                         f"({_plain(second_person)}); the apply refuses an approval by its requester.\n\n{self.body}")
        log.info("Waiting for %s to approve the %s (the run's 'Required actions' in the UI).",
                 f"an approver other than {requester}" if second_person else "an approver", self.what)
        return super().execute(context)

    def execute_complete(self, context, event):
        # Audited before the provider's handling: on Reject it skips the apply by raising.
        chosen = (event.get("chosen_options") or ["?"])[0] if "error" not in event else None
        who = responder_name(event) if event.get("responded_by_user") else "nobody"
        requester = trail(context).user
        if chosen == self.APPROVE and who == requester and four_eyes_reason(
                context["dag_run"].dag_id, context["params"], context["ti"].xcom_pull(task_ids=self.plan_task_id)):
            outcome = "approved by its own requester (the apply refuses it: this plan needs a second person)"
        elif chosen == self.APPROVE:
            outcome = "approved"
        elif event.get("timedout") or event.get("error_type") == "timeout":
            outcome = f"rejected: no answer within {APPROVAL_TIMEOUT} (nothing changed)"
        else:
            outcome = "rejected (nothing changed)"
        trail(context).write("approve", outcome, summary=f"{self.what} {outcome} by {who}", approved_by=who,
                             requested_by=requester)
        log.info("The %s was %s by %s.", self.what, outcome, who)
        return super().execute_complete(context, event)


def release_apply(context) -> None:
    """The gate before an apply changes anything, the same in every DAG that plans: a dry run is
    skipped here (the plan is in the plan task's log), and a run that waits for an approval goes
    on only with an Approve answer (check_approved)."""
    from airflow.sdk.exceptions import AirflowSkipException

    if is_dry_run(context["params"]):
        raise AirflowSkipException(DRY_RUN_SKIP)
    check_approved(context)


DRY_RUN_SKIP = ("Dry run: nothing was changed. The plan is in the 'plan' task's log; trigger again with 'Dry run' off "
                "to apply it.")


def check_approved(context) -> None:
    """The apply's own check: this run needs no approval (dry run, approval off), or its approve
    task recorded an Approve. An approve task marked success or skipped by hand has no answer.
    A plan that can lose or repeat data (four eyes, streamops.access) needs an Approve by someone
    other than the run's requester; with approval off it is applied only where the catalog lets
    the environment do so unattended (`approvals.unattended_in`)."""
    from airflow.sdk.exceptions import AirflowFailException

    params = context["params"]
    # The plan says whether it needs no approval, and whether it can delete records (provisioning).
    planned = context["ti"].xcom_pull(task_ids="plan") if "ti" in context else None
    second_person = four_eyes_reason(context["dag_run"].dag_id, params, planned)
    requester = trail(context).user
    if approval_skip_reason(params) or approval_skip_reason(params, planned):
        catalog = load_catalog(check_programs=False) if second_person and not is_dry_run(params) else None
        if catalog is not None and not catalog.unattended_allowed():
            raise SecondPersonRequired(
                f"Apply refused: this plan needs a second person's approval ({second_person}), and it ran with 'Wait "
                f"for approval' off, which the catalog allows only in the environments of its approvals.unattended_in "
                f"(this run's: {catalog.environment}). Nothing was changed. Trigger it "
                "again with 'Wait for approval' on, and have an approver approve the plan.")
        return
    answer = context["ti"].xcom_pull(task_ids="approve")
    chosen = answer.get("chosen_options") if isinstance(answer, dict) else None
    if chosen != [PlanApproval.APPROVE]:
        raise AirflowFailException(
            "Not applied: this run waits for an approval of its plan and the 'approve' task has no Approve answer "
            f"(found {chosen!r}; a task marked success or skipped by hand is not an approval). Nothing was changed. "
            "Trigger a new run and approve its plan, or turn 'Wait for approval' off.")
    shown = context["ti"].xcom_pull(task_ids="approve", key=PLAN_DIGEST_KEY)
    shown_task = shown.get("task") if isinstance(shown, dict) else None
    if not isinstance(shown_task, str) or shown.get("digest") != plan_digest(
            planned if shown_task == "plan" else context["ti"].xcom_pull(task_ids=shown_task)):
        raise SecondPersonRequired(
            "Apply refused: the plan is not the one that was approved (the plan task ran again after the approval "
            "request, or the approval has no record of its plan). Nothing was changed. Trigger a new run and approve "
            "its plan.")
    approver = responder_name(answer)
    if second_person and (approver == requester or UNKNOWN in (approver, requester)):
        raise SecondPersonRequired(
            f"Apply refused: {approver} approved a plan "
            + ("they triggered themselves" if approver == requester else f"whose requester or approver is unknown "
               f"(requested by {requester})")
            + f", and this one needs a second person ({second_person}). Nothing was changed. Trigger it again and "
            f"have an approver other than {requester} approve it.")


class SecondPersonRequired(OneLineRefused):
    """A plan that can lose or repeat data, approved by nobody or by its own requester."""


UNKNOWN = "unknown"  # a requester or responder without a name: never a second person
PLAN_DIGEST_KEY = "plan_digest"


def plan_digest(plan: Any) -> str:
    """The plan task's XCom as a digest (its canonical JSON)."""
    import hashlib

    return hashlib.sha256(json.dumps(plan, sort_keys=True, default=str).encode()).hexdigest()


def responder_name(answer: Any) -> str:
    """Who answered an approval (its XCom or its trigger event): the auth manager's user name
    (UNKNOWN without one: an id alone never counts as a second person)."""
    by = answer.get("responded_by_user") if isinstance(answer, dict) else None
    name = by.get("name") if isinstance(by, dict) else by
    return str(name) if isinstance(name, str) and name.strip() else UNKNOWN
