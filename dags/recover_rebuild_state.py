"""recover_rebuild_state: rebuild an app's state from earliest (Kafka Streams' cleanUp()).

Wiring only: the trigger form below, the steps in streamops.dag_tasks.recovery (REBUILD), the
logic in plugins/streamops/recovery/rebuild.py and streamops/reprocess.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from streamops.catalog import load_catalog
from streamops.dag_tasks import one_run_at_a_time, runbook
from streamops.dag_tasks.procedures import plan_apply_verify
from streamops.dag_tasks.recovery import REBUILD
from streamops.dag_tasks.recovery_params import recovery_form
from streamops.reprocess import VERSION_SUFFIX_PATTERN


@dag(
    dag_id="recover_rebuild_state",
    description="On-call: rebuild an app's state from earliest into the live topics or new versioned topics.",
    doc_md=runbook(__file__),
    tags=["recovery", "on-call", "spark", "apps", "reprocessing"],
    params=recovery_form(load_catalog(check_programs=False).app_names(), {
        "target": Param("live", type="string", enum=["live", "versioned"], title="Target",
                        description="live: rebuild into the app's own topics (downstream sees those records again); "
                                    "versioned: into new <topic>.<version> topics, validated, then cut over.",
                        values_display={"live": "The live topics (reprocess in place)",
                                        "versioned": "New versioned topics, then cut over"}),
        "version": Param("v2", type="string", pattern=VERSION_SUFFIX_PATTERN, title="Version suffix",
                         description="For target versioned: the new topics are <topic>.<version>."),
    }, verify_deadline_s=1800),
    schedule=None,
    **one_run_at_a_time(),
)
def recover_rebuild_state():
    plan_apply_verify(REBUILD)


recover_rebuild_state()
