"""snapshot_checkpoints: each app's checkpoint snapshots on the catalog's schedule, and their retention.

Wiring only; the step is in plugins/streamops/dag_tasks/snapshots.py, the logic in
plugins/streamops/snapshots.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import apps_param, one_run_at_a_time, runbook
from streamops.dag_tasks import snapshots as steps

APP_NAMES = load_catalog(check_programs=False).app_names()


@dag(
    dag_id="snapshot_checkpoints",
    description="Checkpoint snapshots on each app's catalog policy (every N hours or batches), the rest pruned.",
    doc_md=runbook(__file__),
    schedule=steps.snapshot_schedule(),
    tags=["spark", "apps", "checkpoints", "snapshots"],
    **one_run_at_a_time(),
    params={
        "apps": apps_param(APP_NAMES, required=False, description="Leave empty for every app with a snapshot policy."),
        "dry_run": Param(False, type="boolean", title="Dry run",
                         description="Show whether a snapshot is due and which snapshots would be removed; change nothing."),
    },
)
def snapshot_checkpoints():
    @task(multiple_outputs=False)
    def apply_policies() -> dict:
        context = get_current_context()
        return steps.apply_policies(context, context["params"]["apps"], context["params"]["dry_run"] is True)

    apply_policies()


snapshot_checkpoints()
