"""deploy_apps: start streaming apps from the catalog as long-running Spark drivers.

Wiring only; the logic is in plugins/streamops/dag_tasks/apps.py and streamops/app_ops.py.
"""

from __future__ import annotations

from airflow.sdk import Asset, Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import DEFAULT_ARGS, apps_param, audited_step, runbook
from streamops.dag_tasks import apps as steps
from streamops.dag_tasks.quality import APP_DEPLOYMENTS_ASSET
from streamops.launch_overrides import VERSION_MAX_LENGTH, VERSION_PATTERN, spark_conf_schema

APP_NAMES = load_catalog(check_programs=False).app_names()


@dag(
    dag_id="deploy_apps",
    description="Start streaming apps (one detached Spark driver per app).",
    doc_md=runbook(__file__),
    schedule=None,
    catchup=False,
    # Runs of different apps go on at once; two on one app: the second is refused (operating_on).
    tags=["spark", "apps", "deploy"],
    default_args=dict(DEFAULT_ARGS),
    params={
        "apps": apps_param(APP_NAMES, required=True, description="Apps to start."),
        "version": Param(
            None, type=["null", "string"], pattern=VERSION_PATTERN, maxLength=VERSION_MAX_LENGTH,
            title="Version label", description="Recorded with the run and in dead letters. Empty: the catalog's.",
        ),
        "spark_conf": Param(None, **spark_conf_schema()),
    },
)
def deploy_apps():
    @task
    def chosen_apps() -> list[str]:
        return steps.selected(load_catalog(), get_current_context()["params"]["apps"])

    # A deploy is an asset event: validate_topic_quality then validates the app's output topics.
    @task(multiple_outputs=False, map_index_template="{{ task.op_kwargs['app_name'] }}", outlets=[Asset(APP_DEPLOYMENTS_ASSET)])
    def launch(app_name: str) -> dict:
        context = get_current_context()
        params = context["params"]
        started = audited_step(context, "deploy", lambda: steps.deploy(
            app_name, params["version"], params["spark_conf"], context["run_id"]), app=app_name, operation=True,
            hold_on_failure=False)
        context["outlet_events"][Asset(APP_DEPLOYMENTS_ASSET)].extra = {"apps": [app_name], "version": started["version"]}
        return started

    launch.expand(app_name=chosen_apps())


deploy_apps()
