"""Reprocessing on a real broker, real Spark and real Airflow task runs: a backfill from earliest
reproduces what the live code wrote, a backfill from a timestamp processes only what was written
from then on, a dry run changes nothing, and bad requests are refused before anything changes."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest

from streamops import loadgen
from streamops.audit import read_audit
from streamops.kafka_records import read_all
from tests.support.apps import run_available_now
from tests.support.webhook import WebhookReceiver

SPARK_LOCAL = '{"conn_type": "spark", "host": "local[2]"}'


@pytest.fixture
def reprocess_env(monkeypatch, tmp_path, app_catalog):
    monkeypatch.setenv("STREAMOPS_REPROCESS_ROOT", str(tmp_path / "reprocess"))
    monkeypatch.setenv("STREAMOPS_QUALITY_ROOT", str(tmp_path / "quality"))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", SPARK_LOCAL)
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(app_catalog.to_yaml())
    return catalog_file


def comparable(records, dead_letters: bool = False) -> Counter:
    """(key, value) of a topic as a multiset; dead letters without their failure time."""
    out = Counter()
    for r in records:
        value = r.json()
        if dead_letters:
            value = {k: v for k, v in value.items() if k != "failed_at"}
        out[(r.key_text, json.dumps(value, sort_keys=True))] += 1
    return out


def test_backfill_from_earliest_through_the_dag_reproduces_the_live_output(
    spark, broker, app_catalog, reprocess_env, run_dag, tmp_path, monkeypatch
):
    router = app_catalog.app("oplog-router")
    webhook = WebhookReceiver()  # on-call hears of the run's outcome (streamops.notifications)
    monkeypatch.setenv("AIRFLOW_CONN_STREAMOPS_NOTIFY", webhook.connection_json())
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://127.0.0.1:8080")
    loadgen.run(router, loadgen.LoadSpec(count=1200, keys=30, malformed=0.02, seed=3), broker.client_config)
    run_available_now(spark, app_catalog, "oplog-router", broker, tmp_path / "live")

    result = run_dag("reprocess", reprocess_env, app="oplog-router", start="earliest", end="now",
                     target="versioned", version="v2", dry_run=False)

    assert result.state == "success", result.task_states
    assert result.task_states == {
        "plan": "success", "approve": "skipped", "run": "success", "validate": "success", "cut_over": "skipped"}
    ran = result.xcoms["run"]
    assert ran["records_in"] == 1200
    for live in [*router.outputs.values()]:
        target = f"{live}.v2"
        assert comparable(read_all(broker.client_config, target)) == comparable(read_all(broker.client_config, live))
        assert ran["records_out"][target] == sum(comparable(read_all(broker.client_config, live)).values())
    dead = router.dead_letter_topic
    assert comparable(read_all(broker.client_config, f"{dead}.v2"), True) == comparable(
        read_all(broker.client_config, dead), True)
    assert ran["dead_letters"] > 0
    assert {o["topic"]: o["success"] for o in result.xcoms["validate"]} == {
        f"{t}.v2": True for t in [*router.outputs.values(), dead]}
    told = webhook.wait_for("the reprocess run's outcome", kind="run finished", run_id=result.run_id)
    webhook.close()
    assert (told["dag_id"], told["state"], told["link"]) == (
        "reprocess", "succeeded", f"http://127.0.0.1:8080/dags/reprocess/runs/{quote(result.run_id, safe='')}")
    assert told["text"].startswith("reprocess") and result.run_id in told["text"]


def test_backfill_from_a_timestamp_processes_only_records_written_from_then_on(spark, broker, admin, app_catalog, tmp_path):
    from streamops.reprocess import ReprocessRequest, plan_reprocess, run_reprocess
    from streamops.spark_submit import SparkTarget

    router = app_catalog.app("oplog-router")
    loadgen.run(router, loadgen.LoadSpec(count=300, keys=10, seed=1), broker.client_config)
    before = {(r.partition, r.offset) for r in read_all(broker.client_config, router.inputs["operations"])}
    cut = max(r.timestamp_ms for r in read_all(broker.client_config, router.inputs["operations"])) + 1
    cut_time = datetime.fromtimestamp(cut / 1000, tz=UTC)
    # The second batch is written after `cut`: poll the clock past it instead of sleeping.
    from streamops.waiting import poll_until

    poll_until(lambda: datetime.now(UTC) > cut_time, timeout=5, what="the clock to pass the cut")
    loadgen.run(router, loadgen.LoadSpec(count=300, keys=10, seed=2, start_seq=301), broker.client_config)
    after = {(r.partition, r.offset) for r in read_all(broker.client_config, router.inputs["operations"])} - before

    plan = plan_reprocess(admin, broker.client_config, app_catalog,
                          ReprocessRequest(app="oplog-router", start=cut_time.isoformat(), target="scratch", tag="since"))
    assert plan.records == len(after) == 300
    run_reprocess(broker.client_config, admin, app_catalog, plan, tmp_path / "work", spark=SparkTarget("local[2]"))
    # The driver's listener heard its query stop before the driver exited, and no event failed
    # against Python's closed callback server (a py4j stack trace at the end of the log).
    driver_log = (tmp_path / "work" / "driver.log").read_text()
    assert re.search(r"streamops\.app: query [0-9a-f-]{36} stopped", driver_log), driver_log[-3000:]
    assert "Py4J" not in driver_log, driver_log[-3000:]

    sources = set()
    for live in router.outputs.values():
        for record in read_all(broker.client_config, plan.targets[live]):
            _, partition, offset = record.json()["event_id"].rsplit("/", 2)
            sources.add((int(partition), int(offset)))
    assert sources and sources <= after
    assert min(r.json()["seq"]
               for live in router.outputs.values() for r in read_all(broker.client_config, plan.targets[live])) > 300


def test_dry_run_plans_and_changes_nothing(broker, admin, app_catalog, reprocess_env, run_dag):
    router = app_catalog.app("oplog-router")
    loadgen.run(router, loadgen.LoadSpec(count=200, keys=10, seed=4), broker.client_config)

    result = run_dag("reprocess", reprocess_env, app="oplog-router", start="earliest", end="now", target="versioned",
                     version="v3", dry_run=True)

    assert result.state == "success"
    assert result.task_states == {
        "plan": "success", "approve": "skipped", "run": "skipped", "validate": "skipped", "cut_over": "skipped"}
    plan = result.xcoms["plan"]
    assert sum(p["end"] - p["start"] for p in plan["inputs"]) == 200
    existing = admin.list_topics(timeout=10).topics
    assert not [t for t in existing if t in {f"{topic}.v3" for topic in router.topics()}]


def test_bad_requests_are_refused_before_anything_changes(admin, broker, app_catalog, reprocess_env, run_dag, capfd, caplog):
    inverted = run_dag("reprocess", reprocess_env, app="oplog-router", start="2026-11-22T10:00:00Z",
                       end="2026-11-22T09:00:00Z", target="versioned", version="v2", dry_run=False)
    assert inverted.task_states == {"plan": "failed", "approve": "upstream_failed", "run": "upstream_failed",
                                    "validate": "upstream_failed", "cut_over": "upstream_failed"}
    captured = capfd.readouterr()
    text = captured.out + captured.err + caplog.text
    assert "end 2026-11-22T09:00:00Z is not after start 2026-11-22T10:00:00Z: the range is empty or inverted" in text

    from streamops.reprocess import ReprocessRefused, ReprocessRequest, plan_reprocess

    def refused(**request) -> list[str]:
        with pytest.raises(ReprocessRefused) as caught:
            plan_reprocess(admin, broker.client_config, app_catalog, ReprocessRequest(**request))
        return caught.value.problems

    assert refused(app="no-such-app") == [
        "app 'no-such-app' is not in the catalog (known: oplog-router, presence-notifier, browser-activity)"
    ]
    assert refused(app="oplog-router", start="2026-11-22T10:00:00") == [
        "start '2026-11-22T10:00:00' has no timezone: add Z or an offset such as +01:00; "
        "or use 'earliest' or a duration such as '6 hours'"
    ]
    assert refused(app="oplog-router", version="2") == ["version '2' must look like v2 (it becomes the topic suffix)"]
    # A version pins code: a backfill of a version no artifact holds is refused, naming the build.
    (missing,) = refused(app="oplog-router", program_version="0.9.0")
    assert missing.startswith("no artifact oplog-router 0.9.0 in the store ") and missing.endswith(
        "build it with: streamops artifact build --app oplog-router --version 0.9.0 [--source DIR]")
    assert not [t for t in admin.list_topics(timeout=10).topics
                if t.endswith(".v2") and t.startswith(app_catalog.topics[0].name.split(".")[0])]


def test_nightly_reconciliation_passes_on_live_output_and_fails_on_a_tampered_window(
    spark, broker, admin, app_catalog, reprocess_env, run_dag, tmp_path, monkeypatch, capfd, caplog
):
    from streamops.kafka_records import produce

    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    browser = app_catalog.app("browser-activity")
    load = loadgen.LoadSpec(count=1500, keys=20, seed=9, start_time=datetime(2026, 11, 1, tzinfo=UTC),
                            event_spacing=timedelta(milliseconds=40))
    loadgen.run(browser, load, broker.client_config)
    run_available_now(spark, app_catalog, "browser-activity", broker, tmp_path / "checkpoints" / "browser-activity")

    clean = run_dag("reconcile_stateful_apps", reprocess_env, apps=["browser-activity"])

    assert clean.state == "success", clean.task_states
    (comparison,) = clean.xcoms["reconcile"]["comparisons"]
    assert comparison["closed_by"] == "live watermark"
    assert comparison["compared"] > 20 and comparison["mismatched"] == 0, comparison
    # The scratch topics were deleted (their names end with the live topic's).
    assert not [t for t in admin.list_topics(timeout=10).topics
                if t.startswith("scratch.") and t.endswith(browser.outputs["activity_counts"])]

    counts = read_all(broker.client_config, browser.outputs["activity_counts"])
    first = min((r.json() for r in counts), key=lambda v: (v["window_start"], v["fingerprint"]))
    tampered = [r.json() for r in counts
                if (r.json()["fingerprint"], r.json()["window_start"]) == (first["fingerprint"], first["window_start"])]
    final = max(v["count"] for v in tampered)
    produce(broker.client_config, browser.outputs["activity_counts"],
            [(f"{first['fingerprint']}|{first['window_start']}", json.dumps({**first, "count": final + 7}))])

    broken = run_dag("reconcile_stateful_apps", reprocess_env, apps=["browser-activity"])

    assert broken.state == "failed"
    captured = capfd.readouterr()
    text = captured.out + captured.err + caplog.text
    assert "1 differ" in text
    assert f"fingerprint '{first['fingerprint']}' window {first['window_start'][:19]}Z..{first['window_end'][:19]}Z" in text
    assert f"live {final + 7}, recomputed {final}" in text
    assert "over the 0.00% threshold" in text
    assert [(e["step"], e["outcome"], e["app"]) for e in read_audit(run_id=clean.run_id)] == [
        ("reconcile", "done", "browser-activity")]
    (audited,) = read_audit(run_id=broken.run_id)
    assert (audited["step"], audited["outcome"]) == ("reconcile", "failed") and "1 differ" in audited["error"]
    assert not [t for t in admin.list_topics(timeout=10).topics
                if t.startswith("scratch.") and t.endswith(browser.outputs["activity_counts"])]


def test_cutover_under_load_continues_on_the_new_topics_without_gap_or_overlap_and_a_restart_after_it_keeps_them(
    run_dag, app_env, reprocess_env, app_catalog, broker, admin
):
    """The cutover hands the live app over to the new topics; then its driver is killed (-9) and the
    supervisor restarts it, under the same load: the restart keeps the new topics (an approved change
    the catalog does not say yet), nothing more reaches the old ones, nothing is lost."""
    import os
    import signal

    from streamops.kafka_offsets import end_offsets
    from streamops.loadgen import LoadSpec, background_load
    from streamops.reprocess import target_catalog
    from streamops.waiting import poll_until
    from tests.support.operations import commit_offsets
    from tests.support.routes import wait_until_all_routed

    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    assert run_dag("deploy_apps", catalog_file, apps=["oplog-router"]).state == "success"

    with background_load(spec, LoadSpec(count=200_000, keys=40, rate=300, seed=33), broker.client_config) as load:
        poll_until(lambda: (p := runtime.progress().get("route")) is not None and p.input_rows > 0,
                   timeout=120, what="the router to see load")
        # A team's dashboard reads the groups output: the plan tells it that topic goes quiet.
        groups = spec.outputs["groups"]
        commit_offsets(admin, "dashboards", {(groups, p): high
                                             for p, (_, high) in end_offsets(broker.client_config, groups).items()})
        result = run_dag("reprocess", catalog_file, app="oplog-router", start="earliest", end="now", target="versioned",
                         version="v2", dry_run=False, cutover=True)
        under_load = load.is_alive()  # the producer was still writing when the cutover finished
        assert result.state == "success", result.task_states
        assert result.xcoms["plan"]["downstream"]["lines"][0] == (
            f"group dashboards on {groups}: after the cutover oplog-router writes to "
            f"{', '.join(f'{t}.v2' for t in sorted(spec.outputs.values()))}: this group receives nothing more on {groups} "
            "until it reads those")
        old_ends = {t: end_offsets(broker.client_config, t) for t in [*spec.outputs.values(), spec.dead_letter_topic]}
        cut = runtime.driver()

        # kill -9 after the cutover: the supervisor's restart must run the approved spec, not the catalog's.
        os.killpg(cut.process_group, signal.SIGKILL)
        poll_until(lambda: not runtime.is_running(), timeout=30, what="the killed driver's lease to free")
        supervised = run_dag("app_status", catalog_file, apps=["oplog-router"])
        restarted = runtime.driver()
        assert supervised.xcoms["status"]["oplog-router"]["health"]["action"].startswith("restarted it"), supervised.xcoms
        assert runtime.state() == "running" and restarted.pid != cut.pid
        poll_until(lambda: ((p := runtime.progress().get("route")) is not None and (p.published_at or "") > restarted.started_at),
                   timeout=120, what="the restarted router to complete a batch under load")
        restarted_under_load = load.is_alive()

    assert under_load and restarted_under_load, "the load ended early: not a cutover and restart under load"
    handed_over = result.xcoms["cut_over"]
    targets = dict(zip(handed_over["old_topics"], handed_over["new_topics"], strict=True))
    assert handed_over["old_topics"] == [*spec.outputs.values(), spec.dead_letter_topic]
    assert cut.version == "1.0.0+v2" and restarted.version == "1.0.0+v2"
    assert [(e["step"], e["outcome"]) for e in read_audit(run_id=result.run_id)] == [
        ("plan", "planned"), ("backfill", "done"), ("validate", "done"), ("cutover", "done")]
    # Both launches recorded the same effective spec: the new topics, the checkpoint's cluster.
    for driver in (cut, restarted):
        assert driver.launch.spec["outputs"] == {role: targets[t] for role, t in spec.outputs.items()}
        assert driver.launch.spec["dead_letter_topic"] == targets[spec.dead_letter_topic]
    assert restarted.launch.spec["digest"] == cut.launch.spec["digest"]
    # Drift says what the catalog still names, and the edit that commits the cutover.
    drift = supervised.xcoms["status"]["oplog-router"]["drift"]
    assert drift["state"] == "drifted"
    assert {(f["field"], f["declared"], f["running"], f["cause"]) for f in drift["fields"] if f["field"] != "version"} == {
        *((f"outputs.{role}", t, targets[t], "approved") for role, t in spec.outputs.items()),
        ("dead_letter_topic", spec.dead_letter_topic, targets[spec.dead_letter_topic], "approved")}
    assert f"+    contacts: {targets[spec.outputs['contacts']]}" in drift["catalog_edit"]
    assert handed_over["catalog_edit"] == drift["catalog_edit"]

    new_app = target_catalog(app_catalog, "oplog-router", targets).app("oplog-router")
    routing = wait_until_all_routed(broker.client_config, new_app)  # zero loss; nothing no input explains
    expected, duplicates = routing.expected, routing.duplicates
    # Nothing reached the old topics after the cutover, the restart included.
    assert {t: end_offsets(broker.client_config, t) for t in old_ends} == old_ends
    # No overlap: no record was written both by the backfill and by the app after the cutover.
    cut_ms = datetime.fromisoformat(cut.started_at).timestamp() * 1000
    phases: dict[str, set] = {"backfill": set(), "live": set()}
    for topic in new_app.outputs.values():
        for record in read_all(broker.client_config, topic):
            phases["backfill" if record.timestamp_ms < cut_ms else "live"].add((record.json()["event_id"], topic))
    assert phases["backfill"] and phases["live"]
    assert phases["backfill"] & phases["live"] == set()
    print(f"cutover under load, then kill -9 and the supervisor's restart: {len(expected)} routed records on the new "
          f"topics ({len(phases['backfill'])} by the backfill, {len(phases['live'])} after the cutover), none lost, no "
          f"overlap, {duplicates} duplicates, nothing more on the old topics")
    assert run_dag("stop_apps", catalog_file, apps=["oplog-router"]).state == "success"


def test_the_plan_warns_when_retention_could_delete_the_start_of_the_range(broker, admin, app_catalog):
    from streamops.reprocess import ReprocessRequest, plan_reprocess

    router = app_catalog.app("oplog-router")
    loadgen.run(router, loadgen.LoadSpec(count=60, keys=5, seed=8), broker.client_config)
    retention_h = app_catalog.topic(router.inputs["operations"]).configs["retention.ms"] / 3_600_000
    # Planned as if 6.5 of the input's 7 retained days had passed since these records were written.
    later = datetime.now(UTC) + timedelta(hours=retention_h - 12)

    plan = plan_reprocess(admin, broker.client_config, app_catalog, ReprocessRequest(app="oplog-router"), now=later)
    fresh = plan_reprocess(admin, broker.client_config, app_catalog, ReprocessRequest(app="oplog-router"))

    assert fresh.warnings == []
    partitions_with_records = [p for p in plan.inputs if p.records]
    assert len(plan.warnings) == len(partitions_with_records) > 0
    assert plan.warnings[0].startswith(f"{router.inputs['operations']} p{partitions_with_records[0].partition}: "
                                       "the range starts with a record written 15")
    assert f"retention is {retention_h:.1f} h" in plan.warnings[0]
    assert "could delete it before the run reads it" in plan.table()
