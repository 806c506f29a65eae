"""app_status: the supervisor. Status, health and lag of every streaming app; restarts crashed apps.

Wiring only; the logic is in plugins/streamops/app_status.py and plugins/streamops/supervision.py.
"""

from __future__ import annotations


from airflow.sdk import Param, dag, get_current_context, task

from streamops.catalog import load_catalog, supervisor_schedule
from streamops.dag_tasks import apps as steps
from streamops.dag_tasks import apps_param

APP_NAMES = load_catalog(check_programs=False).app_names()

DOC = """
### Streaming app status, health and supervision

Every 2 minutes (and on demand), per app: **running / stopped / failed / crashed**, version and
code, driver pid and host, Spark application, the last batch of each query, and **lag per
partition** (each query's last committed batch in its checkpoint against the topics' end offsets)
with the time lag (age of the oldest unprocessed record).

Then its **health**, from what the app should be doing (deployed / stopped by an operator, who
and when) and the catalog's `supervision` thresholds: healthy, stopped, not deployed, in
operation (a roll or recovery is changing it), **crashed**, **crash-loop**, **held** (down after
a run failed while changing it: nothing restarts it), **stalled**, **lagging**, **degraded**,
**unreadable**.

**Supervisor**: an app that should run and does not is restarted from its checkpoint with the
version, Spark conf and code it last ran, if its restart policy is `on-failure`: the first
restart at once, later ones after an exponential backoff; after `max_restarts` within
`restart_window` the crash-loop guard leaves it down. Every restart is in `streamops audit`.

**The run fails** (task `check_health`) when any app is crashed, in a crash loop, held, stalled,
lagging, degraded or unreadable, naming each with its evidence, so Airflow's failure notifications page
someone (README "Supervision" shows how to wire a notifier). A crash loop names the batch and
offsets it failed on; the way out is recover_skip_records, recover_reset_offsets or
recover_replay_dead_letters, then recover_restart_app or deploy_apps (which resets the guard).
"""


@dag(
    dag_id="app_status",
    description="Supervisor: status, health and lag of the streaming apps; restarts crashed apps; fails when one needs someone.",
    doc_md=DOC,
    schedule=supervisor_schedule(),
    catchup=False,
    max_active_runs=1,
    tags=["spark", "apps", "status", "supervision"],
    default_args={"owner": "data-platform", "show_return_value_in_logs": False, "retries": 0},
    params={
        "apps": apps_param(APP_NAMES, required=False, description="Leave empty for all apps."),
        "restart_crashed": Param(True, type="boolean", title="Restart crashed apps",
                                 description="As the supervisor: restart apps that should run and do not, within "
                                             "their catalog restart policy and crash-loop guard. Off: only report."),
    },
)
def app_status():
    @task(multiple_outputs=False)
    def status() -> dict:
        context = get_current_context()
        return steps.status(context["params"]["apps"], context["run_id"], context["params"]["restart_crashed"] is not False)

    @task(multiple_outputs=False)
    def check_health(statuses: dict) -> str:
        return steps.check_health(statuses)

    check_health(status())


app_status()
