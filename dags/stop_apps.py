"""stop_apps: stop streaming apps gracefully.

Wiring only; the logic is in plugins/streamops/app_ops.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import DEFAULT_ARGS, apps_param, audited_step, runbook
from streamops.dag_tasks import apps as steps

APP_NAMES = load_catalog(check_programs=False).app_names()


@dag(
    dag_id="stop_apps",
    description="Stop streaming apps after their in-flight micro-batch.",
    doc_md=runbook(__file__),
    schedule=None,
    catchup=False,
    # Runs of different apps go on at once; two on one app: the second is refused (operating_on).
    tags=["spark", "apps", "stop"],
    default_args=dict(DEFAULT_ARGS),
    params={
        "apps": apps_param(APP_NAMES, required=True, description="Apps to stop."),
        "deadline_s": Param(60, type="integer", minimum=steps.STOP_DEADLINE_S[0], maximum=steps.STOP_DEADLINE_S[1],
                            title="Deadline (s)",
                            description="How long a micro-batch may take to finish before it is interrupted."),
    },
)
def stop_apps():
    @task
    def chosen_apps() -> list[str]:
        return steps.selected(load_catalog(check_programs=False), get_current_context()["params"]["apps"])

    @task(map_index_template="{{ task.op_kwargs['app_name'] }}")
    def stop(app_name: str) -> str:
        context = get_current_context()
        return audited_step(context, "stop", lambda: steps.stop_app(
            app_name, context["params"]["deadline_s"], context["run_id"]), app=app_name, operation=True,
            hold_on_failure=False)

    stop.expand(app_name=chosen_apps())


stop_apps()
