"""recover_extend_retention: raise an app's input retention for a stated time, so retention does not
delete input it has not processed yet; the catalog's retention comes back when the time is up.

Wiring only: the trigger form below, the steps in streamops.dag_tasks.recovery (EXTEND), the logic
in plugins/streamops/recovery/extend.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from streamops.catalog import load_catalog
from streamops.dag_tasks import one_run_at_a_time, runbook
from streamops.dag_tasks.procedures import plan_apply_verify
from streamops.dag_tasks.recovery import EXTEND
from streamops.dag_tasks.recovery_params import recovery_form
from streamops.kafka_offsets import DURATION_FORM_PATTERN


@dag(
    dag_id="recover_extend_retention",
    description="On-call: raise an app's input retention for a stated time (retention risk), then revert it.",
    doc_md=runbook(__file__),
    tags=["recovery", "on-call", "topics"],
    params=recovery_form(load_catalog(check_programs=False).app_names(), {
        "extend_by": Param("1 day", type="string", maxLength=40, pattern=DURATION_FORM_PATTERN, title="Extend by",
                           description="Added to each input topic's retention.ms, e.g. '12 hours' (at most 30 days)."),
        "hold_for": Param("1 day", type="string", maxLength=40, pattern=DURATION_FORM_PATTERN, title="Hold for",
                          description="How long the longer retention stays; then the supervisor puts the catalog's back "
                                      "(unless that would delete records the app has not read). At most 30 days."),
    }, verify_deadline_s=None),
    schedule=None,
    **one_run_at_a_time(),
)
def recover_extend_retention():
    plan_apply_verify(EXTEND)


recover_extend_retention()
