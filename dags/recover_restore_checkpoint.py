"""recover_restore_checkpoint: roll an app back to a checkpoint snapshot.

Wiring only; the logic is in plugins/streamops/recovery/restore.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.recovery_params import NAME_PATTERN, app_param, dry_run_param, verify_deadline_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param

DOC = """
### Restore a checkpoint snapshot (rollback, on-call)

**Symptoms**: a reset, rebuild or upgrade went wrong and the app must go back to where it was;
the checkpoint was damaged after a known-good snapshot.

Snapshots are taken before every restart, reset, rebuild, rolling restart and cutover, and kept:
`<checkpoint root>/_backups/<app>/<UTC time>-<label>`.

**Params**: *App*; *Snapshot*: `latest`, or a name from the history (run a dry run first: the plan
lists them); *Stop if running*: let this DAG stop a running app gracefully first (else a running
app is refused).

1. **plan**: the snapshot history (label, version that wrote it, batches), and for the chosen one
   the offsets per partition now and after the restore (records processed again).
2. **approve** (the run's *Required actions*: the plan, Approve / Reject; skipped on a dry run or with *Wait for approval* off), then **apply**: stops the app if allowed, keeps the current checkpoint as a snapshot
   of its own (`replaced`), puts the chosen one in its place, and starts the version that wrote it.
3. **verify**: the app makes progress and its checkpoint continues the snapshot's batches.

Audited (`streamops audit`).
"""


@dag(
    dag_id="recover_restore_checkpoint",
    description="On-call: roll an app back to one of its checkpoint snapshots.",
    doc_md=DOC,
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
