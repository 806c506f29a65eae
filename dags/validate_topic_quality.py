"""validate_topic_quality: validate bounded ranges of output topics with Great Expectations.

Wiring only; the logic is in plugins/streamops/dag_tasks/quality.py and streamops/quality/.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Asset, Param, dag, get_current_context, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.interval import CronDataIntervalTimetable

from streamops.catalog import load_catalog
from streamops.dag_tasks import one_run_at_a_time, runbook
from streamops.dag_tasks import quality as steps
from streamops.dag_tasks.connections import admin_client, kafka_connection, spark_master
from streamops.kafka_offsets import MAX_OFFSET, TIME_PATTERN
from streamops.quality.ranges import MAX_LAST_RECORDS, MODES

CATALOG = load_catalog(check_programs=False)


@dag(
    dag_id="validate_topic_quality",
    description="Validate output topic ranges with the catalog's Great Expectations suites.",
    doc_md=runbook(__file__),
    schedule=AssetOrTimeSchedule(
        timetable=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
        # Airflow annotates this with its serialized asset type; the SDK's Asset is what it documents.
        assets=[Asset(steps.APP_DEPLOYMENTS_ASSET)],  # type: ignore[list-item]
    ),
    tags=["kafka", "quality", "great-expectations"],
    **one_run_at_a_time(retries=1, retry_delay=timedelta(minutes=1)),
    params={
        "topics": steps.topics_param(CATALOG),
        "range": Param(
            "auto", type="string", enum=list(MODES), title="Range",
            description="Which records to validate; the fields of the chosen range follow.",
            values_display={
                "auto": "Automatic (scheduled: last closed hour; after a deploy: last N records)",
                "last_records": "Last N records of each partition",
                "time_range": "Time range",
                "offsets": "Explicit offsets per partition",
            },
        ),
        "last_records": Param(1000, type="integer", minimum=1, maximum=MAX_LAST_RECORDS, title="Last records",
                              description="Records per partition, for 'Last N records' and 'Automatic' after a deploy."),
        "start_time": Param(None, type=["null", "string"], format="date-time", pattern=TIME_PATTERN, title="Start time",
                            description="For 'Time range': first write time included (with a timezone)."),
        "end_time": Param(None, type=["null", "string"], format="date-time", pattern=TIME_PATTERN, title="End time",
                          description="For 'Time range': write time where the range ends (excluded)."),
        "offsets": Param(None, type=["null", "object"], title="Offsets",
                         additionalProperties={"type": "object", "propertyNames": {"pattern": r"^[0-9]{1,10}$"},
                                               "additionalProperties": {
                                                   "type": "array", "minItems": 2, "maxItems": 2,
                                                   "items": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}}},
                         description='For \'Explicit offsets\': {"<topic>": {"<partition>": [start, end]}}, end excluded.'),
    },
)
def validate_topic_quality():
    # Bad params are refused here; retrying would refuse them again.
    @task(retries=0)
    def plan() -> list[dict]:
        context = get_current_context()
        scheduled = context["dag_run"].run_type == "scheduled"
        # An asset-triggered run (after a deploy) has no data interval: Airflow leaves the keys out.
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        interval = (start, end) if scheduled and start and end else None
        triggered_by = steps.apps_from_events(context.get("triggering_asset_events"))
        return steps.plan(admin_client(), context["params"], interval, triggered_by)

    @task
    def validate(ranges: list[dict]) -> list[dict]:
        context = get_current_context()
        # A time range (scheduled, or asked for) must hold records of a running app: freshness.
        timed = context["params"]["range"] == "time_range" or (
            context["params"]["range"] == "auto" and context["dag_run"].run_type == "scheduled")
        return steps.validate(ranges, context["run_id"], kafka_connection(), admin_client(), spark_master(),
                              check_freshness=timed)

    validate(plan())


validate_topic_quality()
