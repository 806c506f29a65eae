"""recover_restart_app: restart a crashed streaming app from its checkpoint.

Wiring only; the logic is in plugins/streamops/recovery/restart.py.
"""

from __future__ import annotations

from airflow.sdk import dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.recovery_params import app_param, dry_run_param, verify_deadline_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param

DOC = """
### Restart a crashed app (on-call)

**Symptom**: `app_status` shows the app **CRASHED** or **FAILED** (or it was stopped), its lag grows,
its output topics go quiet. The supervisor (`app_status`) restarts crashed apps itself when their
policy is `on-failure`; this DAG is for the rest: policy `never`, a **CRASH-LOOP** once the record
that fails it is skipped (this start resets the guard), or a restart by hand.

**Params**: *App*; *Dry run* (only the plan) and *Wait for approval* (on: the plan waits for your Approve).

1. **plan**: the app's state and how its last driver ended (pid, host, version, reason), its
   checkpoint batches and lag, and any process its dead driver **left behind** (spark-submit, the
   JVM that runs the queries). A running app is refused: if it is stuck, stop it with `stop_apps`.
   For a **FAILED** app: the micro-batch its query failed on, the offsets per partition that
   batch covers, and the error. A restart runs exactly that batch again, so when the driver
   before failed on the **same batch**, the plan says *"failed on batch N again ...: restarting
   will fail the same way"*, lists the batch's largest records, and points to
   `recover_skip_records` to skip the one record that fails it.
2. **approve** (the run's *Required actions*: the plan, Approve / Reject; skipped on a dry run or with *Wait for approval* off), then **apply**: ends the leftover processes (SIGTERM, then SIGKILL), **backs up** the
   checkpoint (`_backups/<app>/<time>-before-restart`), starts the version and Spark conf it last
   ran with, from its checkpoint: it resumes exactly after its last committed micro-batch, so
   nothing is lost (a batch cut short by the crash is written again: duplicates, not gaps).
3. **verify**: waits until every query completes micro-batches again and the lag shrinks.

Every step is written to the recovery audit log (`streamops audit`).
"""


@dag(
    dag_id="recover_restart_app",
    description="On-call: restart a crashed app from its checkpoint, ending what its dead driver left.",
    doc_md=DOC,
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
