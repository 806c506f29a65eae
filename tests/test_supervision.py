"""Supervision: desired state, health, the supervisor's restarts and its crash-loop guard, metrics.

The decisions are pure functions tested first (no broker); then, on a real broker with real
drivers and real Airflow task runs: kill -9 -> the status run fails naming the app and the
supervisor restarts it; a poison record -> restarts with backoff, then the guard leaves the app
down and the status names the batch and offsets; a driver frozen with SIGSTOP -> stalled.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from streamops.app_runtime import AppRuntime
from streamops.app_status import AppStatus, PartitionLag
from streamops.audit import read_audit
from streamops.catalog import SupervisionSpec, load_catalog
from streamops.kafka_records import end_offsets, produce
from streamops.supervision import evaluate, restart_decision
from streamops.waiting import poll_until

T0 = datetime(2026, 11, 24, 3, 0, tzinfo=timezone.utc)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def restarted(seconds: float, outcome: str = "started") -> dict:
    return {"at": at(seconds), "outcome": outcome}


# --- the decisions, as pure functions ----------------------------------------------------------------


def test_first_restart_is_at_once_later_ones_back_off_exponentially_up_to_the_cap():
    policy = SupervisionSpec(backoff_initial="10 seconds", backoff_max="25 seconds", max_restarts=5)
    assert restart_decision(policy, [], None, T0).action == "restart"
    one = [restarted(0)]
    waiting = restart_decision(policy, one, None, T0 + timedelta(seconds=9))
    assert (waiting.action, waiting.attempt, waiting.backoff_s, waiting.not_before) == ("wait", 2, 10, at(10))
    assert waiting.reason == f"restart 2 waits for its backoff of 10s: not before {at(10)}"
    assert restart_decision(policy, one, None, T0 + timedelta(seconds=10)).action == "restart"
    two = [*one, restarted(10)]
    assert restart_decision(policy, two, None, T0 + timedelta(seconds=29)).not_before == at(30)  # 20 s after the 2nd
    three = [*two, restarted(30)]
    assert restart_decision(policy, three, None, T0 + timedelta(seconds=31)).backoff_s == 25  # 40 s, capped


def test_the_guard_gives_up_at_its_limit_within_the_window_and_an_operator_action_resets_it():
    policy = SupervisionSpec(backoff_initial="1 second", max_restarts=2, restart_window="10 minutes")
    two = [restarted(0), restarted(60, "failed")]  # a failed start counts too
    gave_up = restart_decision(policy, two, None, T0 + timedelta(seconds=120))
    assert gave_up.action == "give up"
    assert gave_up.reason == (f"crash loop: restarted 2 time(s) within 10 minutes (the guard's limit is 2; the last at "
                              f"{at(60)}): it stays down until an operator acts")
    # Restarts older than the window no longer count; nor do those before an operator's deploy.
    assert restart_decision(policy, two, None, T0 + timedelta(seconds=601)).action == "restart"
    assert restart_decision(policy, two, at(90), T0 + timedelta(seconds=120)).attempt == 1
    assert restart_decision(SupervisionSpec(restart="never"), [], None, T0).action == "none"
    # Once the guard gave up, the app stays down however old the restarts get, until an operator acts.
    tripped = [*two, {"at": at(120), "outcome": "gave up", "restarts": 2}]
    later = restart_decision(policy, tripped, None, T0 + timedelta(days=2))
    assert later.action == "give up" and later.reason.startswith(f"crash loop: the guard gave up at {at(120)} after 2 restart(s)")
    assert restart_decision(policy, tripped, at(200), T0 + timedelta(days=2)).action == "restart"


def test_the_catalog_refuses_a_backoff_cap_below_its_start(tmp_path):
    with pytest.raises(ValueError, match=r"backoff_max \(1 second\) is shorter than backoff_initial \(2 minutes\)"):
        SupervisionSpec(backoff_max="1 second")


def _status(**fields) -> AppStatus:
    base = {"app": "router", "state": "running", "version": "1.0.0", "pid": 4242, "driver_host": "host-a",
            "started_at": at(0), "last_progress_at": at(100), "batches": {"route": 7},
            "queries": {"route": {"published_at": at(100)}}}
    return AppStatus(**{**base, **fields})


@pytest.fixture
def router(tmp_path):
    spec = load_catalog().app("oplog-router").model_copy(update={"checkpoint": str(tmp_path / "cp")})
    runtime = AppRuntime(spec.checkpoint_location())
    runtime.set_desired("running", run_id="manual__1", by="alice", version="1.0.0")
    return spec, runtime


def test_health_tells_a_stop_from_a_crash_and_names_the_evidence(router):
    spec, runtime = router
    crashed = evaluate(spec, _status(state="crashed", reason="the driver (pid 4242 on host-a) stopped heartbeating"), runtime, T0)
    assert crashed.state == "crashed" and crashed.needs_someone
    assert crashed.evidence.startswith("should be running (version 1.0.0, asked for by alice (run manual__1) at ")
    assert "its driver is crashed (pid 4242, ended unrecorded): the driver (pid 4242 on host-a) stopped heartbeating." \
        in crashed.evidence
    runtime.set_desired("stopped", run_id="manual__2", by="bob")
    stopped = evaluate(spec, _status(state="stopped", reason="stop requested"), runtime, T0)
    assert stopped.state == "stopped" and not stopped.needs_someone
    assert stopped.evidence.startswith("stopped on purpose by bob (run manual__2) at ")
    runtime.begin_operation("manual__3", "roll_restart_apps roll")
    runtime.set_desired("running", run_id="manual__3", by="carol")
    assert evaluate(spec, _status(state="stopped"), runtime, T0).state == "in operation"
    runtime.end_operation("manual__3")
    assert evaluate(spec, _status(state="stopped"), runtime, T0).state == "crashed"
    # A run that failed while changing the app holds it: nobody restarts a half-changed checkpoint.
    runtime.begin_operation("manual__4", "recover_reset_offsets apply")
    runtime.fail_operation("manual__4", "LaunchError: the driver exited")
    held = evaluate(spec, _status(state="stopped"), runtime, T0)
    assert held.state == "held" and held.needs_someone and held.decision is None
    assert held.evidence.startswith("recover_reset_offsets apply (run manual__4) failed at ")
    assert ("while changing it: LaunchError: the driver exited. It is stopped now, and its checkpoint may be half-changed, "
            "so the supervisor does not restart it. Read that run's log; it took no checkpoint backup;") in held.evidence
    runtime.set_desired("running", run_id="manual__5", by="dave")  # an operator's start clears it
    assert runtime.operation() is None


def test_a_failed_start_is_a_crash_and_an_app_started_before_supervision_is_not_restarted_by_guesswork(router, tmp_path):
    spec, runtime = router
    never = evaluate(spec, _status(state="never started", pid=None), runtime, T0)
    assert never.state == "crashed" and never.decision.action == "restart"
    assert "but no driver of it ever started: its start failed (see the log of run manual__1)." in never.evidence
    legacy = AppRuntime(tmp_path / "legacy")
    legacy.dir.mkdir(parents=True)
    legacy.driver_file.write_text('{"app": "router", "version": "1.0.0", "launched_by": "manual__0", "started_at": "x"}')
    guessed = evaluate(spec, _status(state="crashed"), legacy, T0)
    assert guessed.state == "crashed" and guessed.decision.action == "none"
    assert "its desired state was never recorded (it was started before supervision)" in guessed.evidence
    assert "asked for by nobody on record: inferred from its last driver (run manual__0" in guessed.evidence


def test_one_run_at_a_time_changes_an_app_and_only_an_operator_takes_over_a_failed_one(router):
    from streamops.app_runtime import OperationInProgress
    from streamops.dag_tasks import is_refusal

    _, runtime = router
    runtime.begin_operation("manual__roll", "roll_restart_apps roll")
    with pytest.raises(OperationInProgress, match=r"is being changed by another run: roll_restart_apps roll \(run manual__roll, since "):
        runtime.begin_operation("scheduled__status", "supervisor restart")
    runtime.fail_operation("manual__roll", "RolloutFailed: the rollback did not start")
    with pytest.raises(OperationInProgress, match=r"is held: roll_restart_apps roll \(run manual__roll\) failed while changing it"):
        runtime.begin_operation("scheduled__status", "supervisor restart")  # the supervisor never takes it over
    failed = runtime.operation()
    taken = runtime.begin_operation("manual__replay", "recover_replay_dead_letters apply", over_failed=True)
    assert taken == failed and runtime.operation()["run_id"] == "manual__replay"
    runtime.end_operation("manual__replay", restore=taken)  # refused, or a dry run: the hold stands
    assert runtime.operation() == failed
    # A run whose process died without ending its operation counts as failed.
    runtime.set_desired("running", run_id="manual__6", by="erin")
    runtime.operation_file.write_text(json.dumps({"run_id": "manual__7", "what": "recover_restore_checkpoint apply",
                                                  "host": socket.gethostname(), "pid": 2 ** 22 + 17, "pid_created": 1.0,
                                                  "started_at": at(0)}))
    assert runtime.operation()["failed_at"] == "unknown" and "ended without finishing it" in runtime.operation()["error"]
    assert is_refusal(RuntimeError("rolling restart refused: oplog-router is stateful")) and is_refusal(OperationInProgress("x"))
    assert not is_refusal(ConnectionRefusedError(111, "Connection refused"))


def test_a_guard_that_could_never_trip_is_refused_by_the_catalog():
    with pytest.raises(ValueError, match=r"max_restarts 8 cannot happen within restart_window \(1 hour\): their backoffs "
                                         r"\(from 2 minutes, at most 30 minutes, each at least the supervisor's 120 s\) add up "
                                         r"to 7200 s, so the crash-loop guard would never trip"):
        SupervisionSpec(max_restarts=8)


def test_stalled_lagging_and_degraded_are_told_apart(router):
    spec, runtime = router  # trigger 2 seconds; stalled after 10 triggers, at least 1 minute
    waiting = [PartitionLag("route", "ops", 0, 10, 110, 100, 90.0)]
    stalled = evaluate(spec, _status(lags=waiting, heartbeat_age_s=80.0, lease_ttl_s=30.0), runtime, T0 + timedelta(seconds=190))
    assert stalled.state == "stalled"
    assert stalled.evidence.startswith("query route: no completed batch for 90s while 100 record(s) wait (stalled after 60s: "
                                       "10 trigger intervals of 2 seconds, at least 1 minute); last batches route #7; its "
                                       "driver's last heartbeat was 80s ago (lease ttl 30s) (driver pid 4242 on host-a).")
    # Records that arrived after a long idle spell: waiting 5 s is not a stall; nor, when their age
    # cannot be read, after a recent "nothing to read" from Spark.
    fresh = [PartitionLag("route", "ops", 0, 10, 110, 100, 5.0)]
    assert evaluate(spec, _status(lags=fresh), runtime, T0 + timedelta(seconds=3600)).state == "healthy"
    unread = [PartitionLag("route", "ops", 0, 10, 110, 100, None)]
    assert evaluate(spec, _status(lags=unread, last_idle_at=at(3590)), runtime, T0 + timedelta(seconds=3600)).state == "healthy"
    assert evaluate(spec, _status(lags=unread, last_idle_at=at(3000)), runtime, T0 + timedelta(seconds=3600)).state == "stalled"
    old = [PartitionLag("route", "ops", 3, 10, 110, 100, 400.0)]
    lagging = evaluate(spec, _status(lags=old, last_progress_at=at(399), queries={"route": {"published_at": at(399)}}), runtime, T0 + timedelta(seconds=400))
    assert lagging.state == "lagging"
    assert lagging.evidence == ("the oldest unprocessed record is 6m40s old (limit 5 minutes), on ops partition 3 at offset "
                                "10; 100 record(s) wait.")
    degraded = evaluate(spec, _status(dead_letters_last_batch=30, input_rows_last_batch=100, progress_age_s=1.0), runtime,
                        T0 + timedelta(seconds=101))
    assert degraded.state == "degraded" and degraded.dead_letter_rate == 0.3
    assert degraded.evidence == (f"30 of the last batch's 100 input record(s) went to the dead-letter topic "
                                 f"{spec.dead_letter_topic} (30.0%, limit 5.0%).")
    assert evaluate(spec, _status(dead_letters_last_batch=3, input_rows_last_batch=100), runtime,
                    T0 + timedelta(seconds=101)).state == "healthy"
    # A rate is judged while the batch is recent: one bad batch before a quiet night is history.
    assert evaluate(spec, _status(dead_letters_last_batch=30, input_rows_last_batch=100, progress_age_s=3600.0), runtime,
                    T0 + timedelta(seconds=3700)).state == "healthy"


# --- on real components ---------------------------------------------------------------------------------


def _with_policy(catalog, catalog_file: Path, **policy):
    """The catalog with the router's supervision set to `policy`, written where the DAGs read it."""
    updated = catalog.model_copy(update={"apps": [
        a.model_copy(update={"supervision": SupervisionSpec(**policy)}) if a.name == "oplog-router" else a for a in catalog.apps]})
    catalog_file.write_text(updated.to_yaml())
    return updated


def _health(result, app="oplog-router") -> dict:
    return result.xcoms["status"][app]["health"]


def test_supervisor_restarts_a_killed_app_then_backs_off_and_its_guard_stops_a_crash_loop(
    run_dag, app_env, app_catalog, broker, admin, capfd, monkeypatch
):
    from test_skip_records import NOT_CONTACTS, POISON_PARTITION, event, produce_to_partitions, routed_except, \
        with_small_output_topic

    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    source, contacts = spec.inputs["operations"], spec.outputs["contacts"]
    catalog = with_small_output_topic(app_catalog, admin, catalog_file, contacts, 20000)
    catalog = _with_policy(catalog, catalog_file, backoff_initial="1 second", max_restarts=3)
    kafka = broker.client_config
    produce_to_partitions(kafka, source, range(1, 41))
    deployed = run_dag("deploy_apps", catalog_file, apps=["oplog-router"], version="1.0.7")
    assert deployed.state == "success", deployed.task_states
    assert runtime.desired()["state"] == "running" and runtime.desired()["by"] == "dag_test"
    routed_except(broker, spec, set())

    # The metrics endpoint's figures for the running app, with the labels Prometheus alerts use.
    from streamops.metrics import render

    text = render(catalog, kafka).decode()
    assert 'streamops_app_state{app="oplog-router"} 0.0' in text
    assert 'streamops_app_up{app="oplog-router"} 1.0' in text
    # (prometheus_client writes the labels in name order)
    assert f'streamops_app_offset_lag{{app="oplog-router",partition="{POISON_PARTITION}",query="route",topic="{source}"}} 0.0' \
        in text, text
    assert f'streamops_app_time_lag_seconds{{app="oplog-router",partition="0",query="route",topic="{source}"}} 0.0' in text
    assert re.search(r'streamops_app_processed_rows_per_second\{app="oplog-router",query="route"\} [0-9.e+]+', text)
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
    assert (audited["dag_id"], audited["user"], audited["step"], audited["outcome"]) == ("app_status", "supervisor", "restart", "done")
    assert audited["app"] == "oplog-router" and audited["restart"]["attempt"] == 1

    # A poison record (valid, but too big for the contacts topic) fails every batch that holds it.
    noise = __import__("base64").b64encode(__import__("random").Random(7).randbytes(36000)).decode()
    poison_offset = end_offsets(kafka, source)[POISON_PARTITION][1] + 3
    produce(kafka, source, [*(event(s, op_types=NOT_CONTACTS) for s in range(100, 103)),
                            event(103, "BLOCK_CONTACT", note=noise)], partition=POISON_PARTITION)
    poll_until(lambda: runtime.state() == "failed", timeout=180, what="the router to fail on the poison record")
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

    # A longer backoff: the supervisor waits, and says until when.
    _with_policy(catalog, catalog_file, backoff_initial="10 minutes", backoff_max="1 hour", max_restarts=3)
    waiting = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert waiting.state == "failed" and runtime.state() == "failed"
    assert re.fullmatch(r"restart 3 waits for its backoff of 1200s: not before \S+Z", _health(waiting)["action"])
    assert [r["attempt"] for r in runtime.restarts()] == [1, 2]

    # The guard: at its limit, the app stays down and the run fails saying so, naming the batch.
    _with_policy(catalog, catalog_file, backoff_initial="1 second", max_restarts=2, max_dead_letter_rate=1)
    capfd.readouterr()
    looped = run_dag("app_status", catalog_file, apps=["oplog-router"])
    said = capfd.readouterr().out
    assert looped.state == "failed" and runtime.state() == "failed" and _health(looped)["state"] == "crash-loop"
    assert "1 streaming app(s) need attention: oplog-router (crash-loop)" in said
    failed = runtime.driver().failed_batches[0]
    assert f"query route failed on batch {failed['batch']} ({source} partition {POISON_PARTITION} offsets" in said
    assert "crash loop: restarted 2 time(s) within 1 hour (the guard's limit is 2;" in said
    assert "it stays down until an operator acts" in said and "recover_skip_records" in said and "recover_reset_offsets" in said
    assert [r.get("attempt") for r in runtime.restarts()] == [1, 2, None]  # and the guard's "gave up"
    assert [(e["step"], e["outcome"]) for e in read_audit(run_id=looped.run_id)] == [("crash-loop guard", "gave up")]
    # It stays down: even with a roomier policy, nothing restarts it until an operator acts.
    _with_policy(catalog, catalog_file, backoff_initial="1 second", max_restarts=5, max_dead_letter_rate=1)
    still = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert _health(still)["state"] == "crash-loop" and runtime.state() == "failed" and len(runtime.restarts()) == 3
    text = render(load_catalog(catalog_file), kafka).decode()
    assert 'streamops_app_state{app="oplog-router"} 8.0' in text and 'streamops_app_restarts_total{app="oplog-router"} 2.0' in text
    assert 'streamops_app_needs_attention{app="oplog-router"} 1.0' in text

    # The documented way out: skip the record; the restart (an operator's action) resets the guard.
    record = f"{source}:{POISON_PARTITION}:{poison_offset}"
    skipped = run_dag("recover_skip_records", catalog_file, app="oplog-router", records=[record], note="OPS-9", dry_run=False)
    assert skipped.state == "success", skipped.task_states
    healthy = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert healthy.state == "success" and _health(healthy)["state"] == "healthy"
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
    poll_until(lambda: (runtime.progress().get("route") or {}).get("input_rows", 0) > 0, timeout=120, what="a batch with data")
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
