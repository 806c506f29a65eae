"""recover_skip_records: skip exactly the input records named (a poison record), nothing else.

Wiring only; the logic is in plugins/streamops/recovery/skip.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks import runbook
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.provision_topics import admin_client
from streamops.dag_tasks.recovery_params import app_param, dry_run_param, verify_deadline_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param
from streamops.recovery.skip import MAX_NOTE, MAX_SPECS, RECORD_PATTERN


@dag(
    dag_id="recover_skip_records",
    description="On-call: skip exactly the input records named (a poison record) into the dead-letter topic.",
    doc_md=runbook(__file__),
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["recovery", "on-call", "spark", "apps"],
    default_args={"owner": "data-platform", "show_return_value_in_logs": False, "retries": 0},
    params={
        "app": app_param(load_catalog(check_programs=False).app_names()),
        "dry_run": dry_run_param(), APPROVE_PARAM: approval_param(),
        "records": Param([], type="array", minItems=1, maxItems=MAX_SPECS,
                         items={"type": "string", "pattern": RECORD_PATTERN, "maxLength": 300},
                         title="Records", description="topic:partition:offset or topic:partition:first-last, one per "
                                                      "line, e.g. oplog.operations:3:1207"),
        "note": Param(None, type=["null", "string"], maxLength=MAX_NOTE, title="Note",
                      description="Optional: why (a ticket, the error); written into each dead letter's reason."),
        "verify_deadline_s": verify_deadline_param(),
    },
)
def recover_skip_records():
    @task
    def plan() -> dict:
        return steps.skip_plan(get_current_context(), admin_client(), kafka_connection())

    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(trigger_rule="none_failed")
    def apply(planned: dict) -> dict:
        return steps.skip_apply(get_current_context(), planned, kafka_connection())

    @task
    def verify(planned: dict, applied: dict) -> dict:
        return steps.skip_verify(get_current_context(), planned, applied, kafka_connection())

    planned = plan()
    applied = apply(planned)
    planned >> PlanApproval(what="skip-records plan") >> applied
    verify(planned, applied)


recover_skip_records()
