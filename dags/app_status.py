"""app_status: the supervisor. Status, health and lag of every streaming app; restarts crashed apps.

Wiring only; the logic is in plugins/streamops/app_status.py and plugins/streamops/supervision.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import apps as steps
from streamops.dag_tasks import apps_param, one_run_at_a_time, runbook, supervisor_schedule, triggering_apps

APP_NAMES = load_catalog(check_programs=False).app_names()


@dag(
    dag_id="app_status",
    description="Supervisor: status, health and lag of the streaming apps; restarts crashed apps; fails when one needs someone.",
    doc_md=runbook(__file__),
    schedule=supervisor_schedule(),
    tags=["spark", "apps", "status", "supervision"],
    **one_run_at_a_time(),
    params={
        "apps": apps_param(APP_NAMES, required=False, description="Leave empty for all apps."),
        "restart_crashed": Param(True, type="boolean", title="Restart crashed apps",
                                 description="As the supervisor: restart apps that should run and do not, within "
                                             "their catalog restart policy and crash-loop guard. Off: only report."),
    },
)
def app_status():
    @task(multiple_outputs=False)
    def status() -> dict:
        context = get_current_context()
        # A run a driver's exit started looks at the apps whose drivers ended (the form's choice wins).
        apps = context["params"]["apps"] or triggering_apps(context) or None
        return steps.status(apps, context["run_id"], context["params"]["restart_crashed"] is not False)

    @task(multiple_outputs=False)
    def check_health(statuses: dict) -> str:
        return steps.check_health(statuses, get_current_context()["run_id"])

    check_health(status())


app_status()
