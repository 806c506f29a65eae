"""Retention runway on a real broker, real Spark and a real app_status run (streamops.retention):
a stopped router with unread input on a topic with a short retention pages before retention can
delete the first unread record, its runway falling; once records it never read are gone (deleted
as retention deletes them: the log start offset moves), its state is 'input lost' with the
partition and offsets, and nothing restarts it into Spark's failOnDataLoss crash. A size limit
pages from the unread records' bytes, and the extension raises it by what the input writes."""

from __future__ import annotations

import re

from confluent_kafka import TopicPartition

from streamops.app_status import app_status
from streamops.catalog import load_catalog
from streamops.kafka_offsets import end_offsets
from streamops.provisioning import ensure_topics
from streamops.supervision import evaluate
from streamops.waiting import poll_until
from tests.support.apps import run_available_now
from tests.support.oplog_events import produce_to_partitions

RETENTION_MS = 600_000  # 10 minutes
PAGE_BELOW_S = 590
PAGE_BELOW = f"{PAGE_BELOW_S} seconds"  # the catalog's min_retention_runway: pages once the oldest unread record is 10 s old


def test_a_stopped_app_pages_before_retention_deletes_its_unread_input_and_then_says_what_was_lost(
        spark, run_dag, app_env, app_catalog, broker, admin):
    catalog_file, runtime = app_env
    source = app_catalog.app("oplog-router").inputs["operations"]
    catalog = app_catalog.model_copy(update={
        "topics": [t.model_copy(update={"configs": {**t.configs, "retention.ms": RETENTION_MS}}) if t.name == source else t
                   for t in app_catalog.topics],
        "apps": [a.model_copy(update={"supervision": a.supervision.model_copy(update={"min_retention_runway": PAGE_BELOW})})
                 if a.name == "oplog-router" else a for a in app_catalog.apps]})
    ensure_topics(admin, [catalog.topic(source)])  # the broker keeps 10 minutes, as provision_topics would set it
    catalog_file.write_text(catalog.to_yaml())
    spec = load_catalog(catalog_file).app("oplog-router")
    produce_to_partitions(broker.client_config, source, range(0, 40))
    run_available_now(spark, catalog, "oplog-router", broker, spec.checkpoint_location())
    runtime.set_desired("stopped", run_id="manual__ops", by="ops")
    produce_to_partitions(broker.client_config, source, range(40, 48))  # two unread records in partitions 0-3

    def runways() -> dict[int, float | None]:
        return {r.partition: r.runway_s for r in app_status(spec, broker.client_config).runways}

    first = runways()
    assert set(first) == set(range(6)) and first[4] is None and first[5] is None  # nothing waits there
    assert all(0 < first[p] <= RETENTION_MS / 1000 for p in range(4)), first
    poll_until(lambda: evaluate(spec, app_status(spec, broker.client_config), runtime).state == "retention risk",
               timeout=120, what="the runway to fall below the catalog's 590 seconds")
    # The four partitions were written one produce after another (seconds apart on a busy host), so the
    # evidence names all four only once the last of them is below the page line too.
    def all_four_below_the_page_line() -> bool:
        now = runways()
        return all((now[p] or 0.0) < PAGE_BELOW_S for p in range(4))

    poll_until(all_four_below_the_page_line, timeout=120, what="every unread partition's runway to fall below 590 s")
    later = runways()
    assert all(later[p] < first[p] for p in range(4)), (first, later)
    assert all(low == 0 for low, _ in end_offsets(broker.client_config, source).values())  # paged before any loss
    paged = run_dag("app_status", catalog_file, apps=["oplog-router"])
    health = paged.xcoms["status"]["oplog-router"]["health"]
    assert paged.state == "failed" and health["state"] == "retention risk"
    assert health["evidence"].startswith("stopped on purpose by ops (run manual__ops) at ")
    assert re.search(rf"retention deletes input oplog-router has not processed in about (\d+) s: {re.escape(source)} "
                     r"partition [0-3], offset 10 \(written (\d+) s ago, retention.ms 600,000\) and 3 more partition\(s\); "
                     r"it pages below 590 s \(the catalog's supervision.min_retention_runway\)", health["evidence"]), \
        health["evidence"]

    # Retention deletes partition 0's records up to and including its first unread one.
    position = next(r.position for r in app_status(spec, broker.client_config).runways if r.partition == 0)
    admin.delete_records([TopicPartition(source, 0, position + 1)])[TopicPartition(source, 0, position + 1)].result(30)
    lost = run_dag("app_status", catalog_file, apps=["oplog-router"])
    health = lost.xcoms["status"]["oplog-router"]["health"]
    assert lost.state == "failed" and health["state"] == "input lost"
    assert health["evidence"].startswith(f"retention deleted input oplog-router had not processed: {source} partition 0 "
                                         f"offsets {position}-{position} (1 records). Spark (failOnDataLoss) fails every "
                                         "start on it, so the supervisor does not restart it.")
    assert runtime.restarts() == [] and not runtime.is_running()


def test_an_approved_extension_keeps_every_unread_record_and_the_catalogs_retention_comes_back(
        spark, run_dag, app_env, app_catalog, broker, admin):
    """The router is stopped with unread input on a topic that keeps records 20 s. An approved
    recover_extend_retention holds it 10 minutes longer: its unread records stay while the same
    records on a topic without the extension are deleted by retention. provision_topics keeps the
    hold; when the hold ends the supervisor puts the catalog's 20 s back."""
    from datetime import UTC, datetime, timedelta

    from streamops.kafka_records import produce, read_all
    from streamops.provisioning import describe_broker, plan_topics, select_topics
    from streamops.recovery.extend import end_holds
    from streamops.retention import read_holds, topic_retentions

    catalog_file, runtime = app_env
    source = app_catalog.app("oplog-router").inputs["operations"]
    control = app_catalog.app("presence-notifier").inputs["events"]  # a topic nobody extends
    short = {"retention.ms": 20_000, "segment.ms": 1_000}
    catalog = app_catalog.model_copy(update={"topics": [
        t.model_copy(update={"configs": {**t.configs, **short}}) if t.name in (source, control) else t
        for t in app_catalog.topics]})
    ensure_topics(admin, [catalog.topic(source), catalog.topic(control)])
    catalog_file.write_text(catalog.to_yaml())
    produce_to_partitions(broker.client_config, source, range(0, 8))
    run_available_now(spark, catalog, "oplog-router", broker, app_catalog.app("oplog-router").checkpoint_location())
    runtime.set_desired("stopped", run_id="manual__ops", by="ops")
    unread = [(f"u{n}", f'{{"seq": {n}, "user_id": "u{n}", "op_type": "SEND_MESSAGE", "event_time": "2026-12-03T03:00:00Z"}}')
              for n in range(20)]
    for topic in (source, control):
        produce(broker.client_config, topic, unread, partition=0)

    extended = run_dag("recover_extend_retention", catalog_file, app="oplog-router", extend_by="10 minutes",
                       hold_for="1 hour", dry_run=False, approved_by="approver")
    assert extended.state == "success", extended.task_states
    (planned,) = extended.xcoms["plan"]["topics"]
    assert (planned["topic"], planned["retention_ms_now"], planned["retention_ms_new"]) == (source, 20_000, 620_000)
    assert topic_retentions(admin, [source])[source].retention_ms == 620_000
    assert read_holds()[source].retention_ms == 620_000 and read_holds()[source].run_id == extended.run_id
    # Another segment on both topics, so the one holding the unread records is closed and can go.
    for topic in (source, control):
        produce(broker.client_config, topic, [("u-late", '{"seq": 99}')], partition=0)
    poll_until(lambda: end_offsets(broker.client_config, control)[0][0] > 0, timeout=120,
               what="retention to delete the control topic's records (20 s, checked every 5 s)")
    # Every record the router has not read stays (what it had read may go: its segment was already due).
    kept = [r.offset for r in read_all(broker.client_config, source) if r.partition == 0 and r.offset >= 2]
    assert end_offsets(broker.client_config, source)[0][0] <= 2 and kept == list(range(2, 2 + 20 + 1))
    # provision_topics keeps the hold: no change planned for the topic.
    held = plan_topics(select_topics(catalog, [source]), describe_broker(admin, [source]), report_unmanaged=False)
    assert held.to_change == [], held.table()

    # The hold's time is up. The router's oldest unread record is older than the catalog's 20 s, so
    # reverting would delete it: the hold is kept, saying why. Once it has read everything, it ends.
    later = datetime.now(UTC) + timedelta(hours=2)
    (kept_line,) = end_holds(admin, broker.client_config, catalog, later)
    assert kept_line.startswith(f"{source}: the retention hold of run {extended.run_id} ended at ") and \
        "oplog-router's oldest unread record (partition 0, offset 2) is " in kept_line and \
        "the catalog's retention (20 s) would delete it, or nearly: kept held" in kept_line
    assert topic_retentions(admin, [source])[source].retention_ms == 620_000
    runtime.set_desired("stopped", run_id="manual__ops2", by="ops")
    run_available_now(spark, catalog, "oplog-router", broker, app_catalog.app("oplog-router").checkpoint_location())
    (ended_line,) = end_holds(admin, broker.client_config, catalog, later)
    assert ended_line.endswith("the catalog's retention.ms 20000 is back")
    assert topic_retentions(admin, [source])[source].retention_ms == 20_000 and source not in read_holds()


def test_a_size_limit_pages_from_the_unread_bytes_and_the_extension_raises_it_by_what_the_input_writes(
        spark, app_env, app_catalog, broker, admin):
    """The router's input keeps 200,000 bytes per partition (and the catalog's time limit, days):
    60 unread records of about 1 KB on partition 0 leave a runway of seconds by size, measured from
    those exact bytes. The extension holds retention.bytes higher by what the partition writes in
    the stated time, through provisioning; the end of the hold is refused while the unread records
    would still fill the catalog's limit within the runway floor."""
    import math
    from datetime import UTC, datetime, timedelta

    from streamops.kafka_records import produce
    from streamops.recovery.extend import ExtendRequest, apply_extend, end_holds, plan_extend, verify_extend
    from streamops.retention import read_holds, record_bytes, topic_retentions

    catalog_file, runtime = app_env
    source = app_catalog.app("oplog-router").inputs["operations"]
    catalog = app_catalog.model_copy(update={"topics": [
        t.model_copy(update={"configs": {**t.configs, "retention.bytes": 200_000}}) if t.name == source else t
        for t in app_catalog.topics]})
    ensure_topics(admin, [catalog.topic(source)])
    catalog_file.write_text(catalog.to_yaml())
    spec = load_catalog(catalog_file).app("oplog-router")
    produce_to_partitions(broker.client_config, source, range(0, 12))
    run_available_now(spark, catalog, "oplog-router", broker, spec.checkpoint_location())
    runtime.set_desired("stopped", run_id="manual__ops", by="ops")
    unread = [(f"u{n}", f'{{"seq": {n}, "user_id": "u{n}", "op_type": "SEND_MESSAGE", "pad": "{"x" * 1000}"}}')
              for n in range(60)]
    produce(broker.client_config, source, unread, partition=0)
    unread_bytes = sum(record_bytes(k.encode(), v.encode(), None) for k, v in unread)

    (runway,) = [r for r in app_status(spec, broker.client_config).runways if r.partition == 0]
    assert (runway.unread_records, runway.unread_bytes, runway.retention_bytes) == (60, unread_bytes, 200_000)
    assert runway.limited_by == "retention.bytes" and runway.runway_s is not None
    assert runway.runway_s < runway.time_runway_s  # type: ignore[operator]  # days by time
    health = evaluate(spec, app_status(spec, broker.client_config), runtime)
    assert health.state == "retention risk"
    assert re.search(rf"retention deletes input oplog-router has not processed in about \d+ s: {re.escape(source)} partition 0, "
                     rf"offset {runway.position} \(its 60 unread record\(s\), about {unread_bytes / 1024:.1f} KiB written over "
                     r"\d+ s, against retention.bytes 200,000 per partition\); it pages below 30 min", health.evidence), \
        health.evidence

    plan = plan_extend(admin, broker.client_config, catalog, ExtendRequest("oplog-router", "1 hour", "1 hour"))
    (topic,) = plan.topics
    assert topic.retention_bytes_now == 200_000 and topic.bytes_per_s
    assert topic.retention_bytes_new == 200_000 + math.ceil(topic.bytes_per_s * 3600) > 200_000
    assert topic.retention_ms_new == topic.retention_ms_now + 3_600_000  # type: ignore[operator]
    assert topic.runway_after_s > topic.shortest_runway_s  # type: ignore[operator]
    apply_extend(admin, plan, run_id="manual__extend", by="approver")
    verify_extend(admin, plan)
    assert topic_retentions(admin, [source])[source].retention_bytes == topic.retention_bytes_new
    assert read_holds()[source].declared_bytes == 200_000

    (kept_line,) = end_holds(admin, broker.client_config, catalog, datetime.now(UTC) + timedelta(hours=2))
    assert f"oplog-router's unread records on partition 0 (from offset {runway.position}, about {unread_bytes:,} bytes) " \
           "would reach the catalog's retention.bytes (200,000) in " in kept_line and kept_line.endswith("kept held; extend "
           "again with recover_extend_retention, let the app catch up, or revert by hand"), kept_line
    assert topic_retentions(admin, [source])[source].retention_bytes == topic.retention_bytes_new
