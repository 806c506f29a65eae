"""recover_replay_dead_letters: put dead letters that now parse back on their input topic, once.

Wiring only: the trigger form below, the steps in streamops.dag_tasks.recovery (REPLAY), the
logic in plugins/streamops/recovery/replay.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from streamops.catalog import load_catalog
from streamops.dag_tasks import one_run_at_a_time, runbook
from streamops.dag_tasks.procedures import plan_apply_verify
from streamops.dag_tasks.recovery import REPLAY
from streamops.dag_tasks.recovery_params import range_end_param, range_start_param, recovery_form


@dag(
    dag_id="recover_replay_dead_letters",
    description="On-call: replay dead letters that pass the app's parsing now back to the input topic, once.",
    doc_md=runbook(__file__),
    tags=["recovery", "on-call", "dead-letters"],
    params=recovery_form(load_catalog(check_programs=False).app_names(), {
        "start": range_start_param("earliest, an ISO-8601 time with timezone, or a duration back such as '6 hours'."),
        "end": range_end_param("now, or an ISO-8601 time with timezone."),
        "reason_contains": Param(None, type=["null", "string"], maxLength=200, title="Reason contains",
                                 description="Optional. Only dead letters whose reason contains this text "
                                             "(case-insensitive); empty: every reason."),
    }, verify_deadline_s=None),
    schedule=None,
    **one_run_at_a_time(),
)
def recover_replay_dead_letters():
    plan_apply_verify(REPLAY)


recover_replay_dead_letters()
