"""recover_reset_offsets: move a Spark app's input position (kafka-consumer-groups --reset-offsets).

Wiring only: the trigger form below, the steps in streamops.dag_tasks.recovery (RESET), the logic
in plugins/streamops/recovery/reset.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from streamops.catalog import load_catalog
from streamops.dag_tasks import one_run_at_a_time, runbook
from streamops.dag_tasks.procedures import plan_apply_verify
from streamops.dag_tasks.recovery import RESET
from streamops.dag_tasks.recovery_params import NAME_PATTERN, recovery_form
from streamops.kafka_offsets import DURATION_FORM_PATTERN, MAX_OFFSET, TIME_PATTERN


@dag(
    dag_id="recover_reset_offsets",
    description="On-call: reset a Spark app's input offsets (earliest, latest, datetime, duration, shift, explicit).",
    doc_md=runbook(__file__),
    tags=["recovery", "on-call", "spark", "apps"],
    params=recovery_form(load_catalog(check_programs=False).app_names(), {
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
    }),
    schedule=None,
    **one_run_at_a_time(),
)
def recover_reset_offsets():
    plan_apply_verify(RESET)


recover_reset_offsets()
