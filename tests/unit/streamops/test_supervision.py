"""The supervisor's decisions as pure functions: restart backoff and the crash-loop guard, health
from a status and the desired state, one run at a time. On real drivers: tests/test_supervision.py."""

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime, timedelta

import pytest

from streamops.app_runtime import AppRuntime
from streamops.app_status import AppStatus, PartitionLag, QueryWindow
from streamops.catalog import SupervisionSpec, load_catalog
from streamops.supervision import evaluate, restart_decision

T0 = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def restarted(seconds: float, outcome: str = "started") -> dict:
    return {"at": at(seconds), "outcome": outcome}


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
    from streamops.dag_tasks import is_refusal, task_failure
    from streamops.rollout import RolloutRefused

    _, runtime = router
    runtime.begin_operation("manual__roll", "roll_restart_apps roll")
    with pytest.raises(OperationInProgress,
                       match=r"is being changed by another run: roll_restart_apps roll \(run manual__roll, since "):
        runtime.begin_operation("scheduled__status", "supervisor restart")
    runtime.fail_operation("manual__roll", "RolloutFailed: the rollback did not start")
    with pytest.raises(OperationInProgress,
                       match=r"is held: roll_restart_apps roll \(run manual__roll\) failed while changing it"):
        runtime.begin_operation("scheduled__status", "supervisor restart")  # the supervisor never takes it over
    failed = runtime.operation()
    taken = runtime.begin_operation("manual__replay", "recover_replay_dead_letters apply", over_failed=True)
    assert taken == failed and runtime.operation().run_id == "manual__replay"
    runtime.end_operation("manual__replay", restore=taken)  # refused, or a dry run: the hold stands
    assert runtime.operation() == failed
    # A run whose process died without ending its operation counts as failed.
    runtime.set_desired("running", run_id="manual__6", by="erin")
    runtime.operation_file.write_text(json.dumps({"run_id": "manual__7", "what": "recover_restore_checkpoint apply",
                                                  "host": socket.gethostname(), "pid": 2 ** 22 + 17, "pid_created": 1.0,
                                                  "started_at": at(0)}))
    assert runtime.operation().failed_at == "unknown" and "ended without finishing it" in runtime.operation().error
    assert is_refusal(OperationInProgress("x")) and is_refusal(task_failure(RolloutRefused("oplog-router is stateful")))
    assert not is_refusal(RuntimeError("rolling restart refused: oplog-router is stateful"))  # its type says, not its text
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
    lagging = evaluate(spec, _status(lags=old, last_progress_at=at(399), queries={"route": {"published_at": at(399)}}),
                       runtime, T0 + timedelta(seconds=400))
    assert lagging.state == "lagging"
    assert lagging.evidence == ("the oldest unprocessed record is 6m40s old (limit 5 minutes), on ops partition 3 at offset "
                                "10; 100 record(s) wait.")
    # Dead letters over the health window, per query, judged once it holds enough records.
    degraded = evaluate(spec, _status(recent={"route": QueryWindow(300, batches=4, input_rows=200, dead_letters=30)}), runtime,
                        T0 + timedelta(seconds=101))
    assert degraded.state == "degraded" and degraded.dead_letter_rate == 0.15
    assert degraded.evidence == (f"query route: 30 of the 200 input record(s) of the last 5 minutes (4 batch(es)) went to the "
                                 f"dead-letter topic {spec.dead_letter_topic} (15.0%, limit 5.0%, judged from 100 records).")
    assert evaluate(spec, _status(recent={"route": QueryWindow(300, batches=4, input_rows=200, dead_letters=10)}), runtime,
                    T0 + timedelta(seconds=101)).state == "healthy"
    # One batch of two records, one of them bad, is no evidence of a degraded app.
    two = evaluate(spec, _status(recent={"route": QueryWindow(300, batches=1, input_rows=2, dead_letters=1)}), runtime,
                   T0 + timedelta(seconds=101))
    assert (two.state, two.dead_letter_rate) == ("healthy", 0.5)
    # Nothing in the window (a quiet night after a bad batch): nothing to judge.
    assert evaluate(spec, _status(recent={}), runtime, T0 + timedelta(seconds=3700)).state == "healthy"


def _late(*batches: tuple[int, int, int], watermark: str | None = None) -> QueryWindow:
    return QueryWindow(300, batches=len(batches), input_rows=sum(b[0] for b in batches), stateful=True,
                       dropped_by_watermark=sum(b[2] for b in batches), state_rows_updated=sum(b[1] for b in batches),
                       per_batch=list(batches), watermark=watermark)


def test_output_stopped_is_input_all_dropped_as_late_or_a_watermark_beyond_the_event_time_bound(tmp_path):
    spec = load_catalog().app("browser-activity")  # inputs bound 5 seconds ahead
    runtime = AppRuntime(tmp_path / "ckpt")
    runtime.set_desired("running", by="alice", run_id="deploy_1")
    now = T0 + timedelta(seconds=120)

    stopped = evaluate(spec, _status(recent={"window-count": _late((5, 0, 10), (3, 0, 6), watermark=at(100))}), runtime, now)
    assert stopped.state == "output stopped" and stopped.needs_someone
    assert stopped.evidence.startswith(
        f"query window-count: its last 2 batch(es) with input (within 5 minutes) read 8 record(s) and updated no state: all of "
        f"them dropped as late (16 late drop(s)); its watermark is {at(100)}, 20s behind now: its output stopped. "
        "Way back (docs/architecture.md "
        '"Input contract", event-time bounds): make sure the inputs\' max_future bound is on, then rebuild the state with '
        "recover_rebuild_state")
    hijacked = evaluate(spec, _status(recent={"window-count": _late((0, 0, 0), watermark="9999-12-31T23:59:49.999Z")}),
                        runtime, now)
    assert hijacked.state == "output stopped"
    assert hijacked.evidence.startswith("query window-count: its watermark is 9999-12-31T23:59:49.999Z, 7972 years ahead of "
                                        "now (the inputs' event-time bound allows 5s ahead, and 60s of clock skew): its "
                                        "output stopped.")
    # One batch of stragglers dropped as late, a watermark within the bound, a batch that updated
    # its windows, a stateless query: all healthy.
    # (After a batch that updated, the streak starts again: one late batch since is not enough.)
    assert evaluate(spec, _status(recent={"window-count": _late((5, 3, 0), (5, 0, 10), (3, 0, 6))}), runtime, now).state == \
        "output stopped"
    for window in (_late((5, 0, 10)), _late((0, 0, 0), watermark=at(150)), _late((5, 0, 10), (3, 2, 1)),
                   _late((5, 0, 0), (3, 0, 6)),  # a batch that dropped nothing (say, only dead letters)
                   _late((5, 0, 10), (3, 2, 1), (4, 0, 3)),
                   QueryWindow(300, batches=2, input_rows=8, per_batch=[(5, 0, 10), (3, 0, 6)])):
        assert evaluate(spec, _status(recent={"window-count": window}), runtime, now).state == "healthy", window


def test_the_supervisor_mode_picks_the_schedule_and_a_wrong_one_is_named(monkeypatch):
    from streamops.catalog import supervisor_mode, supervisor_schedule

    monkeypatch.delenv("STREAMOPS_SUPERVISOR", raising=False)
    assert (supervisor_mode(), supervisor_schedule()) == ("scheduled", timedelta(minutes=2))
    for mode in ("events", "manual"):
        monkeypatch.setenv("STREAMOPS_SUPERVISOR", mode)
        assert (supervisor_mode(), supervisor_schedule()) == (mode, None)
    monkeypatch.setenv("STREAMOPS_SUPERVISOR", "sometimes")
    with pytest.raises(ValueError, match="STREAMOPS_SUPERVISOR='sometimes': use one of scheduled, events, manual"):
        supervisor_mode()


def test_driver_exits_name_apps_that_ended_while_they_should_run_and_nothing_else(tmp_path, monkeypatch):
    """What the driver-exit trigger fires on, from the runtime files alone."""
    from streamops.supervision import driver_exits

    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path))
    catalog = load_catalog()
    router = AppRuntime(catalog.app("oplog-router").checkpoint_location())
    router.acquire({"app": "oplog-router", "version": "1.0.0"})
    router.set_desired("running", run_id="deploy_1", by="alice")
    assert driver_exits(catalog) == {}  # running
    router.release("failed", "query route failed: boom")
    (exit_,) = driver_exits(catalog).values()
    assert (exit_["app"], exit_["state"], exit_["pid"], exit_["reason"]) == ("oplog-router", "failed", os.getpid(),
                                                                            "query route failed: boom")
    router.set_desired("stopped", run_id="stop_1", by="alice")  # stopped on purpose: no exit to act on
    assert driver_exits(catalog) == {}


def test_the_driver_exit_trigger_fires_once_per_driver_that_ended(tmp_path, monkeypatch):
    import asyncio

    from streamops.triggers import DriverExitTrigger

    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path))
    monkeypatch.delenv("STREAMOPS_CATALOG", raising=False)
    router = AppRuntime(load_catalog().app("oplog-router").checkpoint_location())
    router.set_desired("running", run_id="deploy_1", by="alice")

    def a_driver_fails(reason: str) -> None:
        router.acquire({"app": "oplog-router", "version": "1.0.0"})
        router.release("failed", reason)

    trigger = DriverExitTrigger(poll_interval_s=0.05)
    assert trigger.serialize() == ("streamops.triggers.DriverExitTrigger", {"poll_interval_s": 0.05})

    async def scenario() -> list[dict]:
        events = trigger.run()
        a_driver_fails("first")
        first = await asyncio.wait_for(events.__anext__(), timeout=10)
        # The same ended driver, polled again and again: no second event.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(nxt := asyncio.ensure_future(events.__anext__())), timeout=0.5)
        a_driver_fails("second")  # a new driver (a new start) that ended too
        second = await asyncio.wait_for(nxt, timeout=10)
        await events.aclose()
        return [first.payload, second.payload]

    first, second = asyncio.run(scenario())
    assert (first["app"], first["reason"], second["reason"]) == ("oplog-router", "first", "second")
    assert second["lease_epoch"] == first["lease_epoch"] + 1


def test_an_app_whose_version_predates_the_platforms_driver_is_held_not_restarted(router, tmp_path, monkeypatch):
    """A restart of a version built for another driver protocol could never start (and each try
    would back the checkpoint up): the supervisor holds it and says the way forward."""
    from streamops.artifacts import ArtifactStore
    from streamops.supervision import act
    from tests.unit.streamops.driver.test_protocol import _publish

    spec, runtime = router
    monkeypatch.setenv("STREAMOPS_ARTIFACT_STORE", str(tmp_path / "store"))
    _publish(ArtifactStore(), "0.9.0")  # no driver_protocol: built when programs carried their own driver
    runtime.acquire({"app": "oplog-router", "version": "0.9.0", "launch": {"version": "0.9.0"}})
    runtime.release("failed", "query route failed: boom")
    health = evaluate(spec, _status(state="failed", pid=None, reason="query route failed: boom"), runtime, T0)
    assert health.state == "crashed" and health.decision.action == "restart"
    said: list[str] = []
    act(spec, health, runtime, run_id="scheduled__1", start=lambda *_: pytest.fail("no restart may start"), log=said.append)
    assert health.state == "held" and health.action == "held: its version cannot run on this platform's driver"
    assert "It is not restarted: oplog-router: artifact oplog-router 0.9.0 (sha256:" in health.evidence
    assert "roll_restart_apps to a rebuilt version (there is no rollback from this one), or stop_apps." in health.evidence
    assert runtime.restarts() == [] and said == ["oplog-router: held: its version cannot run on this platform's driver"]


def test_retention_risk_pages_before_unread_input_is_deleted_and_input_lost_holds_the_app(router):
    """A stopped app whose oldest unread input record has less runway than the catalog allows needs
    someone; input retention already deleted is 'input lost' (never restarted into failOnDataLoss)."""
    from streamops.retention import Runway

    spec, runtime = router
    spec = spec.model_copy(update={"supervision": spec.supervision.model_copy(update={"min_retention_runway": "10 minutes"})})
    runtime.set_desired("stopped", run_id="manual__2", by="bob")
    source = spec.inputs["operations"]
    plenty = Runway(source, 0, 40, 0, 60.0, 3_600_000)  # written a minute ago, an hour kept: 59 min left
    short = Runway(source, 3, 12, 0, 3_100.0, 3_600_000)  # 500 s left
    assert (plenty.runway_s, short.runway_s, short.lost) == (3540.0, 500.0, 0)
    assert evaluate(spec, _status(state="stopped", runways=[plenty]), runtime, T0).state == "stopped"
    risk = evaluate(spec, _status(state="stopped", runways=[plenty, short]), runtime, T0)
    assert risk.state == "retention risk" and risk.needs_someone
    assert (f"retention deletes input oplog-router has not processed in about 500 s: {source} partition 3, offset 12 "
            "(written 51 min ago, retention.ms 3,600,000); it pages below 10 min (the catalog's "
            "supervision.min_retention_runway)") in risk.evidence
    assert risk.evidence.startswith("stopped on purpose by bob")
    # A running app: the risk comes before its lag.
    running = evaluate(spec, _status(runways=[short]), runtime, T0)
    assert running.state == "retention risk"
    gone = Runway(source, 1, 100, 130, None, 3_600_000)
    lost = evaluate(spec, _status(state="crashed", runways=[plenty, gone]), runtime, T0)
    assert lost.state == "input lost" and lost.decision is None  # no restart decision: nothing restarts it
    assert lost.evidence.startswith(f"retention deleted input oplog-router had not processed: {source} partition 1 "
                                    "offsets 100-129 (30 records). Spark (failOnDataLoss) fails every start on it")


def test_the_default_runway_threshold_is_three_times_the_catch_up_at_the_best_rate():
    from streamops.retention import RUNWAY_FLOOR_S, threshold_s

    assert threshold_s(None, 1_800_000, 1000.0) == (5400.0, "3x the 30 min it needs to read its 1,800,000 waiting records "
                                                            "at 1,000/s (its best rate of the last hour), at least 30 min")
    assert threshold_s(None, 10, 1000.0)[0] == RUNWAY_FLOOR_S
    assert threshold_s(None, 10, None) == (RUNWAY_FLOOR_S, "no rate measured in the last hour: the floor of 30 min")
    assert threshold_s(120.0, 10, None) == (120.0, "the catalog's supervision.min_retention_runway")


def test_a_size_limit_pages_when_the_unread_bytes_will_reach_it_before_the_time_limit(router):
    """By size, the oldest unread record goes once the records after it reach retention.bytes: its
    runway is the difference at the rate the unread records were written; the shorter limit counts."""
    from streamops.retention import RECORD_OVERHEAD_BYTES, Runway, record_bytes

    spec, runtime = router
    spec = spec.model_copy(update={"supervision": spec.supervision.model_copy(update={"min_retention_runway": "10 minutes"})})
    runtime.set_desired("stopped", run_id="manual__3", by="bob")
    source = spec.inputs["operations"]
    # 250,000 bytes written over 100 s (2,500 bytes/s) against 1,000,000: 300 s; by time 3,500 s.
    by_size = Runway(source, 2, 40, 0, 100.0, 3_600_000, 1_000_000, 250_000, 1_000)
    assert (by_size.time_runway_s, by_size.size_runway_s, by_size.runway_s, by_size.limited_by) == (
        3500.0, 300.0, 300.0, "retention.bytes")
    assert Runway(source, 2, 40, 0, 100.0, None, 1_000_000, 1_000_001, 9).runway_s == 0.0  # over it already
    assert Runway(source, 2, 40, 0, 100.0, 3_600_000, 1_000_000, None, 9).limited_by == "retention.ms"  # not measured
    assert Runway(source, 2, 40, 0, None, None, 1_000_000, None, 0).runway_s is None  # nothing waits
    assert by_size.to_json()["runway_s"] == 300.0 and by_size.to_json()["limited_by"] == "retention.bytes"
    risk = evaluate(spec, _status(state="stopped", runways=[by_size]), runtime, T0)
    assert risk.state == "retention risk"
    assert (f"retention deletes input oplog-router has not processed in about 300 s: {source} partition 2, offset 40 "
            "(its 1,000 unread record(s), about 244.1 KiB written over 100 s, against retention.bytes 1,000,000 per "
            "partition); it pages below 10 min (the catalog's supervision.min_retention_runway). Start or speed up the "
            "app, or extend the inputs' retention with recover_extend_retention (approval required; retention.bytes is "
            "the limit here)") in risk.evidence
    assert record_bytes(b"k1", b"value", [("h", b"12")]) == RECORD_OVERHEAD_BYTES + 2 + 5 + 1 + 2
    assert record_bytes(None, None, None) == RECORD_OVERHEAD_BYTES
