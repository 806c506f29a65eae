"""recover_rebuild_state: rebuild an app's state from earliest (Kafka Streams' cleanUp()).

Wiring only; the logic is in plugins/streamops/recovery/rebuild.py and streamops/reprocess.py.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import recovery as steps
from streamops.dag_tasks.apps import kafka_connection
from streamops.dag_tasks.provision_topics import admin_client
from streamops.dag_tasks.quality import spark_master
from streamops.dag_tasks.recovery_params import app_param, dry_run_param, verify_deadline_param
from streamops.dag_tasks.approval import APPROVE_PARAM, PlanApproval, approval_param
from streamops.reprocess import VERSION_SUFFIX_PATTERN

DOC = """
### Rebuild an app's state (on-call)

**Symptoms**: the app's state is wrong or lost (a corrupted or deleted state store, a bug that
wrote bad state, a reset that started state empty), or a state-schema change cannot restart
from the old checkpoint.

**Params**: *App*; *Target*:
* **live**: stop the app, **back up and retire** its checkpoint, start it on a new checkpoint
  from the **earliest** retained input: it reprocesses everything into the **live topics**
  (downstream readers see those records again; de-duplicate by event id) and continues live.
  Refused for an app that reads its own output (it would count old and new copies).
* **versioned**: reprocess from earliest into new `<topic>.<version>` topics while the live app
  keeps running, **validate** them with the live topics' suites, then **cut over** (the old
  checkpoint is kept as a snapshot, the old topics untouched; change the catalog afterwards, as the
  log says).

1. **plan**: retained input per partition, records to reprocess, where the output goes.
2. **approve** (the run's *Required actions*: the plan, Approve / Reject; skipped on a dry run or with *Wait for approval* off), then **apply**: as above.
3. **verify**: live: the app has caught up (lag 0); versioned: it makes progress on the new topics.

To undo a live rebuild: `recover_restore_checkpoint` with the `before-rebuild` snapshot. Audited.
"""


@dag(
    dag_id="recover_rebuild_state",
    description="On-call: rebuild an app's state from earliest into the live topics or new versioned topics.",
    doc_md=DOC,
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
