"""recover_restart_app: restart a crashed streaming app from its checkpoint.

Wiring only: the trigger form below, the steps in streamops.dag_tasks.recovery (RESTART), the
logic in plugins/streamops/recovery/restart.py.
"""

from __future__ import annotations

from airflow.sdk import dag

from streamops.catalog import load_catalog
from streamops.dag_tasks import one_run_at_a_time, runbook
from streamops.dag_tasks.procedures import plan_apply_verify
from streamops.dag_tasks.recovery import RESTART
from streamops.dag_tasks.recovery_params import recovery_form


@dag(
    dag_id="recover_restart_app",
    description="On-call: restart a crashed app from its checkpoint, ending what its dead driver left.",
    doc_md=runbook(__file__),
    tags=["recovery", "on-call", "spark", "apps"],
    params=recovery_form(load_catalog(check_programs=False).app_names()),
    schedule=None,
    **one_run_at_a_time(),
)
def recover_restart_app():
    plan_apply_verify(RESTART)


recover_restart_app()
