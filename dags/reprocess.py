"""reprocess: recompute an app's outputs from its retained input into new topics (backfill).

Wiring only; the logic is in plugins/streamops/reprocess.py and streamops/dag_tasks/reprocess.py.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

from streamops.catalog import load_catalog
from streamops.dag_tasks import audited_step, one_run_at_a_time, runbook
from streamops.dag_tasks import reprocess as steps
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param, check_approved
from streamops.dag_tasks.connections import admin_client, kafka_connection, spark_master, spark_target
from streamops.dag_tasks.recovery_params import range_end_param, range_start_param
from streamops.launch_overrides import VERSION_MAX_LENGTH, VERSION_PATTERN
from streamops.notifications import OnCallNotifier
from streamops.reprocess import TAG_PATTERN, VERSION_SUFFIX_PATTERN

APP_NAMES = load_catalog(check_programs=False).app_names()
# The form offers the catalog's apps (a catalog without apps still parses; the plan then refuses).
APP_CHOICES: dict[str, Any] = {"enum": APP_NAMES} if APP_NAMES else {}


@dag(
    dag_id="reprocess",
    description="Backfill: recompute an app's outputs from its retained input into new topics.",
    doc_md=runbook(__file__),
    # On-call hears of the outcome (streamops.notifications).
    on_success_callback=OnCallNotifier("result"),
    on_failure_callback=OnCallNotifier("result", failed=True),
    schedule=None,
    tags=["spark", "apps", "reprocessing", "backfill"],
    **one_run_at_a_time(),
    params={
        "app": Param(APP_NAMES[0] if APP_NAMES else "", type="string", title="App",
                     description="The app whose outputs are recomputed from its retained input "
                                 "(the plan waits for approval before anything is written).",
                     **APP_CHOICES),
        "start": range_start_param("earliest, an ISO-8601 time with timezone, or a duration back from now such as '6 hours'."),
        "end": range_end_param("now, or an ISO-8601 time with timezone."),
        "target": Param("versioned", type="string", enum=["versioned", "scratch"], title="Target",
                        description="Where the recomputed records go: new versioned topics (a cutover can follow) or "
                                    "scratch topics (to compare, then delete).",
                        values_display={"versioned": "New versioned topics (<topic>.<version>)",
                                        "scratch": "Scratch topics (scratch.<tag>.<topic>)"}),
        "version": Param("v2", type="string", pattern=VERSION_SUFFIX_PATTERN, title="Version suffix",
                         description="For versioned targets."),
        "program_version": Param(None, type=["null", "string"], pattern=VERSION_PATTERN, maxLength=VERSION_MAX_LENGTH,
                                 title="Code version",
                                 description="The version of the app's code to run (an artifact app runs exactly that "
                                             "version's artifact). Empty: the version running live."),
        "tag": Param(None, type=["null", "string"], pattern=TAG_PATTERN, maxLength=40, title="Tag",
                     description="Names scratch targets and the run's folder. Empty: a timestamp."),
        "dry_run": Param(False, type="boolean", title="Dry run",
                         description="Only show the plan (the 'plan' task's log); create and write nothing."),
        APPROVE_PARAM: approval_param(),
        "cutover": Param(False, type="boolean", title="Cut over",
                         description="After a validated run: stop the live app and continue it on the new topics "
                                     "from where the backfill ended (needs versioned targets and end 'now')."),
    },
)
def reprocess():
    # A refused request is an answer: no retries.
    @task(retries=0, multiple_outputs=False)
    def plan() -> dict:
        context = get_current_context()
        return audited_step(context, "plan", lambda: steps.plan(admin_client(), kafka_connection(), context["params"]))

    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(multiple_outputs=False, trigger_rule="none_failed")
    def run(planned: dict) -> dict:
        context = get_current_context()
        return audited_step(context, "backfill", lambda: steps.run(
            planned, context["run_id"], kafka_connection(), admin_client(), spark_target()), applies_plan=True)

    @task(multiple_outputs=False)
    def validate(planned: dict, _ran: dict) -> list[dict]:
        context = get_current_context()
        return audited_step(context, "validate", lambda: steps.validate(
            planned, context["run_id"], kafka_connection(), admin_client(), spark_master()))

    @task(multiple_outputs=False)
    def cut_over(planned: dict, ran: dict, _validated: list[dict]) -> dict:
        context = get_current_context()

        def cutover() -> dict:
            if context["params"].get("cutover") is not True:
                raise AirflowSkipException("No cutover asked for: the live app was not touched.")
            check_approved(context)  # a cutover needs a second person's approval (streamops.access)
            return steps.cutover(planned, ran, context["run_id"], kafka_connection())

        return audited_step(context, "cutover", cutover, app=context["params"].get("app"),
                            operation=context["params"].get("cutover") is True)

    planned = plan()
    ran = run(planned)
    planned >> PlanApproval(what="reprocessing plan") >> ran
    cut_over(planned, ran, validate(planned, ran))


reprocess()
