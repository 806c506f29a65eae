"""recover_rebuild_state: rebuild an app's state from earliest (Kafka Streams' cleanUp()).

Wiring only; the logic is in plugins/streamops/recovery/rebuild.py and streamops/reprocess.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks import runbook
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.provision_topics import admin_client
from streamops.dag_tasks.quality import spark_master
from streamops.dag_tasks.recovery_params import app_param, dry_run_param, verify_deadline_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param
from streamops.reprocess import VERSION_SUFFIX_PATTERN


@dag(
    dag_id="recover_rebuild_state",
    description="On-call: rebuild an app's state from earliest into the live topics or new versioned topics.",
    doc_md=runbook(__file__),
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["recovery", "on-call", "spark", "apps", "reprocessing"],
    default_args={"owner": "data-platform", "show_return_value_in_logs": False, "retries": 0},
    params={
        "app": app_param(load_catalog(check_programs=False).app_names()),
        "dry_run": dry_run_param(), APPROVE_PARAM: approval_param(),
        "target": Param("live", type="string", enum=["live", "versioned"], title="Target",
                        description="live: rebuild into the app's own topics (downstream sees those records again); "
                                    "versioned: into new <topic>.<version> topics, validated, then cut over.",
                        values_display={"live": "The live topics (reprocess in place)",
                                        "versioned": "New versioned topics, then cut over"}),
        "version": Param("v2", type="string", pattern=VERSION_SUFFIX_PATTERN, title="Version suffix",
                         description="For target versioned: the new topics are <topic>.<version>."),
        "verify_deadline_s": verify_deadline_param(1800),
    },
)
def recover_rebuild_state():
    @task
    def plan() -> dict:
        return steps.rebuild_plan(get_current_context(), admin_client(), kafka_connection())

    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(trigger_rule="none_failed")
    def apply(planned: dict) -> dict:
        return steps.rebuild_apply(get_current_context(), planned, admin_client(), kafka_connection(), spark_master())

    @task
    def verify(planned: dict, _applied: dict) -> dict:
        return steps.await_progress(get_current_context(), planned["app"], kafka_connection(), None,
                                    caught_up=planned["target"] == "live")

    planned = plan()
    applied = apply(planned)
    planned >> PlanApproval(what="state rebuild plan") >> applied
    verify(planned, applied)


recover_rebuild_state()
