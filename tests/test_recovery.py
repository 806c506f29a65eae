"""Recovery DAGs on a real broker, real Spark drivers and real Airflow task runs: restart after
kill -9 with zero loss, reset to a datetime, dead-letter replay (once, even when run twice),
state rebuild, checkpoint restore, and refusals that change nothing."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest

from streamops.app_runtime import AppRuntime
from streamops.audit import read_audit
from streamops.checkpoints import backup_checkpoint, backup_info, list_backups
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import produce, read_all
from streamops.loadgen import LoadSpec
from streamops.loadgen import run as run_load
from streamops.waiting import poll_until
from tests.support.apps import run_available_now
from tests.support.artifacts import same_code_as
from tests.support.operations import checkpoint_state, commit_offsets, steps_of, stop_driver
from tests.support.routes import routed, wait_until_all_routed


def test_restart_after_kill_dash_9_resumes_from_the_checkpoint_and_loses_nothing(run_dag, app_env, app_catalog, broker):
    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    same_code_as(spec, "1.0.3")
    deployed = run_dag("deploy_apps", catalog_file, apps=["oplog-router"], version="1.0.3")
    assert deployed.state == "success", deployed.task_states
    producer = threading.Thread(target=run_load,
                                args=(spec, LoadSpec(count=3000, keys=30, rate=300, seed=11), broker.client_config))
    producer.start()
    poll_until(lambda: (p := runtime.progress().get("route")) is not None and p.input_rows > 0,
               timeout=120, what="a batch with data")
    dead = runtime.driver()
    os.kill(dead.pid, signal.SIGKILL)  # mid-stream
    poll_until(lambda: not runtime.is_running(), timeout=30, what="the lock to be released")
    assert runtime.state() == "crashed"

    dry = run_dag("recover_restart_app", catalog_file, dry_run=True, app="oplog-router")
    assert dry.task_states == {"plan": "success", "approve": "skipped", "apply": "skipped", "verify": "skipped"}
    assert dry.xcoms["plan"]["state"] == "crashed"
    assert dry.xcoms["plan"]["version"] == "1.0.3"  # what it last ran with, not the catalog's
    assert runtime.state() == "crashed" and list_backups(spec.checkpoint_location()) == []

    producer.join(timeout=120)
    result = run_dag("recover_restart_app", catalog_file, app="oplog-router", dry_run=False)
    assert result.state == "success", result.task_states
    applied, verified = result.xcoms["apply"], result.xcoms["verify"]
    assert runtime.state() == "running" and runtime.driver().pid == applied["pid"] != dead.pid
    assert runtime.driver().version == "1.0.3"
    assert backup_info(Path(applied["backup"]))["label"] == "before-restart"
    assert verified["lag_after"] < result.xcoms["plan"]["lag"] or verified["lag_after"] == 0
    # Nothing of the dead driver's process group is left.
    assert [p.pid for p in psutil.process_iter() if _group(p.pid) == dead.process_group] == []

    routing = wait_until_all_routed(broker.client_config, spec)

    expected, duplicates = routing.expected, routing.duplicates
    print(f"recover_restart_app after kill -9: {len(expected)} routed records, none lost, {duplicates} duplicates; "
          f"left behind by the dead driver: {result.xcoms['plan']['leftovers']}")
    assert steps_of(result.run_id) == [("plan", "done"), ("apply", "done"), ("verify", "done")]
    entry = read_audit(run_id=result.run_id)[1]
    assert entry["user"] == "dag_test" and entry["params"]["app"] == "oplog-router"
    assert entry["result"]["backup"] == applied["backup"]
    assert entry["snapshots_taken"] == [applied["backup"]]
    stop_driver(runtime)


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_reset_to_a_datetime_processes_exactly_the_records_written_from_then_on(spark, run_dag, app_env, app_catalog, broker,
                                                                              admin):
    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    source = spec.inputs["operations"]
    run_load(spec, LoadSpec(count=400, keys=20, seed=21), broker.client_config)
    before = read_all(broker.client_config, source)
    cut = datetime.fromtimestamp((max(r.timestamp_ms for r in before) + 1) / 1000, tz=UTC)
    poll_until(lambda: time.time() * 1000 > cut.timestamp() * 1000 + 1, timeout=5, what="the clock to pass the cut")
    run_load(spec, LoadSpec(count=250, keys=20, seed=22, start_seq=1000), broker.client_config)
    run_available_now(spark, app_catalog, "oplog-router", broker, spec.checkpoint_location())
    routed_before = Counter(routed(broker.client_config, spec))
    after_cut = {f"{r.topic}/{r.partition}/{r.offset}"
                 for r in read_all(broker.client_config, source) if r.timestamp_ms >= cut.timestamp() * 1000}
    assert len(after_cut) == 250
    files_before = checkpoint_state(Path(spec.checkpoint_location()))
    # A team outside the suite reads the contacts output and has read half of each partition; the
    # suite's own reader groups never count.
    contacts = spec.outputs["contacts"]
    written = read_all(broker.client_config, contacts)
    half = {p: hi // 2 for p, (_, hi) in end_offsets(broker.client_config, contacts).items()}
    commit_offsets(admin, "billing-readers", {(contacts, p): o for p, o in half.items()})
    commit_offsets(admin, "streamops-reader", {(contacts, p): 0 for p in half})
    again = [r for r in written if r.json()["event_id"] in after_cut]
    read_again = sum(1 for r in again if r.offset < half[r.partition])

    result = run_dag("recover_reset_offsets", catalog_file, app="oplog-router", mode="datetime",
                     to_datetime=cut.isoformat(), dry_run=False)

    assert result.state == "success", result.task_states
    plan = result.xcoms["plan"]
    assert plan["replayed"] == 250 and plan["skipped"] == 0
    # What that team will see, exactly, in the plan (and so in the approval text and the audit).
    assert plan["downstream"]["groups"] == [{
        "group": "billing-readers", "topic": contacts, "again_read": read_again, "again_unread": len(again) - read_again,
        "never": 0, "note": "", "replayed": 0}]
    assert 0 < read_again < len(again)
    assert plan["downstream"]["lines"][0] == (
        f"group billing-readers on {contacts}: receives again {read_again:,} record(s) it has read, and "
        f"{len(again) - read_again:,} it has not read yet twice")
    assert plan["summary"].endswith("; downstream: 1 consumer group(s) affected")
    assert [e["result"]["downstream"] for e in read_audit(run_id=result.run_id) if e["step"] == "plan"] == [plan["downstream"]]
    ends = end_offsets(broker.client_config, source)
    assert {(r["partition"], r["current"]) for r in plan["rows"]} == {(p, hi) for p, (_, hi) in ends.items()}
    assert "every query (route) started exactly at the planned offsets" in result.xcoms["verify"]["summary"]
    backup = Path(result.xcoms["apply"]["backup"])
    assert checkpoint_state(backup) == (
        {k: v for k, v in files_before.items()} | {"_backup.json": (backup / "_backup.json").read_bytes()})

    # The new driver processes the records written at or after the cut, each once, and no other.
    def replayed() -> Counter:
        return Counter(routed(broker.client_config, spec)) - routed_before

    expected = Counter({pair: 1 for pair in routed_before if pair[0] in after_cut})
    poll_until(lambda: replayed() == expected, timeout=180, what="the records after the cut to be routed again")
    stop_driver(runtime)
    assert replayed() == expected


def test_bad_requests_are_refused_and_change_nothing(spark, run_dag, app_env, app_catalog, broker, admin):
    from airflow.sdk.definitions.param import ParamValidationError

    from streamops.recovery.common import RecoveryRefused
    from streamops.recovery.reset import ResetRequest, plan_reset
    from streamops.recovery.restore import plan_restore

    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    source = spec.inputs["operations"]
    run_load(spec, LoadSpec(count=50, keys=5, seed=31), broker.client_config)
    run_available_now(spark, app_catalog, "oplog-router", broker, spec.checkpoint_location())
    checkpoint = Path(spec.checkpoint_location())
    files = checkpoint_state(checkpoint)

    def refusal(**params) -> str:
        """The refusal as the audit log recorded it (the task fails with the same text)."""
        result = run_dag("recover_reset_offsets", catalog_file, app="oplog-router", dry_run=False, **params)
        assert result.task_states == {
            "plan": "failed", "approve": "upstream_failed", "apply": "upstream_failed", "verify": "upstream_failed"}
        (entry,) = read_audit(run_id=result.run_id)
        assert (entry["step"], entry["outcome"], entry["user"]) == ("plan", "refused", "dag_test")
        return entry["error"]

    # A running app (a live process holds its driver lock).
    holder = AppRuntime(checkpoint)
    holder.acquire({"app": "oplog-router", "version": "9.9.9"})
    try:
        text = refusal(mode="earliest")
    finally:
        holder.release("stopped", "test")
    assert "oplog-router is running (driver pid" in text and "version 9.9.9" in text
    assert "needs it stopped: stop it with the stop_apps DAG first" in text

    text = refusal(mode="datetime", to_datetime="2026-11-22T03:00:00")
    assert "to_datetime '2026-11-22T03:00:00' has no timezone: add Z or an offset such as +01:00" in text
    last = max(end_offsets(broker.client_config, source))
    text = refusal(mode="earliest", partitions=[f"{source}:{last + 1}"])
    assert f"partition {last + 1} of '{source}' does not exist (it has partitions 0-{last})" in text
    text = refusal(mode="offsets", offsets={source: {"0": 10**9}})
    assert f"offsets: {source} p0 offset 1000000000 is outside the retained range" in text

    # The trigger form (and the API) refuse unknown apps, metacharacters and paths before any task.
    for bad in ({"app": "no-such-app"}, {"partitions": ["x; rm -rf /"]}, {"offsets": {"../../etc/passwd": {"0": 1}}}):
        with pytest.raises(ParamValidationError) as refused:
            run_dag("recover_reset_offsets", catalog_file, dry_run=True, **{"app": "oplog-router", "mode": "offsets", **bad})
        assert list(bad)[0] in str(refused.value)
    with pytest.raises(ParamValidationError, match="snapshot"):
        run_dag("recover_restore_checkpoint", catalog_file, dry_run=True, app="oplog-router", snapshot="../../other-app")

    # The same checks in the code, for callers that bypass the form.
    def problems(**request) -> list[str]:
        with pytest.raises(RecoveryRefused) as refused:
            plan_reset(admin, app_catalog, ResetRequest(**request))
        return refused.value.problems

    assert problems(app="no-such-app") == [
        "app 'no-such-app' is not in the catalog; choose from: oplog-router, presence-notifier, browser-activity"]
    assert problems(app="oplog-router; reboot") == [
        "app 'oplog-router; reboot' contains ' ' ';': shell metacharacters and spaces are not allowed in names"]
    assert problems(app="oplog-router", partitions=["../etc:0"]) == [
        "partition selector '../etc:0': topic '../etc' looks like a path; give the name only (no '/', '\\\\' or '..')"]
    assert problems(app="oplog-router", mode="shift", shift=0) == [
        "shift 0 must be a non-zero whole number (-N replays N records per partition, +N skips N)"]
    with pytest.raises(RecoveryRefused, match="snapshot '../x' looks like a path"):
        plan_restore(app_catalog, "oplog-router", "../x", stop_if_running=False)

    assert checkpoint_state(checkpoint) == files and list_backups(str(checkpoint)) == []
    refused_steps = [e for e in read_audit(app="oplog-router") if e["outcome"] == "refused"]
    assert len(refused_steps) == 4 and {e["step"] for e in refused_steps} == {"plan"}

    # On-call reads the same log from the command line.
    from typer.testing import CliRunner

    from streamops.cli import app as cli

    shown = CliRunner().invoke(cli, ["audit", "--app", "oplog-router"]).output
    assert shown.count("recover_reset_offsets") == 4 and shown.count("refused") == 4 and "dag_test" in shown


def test_dead_letter_replay_after_a_fix_delivers_the_repaired_records_once_even_when_run_twice(
    spark, run_dag, app_env, app_catalog, broker, tmp_path, admin
):
    catalog_file, _ = app_env
    strict = app_catalog.model_copy(update={"apps": [
        a.model_copy(update={"max_record_bytes": 600}) if a.name == "oplog-router" else a for a in app_catalog.apps]})
    spec = strict.app("oplog-router")
    source = spec.inputs["operations"]

    def event(seq: int, padding: int = 0) -> tuple[str, str]:
        body = {"seq": seq, "user_id": f"u{seq % 7}", "op_type": "ADD_CONTACT", "event_time": "2026-11-22T03:00:00.000Z"}
        if padding:
            body["note"] = "x" * padding
        return f"u{seq % 7}", json.dumps(body)

    produce(broker.client_config, source, [event(s) for s in range(1, 41)])
    produce(broker.client_config, source, [event(s, padding=900) for s in range(100, 112)])  # over 600 bytes
    produce(broker.client_config, source, [(f"bad{i}", "{not json") for i in range(5)])
    run_available_now(spark, strict, "oplog-router", broker, spec.checkpoint_location())
    assert len(read_all(broker.client_config, spec.dead_letter_topic)) == 17

    # The fix: the catalog raises the limit (app_env's catalog keeps 65536). A team reads the contacts
    # output: the plan tells it what it will receive that it never had.
    commit_offsets(admin, "crm-sync", {(spec.outputs["contacts"], p): high  # it has read all there is
                                       for p, (_, high) in end_offsets(broker.client_config, spec.outputs["contacts"]).items()})
    dry = run_dag("recover_replay_dead_letters", catalog_file, dry_run=True, app="oplog-router", reason_contains="BYTE LIMIT")
    assert dry.task_states == {"plan": "success", "approve": "skipped", "apply": "skipped", "verify": "skipped"}
    assert dry.xcoms["plan"]["downstream"]["lines"][0] == (
        f"group crm-sync on {spec.outputs['contacts']}: receives the outputs of 12 replayed dead letter(s), new to it")
    assert dry.xcoms["plan"]["totals"] == {"records": 17, "replay": 12, "still fails": 0, "already replayed": 0,
                                           "filtered out": 5, "other": 0}
    assert len(read_all(broker.client_config, source)) == 57

    everything = run_dag("recover_replay_dead_letters", catalog_file, app="oplog-router", dry_run=True)
    assert everything.xcoms["plan"]["totals"]["still fails"] == 5
    assert everything.xcoms["plan"]["still_failing"][0]["now"] == "value is not valid JSON (input contract json: RFC 8259)"

    first = run_dag("recover_replay_dead_letters", catalog_file, app="oplog-router", reason_contains="byte limit", dry_run=False)
    assert first.state == "success", first.task_states
    assert first.xcoms["apply"]["count"] == 12 and first.xcoms["verify"]["verified"] == 12
    second = run_dag("recover_replay_dead_letters", catalog_file, app="oplog-router", dry_run=False)
    assert second.state == "success", second.task_states
    assert second.xcoms["apply"]["count"] == 0
    assert second.xcoms["plan"]["totals"]["already replayed"] == 12 and second.xcoms["plan"]["totals"]["still fails"] == 5
    replays = [r for r in read_all(broker.client_config, source) if r.headers]
    assert sorted(r.json()["seq"] for r in replays) == list(range(100, 112))

    # The fixed app routes each repaired record exactly once.
    fixed = app_catalog.app("oplog-router")
    run_available_now(spark, app_catalog, "oplog-router", broker, fixed.checkpoint_location())
    contacts = [r.json() for r in read_all(broker.client_config, fixed.outputs["contacts"])]
    seqs = Counter(v["seq"] for v in contacts)
    assert {s: seqs[s] for s in range(100, 112)} == {s: 1 for s in range(100, 112)}
    assert sum(seqs.values()) == 52


def test_rebuild_into_the_live_topics_reproduces_the_state_and_its_output(spark, run_dag, app_env, app_catalog, broker):
    catalog_file, _ = app_env
    spec = app_catalog.app("browser-activity")
    load = LoadSpec(count=600, keys=12, seed=41, start_time=datetime(2026, 11, 1, tzinfo=UTC))
    run_load(spec, load, broker.client_config)
    run_available_now(spark, app_catalog, "browser-activity", broker, spec.checkpoint_location())
    original = {t: Counter((r.key, r.value) for r in read_all(broker.client_config, t)) for t in spec.outputs.values()}
    assert all(original.values())
    state_before = _state_rows(spark, Path(spec.checkpoint_location()))
    assert set(state_before) == {"challenge", "window-count"} and all(state_before.values())

    refused = run_dag("recover_rebuild_state", catalog_file, app="presence-notifier", target="live", dry_run=False)
    assert refused.task_states["plan"] == "failed"
    assert "presence-notifier reads its own output" in read_audit(run_id=refused.run_id)[0]["error"]

    result = run_dag("recover_rebuild_state", catalog_file, app="browser-activity", target="live", dry_run=False)
    assert result.state == "success", result.task_states
    assert result.xcoms["plan"]["records"] == 600
    assert result.xcoms["verify"]["lag_after"] == 0
    assert backup_info(Path(result.xcoms["apply"]["backup"]))["label"] == "before-rebuild"
    runtime = AppRuntime(spec.checkpoint_location())
    poll_until(lambda: all(sum(Counter((r.key, r.value) for r in read_all(broker.client_config, t)).values())
                           >= 2 * sum(original[t].values()) for t in original), timeout=120, what="the rebuilt output")
    stop_driver(runtime)
    for topic, first in original.items():
        assert Counter((r.key, r.value) for r in read_all(broker.client_config, topic)) == first + first, topic
    assert _state_rows(spark, Path(spec.checkpoint_location())) == state_before


def _state_rows(spark, checkpoint: Path) -> dict[str, list]:
    """Per stateful query, its state store rows as of the last committed batch (Spark's reader)."""
    rows = {}
    for query in sorted(p for p in checkpoint.iterdir() if (p / "state").exists()):
        frame = spark.read.format("statestore").load(str(query))
        rows[query.name] = sorted(json.dumps(r.asDict(recursive=True), sort_keys=True, default=str)
                                  for r in frame.drop("partition_id").collect())
    return rows


def test_restore_brings_back_the_previous_checkpoint(spark, run_dag, app_env, app_catalog, broker):
    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    checkpoint = spec.checkpoint_location()
    run_load(spec, LoadSpec(count=200, keys=10, seed=51), broker.client_config)
    run_available_now(spark, app_catalog, "oplog-router", broker, checkpoint)
    good = backup_checkpoint(checkpoint, "known-good")
    routed_at_snapshot = Counter(routed(broker.client_config, spec))
    run_load(spec, LoadSpec(count=150, keys=10, seed=52, start_seq=1000), broker.client_config)
    run_available_now(spark, app_catalog, "oplog-router", broker, checkpoint)
    routed_after = Counter(routed(broker.client_config, spec))
    newer = checkpoint_state(Path(checkpoint))

    dry = run_dag("recover_restore_checkpoint", catalog_file, dry_run=True, app="oplog-router")
    assert dry.task_states == {"plan": "success", "approve": "skipped", "apply": "skipped", "verify": "skipped"}
    assert dry.xcoms["plan"]["snapshot"] == good.name and dry.xcoms["plan"]["replayed"] == 150

    result = run_dag("recover_restore_checkpoint", catalog_file, app="oplog-router", snapshot=good.name, dry_run=False)
    assert result.state == "success", result.task_states
    replaced = Path(result.xcoms["apply"]["replaced_snapshot"])
    assert {k: v for k, v in checkpoint_state(replaced).items() if k != "_backup.json"} == newer
    assert result.xcoms["apply"]["restored_batches"] == {"route": 0}
    # From the snapshot, the app routes the 150 later records again: they are there twice now.
    expected = routed_after + (routed_after - routed_at_snapshot)
    poll_until(lambda: Counter(routed(broker.client_config, spec)) == expected,
               timeout=180, what="the records after the snapshot again")
    stop_driver(runtime)
    assert [n.split("-", 1)[1] for n in (p.name for p in list_backups(checkpoint))] == ["known-good", "replaced"]


def test_processes_a_dead_driver_left_behind_are_found_and_ended(tmp_path):
    """A JVM that outlived its Python driver could still write the checkpoint: the restart ends
    every Spark process of the dead driver's process group (real processes, own session)."""
    import dataclasses
    import socket
    import subprocess
    import sys

    from streamops.app_runtime import DriverRecord
    from streamops.driver_processes import end_leftovers, leftovers

    # Ignores SIGTERM, like a JVM stuck in shutdown: only SIGKILL ends it.
    stuck = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "print('ready', flush=True); time.sleep(600)", "org.apache.spark.deploy.SparkSubmit",
                              "plugins/streamops/entrypoints/driver.py", "--app", "oplog-router"],
                             start_new_session=True, stdout=subprocess.PIPE)
    assert stuck.stdout.readline() == b"ready\n"
    unrelated = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        driver = DriverRecord(app="oplog-router", process_group=stuck.pid, host=socket.gethostname(), pid=999999)
        found = leftovers(driver)
        assert [p.pid for p in found] == [stuck.pid]
        assert leftovers(dataclasses.replace(driver, app="oplog-route")) == []  # only this app's processes
        assert leftovers(dataclasses.replace(driver, host="another-host")) == []  # cannot see other hosts' processes
        ended = end_leftovers(found, grace_s=1)
        assert ended == [{"pid": stuck.pid, "name": found[0].name, "command": found[0].command, "signal": "SIGKILL"}]
        assert not psutil.pid_exists(stuck.pid)  # (psutil reaped it: its exit status is not ours to read)
        assert unrelated.poll() is None
    finally:
        for process in (stuck, unrelated):
            if process.poll() is None:
                process.kill()
            process.wait()


def test_rebuild_into_versioned_topics_reproduces_the_output_and_hands_over(spark, run_dag, app_env, app_catalog, broker,
                                                                            tmp_path, monkeypatch):
    """presence-notifier reads its own output, so it is rebuilt into new topics: backfill from
    earliest, validate, cut over; the live app then runs on the .v2 topics."""
    from datetime import timedelta

    monkeypatch.setenv("STREAMOPS_REPROCESS_ROOT", str(tmp_path / "reprocess"))
    monkeypatch.setenv("STREAMOPS_QUALITY_ROOT", str(tmp_path / "quality"))
    catalog_file, _ = app_env
    spec = app_catalog.app("presence-notifier")
    load = LoadSpec(count=600, keys=12, seed=61, start_time=datetime(2026, 11, 1, tzinfo=UTC), event_spacing=timedelta(seconds=2))
    run_load(spec, load, broker.client_config)
    run_available_now(spark, app_catalog, "presence-notifier", broker, spec.checkpoint_location())

    result = run_dag("recover_rebuild_state", catalog_file, app="presence-notifier", target="versioned", version="v2",
                     dry_run=False)

    assert result.state == "success", result.task_states
    applied = result.xcoms["apply"]
    assert applied["new_topics"] == [f"{t}.v2" for t in [*spec.outputs.values(), spec.dead_letter_topic]]
    assert backup_info(Path(applied["backup"]))["label"] == "before-cutover"
    runtime = AppRuntime(spec.checkpoint_location())
    assert runtime.state() == "running" and runtime.driver().version == f"{spec.version}+v2"
    for live in spec.outputs.values():
        rebuilt = Counter((r.key, r.value) for r in read_all(broker.client_config, f"{live}.v2"))
        assert rebuilt == Counter((r.key, r.value) for r in read_all(broker.client_config, live)), live
    stop_driver(runtime)


def test_the_reset_plan_of_every_mode(spark, app_env, app_catalog, broker, admin):
    """Plans only (the apply path is the datetime test's): each mode's new offsets per partition."""
    from streamops.recovery.reset import ResetRequest, plan_reset

    spec = app_catalog.app("oplog-router")
    source = spec.inputs["operations"]
    run_load(spec, LoadSpec(count=120, keys=12, seed=71), broker.client_config)
    run_available_now(spark, app_catalog, "oplog-router", broker, spec.checkpoint_location())
    ends = {p: hi for p, (_, hi) in end_offsets(broker.client_config, source).items()}
    busy = max(ends, key=ends.get)

    def new_offsets(**request) -> dict[int, int]:
        plan = plan_reset(admin, app_catalog, ResetRequest(app="oplog-router", **request))
        assert {r.partition: r.current for r in plan.rows} == ends  # the checkpoint is at the end
        return {r.partition: r.new for r in plan.rows}

    assert new_offsets(mode="earliest") == {p: 0 for p in ends}
    assert new_offsets(mode="latest") == ends
    assert new_offsets(mode="shift", shift=-3) == {p: max(e - 3, 0) for p, e in ends.items()}
    assert new_offsets(mode="shift", shift=-3, partitions=[f"{source}:{busy}"]) == {**ends, busy: ends[busy] - 3}
    assert new_offsets(mode="offsets", offsets={source: {str(busy): 1}}) == {**ends, busy: 1}
    assert new_offsets(mode="duration", duration="1 hour") == {p: 0 for p in ends}  # everything is younger
    plan = plan_reset(admin, app_catalog, ResetRequest(app="oplog-router", mode="shift", shift=-3))
    assert plan.replayed == sum(min(e, 3) for e in ends.values()) and plan.skipped == 0
    assert "replays 3" in plan.table() and "STATE" not in plan.table()  # the router keeps no state
