"""Supervision: desired state, health, the supervisor's restarts and its crash-loop guard, metrics,
and the way out of a crash loop (the restart plan, recover_skip_records).

On a real broker with real drivers and real Airflow task runs (the decisions as pure functions
are in tests/unit/streamops/test_supervision.py): kill -9 -> the status run fails naming the app and the
supervisor restarts it; a poison record in the middle of a partition -> restarts with backoff, then
the guard leaves the app down and the status names the batch and offsets; the restart plan says a
restart fails again and it does; skipping exactly the poison record loses nothing; a driver frozen
with SIGSTOP -> stalled. (The skip DAG's refusals: tests/test_skip_records.py.)
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx

from streamops.audit import read_audit
from streamops.catalog import SupervisionSpec, load_catalog
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import produce
from streamops.local_stack.history_server import SparkHistoryServer
from streamops.spark_history import failed_batch_job
from streamops.waiting import poll_until
from tests.support.artifacts import same_code_as
from tests.support.ports import free_port
from tests.support.webhook import WebhookReceiver


def _with_policy(catalog, catalog_file: Path, **policy):
    """The catalog with the router's supervision set to `policy`, written where the DAGs read it."""
    updated = catalog.model_copy(update={"apps": [
        a.model_copy(update={"supervision": SupervisionSpec(**policy)}) if a.name == "oplog-router" else a
        for a in catalog.apps]})
    catalog_file.write_text(updated.to_yaml())
    return updated


def _health(result, app="oplog-router") -> dict:
    return result.xcoms["status"][app]["health"]


def test_supervisor_restarts_a_killed_app_backs_off_stops_a_crash_loop_and_skipping_the_poison_loses_nothing(
    run_dag, app_env, app_catalog, broker, admin, capfd, monkeypatch
):
    """One router through the supervisor's whole story: kill -9 and a restart; a poison record in the
    middle of a partition, a restart after its backoff that fails on the same batch, a longer backoff
    that waits, the crash-loop guard that leaves it down; then the operator's way out: the restart plan
    says it would fail again (and it does), recover_skip_records skips exactly that record into the
    dead-letter topic, and every other record is routed (zero loss)."""
    import base64
    import json
    import random

    from streamops.app_runtime import AppRuntime
    from streamops.app_status import app_status
    from streamops.checkpoints import backup_info
    from streamops.kafka_records import read_all
    from tests.support.operations import commit_offsets, steps_of
    from tests.support.oplog_events import NOT_CONTACTS, POISON_PARTITION, event, produce_to_partitions, with_small_output_topic
    from tests.support.routes import routed_except

    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    source, contacts = spec.inputs["operations"], spec.outputs["contacts"]
    # On-call's webhook (streamops.notifications): what it hears of the story, once per state.
    webhook = WebhookReceiver()
    monkeypatch.setenv("AIRFLOW_CONN_STREAMOPS_NOTIFY", webhook.connection_json())
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://127.0.0.1:8080")
    # The broker refuses any contacts record over 20000 bytes: a valid input whose routed output
    # is bigger fails the Kafka sink (RecordTooLargeException), and with it the query.
    catalog = with_small_output_topic(app_catalog, admin, catalog_file, contacts, 20000)
    catalog = _with_policy(catalog, catalog_file, backoff_initial="1 second", max_restarts=3)
    kafka = broker.client_config
    produce_to_partitions(kafka, source, range(1, 41))
    same_code_as(app_catalog.app("oplog-router"), "1.0.7")
    deployed = run_dag("deploy_apps", catalog_file, apps=["oplog-router"], version="1.0.7")
    assert deployed.state == "success", deployed.task_states
    assert runtime.desired().state == "running" and runtime.desired().by == "dag_test"
    routed_except(broker.client_config, spec, set())

    # The metrics endpoint's figures for the running app, with the labels Prometheus alerts use.
    from streamops.metrics import render

    processed = r'streamops_app_processed_rows_per_second\{app="oplog-router",query="route"\} [0-9.e+]+'
    # The batch's progress reaches the driver's files from Spark's listener thread, after the batch
    # committed: on a busy host a little after its records are visible.
    def with_last_batch() -> str | None:
        scraped = render(catalog, kafka).decode()
        return scraped if re.search(processed, scraped) else None

    text = poll_until(with_last_batch, timeout=60, what="the metrics to show the route query's last batch")
    assert 'streamops_app_state{app="oplog-router"} 0.0' in text
    assert 'streamops_app_up{app="oplog-router"} 1.0' in text
    # (prometheus_client writes the labels in name order)
    assert f'streamops_app_offset_lag{{app="oplog-router",partition="{POISON_PARTITION}",query="route",topic="{source}"}} 0.0' \
        in text, text
    assert f'streamops_app_time_lag_seconds{{app="oplog-router",partition="0",query="route",topic="{source}"}} 0.0' in text
    assert f'streamops_app_dead_letters_total{{app="oplog-router",topic="{spec.dead_letter_topic}"}} 0.0' in text
    assert 'streamops_app_restarts_total{app="oplog-router"} 0.0' in text
    # The same through the endpoint the API server mounts: credentials first.
    from fastapi.testclient import TestClient

    from streamops.metrics import metrics_app

    (catalog_file.parent / "scrape-token").write_text("a-scrape-token\n")
    monkeypatch.setenv("STREAMOPS_METRICS_TOKEN_FILE", str(catalog_file.parent / "scrape-token"))
    monkeypatch.setenv("STREAMOPS_CATALOG", str(catalog_file))
    endpoint = TestClient(metrics_app())
    assert endpoint.get("/metrics").status_code == 401
    served = endpoint.get("/metrics", headers={"Authorization": "Bearer a-scrape-token"})
    assert served.status_code == 200 and 'streamops_app_up{app="oplog-router"} 1.0' in served.text

    # kill -9: the next status run fails naming the app, and the supervisor restarts it.
    killed = runtime.driver()
    os.kill(killed.pid, signal.SIGKILL)
    poll_until(lambda: not runtime.is_running(), timeout=30, what="the killed driver's lease to free")
    capfd.readouterr()
    first = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert first.state == "failed" and first.task_states == {"status": "success", "check_health": "failed"}
    said = capfd.readouterr().out
    assert "1 streaming app(s) need attention: oplog-router (crashed)" in said
    assert f"- oplog-router: CRASHED: should be running (version 1.0.7, asked for by dag_test (run {deployed.run_id})" in said
    assert f"but its driver is crashed (pid {killed.pid}," in said
    health = _health(first)
    assert health["action"].startswith("restarted it (restart 1 of at most 3 within 1 hour): driver pid ")
    restarted = runtime.driver()
    assert runtime.state() == "running" and restarted.pid != killed.pid
    assert restarted.launched_by == first.run_id and restarted.version == "1.0.7"  # what it last ran
    (audited,) = read_audit(run_id=first.run_id)
    assert (audited["dag_id"], audited["user"], audited["step"], audited["outcome"]) == (
        "app_status", "supervisor", "restart", "done")
    assert audited["app"] == "oplog-router" and audited["restart"]["attempt"] == 1

    # The poison: valid JSON, a known op type, 48 KB of incompressible text (lz4 cannot shrink it
    # under the limit), IN THE MIDDLE of partition 2, with valid records around it. It fails every
    # batch that holds it.
    noise = base64.b64encode(random.Random(7).randbytes(36000)).decode()
    before = [event(s, op_types=NOT_CONTACTS) for s in range(100, 106)]
    after = [event(s, op_types=NOT_CONTACTS) for s in range(107, 113)]
    poison_offset = end_offsets(kafka, source)[POISON_PARTITION][1] + len(before)
    poison = event(106, "BLOCK_CONTACT", note=noise)
    produce(kafka, source, [*before, poison, *after], partition=POISON_PARTITION)
    produce_to_partitions(kafka, source, range(200, 220), NOT_CONTACTS)
    poison_id = f"{source}/{POISON_PARTITION}/{poison_offset}"
    poll_until(lambda: runtime.state() == "failed", timeout=180, what="the router to fail on the poison record")
    (failed,) = runtime.driver().failed_batches
    assert failed["query"] == "route" and "RecordTooLargeException" in failed["error"], failed
    # The record says what went wrong in a line; Spark's whole plan stays in the driver log.
    assert runtime.driver().reason == f"query {spec.name}.route failed: {failed['error']}"
    assert failed["error"].startswith("org.apache.kafka.common.errors.RecordTooLargeException: ") and len(failed["error"]) <= 400
    assert "Logical Plan" in runtime.driver_log().read_text()
    assert any(r["topic"] == source and r["partition"] == POISON_PARTITION and r["first"] <= poison_offset <= r["last"]
               for r in failed["ranges"]), failed
    status = app_status(spec, kafka)
    assert (status.state == "failed"
            and status.reason.startswith(f"query route failed on batch {failed['batch']} (")), status.reason
    first_plan = run_dag("recover_restart_app", catalog_file, dry_run=True, app="oplog-router").xcoms["plan"]
    assert first_plan["failed_batches"] == [failed] and first_plan["failed_again"] is False

    second = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert second.state == "failed"
    entry = [r for r in runtime.restarts() if r["run_id"] == second.run_id][0]
    first_restart = [r for r in runtime.restarts() if r["run_id"] == first.run_id][0]
    # Restart 2 came after its backoff (1 s after restart 1), measured on the records' own clocks.
    # (It may fail on the batch before its start-up wait ends: a failed start counts for the guard too.)
    assert entry["attempt"] == 2 and entry["backoff_s"] == 1 and entry["outcome"] in ("started", "failed")
    assert entry["not_before"] > first_restart["at"] and entry["at"] >= entry["not_before"]
    poll_until(lambda: runtime.state() == "failed" and runtime.driver().launched_by == second.run_id, timeout=180,
               what="the restarted router to fail on the same batch")
    (again_failed,) = runtime.driver().failed_batches
    assert {k: again_failed[k] for k in ("query", "batch", "ranges")} == {k: failed[k] for k in ("query", "batch", "ranges")}

    # A longer backoff: the supervisor waits, and says until when.
    _with_policy(catalog, catalog_file, backoff_initial="10 minutes", backoff_max="1 hour", max_restarts=3)
    waiting = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert waiting.state == "failed" and runtime.state() == "failed"
    assert re.fullmatch(r"restart 3 waits for its backoff of 1200s: not before \S+Z", _health(waiting)["action"])
    assert [r["attempt"] for r in runtime.restarts()] == [1, 2]

    # The guard: at its limit, the app stays down and the run fails saying so, naming the batch and
    # linking the job that batch failed in on a real History Server (one of this test's, scanning
    # the drivers' event logs every second).
    _with_policy(catalog, catalog_file, backoff_initial="1 second", max_restarts=2, max_dead_letter_rate=1)
    history = SparkHistoryServer(state_dir=catalog_file.parent / "history", port=free_port(), update_interval="1s")
    history.start()
    try:
        monkeypatch.setenv("STREAMOPS_SPARK_HISTORY_URL", history.url)
        last_driver = runtime.driver().application_id
        job = poll_until(lambda: failed_batch_job(last_driver, "oplog-router.route", failed["batch"]), timeout=120,
                         what="the History Server to list the failed batch's job")
        capfd.readouterr()
        looped = run_dag("app_status", catalog_file, apps=["oplog-router"])
        said = capfd.readouterr().out
        assert f"The failed batch's job (query route, batch {failed['batch']}): {job}" in said
        assert job.startswith(f"{history.url}/history/{last_driver}/jobs/job/?id=")
        page = httpx.get(job, timeout=60, follow_redirects=True)
        assert page.status_code == 200 and f"Details for Job {job.rsplit('=', 1)[1]}" in page.text
    finally:
        history.stop()
    assert looped.state == "failed" and runtime.state() == "failed" and _health(looped)["state"] == "crash-loop"
    assert "1 streaming app(s) need attention: oplog-router (crash-loop)" in said
    assert f"query route failed on batch {failed['batch']} ({source} partition " in said
    assert f"{source} partition {POISON_PARTITION} offsets" in said
    assert "crash loop: restarted 2 time(s) within 1 hour (the guard's limit is 2;" in said
    assert "it stays down until an operator acts" in said and "recover_skip_records" in said and "recover_reset_offsets" in said
    assert [r.get("attempt") for r in runtime.restarts()] == [1, 2, None]  # and the guard's "gave up"
    assert [(e["step"], e["outcome"]) for e in read_audit(run_id=looped.run_id)] == [("crash-loop guard", "gave up")]
    notice = webhook.wait_for("the crash-loop notice", state="crash-loop", run_id=looped.run_id)
    assert (notice["kind"], notice["app"], notice["link"]) == ("app needs attention", "oplog-router",
                                                              "http://127.0.0.1:8080/streamops/apps")
    told = f"{notice['evidence']} {notice['action'] or ''}"  # what the health says, and what the supervisor did
    assert f"query route failed on batch {failed['batch']}" in told and "crash loop: restarted 2 time(s) within 1 hour" in told
    assert notice["text"].startswith("oplog-router is CRASH-LOOP: ")
    # It stays down: even with a roomier policy, nothing restarts it until an operator acts.
    _with_policy(catalog, catalog_file, backoff_initial="1 second", max_restarts=5, max_dead_letter_rate=1)
    still = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert _health(still)["state"] == "crash-loop" and runtime.state() == "failed" and len(runtime.restarts()) == 3
    assert [m["run_id"] for m in webhook.messages if m["state"] == "crash-loop"] == [looped.run_id]  # paged once
    text = render(load_catalog(catalog_file), kafka).decode()
    assert 'streamops_app_state{app="oplog-router"} 8.0' in text
    assert 'streamops_app_restarts_total{app="oplog-router"} 2.0' in text
    assert 'streamops_app_needs_attention{app="oplog-router"} 1.0' in text

    # The operator: the restart plan says a restart fails the same way, and one does (in apply when
    # that happens before its start-up wait ends, else in verify: either way the run fails, saying why).
    plan = run_dag("recover_restart_app", catalog_file, dry_run=True, app="oplog-router").xcoms["plan"]
    assert plan["failed_again"] is True
    from streamops.recovery.restart import RestartPlan

    why = RestartPlan(**{k: v for k, v in plan.items() if k != "summary"}).failure()
    assert why.startswith(f"oplog-router failed on batch {failed['batch']} again (the same batch as the previous failure): "
                          "restarting will fail the same way.")
    assert f"{source} partition {POISON_PARTITION} offsets" in why and "RecordTooLargeException" in why
    assert f'recover_skip_records (records: ["{source}:' in why
    assert "AGAIN" in plan["summary"]
    assert plan["largest_records"][0] == {"record": f"{source}:{POISON_PARTITION}:{poison_offset}",
                                          "bytes": len(poison[0]) + len(poison[1])}
    tried = run_dag("recover_restart_app", catalog_file, app="oplog-router", dry_run=False)
    assert tried.state == "failed", tried.task_states
    poll_until(lambda: runtime.state() == "failed" and runtime.driver().launched_by == tried.run_id, timeout=120,
               what="the router restarted by the operator to fail again")

    # The documented way out: skip exactly that record (a dry run first: what and where it is, and
    # what a team reading the contacts output will never receive).
    commit_offsets(admin, "analytics-team", {(contacts, p): high for p, (_, high) in end_offsets(kafka, contacts).items()})
    record = f"{source}:{POISON_PARTITION}:{poison_offset}"
    dry = run_dag("recover_skip_records", catalog_file, dry_run=True, app="oplog-router", records=[record],
                  note="OPS-7 too big for contacts")
    assert dry.task_states == {"plan": "success", "approve": "skipped", "apply": "skipped", "verify": "skipped"}
    assert dry.xcoms["plan"]["downstream"]["lines"] == [
        f"group analytics-team on {contacts}: never receives the outputs of 1 input record(s)",
        f"no consumer group outside the suite reads {', '.join(sorted(set(spec.outputs.values()) - {contacts}))}"]
    (shown,) = dry.xcoms["plan"]["shown"]
    assert (shown["partition"], shown["offset"], shown["key"]) == (POISON_PARTITION, poison_offset, "u1")
    assert shown["size"] > 48000 and shown["preview"].startswith('{"seq": 106, "user_id": "u1", "op_type": "BLOCK_CONTACT"')
    assert shown["batch"] == f"route: batch {failed['batch']} (planned, not committed)"
    assert AppRuntime(spec.checkpoint_location()).skip_records() == [] and runtime.state() == "failed"
    skipped = run_dag("recover_skip_records", catalog_file, app="oplog-router", records=[record],
                      note="OPS-7 too big for contacts", dry_run=False)
    assert skipped.state == "success", skipped.task_states
    assert steps_of(skipped.run_id) == [("plan", "done"), ("apply", "done"), ("verify", "done")]
    assert backup_info(Path(skipped.xcoms["apply"]["backup"]))["label"] == "before-skip"
    assert skipped.xcoms["verify"]["dead_lettered"] == 1 and runtime.state() == "running"
    healthy = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert healthy.state == "success" and _health(healthy)["state"] == "healthy"  # the operator's restart reset the guard

    produce_to_partitions(kafka, source, range(300, 320))  # and the app runs on
    expected, got = routed_except(broker.client_config, spec, {poison_id})
    assert set(got) - expected == set(), "output records no input explains (the poison must not be routed)"
    duplicates = {pair: n - 1 for pair, n in got.items() if n > 1}
    reason = f"skipped by operator dag_test (run {skipped.run_id}): OPS-7 too big for contacts"
    letters = read_all(kafka, spec.dead_letter_topic)
    assert [(v["reason"], v["source"]["topic"], v["source"]["partition"], v["source"]["offset"])
            for v in (json.loads(r.value) for r in letters)] == [(reason, source, POISON_PARTITION, poison_offset)]
    assert letters[0].key == b"u1"
    print(f"skip of {record}: {len(expected)} routed records, none lost, exactly 1 dead letter (the skipped record), "
          f"{sum(duplicates.values())} duplicates (from the failed attempts of batch {failed['batch']}): {sorted(duplicates)}")
    runtime.request_stop(by="test")
    poll_until(lambda: not runtime.is_running(), timeout=120, what="the driver to stop")


def test_a_driver_frozen_with_sigstop_is_reported_stalled(run_dag, app_env, app_catalog, broker, capfd, monkeypatch):
    from streamops.loadgen import LoadSpec
    from streamops.loadgen import run as run_load

    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    # A long lease: the frozen driver keeps it, as a hung driver on another host would for its ttl.
    monkeypatch.setenv("STREAMOPS_LEASE_TTL_S", "900")
    _with_policy(app_catalog, catalog_file, stall_after_triggers=2, stall_min="1 second")
    deployed = run_dag("deploy_apps", catalog_file, apps=["oplog-router"])
    assert deployed.state == "success", deployed.task_states
    run_load(spec, LoadSpec(count=200, keys=10, seed=3), broker.client_config)
    poll_until(lambda: (p := runtime.progress().get("route")) is not None and p.input_rows > 0,
               timeout=120, what="a batch with data")
    group = runtime.driver().process_group
    os.killpg(group, signal.SIGSTOP)  # spark-submit, its JVM and the Python driver
    try:
        run_load(spec, LoadSpec(count=200, keys=10, seed=4), broker.client_config)
        from streamops.app_status import app_status
        from streamops.supervision import evaluate as health_of

        spec_now = load_catalog(catalog_file).app("oplog-router")
        poll_until(lambda: health_of(spec_now, app_status(spec_now, broker.client_config), runtime).state == "stalled",
                   timeout=120, what="the frozen router to count as stalled")
        capfd.readouterr()
        result = run_dag("app_status", catalog_file, apps=["oplog-router"])
        said = capfd.readouterr().out
        assert result.state == "failed" and runtime.is_running()  # the lease is held: not a crash, no restart
        assert "1 streaming app(s) need attention: oplog-router (stalled)" in said
        evidence = _health(result)["evidence"]
        assert re.match(r"query route: no completed batch for \d+s while \d+ record\(s\) wait \(stalled after 4s: 2 trigger "
                        r"intervals of 2 seconds, at least 1 second\); last batches route #\d+; its driver's last heartbeat was "
                        r"\d+s ago", evidence), evidence
        assert runtime.restarts() == []
    finally:
        os.killpg(group, signal.SIGCONT)
    runtime.request_stop(by="test")
    poll_until(lambda: not runtime.is_running(), timeout=120, what="the driver to stop")
