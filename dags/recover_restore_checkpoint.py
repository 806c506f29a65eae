"""recover_restore_checkpoint: roll an app back to a checkpoint snapshot.

Wiring only: the trigger form below, the steps in streamops.dag_tasks.recovery (RESTORE), the
logic in plugins/streamops/recovery/restore.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from streamops.catalog import load_catalog
from streamops.dag_tasks import one_run_at_a_time, runbook
from streamops.dag_tasks.procedures import plan_apply_verify
from streamops.dag_tasks.recovery import RESTORE
from streamops.dag_tasks.recovery_params import NAME_PATTERN, recovery_form


@dag(
    dag_id="recover_restore_checkpoint",
    description="On-call: roll an app back to one of its checkpoint snapshots.",
    doc_md=runbook(__file__),
    tags=["recovery", "on-call", "spark", "apps"],
    params=recovery_form(load_catalog(check_programs=False).app_names(), {
        "snapshot": Param("latest", type="string", pattern=NAME_PATTERN, title="Snapshot",
                          description="latest, or a snapshot name from the plan's history."),
        "stop_if_running": Param(False, type="boolean", title="Stop if running",
                                 description="Stop a running app gracefully before restoring (else it is refused)."),
    }),
    schedule=None,
    **one_run_at_a_time(),
)
def recover_restore_checkpoint():
    plan_apply_verify(RESTORE)


recover_restore_checkpoint()
