"""recover_skip_records: skip exactly the input records named (a poison record), nothing else.

Wiring only; the logic is in plugins/streamops/recovery/skip.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.provision_topics import admin_client
from streamops.dag_tasks.recovery_params import app_param, dry_run_param, verify_deadline_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param
from streamops.recovery.skip import MAX_NOTE, MAX_SPECS, RECORD_PATTERN

DOC = """
### Skip exactly the records named (on-call)

**Symptom**: the app **FAILED** on the same micro-batch twice: `recover_restart_app`'s plan says
*"failed on batch N again (the same batch as the previous failure)"* and names the offsets that
batch covers. One record in it fails the query (not the parser: records that do not parse are
dead-lettered already), so every restart fails the same way. `recover_reset_offsets` would skip
whole partitions' worth of valid records with it; this DAG skips only the records named.

**Params**: *App*; *Records*: `topic:partition:offset` items, or `topic:partition:first-last`
for a range (e.g. `oplog.operations:3:1207`); *Note* (optional, e.g. a ticket); the plan
shows each record for approval (*Dry run*: only the plan). The app must be **stopped** (`stop_apps`).

1. **plan**: each named record (offset, timestamp, size, key, start of the value) and the
   batch it is in. Refused, naming the item: a topic that is not an input of the app, a
   partition that does not exist, an offset past the end or deleted by retention, a record the
   checkpoint has already processed, a record already in the skip list, a running app.
2. **approve** (the run's *Required actions*: the plan, Approve / Reject; skipped on a dry run or with *Wait for approval* off), then **apply**: **backs up** the checkpoint (`<time>-before-skip`), adds the records
   to the app's skip list (`<checkpoint>/_runtime/skip-records.json`, with run, user, time and
   note), starts the version and Spark conf it last ran with **from the same checkpoint**.
3. **verify**: each skipped record is in the app's **dead-letter topic** with reason
   `skipped by operator <user> (run <run id>)[: <note>]` and its source topic/partition/offset,
   and the app committed batches past it. Every other record is processed as before.

A dead letter keeps the record, so `recover_replay_dead_letters` can bring it back once it is
fixed. Every step is written to the recovery audit log (`streamops audit`).
"""


@dag(
    dag_id="recover_skip_records",
    description="On-call: skip exactly the input records named (a poison record) into the dead-letter topic.",
    doc_md=DOC,
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
