"""reconcile_stateful_apps: nightly, recompute each stateful app's closed windows from the earliest
offsets and compare them with what the live app emitted.

Wiring only; the logic is in plugins/streamops/reconciliation.py and dag_tasks/reconcile_apps.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task
from airflow.timetables.trigger import CronTriggerTimetable

from streamops.catalog import load_catalog
from streamops.dag_tasks import audited_step, one_run_at_a_time, runbook
from streamops.dag_tasks import reconcile_apps as steps
from streamops.dag_tasks.connections import admin_client, kafka_connection, spark_target
from streamops.launch_overrides import VERSION_MAX_LENGTH, VERSION_PATTERN

STATEFUL = steps.stateful_app_names(load_catalog(check_programs=False))


@dag(
    dag_id="reconcile_stateful_apps",
    description="Nightly: recompute stateful apps' closed windows from earliest and compare with the live output.",
    doc_md=runbook(__file__),
    schedule=CronTriggerTimetable("0 2 * * *", timezone="UTC"),
    tags=["spark", "apps", "reprocessing", "quality"],
    **one_run_at_a_time(),
    params={
        "apps": Param(STATEFUL, type="array", items={"type": "string", "enum": STATEFUL} if STATEFUL else {"type": "string"},
                      uniqueItems=True, examples=STATEFUL, title="Apps", description="Stateful apps to reconcile."),
        "max_mismatch_ratio": Param(0.0, type="number", minimum=0, maximum=1, title="Max mismatch ratio",
                                    description="Share of compared windows that may differ before the run fails."),
        "program_version": Param(None, type=["null", "string"], pattern=VERSION_PATTERN, maxLength=VERSION_MAX_LENGTH,
                                 title="Code version",
                                 description="The version of the apps' code that recomputes (an artifact app runs exactly "
                                             "that version's artifact). Empty: each app's version running live."),
    },
)
def reconcile_stateful_apps():
    @task
    def chosen() -> list[str]:
        names = get_current_context()["params"]["apps"]
        unknown = sorted(set(names) - set(STATEFUL))
        if unknown:
            raise ValueError(f"not stateful apps of the catalog: {', '.join(unknown)} (choose from {', '.join(STATEFUL)})")
        return names

    @task(multiple_outputs=False, map_index_template="{{ task.op_kwargs['app_name'] }}")
    def reconcile(app_name: str) -> dict:
        context = get_current_context()
        return audited_step(context, "reconcile", lambda: steps.reconcile_app(
            app_name, context["run_id"], kafka_connection(), admin_client(), spark_target(),
            context["params"]["max_mismatch_ratio"], context["params"].get("program_version")), app=app_name)

    reconcile.expand(app_name=chosen())


reconcile_stateful_apps()
