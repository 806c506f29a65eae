"""roll_restart_apps: upgrade streaming apps one at a time with a health gate and rollback.

Wiring only; the logic is in plugins/streamops/rollout.py.
"""

from __future__ import annotations

from functools import partial

from airflow.sdk import Asset, Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import apps as steps
from streamops.dag_tasks import apps_param, audited_step, one_run_at_a_time, runbook
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param, check_approved
from streamops.dag_tasks.quality import APP_DEPLOYMENTS_ASSET
from streamops.launch_overrides import VERSION_MAX_LENGTH, VERSION_PATTERN, spark_conf_schema
from streamops.rollout import dependency_order

CATALOG = load_catalog(check_programs=False)
APP_NAMES = CATALOG.app_names()


@dag(
    dag_id="roll_restart_apps",
    description="Upgrade streaming apps one at a time: warm standby, plan check, stop, backup, take-over, health gate, rollback.",
    doc_md=runbook(__file__),
    schedule=None,
    tags=["spark", "apps", "deploy", "upgrade"],
    **one_run_at_a_time(),
    params={
        "apps": apps_param(APP_NAMES, required=True, description="Apps to roll, in any order."),
        "version": Param(
            steps.suggested_version(CATALOG), type="string", pattern=VERSION_PATTERN, maxLength=VERSION_MAX_LENGTH,
            title="New version label",
            description="Suggested: the next patch after the catalog's newest version. The version the chosen apps run as "
                        "after the roll, a semantic version such as 1.4.0 (at most "
                        "64 characters). An app with an artifact runs that version's artifact (streamops artifact build); "
                        "others run the installed code under this label. Shown by app_status, recorded in the launch "
                        "record and in dead letters; a rollback returns to the running version and its code.",
        ),
        APPROVE_PARAM: approval_param(),
        "spark_conf": Param(None, **spark_conf_schema()),
        "gate_deadline_s": Param(180, type="integer", minimum=steps.GATE_DEADLINE_S[0], maximum=steps.GATE_DEADLINE_S[1],
                                 title="Health gate deadline (s)",
                                 description="How long the new version has to prove itself (alive; caught up or lag not "
                                             "growing; dead letters under the limit) before it is rolled back."),
        "max_dead_letter_rate": Param(0.05, type="number", minimum=0, maximum=1, title="Max dead-letter rate",
                                      description="Share of the new version's input that may go to dead letters during "
                                                  "the health gate (0.05 = 5%); above it, the roll is rolled back."),
    },
)
def roll_restart_apps():
    @task
    def ordered_apps() -> list[str]:
        names = steps.selected(load_catalog(), get_current_context()["params"]["apps"])
        return dependency_order(load_catalog(), names)

    # Rolled apps are announced like deploys: validate_topic_quality then checks their topics.
    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(multiple_outputs=False, outlets=[Asset(APP_DEPLOYMENTS_ASSET)], trigger_rule="none_failed")
    def roll(apps: list[str]) -> list[dict]:
        # Sequential on purpose: the next app is touched only after this one passed its gate.
        context = get_current_context()
        p = context["params"]
        check_approved(context)
        rolled = [
            audited_step(context, "roll", partial(
                steps.roll, app, p["version"], p["spark_conf"], p["gate_deadline_s"],
                p["max_dead_letter_rate"], context["run_id"]),
                app=app, operation=True)
            for app in apps
        ]
        context["outlet_events"][Asset(APP_DEPLOYMENTS_ASSET)].extra = {"apps": list(apps), "version": p["version"]}
        return rolled

    ordered = ordered_apps()
    ordered >> PlanApproval(plan_task_id="ordered_apps", what="roll plan") >> roll(ordered)


roll_restart_apps()
