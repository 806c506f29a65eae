"""Output topic quality on a real broker, real Spark and real Airflow task runs: the three apps'
clean outputs pass every suite; injected bad records and a missing output fail the run naming
the expectation and the offsets; bad params are refused before anything is read."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from confluent_kafka import TopicPartition

from streamops import loadgen
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import produce, read_all
from streamops.quality import docs, docs_assets, results
from streamops.runtime_records import SkipEntry
from tests.support.apps import run_available_now

SPARK_LOCAL = '{"conn_type": "spark", "host": "local[2]"}'


@pytest.fixture(scope="module")
def app_outputs(spark, broker, admin, tmp_path_factory):
    """All three apps run once over generated input (event times spread so windows close);
    returns (catalog file, catalog, {topic: clean [start, end) per partition})."""
    from streamops.catalog import load_catalog
    from streamops.provisioning import ensure_topics

    catalog = load_catalog().with_topic_prefix(f"q{uuid.uuid4().hex[:8]}")
    ensure_topics(admin, catalog.topics)
    spacing = {"oplog-router": timedelta(milliseconds=5), "presence-notifier": timedelta(seconds=1),
               "browser-activity": timedelta(milliseconds=40)}
    start = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)
    folder = tmp_path_factory.mktemp("quality")
    for app in catalog.apps:
        load = loadgen.LoadSpec(count=2400, keys=40, malformed=0.01, seed=7, start_time=start, event_spacing=spacing[app.name])
        loadgen.run(app, load, broker.client_config)
        run_available_now(spark, catalog, app.name, broker, folder / "checkpoints" / app.name)
    catalog_file = folder / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    clean = {
        topic: {str(p): [low, high] for p, (low, high) in end_offsets(broker.client_config, topic).items()}
        for topic in catalog.validated_topics()
    }
    return catalog_file, catalog, clean


def task_log(capfd, caplog) -> str:
    """What the in-process task runs logged. Airflow routes stdlib logging to the output of the
    first dag.test in the process, so depending on test order it lands in one or the other."""
    captured = capfd.readouterr()
    return captured.out + captured.err + caplog.text


@pytest.fixture
def quality_env(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMOPS_QUALITY_ROOT", str(tmp_path / "quality"))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", SPARK_LOCAL)
    return tmp_path / "quality"


def test_clean_outputs_of_the_three_apps_pass_every_suite(run_dag, app_outputs, quality_env):
    catalog_file, catalog, clean = app_outputs
    topics = catalog.validated_topics()
    assert len(topics) == 11

    result = run_dag("validate_topic_quality", catalog_file, topics=topics, range="offsets", offsets=clean)

    assert result.state == "success", result.task_states
    outcomes = {o["topic"]: o for o in result.xcoms["validate"]}
    assert {t: (o["success"], o["failed_expectations"], o["warnings"]) for t, o in outcomes.items()} == {
        t: (True, [], []) for t in topics
    }
    for topic, outcome in outcomes.items():
        assert outcome["records"] > 0, topic  # every suite saw records
        for url in outcome["data_docs"]:
            page = Path(unquote(urlparse(url).path)).read_text(encoding="utf-8")
            assert outcome["suite"] in page and result.run_id in page  # this run's Data Docs page
    # Served without internet: every style and script GX's pages load is rewritten to the suite's copy.
    site = docs.site_dir(quality_env)
    pages = [site / "index.html", *sorted(site.glob("validations/**/*.html"))]
    assert len(pages) > len(topics)
    for page_file in pages:
        served = docs_assets.localise(page_file.read_text(encoding="utf-8"), "/assets")
        external = re.findall(r'<(?:script|link)[^>]*(?:src|href)="(https?://[^"]+)"', served)
        assert external == [], (page_file, external)
        for local in re.findall(r'"/assets/([^"]+)"', served):
            assert (docs_assets.ASSETS_DIR / local).is_file(), local
    # The cross-record checks compared real work: every routed record, and closed windows.
    contacts = outcomes[catalog.app("oplog-router").outputs["contacts"]]["reconciliation"]
    assert contacts["expected"] == contacts["written"] > 100
    assert (contacts["missing"], contacts["unexpected"], contacts["duplicates"]) == (0, 0, 0)
    for app, role in (("presence-notifier", "notification_counts"), ("browser-activity", "activity_counts")):
        windows = outcomes[catalog.app(app).outputs[role]]["reconciliation"]
        assert windows["closed"] > 10 and windows["differ"] == 0, windows

    stored = results.query(run_name=None, limit=50, root=quality_env)
    assert sorted((row["topic"], row["success"], row["records"]) for row in stored) == sorted(
        (t, True, outcomes[t]["records"]) for t in topics
    )


def test_injected_bad_records_fail_naming_the_expectation_and_the_offsets(run_dag, broker, app_outputs, quality_env, capfd,
                                                                          caplog):
    _, catalog, clean = app_outputs
    router, browser = catalog.app("oplog-router"), catalog.app("browser-activity")
    contacts, counts, challenges = router.outputs["contacts"], browser.outputs["activity_counts"], browser.outputs["challenges"]
    good = read_all(broker.client_config, contacts)[-1]
    # A messages record written to the contacts topic: wrong op type and category, and an output
    # the operation log does not justify for contacts.
    wrong_type = read_all(broker.client_config, router.outputs["messages"])[0].json()
    bad_window = {"fingerprint": "browser-00001", "window_start": "2026-11-01T08:00:00.000Z",
                  "window_end": "2026-11-01T08:00:07.000Z", "count": 3}
    low_challenge = {"fingerprint": "browser-00002", "actions": 2, "verified": False, "threshold": 5,
                     "last_event_id": "x/0/1", "last_event_time": "2026-11-01T08:00:00.000Z"}
    produce(broker.client_config, contacts, [(wrong_type["user_id"], json.dumps(wrong_type)), (None, good.value)], partition=0)
    produce(broker.client_config, counts, [("browser-00001|2026-11-01T08:00:00.000Z", json.dumps(bad_window))], partition=1)
    produce(broker.client_config, challenges, [("browser-00002", json.dumps(low_challenge))], partition=2)
    wrong_at, null_key_at = clean[contacts]["0"][1], clean[contacts]["0"][1] + 1
    window_at, challenge_at = clean[counts]["1"][1], clean[challenges]["2"][1]

    result = run_dag(
        "validate_topic_quality", app_outputs[0], topics=[contacts, counts, challenges], range="last_records", last_records=1000
    )

    assert result.state == "failed"
    assert result.task_states == {"plan": "success", "validate": "failed"}
    text = task_log(capfd, caplog)
    assert f"FAILED {contacts}" in text and f"FAILED {counts}" in text and f"FAILED {challenges}" in text
    assert "expect_column_values_to_be_in_set(op_type) [records]" in text
    assert f"partition 0 offset {wrong_at}: key '{wrong_type['user_id']}', op_type '{wrong_type['op_type']}'" in text
    assert "expect_column_values_to_not_be_null(key) [records]" in text
    assert f"partition 0 offset {null_key_at}: key None" in text
    # The wrong-category copy is also an output the input does not justify; the null-key copy a duplicate.
    assert "reconciliation: no output record without an operation-log record of this category" in text
    assert f'event_id "{wrong_type["event_id"]}"' in text
    assert "window end minus window start equals the window size" in text
    assert f"partition 1, offset {window_at}, key \"browser-00001|2026-11-01T08:00:00.000Z\"" in text
    assert "expect_column_values_to_be_between(actions) [records]" in text
    assert f"partition 2 offset {challenge_at}: key 'browser-00002', actions 2" in text
    assert "Data Docs: file://" in text

    failed = {row["topic"]: row for row in results.query(failed_only=True, root=quality_env)}
    assert set(failed) == {contacts, counts, challenges}
    assert any("expect_column_values_to_be_in_set(op_type)" in f for f in failed[contacts]["failed_expectations"])
    assert any("reconciliation: duplicates" in w for w in failed[contacts]["warnings"])


def test_a_missing_output_record_fails_the_reconciliation(spark, broker, admin, app_catalog, tmp_path, monkeypatch, quality_env):
    """Retention (here: delete_records) removed the head of one output partition before anyone
    read it: the records whose sources lie inside the covered input range are reported missing."""
    from streamops.quality.ranges import RangeRequest, resolve
    from streamops.quality.validate import validate_topics

    router = app_catalog.app("oplog-router")
    contacts = router.outputs["contacts"]
    load = loadgen.LoadSpec(count=1500, keys=40, seed=11, start_time=datetime(2026, 11, 1, tzinfo=UTC))
    loadgen.run(router, load, broker.client_config)
    run_available_now(spark, app_catalog, "oplog-router", broker, tmp_path / "ckpt")
    before = read_all(broker.client_config, contacts)
    lost_partition = max({r.partition for r in before}, key=lambda p: sum(r.partition == p for r in before))
    lost = [r for r in before if r.partition == lost_partition][:10]
    admin.delete_records([TopicPartition(contacts, lost_partition, lost[-1].offset + 1)])[
        TopicPartition(contacts, lost_partition, lost[-1].offset + 1)
    ].result()
    kept = [r for r in before if r not in lost]
    lowest_kept = {}
    for record in kept:
        partition, offset = (int(x) for x in record.json()["event_id"].rsplit("/", 2)[1:])
        lowest_kept[partition] = min(offset, lowest_kept.get(partition, offset))
    expected_missing = sorted(
        r.json()["event_id"] for r in lost
        if int(r.json()["event_id"].rsplit("/", 2)[2]) > lowest_kept[int(r.json()["event_id"].rsplit("/", 2)[1])]
    )
    assert expected_missing  # the test data put some of them inside the covered range

    ranges = resolve(admin, app_catalog, [contacts], RangeRequest(mode="last_records", last_records=100_000))
    (outcome,) = validate_topics(spark, broker.client_config, admin, app_catalog, ranges, "missing-test", quality_env)

    assert not outcome.success
    assert outcome.reconciliation["missing"] == len(expected_missing)
    assert (outcome.reconciliation["unexpected"], outcome.reconciliation["duplicates"]) == (0, 0)
    (failure,) = outcome.failures
    assert failure.part == "reconciliation"
    assert failure.description.startswith("reconciliation: every operation-log record of this category")
    assert failure.unexpected == len(expected_missing)
    shown = [re.search(r'event_id "([^"]+)"', sample).group(1) for sample in failure.samples]
    assert shown == sorted(expected_missing, key=lambda e: (int(e.rsplit("/", 2)[1]), int(e.rsplit("/", 2)[2])))[:5]


def test_records_an_operator_skipped_are_not_missing_and_the_result_names_them(
    spark, broker, admin, app_catalog, tmp_path, monkeypatch, quality_env
):
    """recover_skip_records' list is honoured by the reconciliation: the run passes and says which
    offsets were skipped (and how many records were dead-lettered), instead of paging on them."""
    from streamops.app_runtime import AppRuntime
    from streamops.quality.ranges import whole_topics
    from streamops.quality.validate import validate_topics
    from streamops.recovery.skip import skip_reason
    from tests.support.oplog_events import produce_to_partitions

    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    router = app_catalog.app("oplog-router")
    source, contacts = router.inputs["operations"], router.outputs["contacts"]
    produce_to_partitions(broker.client_config, source, range(1, 41))
    # Partition 0 holds seqs 4, 8, ... 40 (offsets 0-9), partition 1 seqs 1, 5, ... 37: offsets 4-6
    # of partition 0 (seqs 20, 24, 28) and offset 3 of partition 1 (seq 13), three of them contacts.
    reason = skip_reason("oncall", "manual__skip", "poison records")
    entries = [SkipEntry(topic=source, partition=partition, first=first, last=last, reason=reason,
                         run_id="manual__skip", user="oncall", at="2026-11-27T03:00:00Z", note="poison records")
               for partition, first, last in ((0, 4, 6), (1, 3, 3))]
    checkpoint = router.checkpoint_location()
    AppRuntime(checkpoint).add_skip_records(entries)
    run_available_now(spark, app_catalog, "oplog-router", broker, checkpoint)
    dead = [r.json() for r in read_all(broker.client_config, router.dead_letter_topic)]
    assert sorted((d["source"]["partition"], d["source"]["offset"], d["reason"]) for d in dead) == [
        (0, 4, reason), (0, 5, reason), (0, 6, reason), (1, 3, reason)]

    (outcome,) = validate_topics(spark, broker.client_config, admin, app_catalog, whole_topics(admin, [contacts]), "skips",
                                 quality_env)

    assert outcome.success, outcome.report()
    summary = outcome.reconciliation
    assert (summary["missing"], summary["unexpected"], summary["duplicates"]) == (0, 0, 0)
    assert summary["skipped_by_operator"] == [f"{source}:0:4-6", f"{source}:1:3"]
    assert summary["dead_lettered"] == 4
    assert summary["note"].endswith(
        f"not expected: 4 dead-lettered with a reason (4 of them skipped by an operator, recover_skip_records: "
        f"{source}:0:4-6, {source}:1:3)")


def test_bad_params_are_refused_before_anything_is_read(run_dag, broker, app_outputs, quality_env, capfd, caplog):
    catalog_file, catalog, _ = app_outputs
    contacts = catalog.app("oplog-router").outputs["contacts"]
    end = end_offsets(broker.client_config, contacts)[0][1]

    inverted = run_dag("validate_topic_quality", catalog_file, topics=[contacts], range="time_range",
                       start_time="2026-11-22T10:00:00Z", end_time="2026-11-22T09:00:00Z")
    beyond = run_dag("validate_topic_quality", catalog_file, topics=[contacts], range="offsets",
                     offsets={contacts: {"0": [0, end + 50], "9": [0, 1]}})

    for result in (inverted, beyond):
        assert result.state == "failed"
        assert result.task_states == {"plan": "failed", "validate": "upstream_failed"}
    text = task_log(capfd, caplog)
    assert ("end_time 2026-11-22T09:00:00Z is not after start_time 2026-11-22T10:00:00Z: the time range is empty or inverted"
            in text)
    assert f"offsets['{contacts}']['0'] = [0, {end + 50}]: end is beyond the end of the partition ({end})" in text
    assert f"offsets['{contacts}']['9']: topic '{contacts}' has no partition 9 (it has 6: 0-5)" in text
    assert results.query(root=quality_env) == []  # nothing was validated or recorded


def test_before_the_topics_exist_the_run_is_skipped_saying_why(run_dag, admin, quality_env, tmp_path, capfd, caplog):
    """A fresh install: the hourly run comes before provision_topics created anything."""
    from streamops.catalog import load_catalog

    catalog = load_catalog().with_topic_prefix(f"q{uuid.uuid4().hex[:8]}")  # nothing of it on the broker
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    result = run_dag("validate_topic_quality", catalog_file)
    assert result.state == "success" and result.task_states == {"plan": "skipped", "validate": "skipped"}
    text = task_log(capfd, caplog)
    assert (f"Nothing to validate yet: {', '.join(catalog.validated_topics())} do not exist on the broker. "
            "Run provision_topics" in text)
    assert results.query(root=quality_env) == []


def test_an_empty_hour_of_a_running_apps_topic_fails_freshness(run_dag, admin, quality_env, tmp_path, monkeypatch, capfd, caplog):
    """An app that should run but wrote nothing in the hour is not a clean hour; a stopped one is."""
    from streamops.app_runtime import AppRuntime
    from streamops.catalog import load_catalog
    from streamops.provisioning import ensure_topics

    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    catalog = load_catalog().with_topic_prefix(f"q{uuid.uuid4().hex[:8]}")
    ensure_topics(admin, catalog.topics)
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    router = catalog.app("oplog-router")
    contacts = router.outputs["contacts"]
    runtime = AppRuntime(router.checkpoint_location())
    runtime.set_desired("running", run_id="manual__deploy", by="alice")
    hour = {"topics": [contacts], "range": "time_range", "start_time": "2026-11-24T01:00:00Z", "end_time": "2026-11-24T02:00:00Z"}

    stale = run_dag("validate_topic_quality", catalog_file, **hour)
    assert stale.state == "failed" and stale.task_states == {"plan": "success", "validate": "failed"}
    assert (f"{contacts}: freshness: no records in records written from 2026-11-24T01:00:00+00:00 up to "
            "2026-11-24T02:00:00+00:00, though its app oplog-router should be running (since ") in task_log(capfd, caplog)
    runtime.set_desired("stopped", run_id="manual__stop", by="bob")
    assert run_dag("validate_topic_quality", catalog_file, **hour).state == "success"  # stopped on purpose: nothing is due


def test_range_requests_are_checked_against_the_catalog_and_the_broker(admin, broker, app_outputs):
    from streamops.quality.ranges import RangeError, RangeRequest, resolve

    _, catalog, clean = app_outputs
    contacts = catalog.app("oplog-router").outputs["contacts"]
    operations = catalog.app("oplog-router").inputs["operations"]

    def problems(topics, **request):
        with pytest.raises(RangeError) as caught:
            resolve(admin, catalog, topics, RangeRequest(**request))
        return caught.value.problems

    assert problems(["no.such.topic"], mode="last_records") == [
        f"topic 'no.such.topic' is not in the catalog (topics with suites: {', '.join(catalog.validated_topics())})"
    ]
    assert problems([operations], mode="last_records")[0].startswith(f"topic '{operations}' has no expectation suite")
    assert problems([contacts], mode="time_range", start_time="2026-11-22T10:00:00", end_time="2026-11-22T11:00:00Z") == [
        "start_time '2026-11-22T10:00:00' has no timezone: add Z or an offset such as +01:00"
    ]
    assert problems([contacts], mode="last_records", last_records=0) == ["last_records must be a positive whole number (got 0)"]
    assert problems([contacts], mode="offsets", offsets={contacts: {"0": [5, 2]}}) == [
        f"offsets['{contacts}']['0'] = [5, 2]: start must be >= 0 and end >= start"
    ]

    marks = end_offsets(broker.client_config, contacts)
    (last,) = resolve(admin, catalog, [contacts], RangeRequest(mode="last_records", last_records=3))
    assert last.partitions == {p: (max(low, high - 3), high) for p, (low, high) in marks.items()}
    # A scheduled run's data interval: records written in it (all of them, written minutes ago).
    now = datetime.now(UTC)
    (hour,) = resolve(admin, catalog, [contacts], RangeRequest(mode="auto"), (now - timedelta(hours=1), now))
    assert hour.partitions == marks
    (future,) = resolve(admin, catalog, [contacts], RangeRequest(mode="auto"), (now, now + timedelta(hours=1)))
    assert future.records == 0


def test_a_deploy_event_narrows_the_run_to_the_deployed_apps_topics():
    from types import SimpleNamespace

    from streamops.catalog import load_catalog
    from streamops.dag_tasks.quality import apps_from_events, topics_of_apps

    catalog = load_catalog()
    events = {"streamops://apps/deployments": [SimpleNamespace(extra={"apps": ["browser-activity"]}),
                                               SimpleNamespace(extra={"apps": ["browser-activity", "oplog-router"]})]}
    assert apps_from_events(events) == ["browser-activity", "oplog-router"]
    assert apps_from_events(None) == []
    assert topics_of_apps(catalog, ["browser-activity"]) == [
        "browser.captcha-challenges", "browser.activity-counts", "browser.activity.dead-letters"
    ]


def test_an_expectation_that_cannot_be_evaluated_fails_with_the_error(spark, broker, admin, app_outputs, tmp_path):
    from streamops.quality.ranges import whole_topics
    from streamops.quality.validate import validate_topics

    _, catalog, _ = app_outputs
    dead = catalog.app("oplog-router").dead_letter_topic
    suite = tmp_path / "broken.json"
    suite.write_text(json.dumps({"name": "broken", "expectations": [{
        "type": "unexpected_rows_expectation", "description": "a query with a typo",
        "kwargs": {"unexpected_rows_query": "SELECT * FROM {batch} WHERE no_such_column > 0"}}]}))
    broken = catalog.model_copy(update={"topics": [
        t.model_copy(update={"expectation_suite": str(suite)}) if t.name == dead else t for t in catalog.topics]})

    (outcome,) = validate_topics(spark, broker.client_config, admin, broken, whole_topics(admin, [dead]), "broken", tmp_path)

    (failure,) = outcome.failures
    assert failure.description == "a query with a typo"
    assert failure.samples[0].startswith("the expectation could not be evaluated:")
    assert "no_such_column" in failure.samples[0]
