"""recover_restart_app: restart a crashed streaming app from its checkpoint.

Wiring only; the logic is in plugins/streamops/recovery/restart.py.
"""

from __future__ import annotations

from airflow.sdk import dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks import runbook
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.recovery_params import app_param, dry_run_param, verify_deadline_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param


@dag(
    dag_id="recover_restart_app",
    description="On-call: restart a crashed app from its checkpoint, ending what its dead driver left.",
    doc_md=runbook(__file__),
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["recovery", "on-call", "spark", "apps"],
    default_args={"owner": "data-platform", "show_return_value_in_logs": False, "retries": 0},
    params={"app": app_param(load_catalog(check_programs=False).app_names()), "dry_run": dry_run_param(), APPROVE_PARAM: approval_param(), "verify_deadline_s": verify_deadline_param()},
)
def recover_restart_app():
    @task
    def plan() -> dict:
        return steps.restart_plan(get_current_context(), kafka_connection())

    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(trigger_rule="none_failed")
    def apply(planned: dict) -> dict:
        return steps.restart_apply(get_current_context(), planned)

    @task
    def verify(planned: dict, _applied: dict) -> dict:
        return steps.await_progress(get_current_context(), planned["app"], kafka_connection(), planned["lag"])

    planned = plan()
    applied = apply(planned)
    planned >> PlanApproval(what="restart plan") >> applied
    verify(planned, applied)


recover_restart_app()
