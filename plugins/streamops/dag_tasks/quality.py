"""Tasks of the validate_topic_quality DAG: plan the ranges, then validate them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from tabulate import tabulate

from streamops.app_runtime import AppRuntime
from streamops.catalog import Catalog, load_catalog
from streamops.dag_tasks import refusals_fail, refusals_fail_the_task
from streamops.dag_tasks.connections import spark_session
from streamops.kafka_client import KafkaClientConfig
from streamops.provisioning import ADMIN_TIMEOUT_S
from streamops.quality.ranges import RangeRequest, TopicRange, resolve
from streamops.runtime_records import RuntimeRecordError
from streamops.supervision import desired_state

log = logging.getLogger(__name__)

# The asset whose events trigger a validation run: apps deployed or rolled. Producers put the
# app names in the event's extra ({"apps": [...]}).
APP_DEPLOYMENTS_ASSET = "streamops://apps/deployments"


def topics_param(catalog: Catalog):
    """The "Topics" multi-select: every topic that has an expectation suite (all by default)."""
    from airflow.sdk import Param

    names = catalog.validated_topics()
    # A catalog without suites still parses (the plan task then says there is nothing to do).
    items = {"type": "string", "enum": names} if names else {"type": "string"}
    return Param(
        names, type="array", items=items, uniqueItems=True, examples=names, title="Topics",
        description="Output topics to validate, each with its expectation suite.",
    )


def topics_of_apps(catalog: Catalog, apps: Sequence[str]) -> list[str]:
    """Validated topics written by these apps (for runs triggered by a deploy or backfill)."""
    wanted = set(apps)
    return [
        topic for topic in catalog.validated_topics() if (writer := catalog.writer(topic)) and writer[0].name in wanted
    ]


def apps_from_events(triggering_events: dict | None) -> list[str]:
    """App names carried by the asset events that triggered this run (empty: not triggered)."""
    names: list[str] = []
    for events in (triggering_events or {}).values():
        for event in events:
            for name in (getattr(event, "extra", None) or {}).get("apps", []):
                if name not in names:
                    names.append(name)
    return names


@refusals_fail
def plan(
    admin,
    params: dict,
    interval: tuple[datetime, datetime] | None,
    triggered_by_apps: Sequence[str] = (),
) -> list[dict]:
    """Resolve the form's range to offsets per topic; refuse bad params before any reading."""
    from airflow.sdk.exceptions import AirflowSkipException

    catalog = load_catalog()
    topics = list(params["topics"])
    if not topics and not catalog.validated_topics():
        raise AirflowSkipException("The catalog has no topics with an expectation suite: nothing to validate.")
    if triggered_by_apps:
        topics = topics_of_apps(catalog, triggered_by_apps) or topics
        log.info("Triggered after a deploy or backfill of %s: validating %s", ", ".join(triggered_by_apps), ", ".join(topics))
    topics = _provisioned(admin, topics or catalog.validated_topics(), set(catalog.topic_names()))
    # A refused form (RangeError) is an answer, not a transient failure: no retries.
    ranges = resolve(admin, catalog, topics, RangeRequest.from_params(params), interval)
    rows = [[r.topic, r.description, r.spans(), r.records] for r in ranges]
    log.info("Ranges to validate:\n%s", tabulate(rows, headers=["topic", "range", "offsets [start-end)", "records"]))
    return [r.to_json() for r in ranges]


def _provisioned(admin, topics: list[str], in_catalog: set[str]) -> list[str]:
    """`topics` but the catalog topics the broker does not have yet. Such a topic (a fresh install
    whose hourly run comes before provision_topics) is not a quality failure: the run validates
    the others, or is skipped saying so when none exists. Names the catalog does not know stay,
    for the range check to refuse them."""
    from airflow.sdk.exceptions import AirflowSkipException

    existing = set(admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics)
    missing = [t for t in topics if t in in_catalog and t not in existing]
    if missing and len(missing) == len(topics):
        raise AirflowSkipException(f"Nothing to validate yet: {', '.join(missing)} "
                                   f"{'does' if len(missing) == 1 else 'do'} not exist on the broker. Run provision_topics "
                                   "(the catalog's topics are created there); this run was skipped, not failed.")
    if missing:
        log.warning("Not validated: %s do(es) not exist on the broker yet (run provision_topics)", ", ".join(missing))
    return [t for t in topics if t not in missing]


def freshness_failures(catalog: Catalog, ranges: list[TopicRange]) -> list[str]:
    """Empty ranges of topics whose writing app should be running: a stopped, crashed or stalled
    app writes nothing, and an empty range must not pass as clean."""
    failures = []
    for item in ranges:
        if item.records:
            continue
        for app in catalog.apps:
            if item.topic not in app.outputs.values():
                continue
            try:
                desired = desired_state(AppRuntime(app.checkpoint_location()))
            except RuntimeRecordError as exc:  # one app's unreadable file: its topic's check says so, the run goes on
                failures.append(f"{item.topic}: freshness: no records in {item.description}; whether its app {app.name} "
                                f"should be running cannot be read: {exc}")
                continue
            if desired is not None and desired.state == "running":
                failures.append(f"{item.topic}: freshness: no records in {item.description}, though its app {app.name} should "
                                f"be running (since {desired.at or '?'}): a stopped, crashed or stalled app writes "
                                "nothing; see app_status")
    return failures


def validate(ranges: list[dict], run_name: str, kafka: KafkaClientConfig, admin, spark_master: str,
             check_freshness: bool = False) -> list[dict]:
    """Validate each planned range; fail (after validating all of them) if any suite failed, or,
    with `check_freshness` (a time range), if a running app's topic got no records in it."""
    from airflow.sdk.exceptions import AirflowFailException

    from streamops.quality.validate import QualityCheckFailed, raise_on_failures, validate_topics

    with refusals_fail_the_task():  # ranges the plan task never made (PlanMismatch)
        topic_ranges = [TopicRange.from_json(r) for r in ranges]
    if not any(r.records for r in topic_ranges):
        log.info("Every range is empty: nothing was written in it, so nothing is validated (no Spark job started).")
        spark = None  # validate_topics needs no session for empty ranges
    else:
        spark = spark_session("streamops-validate-topic-quality", spark_master)
    outcomes = validate_topics(spark, kafka, admin, load_catalog(), topic_ranges, run_name)
    rows = [[o.topic, "passed" if o.success else "FAILED", o.records, len(o.failures), len(o.warnings)] for o in outcomes]
    log.info("Summary:\n%s", tabulate(rows, headers=["topic", "result", "records", "failed", "warnings"]))
    stale = freshness_failures(load_catalog(), topic_ranges) if check_freshness else []
    try:
        raise_on_failures(outcomes)
    except QualityCheckFailed as exc:
        # Retrying would read the same records and fail the same way.
        raise AirflowFailException("\n".join([str(exc), *stale])) from None
    if stale:
        raise AirflowFailException("\n".join(["Output quality failed:", *stale]))
    return [o.to_json() for o in outcomes]
