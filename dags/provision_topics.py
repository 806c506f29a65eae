"""provision_topics: create and update the Kafka topics declared in the catalog.

Wiring only; the logic is in plugins/streamops/dag_tasks/provision_topics.py.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import audited_step, one_run_at_a_time, runbook
from streamops.dag_tasks import provision_topics as steps
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param
from streamops.dag_tasks.connections import admin_client

# Parsing the catalog here means a broken catalog shows as this DAG's import error in the UI,
# with the file, entry and field named.
CATALOG = load_catalog(check_programs=False)
TOPIC_NAMES = CATALOG.topic_names()


@dag(
    dag_id="provision_topics",
    description="Create and update Kafka topics from the catalog (plan, apply, verify).",
    doc_md=runbook(__file__),
    schedule=None,
    tags=["kafka", "topics", "provisioning"],
    **one_run_at_a_time(retries=2, retry_delay=timedelta(seconds=15)),
    params={
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            description="Only show the plan (the 'plan' task's log); change nothing on the broker.",
        ),
        APPROVE_PARAM: approval_param(),
        "topics": Param(
            # "null" in the type keeps the field optional in the form (no "required" asterisk).
            [],
            type=["array", "null"],
            items={"type": "string", "enum": TOPIC_NAMES},
            uniqueItems=True,
            examples=TOPIC_NAMES,
            title="Topics",
            description="Catalog topics to provision. Leave empty for all of them.",
        ),
    },
)
def provision_topics():
    # One XCom per task (the whole dict), not one per key: easier to read in the UI.
    @task(multiple_outputs=False)
    def plan() -> dict:
        context = get_current_context()
        return audited_step(context, "plan", lambda: steps.plan(admin_client(), context["params"]["topics"]))

    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(multiple_outputs=False, trigger_rule="none_failed")
    def apply(plan_xcom: dict) -> dict:
        return audited_step(get_current_context(), "apply", lambda: steps.apply(admin_client(), plan_xcom), applies_plan=True)

    # verify polls the broker with its own deadline; retrying it would only repeat that wait.
    @task(retries=0, multiple_outputs=False)
    def verify() -> dict:
        context = get_current_context()
        return audited_step(context, "verify", lambda: steps.check(admin_client(), context["params"]["topics"]))

    planned = plan()
    planned >> PlanApproval(what="topic plan") >> apply(planned) >> verify()


provision_topics()
