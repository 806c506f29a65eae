"""What the recovery plans tell the on-call engineer, and the refusals that need no broker: a
restart's failed batch and the way past it, a rebuild's refusals and steps, a replay's range and
verdicts, a restore's snapshot history. On real components: tests/test_recovery.py,
tests/test_skip_records.py, tests/test_dead_letters.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from streamops.catalog import load_catalog
from streamops.dead_letters import DeadLetter
from streamops.recovery.common import RecoveryRefused
from streamops.recovery.rebuild import RebuildPlan, plan_rebuild
from streamops.recovery.replay import ReplayRequest, _summarise, resolve_spans
from streamops.recovery.restart import RestartPlan, _same_as_previous_failure
from streamops.recovery.restore import RestorePlan, Snapshot

CATALOG = load_catalog(check_programs=False)
FAILED = [{"query": "route", "batch": 14, "error": "org.apache.kafka.common.errors.RecordTooLargeException: too large.",
           "ranges": [{"topic": "oplog.operations", "partition": 3, "first": 1200, "last": 1210}]}]


def restart(**fields) -> RestartPlan:
    return RestartPlan(**{"app": "oplog-router", "state": "failed",
                          "last_driver": {"pid": 4242, "host": "host-a", "version": "1.0.3", "started_at": "t0",
                                          "stopped_at": "t1", "reason": "query failed"},
                          "leftovers": [], "lag": 12, "batches": {"route": 13}, "version": "1.0.3", "spark_conf": {}, **fields})


def test_a_failed_batch_is_told_with_its_records_and_a_second_failure_on_it_points_to_the_skip():
    once = restart(failed_batches=FAILED)
    assert once.failure() == (
        "oplog-router failed on batch 14 (query route); a restart runs that batch again. Batch 14 covers "
        "oplog.operations partition 3 offsets 1200-1210. The error: org.apache.kafka.common.errors.RecordTooLargeException: "
        "too large. If it fails on this batch again, a record in it fails the query: skip that record with recover_skip_records.")
    again = restart(failed_batches=FAILED, failed_again=True,
                    largest_records=[{"record": "oplog.operations:3:1207", "bytes": 2_000_000}])
    assert "failed on batch 14 again (the same batch as the previous failure): restarting will fail the same way." \
           in again.failure()
    assert 'skip it with recover_skip_records (records: ["oplog.operations:3:<offset>"]). Its largest records: ' \
           "oplog.operations:3:1207 (2000000 bytes)." in again.failure()
    assert "AGAIN, on the same batch as before" in again.summary()
    assert again.table().splitlines()[0] == again.failure().splitlines()[0]
    assert "will: back up the checkpoint, start version 1.0.3 from the checkpoint, and wait for progress" in again.table()


def test_the_same_failure_twice_is_the_same_query_batch_and_records(tmp_path):
    from streamops.app_runtime import AppRuntime

    runtime = AppRuntime(str(tmp_path / "cp"))
    runtime.dir.mkdir(parents=True)
    history = runtime.history_file

    def ended(*failures):
        history.write_text("".join(json.dumps({"event": "stopped", "outcome": "failed", "failed_batches": f}) + "\n"
                                   for f in failures))
    ended(FAILED, FAILED)
    assert _same_as_previous_failure(runtime, FAILED)
    # driver.json keeps a range's keys as the file has them (sorted); the history reads them in its order
    as_in_driver_json = [{**FAILED[0], "ranges": [dict(sorted(FAILED[0]["ranges"][0].items()))]}]
    assert _same_as_previous_failure(runtime, as_in_driver_json)
    ended([{**FAILED[0], "batch": 13}], FAILED)
    assert not _same_as_previous_failure(runtime, FAILED)
    ended(FAILED)
    assert not _same_as_previous_failure(runtime, FAILED)


def test_a_rebuild_is_refused_before_the_broker_is_asked():
    with pytest.raises(RecoveryRefused) as refused:
        plan_rebuild(None, CATALOG, "nope", "sideways")  # type: ignore[arg-type]
    assert refused.value.problems == [
        "app 'nope' is not in the catalog; choose from: oplog-router, presence-notifier, browser-activity",
        "target 'sideways' must be one of: live, versioned"]
    with pytest.raises(RecoveryRefused, match="presence-notifier reads its own output presence.notifications: rebuilt into "
                                              "the live topics it would read the old and the new copies"):
        plan_rebuild(None, CATALOG, "presence-notifier", "live")  # type: ignore[arg-type]


def test_a_rebuild_says_what_it_will_do_to_the_live_topics_or_beside_them():
    inputs = [{"topic": "oplog.operations", "partition": 0, "earliest": 5, "latest": 25}]
    live = RebuildPlan("oplog-router", "live", True, False, {"route": 3}, inputs, ["out"])
    assert "will: stop the running app gracefully, back up and retire the checkpoint (batches {'route': 3}), start the app " \
           "on a new checkpoint from earliest: 20 record(s) reprocessed into the LIVE topics out, then it continues live" \
           in live.table()
    versioned = RebuildPlan("oplog-router", "versioned", True, False, {}, inputs, ["out.v2"])
    assert "will: reprocess 20 record(s) from earliest into out.v2 while the live app runs, validate them, then cut over" \
           in versioned.table()


def test_a_replay_range_is_refused_before_the_broker_is_asked():
    now = datetime(2026, 11, 25, 3, 0, tzinfo=UTC)
    with pytest.raises(RecoveryRefused) as refused:
        resolve_spans(None, CATALOG, ReplayRequest(app="oplog-router", start="2026-11-25T02:00:00Z", end="2026-11-25T01:00:00Z",
                                                   reason_contains="x" * 201), now)  # type: ignore[arg-type]
    assert refused.value.problems == ["end 2026-11-25T01:00:00Z is not after start 2026-11-25T02:00:00Z",
                                      "reason_contains is over 200 characters"]
    with pytest.raises(RecoveryRefused, match="start"):
        resolve_spans(None, CATALOG, ReplayRequest(app="oplog-router", start="yesterday"), now)  # type: ignore[arg-type]


def test_a_replay_plan_counts_each_reasons_verdicts_and_shows_what_still_fails():
    letters = [DeadLetter("dlq/0/0", "bad json", "ops/0/1", verdict="replay"),
               DeadLetter("dlq/0/1", "bad json", "ops/0/2", verdict="still fails: missing field 'op'"),
               DeadLetter("dlq/0/2", "bad json", "ops/0/3", verdict="already replayed"),
               DeadLetter("dlq/0/3", "too large", None, verdict="not replayable: not an envelope")]
    plan = _summarise(CATALOG.app("oplog-router"), ReplayRequest(app="oplog-router"), {"0": [0, 4]}, letters)
    assert plan.totals == {"records": 4, "replay": 1, "still fails": 1, "already replayed": 1, "filtered out": 0, "other": 1}
    assert plan.still_failing == [{"at": "dlq/0/1", "was": "bad json", "now": "missing field 'op'"}]
    assert plan.summary() == "1 to replay, 1 still fail, 1 replayed before"
    assert "dead letters of oplog-router in oplog.router.dead-letters [p0 0..4]:" in plan.table()


def test_a_restore_shows_the_snapshot_history_and_what_is_processed_again(tmp_path):
    snapshot = tmp_path / "20261125T010000.000000Z-before-reset"
    (snapshot / "route" / "commits").mkdir(parents=True)
    (snapshot / "route" / "offsets").mkdir(parents=True)
    (snapshot / "route" / "commits" / "4").write_text("v1\n{}\n")
    (snapshot / "route" / "offsets" / "4").write_text('v1\n{}\n{"ops":{"0":60}}\n')
    (snapshot / "_backup.json").write_text(json.dumps({"label": "before-reset", "taken_at": "t", "version": "1.0.0",
                                                       "launch": {"version": "1.0.0", "spark_conf": {}}}))
    shot = Snapshot.of(snapshot)
    assert (shot.name, shot.label, shot.version, shot.batches) == (snapshot.name, "before-reset", "1.0.0", {"route": 4})
    plan = RestorePlan("oplog-router", shot.name, [vars(shot)], {"route": 9}, {"route": 4},
                       [{"query": "route", "topic": "ops", "partition": 0, "now": 90, "restored": 60}], True, "1.0.0", {})
    assert f"-> {shot.name}" in plan.table()
    assert "30 record(s) read since the snapshot are processed again (their outputs written again)" in plan.table()
    assert plan.table().endswith(f"will: stop the running app gracefully, keep the current checkpoint as a snapshot, put "
                                 f"{shot.name} in its place, start version 1.0.0")
