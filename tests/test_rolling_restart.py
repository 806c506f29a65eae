"""roll_restart_apps end to end: zero loss under load, a version that cannot start refused before
anything stops, scheduled snapshots of a running stateful app and a restore from one, a stateful
change refused by Spark's own check (its standby sent away), all as real Airflow task runs with
real detached drivers."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import psutil
import pytest
import yaml

from streamops.app_runtime import AppRuntime
from streamops.artifacts import build
from streamops.audit import read_audit
from streamops.checkpoints import backup_info, backup_path, batch_marks, batch_offsets, list_backups, query_dir
from streamops.kafka_records import read_all
from streamops.loadgen import LoadSpec, background_load
from streamops.snapshots import holds as snapshot_holds
from streamops.state_page import run_state_read
from streamops.state_query import StateRequest
from streamops.waiting import DeadlineExceeded, poll_until
from tests.support.artifacts import presence_source_counting_by_length, same_code_as
from tests.support.routes import wait_until_all_routed

# Rolls, a roll's catch-up under load, snapshots and a restore, each waiting on a deadline of its own.
pytestmark = pytest.mark.timeout(1500)


def test_roll_under_load_loses_nothing_and_a_version_that_cannot_start_is_refused_before_anything_stops(
        run_dag, app_env, app_catalog, broker, capfd, monkeypatch):
    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    assert run_dag("deploy_apps", catalog_file, apps=["oplog-router"], version="1.0.0").state == "success"
    first_pid = runtime.driver().pid

    with background_load(spec, LoadSpec(count=200_000, keys=40, rate=300, seed=21), broker.client_config) as load:
        poll_until(lambda: (p := runtime.progress().get("route")) is not None and p.input_rows > 0,
                   timeout=120, what="the router to see load")
        same_code_as(spec, "1.1.0")
        rolled = run_dag("roll_restart_apps", catalog_file, apps=["oplog-router"], version="1.1.0", gate_deadline_s=120)
        under_load = load.is_alive()  # the producer was still writing when the roll finished
    assert rolled.state == "success", rolled.task_states
    (summary,) = rolled.xcoms["roll"]
    assert summary["version"] == "1.1.0" and summary["previous_version"] == "1.0.0"
    assert runtime.driver().version == "1.1.0" and runtime.driver().pid != first_pid
    # 1.1.0 started as a warm standby (session built, plan rehearsed) and took over on the word.
    new_log = Path(runtime.driver().driver_log).read_text()
    assert f"go from {rolled.run_id}" in new_log and "s (query route, the Kafka producer)" in new_log
    (audited,) = read_audit(run_id=rolled.run_id)
    assert (audited["step"], audited["outcome"], audited["app"]) == ("roll", "done", "oplog-router")
    assert under_load, "the load ended before the roll: it was not a restart under load"
    print(f"roll-restart downtime: {summary['downtime_s']} s")
    routing = wait_until_all_routed(broker.client_config, spec)
    expected, duplicates = routing.expected, routing.duplicates
    print(f"rolling restart under load: {len(expected)} routed records, none lost, {duplicates} duplicates")

    # A broken new version: its plan builds, but its queries cannot start.
    good_pid = runtime.driver().pid
    backups_before = list_backups(spec.checkpoint_location())
    capfd.readouterr()
    # The trigger allow-list refuses values that break an app (streamops.launch_overrides); this
    # check needs a version that cannot start, so one bound is widened for this test only.
    from streamops.launch_overrides import ALLOWED_SPARK_CONF, ConfKey

    monkeypatch.setitem(ALLOWED_SPARK_CONF, "spark.sql.streaming.minBatchesToRetain",
                        ConfKey("spark.sql.streaming.minBatchesToRetain", "count", "widened by this test", 0, 10000))
    same_code_as(app_catalog.app("oplog-router"), "1.2.0")
    broken = run_dag(
        "roll_restart_apps", catalog_file, apps=["oplog-router"], version="1.2.0",
        spark_conf={"spark.sql.streaming.minBatchesToRetain": 0}, gate_deadline_s=60,
    )
    assert broken.state == "failed"
    out = capfd.readouterr().out
    # Its standby's check starts its query on a copy of the checkpoint: Spark cannot start it, so
    # the roll is refused before the running version is touched (a gate failure's rollback:
    # test_bring_your_own_app.py).
    assert ("oplog-router: the new version cannot restart from the running version's checkpoint, so nothing was stopped"
            in out), out[-3000:]
    assert "query 'route': Spark's check could not judge" in out and "minBatchesToRetain has to be positive" in out
    (audited,) = read_audit(run_id=broken.run_id)
    assert (audited["step"], audited["outcome"]) == ("roll", "refused")
    record = runtime.driver()
    assert runtime.state() == "running" and record.version == "1.1.0" and record.pid == good_pid
    assert list_backups(spec.checkpoint_location()) == backups_before
    assert run_dag("stop_apps", catalog_file, apps=["oplog-router"]).state == "success"


def test_presence_notifier_rolled_under_load_notifies_every_close_and_a_stateful_change_is_refused(
        run_dag, app_env, app_catalog, broker, tmp_path, capfd, caplog):
    catalog_file, _ = app_env
    spec = app_catalog.app("presence-notifier")
    runtime = AppRuntime(tmp_path / "checkpoints" / "presence-notifier")
    assert run_dag("deploy_apps", catalog_file, apps=["presence-notifier"]).state == "success"
    with background_load(spec, LoadSpec(count=200_000, keys=30, rate=200, seed=4), broker.client_config) as load:
        poll_until(lambda: (p := runtime.progress().get("notify")) is not None and p.input_rows > 0,
                   timeout=180, what="notify to see load")
        same_code_as(spec, "3.1.0")
        rolled = run_dag("roll_restart_apps", catalog_file, apps=["presence-notifier"], version="3.1.0", gate_deadline_s=180)
        under_load = load.is_alive()
    assert rolled.state == "success", rolled.task_states
    assert under_load
    print(f"presence roll-restart downtime: {rolled.xcoms['roll'][0]['downtime_s']} s")

    closes = {
        f"{r.topic}/{r.partition}/{r.offset}"
        for r in read_all(broker.client_config, spec.inputs["events"])
        if r.json()["action"] == "Close"
    }
    notified: list[str] = []

    def every_close_notified() -> bool:
        notifications = (r.json() for r in read_all(broker.client_config, spec.outputs["notifications"]))
        notified[:] = [n["source_event_id"] for n in notifications if n["cause"] == "close"]
        return closes <= set(notified)

    try:
        poll_until(every_close_notified, timeout=480, what="a notification for every Close", max_interval=2)
    except DeadlineExceeded:
        raise AssertionError(_unnotified(closes - set(notified), len(closes), runtime)) from None
    print(f"presence roll under load: {len(closes)} Close events, all notified, {len(notified) - len(set(notified))} duplicates")

    # On-call reads one user's state while the rolled app runs (the apps page's read: Spark's state
    # data source in a child process): as of its batch, the user's presence history ends with the
    # latest presence event that batch had read, and holds nothing that was not read.
    driver = runtime.driver()
    events = [r for r in read_all(broker.client_config, spec.inputs["events"])]
    user = events[-1].json()["user_id"]
    answer = run_state_read("presence-notifier", StateRequest(key=user, limit=100))
    stores = {(store["query"], store["operator"]): store for store in answer["stores"]}
    # count keeps the notification ids it has seen (keyed by id: none is the user's) and the windows.
    assert set(stores) == {("notify", "flatMapGroupsWithState"), ("count", "dedupeWithinWatermark"),
                           ("count", "stateStoreSave")}, answer
    notify = stores["notify", "flatMapGroupsWithState"]
    assert len(notify["rows"]) == 1, notify
    (row,) = notify["rows"]
    assert row["key"] == {"user_id": user}
    ends = batch_offsets(query_dir(spec.checkpoint_location(), "notify"), notify["batch_id"])[spec.inputs["events"]]
    read_by_then = sorted((_ms(r.json()["event_time"]), r.json()["action"], f"{r.topic}/{r.partition}/{r.offset}")
                          for r in events if r.json()["user_id"] == user and r.offset < ends[r.partition])
    history = [(e["time_ms"], e["action"], e["event_id"]) for e in row["value"]["groupState"]["history"]]
    latest = [e for e in read_by_then if e[0] == read_by_then[-1][0]]  # the newest time (a tie in a millisecond: any)
    assert history and history[-1] in latest and set(history) <= set(read_by_then), (history[-3:], read_by_then[-3:])
    windows = stores["count", "stateStoreSave"]["rows"]
    assert windows and all(r["key"]["user_id"] == user for r in windows)
    assert runtime.state() == "running" and runtime.driver().pid == driver.pid  # not paused, not restarted
    print(f"presence state of {user} as of batch {notify['batch_id']}: {len(history)} history entries, "
          f"{len(windows)} count windows")

    _scheduled_snapshots_of_the_running_app(run_dag, catalog_file, spec, runtime, broker, capfd, caplog)

    # A stateful change (version 4.0.0 counts per another key) is refused by Spark's own check, on a
    # copy of the running checkpoint in the new version's warm standby, before the running app is
    # touched; the standby is sent away: no driver of it is left waiting.
    running, backups_before = runtime.driver(), list_backups(spec.checkpoint_location())
    build("presence-notifier", "4.0.0", spec.program, source=presence_source_counting_by_length(tmp_path))
    capfd.readouterr()
    refused = run_dag("roll_restart_apps", catalog_file, apps=["presence-notifier"], version="4.0.0")
    assert refused.state == "failed"
    out = capfd.readouterr().out
    assert ("presence-notifier: the new version cannot restart from the running version's checkpoint, so nothing was stopped"
            in out)
    assert ("query 'count': Spark refuses to restart it from the running version's checkpoint: Provided key schema does not "
            "match existing state key schema.") in out, out[-3000:]
    assert "(STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE)" in out and "query 'notify'" not in out  # notify's state carries over
    assert runtime.state() == "running" and runtime.driver().pid == running.pid
    assert list_backups(spec.checkpoint_location()) == backups_before
    (standby_log,) = [log for log in runtime.logs_dir.glob("driver-*.log")
                      if " --standby " in (text := log.read_text()) and " --version 4.0.0 " in text]
    said = standby_log.read_text()
    assert "not needed, exiting without starting: the rollout stopped: presence-notifier: the new version cannot" in said
    assert list((runtime.dir / "standby").iterdir()) == []
    # (The running driver started as the first roll's standby: only 4.0.0's would be left over.)
    assert not [p.pid for p in psutil.process_iter(["cmdline"])
                if {"--standby", "presence-notifier", "4.0.0"} <= set(p.info["cmdline"] or [])]
    assert run_dag("stop_apps", catalog_file, apps=["presence-notifier"]).state == "success"


def _unnotified(missing: set[str], closes: int, runtime: AppRuntime) -> str:
    """Why Close events went without a notification: read past by a committed batch (lost) or
    not read yet (the app behind, stopped or crashed), with the driver's own words."""
    notify = runtime.progress().get("notify")
    ends = (notify.end_offsets if notify else {}) or {}

    def read_past(event: str) -> bool:
        topic, partition, offset = event.rsplit("/", 2)
        return int(offset) < ends.get(topic, {}).get(partition, -1)

    lost = sorted(e for e in missing if read_past(e))
    driver = runtime.driver()
    log = runtime.driver_log()
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log else "(no driver log)"
    return (f"{len(missing)} of {closes} Close events without a notification: {len(lost)} read past by notify's "
            f"committed batch {notify.batch_id if notify else None} (lost: {lost[:5]}), the rest not read yet "
            f"({sorted(set(missing) - set(lost))[:5]}); app {runtime.state()}, driver {driver.pid if driver else None} "
            f"{driver.outcome if driver else ''} {driver.reason if driver else ''}; its log ends:\n{tail}")


def _ms(iso: str) -> int:
    return round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _scheduled_snapshots_of_the_running_app(run_dag, catalog_file, spec, runtime, broker, capfd, caplog):
    """snapshot_checkpoints on a policy (every batch; keep the last one, none for its age) copies
    the running notifier under load twice: the first copy is pruned by the second run, the roll's
    snapshot of 3.0.0 stays as the last good rollback. A restore from the live copy starts the app
    on it and continues its batches (Spark loads its state), the snapshot held for the restore."""
    checkpoint = spec.checkpoint_location()
    with_policy = yaml.safe_load(catalog_file.read_text())
    next(a for a in with_policy["apps"] if a["name"] == "presence-notifier")["snapshots"] = {
        "every_batches": 1, "keep_last": 1, "keep_for": "1 millisecond"}
    catalog_file.write_text(yaml.safe_dump(with_policy, sort_keys=False))
    (roll_snapshot,) = [p.name for p in list_backups(checkpoint)]
    assert roll_snapshot.endswith("-before-3.1.0")
    driver, outcomes = runtime.driver(), []
    with background_load(spec, LoadSpec(count=100_000, keys=30, rate=200, seed=5), broker.client_config):
        for _ in range(2):
            last = list_backups(checkpoint)[-1]
            poll_until(lambda last=last: batch_marks(checkpoint)["notify"] > (batch_marks(last)["notify"] or -1),
                       timeout=120, what="a batch committed since the last snapshot")
            run = run_dag("snapshot_checkpoints", catalog_file, apps=["presence-notifier"])
            assert run.state == "success", run.task_states
            (outcome,) = run.xcoms["apply_policies"]["apps"]
            assert outcome["taken"], outcome
            (audited,) = read_audit(run_id=run.run_id)
            assert (audited["step"], audited["outcome"], audited["snapshots_taken"]) == ("snapshot", "done", [outcome["taken"]])
            outcomes.append(outcome)
    taken = [o["taken"] for o in outcomes]
    assert outcomes[0]["removed"] == [] and outcomes[1]["removed"] == [taken[0]]
    assert [p.name for p in list_backups(checkpoint)] == [roll_snapshot, taken[1]]
    kept = {k["name"]: k["why"] for k in outcomes[1]["kept"]}
    assert kept == {roll_snapshot: ["the last good rollback: the newest snapshot of 3.0.0 "
                                    f"({_digest(checkpoint, roll_snapshot)}), the version before the running 3.1.0"],
                    taken[1]: ["one of the last 1"]}
    assert runtime.driver().pid == driver.pid and runtime.state() == "running"  # copied live, not paused

    newest = backup_path(checkpoint, taken[1])
    capfd.readouterr()
    caplog.clear()
    restored = run_dag("recover_restore_checkpoint", catalog_file, app="presence-notifier", snapshot=taken[1],
                       stop_if_running=True, dry_run=False)
    assert restored.state == "success", restored.task_states
    assert restored.xcoms["apply"]["restored_batches"] == batch_marks(newest)
    table = capfd.readouterr().out + caplog.text  # the plan's table, in its task's log
    assert f"-> {taken[1]}" in table and f"3.1.0 ({_digest(checkpoint, taken[1])})" in table, table[-3000:]
    assert runtime.state() == "running" and runtime.driver().pid != driver.pid
    assert snapshot_holds(checkpoint) == []  # the restore's hold ended with its apply
    print(f"scheduled snapshots under load: {taken[1]} kept, {taken[0]} pruned, {roll_snapshot} kept as the rollback; "
          f"restored {taken[1]} (batches {batch_marks(newest)})")


def _digest(checkpoint: str, snapshot: str) -> str:
    return backup_info(backup_path(checkpoint, snapshot))["code"]["digest"].removeprefix("sha256:")[:12]
