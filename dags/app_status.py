"""app_status: running / stopped / crashed, last progress and lag of every streaming app.

Wiring only; the logic is in plugins/streamops/app_status.py.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, get_current_context, task

from streamops.catalog import load_catalog
from streamops.dag_tasks import apps as steps
from streamops.dag_tasks import apps_param

APP_NAMES = load_catalog(check_programs=False).app_names()

DOC = """
### Streaming app status and lag

Per app: **running / stopped / failed / crashed** (a driver that died without recording a stop,
e.g. `kill -9` or a lost host), version, driver pid, Spark application, age of the last progress,
the last batch of each query, and **lag per partition**: the offsets of each query's last
committed micro-batch (from its checkpoint; Spark commits no consumer-group offsets) against the
topics' end offsets, plus the time lag (age of the oldest unprocessed record).

Running apps also commit their processed offsets to the consumer group `streamops.<app>`, so
`kafka-consumer-groups --describe` and other Kafka lag tools see them. Runs every 5 minutes.
"""


@dag(
    dag_id="app_status",
    description="Status, last progress and lag per partition of the streaming apps.",
    doc_md=DOC,
    schedule=timedelta(minutes=5),
    catchup=False,
    max_active_runs=1,
    tags=["spark", "apps", "status"],
    default_args={"owner": "data-platform", "retries": 1, "retry_delay": timedelta(seconds=30)},
    params={
        "apps": apps_param(APP_NAMES, required=False, description="Leave empty for all apps."),
    },
)
def app_status():
    @task(multiple_outputs=False)
    def status() -> dict:
        return steps.status(get_current_context()["params"]["apps"])

    status()


app_status()
