"""recover_reset_offsets: move a Spark app's input position (kafka-consumer-groups --reset-offsets).

Wiring only; the logic is in plugins/streamops/recovery/reset.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks import runbook
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.provision_topics import admin_client
from streamops.dag_tasks.recovery_params import NAME_PATTERN, app_param, dry_run_param, verify_deadline_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param
from streamops.kafka_offsets import DURATION_FORM_PATTERN, MAX_OFFSET, TIME_PATTERN


@dag(
    dag_id="recover_reset_offsets",
    description="On-call: reset a Spark app's input offsets (earliest, latest, datetime, duration, shift, explicit).",
    doc_md=runbook(__file__),
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["recovery", "on-call", "spark", "apps"],
    default_args={"owner": "data-platform", "show_return_value_in_logs": False, "retries": 0},
    params={
        "app": app_param(load_catalog(check_programs=False).app_names()),
        "dry_run": dry_run_param(), APPROVE_PARAM: approval_param(),
        "mode": Param("earliest", type="string", enum=["earliest", "latest", "datetime", "duration", "shift", "offsets"],
                      title="Mode", description="Where the app's input starts again; fill the field of this mode "
                                                "in 'Where to' below (the others are ignored).", values_display={
                          "earliest": "Earliest retained record", "latest": "Latest (skip everything waiting)",
                          "datetime": "Records written at or after a time", "duration": "A duration back from now",
                          "shift": "Shift by N records per partition", "offsets": "Explicit offsets"}),
        "to_datetime": Param(None, type=["null", "string"], pattern=TIME_PATTERN, maxLength=64, title="To datetime",
                             section="Where to (the field of the chosen mode)",
                             description="Mode datetime: ISO-8601 with a timezone, e.g. 2026-11-22T03:00:00Z "
                                         "(from 1970 to 2999)."),
        "duration": Param(None, type=["null", "string"], pattern=DURATION_FORM_PATTERN,
                          section="Where to (the field of the chosen mode)",
                          title="Duration", description="Mode duration: e.g. '2 hours' back from now (at most 3650 days)."),
        "shift": Param(None, type=["null", "integer"], minimum=-MAX_OFFSET, maximum=MAX_OFFSET, title="Shift",
                       section="Where to (the field of the chosen mode)",
                       description="Mode shift: -N replays N records per partition, +N skips N."),
        "offsets": Param(None, type=["null", "object"], title="Offsets", section="Where to (the field of the chosen mode)",
                         propertyNames={"pattern": NAME_PATTERN},
                         additionalProperties={"type": "object", "propertyNames": {"pattern": r"^[0-9]{1,10}$"},
                                               "additionalProperties": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}},
                         description='Mode offsets: {"<input topic>": {"<partition>": <offset>}}.'),
        "partitions": Param(None, type=["null", "array"], items={"type": "string", "maxLength": 260,
                                                                 "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]*(:[0-9]{1,10})?$"},
                            title="Partitions", section="Scope",
                            description="Optional. Empty: every input partition. Else 'topic' or 'topic:N' items."),
        "verify_deadline_s": verify_deadline_param(),
    },
)
def recover_reset_offsets():
    @task
    def plan() -> dict:
        return steps.reset_plan(get_current_context(), admin_client())

    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(trigger_rule="none_failed")
    def apply(planned: dict) -> dict:
        return steps.reset_apply(get_current_context(), planned)

    @task
    def verify(planned: dict, _applied: dict) -> dict:
        return steps.reset_verify(get_current_context(), planned, kafka_connection())

    planned = plan()
    applied = apply(planned)
    planned >> PlanApproval(what="offset reset plan") >> applied
    verify(planned, applied)


recover_reset_offsets()
