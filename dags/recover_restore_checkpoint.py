"""recover_restore_checkpoint: roll an app back to a checkpoint snapshot.

Wiring only; the logic is in plugins/streamops/recovery/restore.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks import runbook
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.recovery_params import NAME_PATTERN, app_param, dry_run_param, verify_deadline_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param


@dag(
    dag_id="recover_restore_checkpoint",
    description="On-call: roll an app back to one of its checkpoint snapshots.",
    doc_md=runbook(__file__),
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["recovery", "on-call", "spark", "apps"],
    default_args={"owner": "data-platform", "show_return_value_in_logs": False, "retries": 0},
    params={
        "app": app_param(load_catalog(check_programs=False).app_names()),
        "dry_run": dry_run_param(), APPROVE_PARAM: approval_param(),
        "snapshot": Param("latest", type="string", pattern=NAME_PATTERN, title="Snapshot",
                          description="latest, or a snapshot name from the plan's history."),
        "stop_if_running": Param(False, type="boolean", title="Stop if running",
                                 description="Stop a running app gracefully before restoring (else it is refused)."),
        "verify_deadline_s": verify_deadline_param(),
    },
)
def recover_restore_checkpoint():
    @task
    def plan() -> dict:
        return steps.restore_plan(get_current_context())

    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(trigger_rule="none_failed")
    def apply(planned: dict) -> dict:
        return steps.restore_apply(get_current_context(), planned)

    @task
    def verify(planned: dict, _applied: dict) -> dict:
        return steps.restore_verify(get_current_context(), planned, kafka_connection())

    planned = plan()
    applied = apply(planned)
    planned >> PlanApproval(what="checkpoint restore plan") >> applied
    verify(planned, applied)


recover_restore_checkpoint()
