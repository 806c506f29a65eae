"""recover_replay_dead_letters: put dead letters that now parse back on their input topic, once.

Wiring only; the logic is in plugins/streamops/recovery/replay.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks import runbook
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.provision_topics import admin_client
from streamops.dag_tasks.quality import spark_master
from streamops.dag_tasks.recovery_params import app_param, dry_run_param, range_end_param, range_start_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param


@dag(
    dag_id="recover_replay_dead_letters",
    description="On-call: replay dead letters that pass the app's parsing now back to the input topic, once.",
    doc_md=runbook(__file__),
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["recovery", "on-call", "dead-letters"],
    default_args={"owner": "data-platform", "show_return_value_in_logs": False, "retries": 0},
    params={
        "app": app_param(load_catalog(check_programs=False).app_names()),
        "dry_run": dry_run_param(), APPROVE_PARAM: approval_param(),
        "start": range_start_param("earliest, an ISO-8601 time with timezone, or a duration back such as '6 hours'."),
        "end": range_end_param("now, or an ISO-8601 time with timezone."),
        "reason_contains": Param(None, type=["null", "string"], maxLength=200, title="Reason contains",
                                 description="Optional. Only dead letters whose reason contains this text "
                                             "(case-insensitive); empty: every reason."),
    },
)
def recover_replay_dead_letters():
    def session():
        from spark_apps.common.session import build_session

        return build_session("streamops-recovery", master=spark_master())

    @task
    def plan() -> dict:
        return steps.replay_plan(get_current_context(), session(), admin_client(), kafka_connection())

    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(trigger_rule="none_failed")
    def apply(planned: dict) -> dict:
        return steps.replay_apply(get_current_context(), session(), planned, kafka_connection())

    @task
    def verify(applied: dict) -> dict:
        return steps.replay_verify(get_current_context(), applied, kafka_connection())

    planned = plan()
    applied = apply(planned)
    planned >> PlanApproval(what="dead-letter replay plan") >> applied
    verify(applied)


recover_replay_dead_letters()
