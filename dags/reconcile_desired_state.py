"""reconcile_desired_state: bring what runs in line with the catalog, through a plan.

Wiring only; the planning is in plugins/streamops/desired_state.py, the tasks in
plugins/streamops/dag_tasks/desired_state.py.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import apps as steps
from streamops.dag_tasks import apps_param, desired_state, one_run_at_a_time, runbook
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param
from streamops.dag_tasks.recovery_params import dry_run_param
from streamops.notifications import OnCallNotifier

APP_NAMES = load_catalog(check_programs=False).app_names()


@dag(
    dag_id="reconcile_desired_state",
    description="Drift: plan the rolls that bring every app in line with the catalog; roll per the app's reconcile policy.",
    doc_md=runbook(__file__),
    # On-call hears of the outcome (streamops.notifications).
    on_success_callback=OnCallNotifier("result"),
    on_failure_callback=OnCallNotifier("result", failed=True),
    schedule=timedelta(minutes=30),
    tags=["spark", "apps", "drift", "reconcile"],
    **one_run_at_a_time(),
    params={
        "apps": apps_param(APP_NAMES, required=False, description="Leave empty for all apps."),
        "dry_run": dry_run_param(),
        APPROVE_PARAM: approval_param(),
        "gate_deadline_s": Param(180, type="integer", minimum=steps.GATE_DEADLINE_S[0], maximum=steps.GATE_DEADLINE_S[1],
                                 title="Health gate deadline (s)",
                                 description="How long each rolled app has to prove itself before it is rolled back."),
        "max_dead_letter_rate": Param(0.05, type="number", minimum=0, maximum=1, title="Max dead-letter rate",
                                      description="Share of a rolled app's input that may go to dead letters during its "
                                                  "health gate (0.05 = 5%); above it, the roll is rolled back."),
    },
)
def reconcile_desired_state():
    @task(task_id="plan")
    def plan() -> dict:
        return desired_state.plan(get_current_context())

    @task(task_id="roll_auto")
    def roll_auto(planned: dict) -> list[dict]:
        return desired_state.apply(get_current_context(), planned, "auto")

    # none_failed: after an approval that was not needed (skipped); a Reject skips it directly.
    @task(task_id="roll_approved", trigger_rule="none_failed")
    def roll_approved(planned: dict) -> list[dict]:
        return desired_state.apply(get_current_context(), planned, "approve")

    @task(task_id="verify", trigger_rule="none_failed")
    def verify(planned: dict, auto: list | None, approved: list | None) -> dict:
        return desired_state.verify(get_current_context(), planned, [*(auto or []), *(approved or [])])

    planned = plan()
    auto = roll_auto(planned)
    approved = roll_approved(planned)
    # none_failed: the approval still comes when no app rolled without one (roll_auto skipped).
    auto >> PlanApproval(what="reconcile plan", trigger_rule="none_failed") >> approved
    verify(planned, auto, approved)


reconcile_desired_state()
