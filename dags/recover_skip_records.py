"""recover_skip_records: skip exactly the input records named (a poison record), nothing else.

Wiring only: the trigger form below, the steps in streamops.dag_tasks.recovery (SKIP), the logic
in plugins/streamops/recovery/skip.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from streamops.catalog import load_catalog
from streamops.dag_tasks import one_run_at_a_time, runbook
from streamops.dag_tasks.procedures import plan_apply_verify
from streamops.dag_tasks.recovery import SKIP
from streamops.dag_tasks.recovery_params import recovery_form
from streamops.recovery.skip import MAX_NOTE, MAX_SPECS, RECORD_PATTERN


@dag(
    dag_id="recover_skip_records",
    description="On-call: skip exactly the input records named (a poison record) into the dead-letter topic.",
    doc_md=runbook(__file__),
    tags=["recovery", "on-call", "spark", "apps"],
    params=recovery_form(load_catalog(check_programs=False).app_names(), {
        "records": Param([], type="array", minItems=1, maxItems=MAX_SPECS,
                         items={"type": "string", "pattern": RECORD_PATTERN, "maxLength": 300},
                         title="Records", description="topic:partition:offset or topic:partition:first-last, one per "
                                                      "line, e.g. oplog.operations:3:1207"),
        "note": Param(None, type=["null", "string"], maxLength=MAX_NOTE, title="Note",
                      description="Optional: why (a ticket, the error); written into each dead letter's reason."),
    }),
    schedule=None,
    **one_run_at_a_time(),
)
def recover_skip_records():
    plan_apply_verify(SKIP)


recover_skip_records()
