"""Checkpoint snapshots while the app runs (streamops.checkpoints.copy_checkpoint) and the catalog's
snapshot policies (streamops.snapshots): when one is due, exactly which are kept and why, the
holds of restore plans, pruning that never leaves a half-removed snapshot. Checkpoint folders
written by hand in Spark's layout, times injected; the real app's copy is test_rolling_restart's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec, SnapshotPolicy
from streamops.checkpoints import (
    BACKUP_INFO,
    backup_checkpoint,
    backup_info,
    backups_dir,
    batch_marks,
    committed_batches,
    copy_checkpoint,
    list_backups,
)
from streamops.runtime_files import write_json_atomic
from streamops.runtime_records import OperationRecord
from streamops.snapshots import (
    SCHEDULED,
    Snapshot,
    SnapshotGone,
    apply_policy,
    due,
    hold,
    holds,
    listing,
    listing_table,
    release,
    retention,
    snapshots,
)
from streamops.timestamps import file_stamp, iso_seconds_utc
from tests.unit.streamops.test_checkpoints import EVENTS, commit_batch, new_query, plan_batch

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def stateful_checkpoint(root: Path, committed: int) -> Path:
    """Query `count` committed batches 0..committed and planned the next; its RocksDB store
    (partition 0) holds changelogs of versions 1..committed+1, a zip of version 1 and its SST."""
    checkpoint = root / "checkpoints" / "my-app"
    query = new_query(checkpoint, "count")
    for batch in range(committed + 1):
        plan_batch(query, batch, {EVENTS: {"0": 10 * (batch + 1)}})
        commit_batch(query, batch)
    plan_batch(query, committed + 1, {EVENTS: {"0": 10 * (committed + 2)}})
    store = query / "state" / "0" / "0"
    (store / "SSTs").mkdir(parents=True)
    (query / "state" / "0" / "_metadata").mkdir()
    (query / "state" / "0" / "_metadata" / "metadata").write_text('{"operatorInfo":{}}')
    for version in range(1, committed + 2):
        (store / f"{version}.changelog").write_bytes(b"changes %d" % version)
        (store / f".{version}.changelog.crc").write_bytes(b"crc")
    (store / "1.zip").write_bytes(b"zip 1")
    (store / "SSTs" / "000008-1a2b.sst").write_bytes(b"sst")
    AppRuntime(checkpoint).dir.mkdir(parents=True)
    return checkpoint


def write_driver(checkpoint: Path, version: str, digest: str) -> None:
    write_json_atomic(AppRuntime(checkpoint).driver_file, {
        "app": "my-app", "version": version, "code": {"artifact": "my-app", "digest": digest},
        "launch": {"version": version, "spark_conf": {}},
    })


def snapshot_at(checkpoint: Path, when: datetime, label: str, version: str = "1.0.0", digest: str = "sha256:aa",
                batch: int = 3) -> str:
    """A snapshot as backup_checkpoint writes one, taken at `when` by `version`."""
    name = f"{file_stamp(when)}-{label}"
    target = backups_dir(checkpoint) / name
    (target / "count" / "commits").mkdir(parents=True)
    (target / "count" / "offsets").mkdir()
    (target / "count" / "offsets" / str(batch)).write_text("v1\n{}\n{}")
    (target / "count" / "commits" / str(batch)).write_text("v1\n{}")
    (target / BACKUP_INFO).write_text(json.dumps({
        "label": label, "taken_at": iso_seconds_utc(when), "version": version,
        "code": {"artifact": "my-app", "digest": digest}, "launch": {"version": version, "spark_conf": {}}}))
    return name


def app_with(checkpoint: Path, **policy) -> AppSpec:
    return AppSpec.model_validate({
        "name": "my-app", "program": "spark_apps.oplog_router", "code": "installed", "version": "1.0.0", "owner": "o",
        "description": "d", "inputs": {"events": EVENTS}, "outputs": {"out": "app.out"}, "dead_letter_topic": "app.dlq",
        "checkpoint": str(checkpoint), "snapshots": policy or None})


def names(decisions) -> list[str]:
    return [d.snapshot.name for d in decisions if d.kept]


# --- the copy while the app runs ---------------------------------------------------------------------


def test_a_copy_is_whole_as_of_its_last_commit_and_leaves_out_state_written_after_it(tmp_path: Path):
    checkpoint = stateful_checkpoint(tmp_path, committed=4)
    store = checkpoint / "count" / "state" / "0" / "0"
    # Batch 5 is running: it wrote state version 6 (and a file still being written) but has not committed.
    (store / "6.changelog").write_bytes(b"changes 6")
    (store / ".6.changelog.crc").write_bytes(b"crc")
    (store / ".7.changelog.5d2c.tmp").write_bytes(b"half")
    target = tmp_path / "copy"
    assert copy_checkpoint(checkpoint, target) == []
    copied = target / "count" / "state" / "0" / "0"
    assert committed_batches(target / "count") == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (target / "count" / "offsets").iterdir() if not p.name.startswith(".")) == \
        ["0", "1", "2", "3", "4", "5"]  # batch 5 runs again on a restart, with the same offsets
    assert sorted(p.name for p in copied.iterdir()) == [
        ".1.changelog.crc", ".2.changelog.crc", ".3.changelog.crc", ".4.changelog.crc", ".5.changelog.crc",
        "1.changelog", "1.zip", "2.changelog", "3.changelog", "4.changelog", "5.changelog", "SSTs"]
    assert (copied / "SSTs" / "000008-1a2b.sst").read_bytes() == b"sst"  # not a version: always copied
    assert (target / "count" / "state" / "0" / "_metadata" / "metadata").exists()
    assert not (target / "_runtime").exists()


def test_commits_during_the_copy_and_files_the_maintenance_removes_meanwhile(tmp_path: Path, monkeypatch):
    """The commit log is copied first (its last commit L), then the offset log, which holds every
    entry up to L (each was written before its commit): batches that commit meanwhile are left to
    run again, a commit whose offsets the maintenance purged meanwhile is dropped, and a state file
    removed meanwhile is left out and named."""
    checkpoint = stateful_checkpoint(tmp_path, committed=4)
    query, store = checkpoint / "count", checkpoint / "count" / "state" / "0" / "0"
    real_copy = shutil.copy2
    happened: list[str] = []

    def racing_copy(source, target, *args, **kwargs):
        source = Path(source)
        if source == query / "commits" / "4" and not happened:
            # Batches 5 and 6 run and commit (their offsets first), 7 is planned, their state is
            # written, and the maintenance purges batch 0's offsets.
            for batch in (5, 6):
                plan_batch(query, batch, {EVENTS: {"0": 10 * (batch + 1)}})
                commit_batch(query, batch)
                (store / f"{batch + 1}.changelog").write_bytes(b"changes")
            plan_batch(query, 7, {EVENTS: {"0": 80}})
            (query / "offsets" / "0").unlink()
            happened.append("raced")
        if source == store / "1.changelog":
            source.unlink()  # the maintenance removes version 1 after the copy listed it
        return real_copy(source, target, *args, **kwargs)

    monkeypatch.setattr(shutil, "copy2", racing_copy)
    target = tmp_path / "copy"
    vanished = copy_checkpoint(checkpoint, target)
    assert happened and vanished == ["count/state/0/0/1.changelog"]
    # Commits 1..4 (listed before 5 and 6 committed; 0's offsets were purged); offsets up to 5, the
    # batch after the last copied commit, which a restart runs again; state up to version 5.
    assert committed_batches(target / "count") == [1, 2, 3, 4]
    assert sorted(int(p.name) for p in (target / "count" / "offsets").iterdir() if p.name.isdigit()) == [1, 2, 3, 4, 5]
    assert all((target / "count" / "offsets" / str(b)).exists() for b in committed_batches(target / "count"))
    versions = sorted(int(p.name.split(".")[0]) for p in (target / "count" / "state" / "0" / "0").glob("*.changelog"))
    assert versions == [2, 3, 4, 5]


def test_a_backup_cut_short_is_never_listed_and_says_what_it_left_out(tmp_path: Path, monkeypatch):
    checkpoint = stateful_checkpoint(tmp_path, committed=2)
    write_driver(checkpoint, "1.0.0", "sha256:aa")
    import streamops.checkpoints as checkpoints

    def killed(*_args, **_kwargs):
        (backups_dir(checkpoint) / next(iter(p.name for p in backups_dir(checkpoint).iterdir())) / "x").write_text("")
        raise KeyboardInterrupt  # the task is killed in the middle of the copy

    monkeypatch.setattr(checkpoints, "copy_checkpoint", lambda source, target, *_: (target.mkdir(parents=True), killed()))
    with pytest.raises(KeyboardInterrupt):
        backup_checkpoint(checkpoint, SCHEDULED)
    assert list_backups(checkpoint) == [] and [p.name[:9] for p in backups_dir(checkpoint).iterdir()] == [".partial-"]
    monkeypatch.undo()
    real = checkpoints.copy_checkpoint
    monkeypatch.setattr(checkpoints, "copy_checkpoint",
                        lambda source, target, *_: [*real(source, target), "count/state/0/0/1.changelog"])
    (taken,) = [backup_checkpoint(checkpoint, SCHEDULED)]
    assert list_backups(checkpoint) == [taken] and backup_info(taken)["skipped_files"] == 1
    assert batch_marks(taken) == {"count": 2}


# --- when a snapshot is due ----------------------------------------------------------------------


def test_when_a_scheduled_snapshot_is_due(tmp_path: Path):
    checkpoint = stateful_checkpoint(tmp_path, committed=4)
    policy = SnapshotPolicy(every="6 hours", every_batches=10)
    assert due(policy, checkpoint, [], NOW).why == "no scheduled snapshot yet"
    snapshot_at(checkpoint, NOW - timedelta(hours=1), SCHEDULED, batch=4)
    snapshot_at(checkpoint, NOW - timedelta(minutes=5), "before-1.1.0", batch=4)  # not a scheduled one
    taken = snapshots(checkpoint)
    idle = due(policy, checkpoint, taken, NOW)
    assert not idle.due and idle.why == f"no batch committed since {taken[0].name}"
    for batch in range(5, 9):
        plan_batch(checkpoint / "count", batch, {EVENTS: {"0": 10 * batch}})
        commit_batch(checkpoint / "count", batch)
    waiting = due(policy, checkpoint, taken, NOW)
    assert not waiting.due and waiting.why == f"60 min since {taken[0].name}, due every 6 hours or 10 batches (4 so far)"
    assert due(policy, checkpoint, taken, NOW + timedelta(hours=5, minutes=1)).due
    assert due(policy, checkpoint, taken, NOW + timedelta(hours=5, minutes=1)).why == \
        f"6.0 h since {taken[0].name} (every 6 hours)"
    by_batches = due(SnapshotPolicy(every_batches=4), checkpoint, taken, NOW)
    assert by_batches.due and by_batches.why == f"query count committed 4 batch(es) since {taken[0].name} (every 4)"
    assert not due(SnapshotPolicy(every_batches=5), checkpoint, taken, NOW).due
    empty = tmp_path / "empty"
    new_query(empty, "count")
    assert due(policy, empty, [], NOW).why == "the checkpoint has no committed batch yet"


def test_a_policy_needs_a_schedule_and_sane_numbers():
    with pytest.raises(ValidationError, match="a snapshot policy needs 'every'"):
        SnapshotPolicy(keep_last=3)
    with pytest.raises(ValidationError, match="keep_last"):
        SnapshotPolicy(every="1 hour", keep_last=0)
    with pytest.raises(ValidationError, match="every"):
        SnapshotPolicy(every="often")


# --- what is kept -------------------------------------------------------------------------------------


def test_keep_the_last_k_and_everything_younger_than_d(tmp_path: Path):
    checkpoint = stateful_checkpoint(tmp_path, committed=1)
    ages = [timedelta(days=9), timedelta(days=5), timedelta(days=3), timedelta(hours=30), timedelta(hours=20),
            timedelta(hours=2)]
    made = [snapshot_at(checkpoint, NOW - age, SCHEDULED) for age in ages]
    judged = retention(SnapshotPolicy(every="6 hours", keep_last=2, keep_for="1 day"), snapshots(checkpoint), now=NOW)
    assert names(judged) == made[-2:]  # the last two, both younger than a day
    judged = retention(SnapshotPolicy(every="6 hours", keep_last=1, keep_for="4 days"), snapshots(checkpoint), now=NOW)
    assert names(judged) == made[2:]
    why = {d.snapshot.name: d.why for d in judged}
    assert why[made[-1]] == ["one of the last 1", "younger than 4 days"] and why[made[2]] == ["younger than 4 days"]
    assert [d.why for d in judged if not d.kept] == [[], []]
    everything = retention(None, snapshots(checkpoint), now=NOW)
    assert names(everything) == made and everything[0].why == ["the app has no snapshot policy: every snapshot is kept"]


def test_the_last_good_rollback_is_kept_and_a_replaced_checkpoint_is_not_it(tmp_path: Path):
    checkpoint = stateful_checkpoint(tmp_path, committed=1)
    old = NOW - timedelta(days=10)
    v1_early = snapshot_at(checkpoint, old, SCHEDULED, "1.0.0", "sha256:aa")
    v1_last = snapshot_at(checkpoint, old + timedelta(hours=1), "before-2.0.0", "1.0.0", "sha256:aa")
    # 2.0.0 was bad and rolled back: the restore set 2.0.0's checkpoint aside...
    snapshot_at(checkpoint, old + timedelta(hours=2), "replaced", "2.0.0", "sha256:bb")
    # ...and 1.0.0 runs again; later it was rolled to 2.1.0, which runs now.
    v1_again = snapshot_at(checkpoint, old + timedelta(hours=3), "before-2.1.0", "1.0.0", "sha256:aa")
    newest = [snapshot_at(checkpoint, old + timedelta(hours=h), SCHEDULED, "2.1.0", "sha256:cc") for h in (4, 5)]
    policy = SnapshotPolicy(every="6 hours", keep_last=2, keep_for="1 hour")
    judged = retention(policy, snapshots(checkpoint), now=NOW, running_code="2.1.0 sha256:cc", running_version="2.1.0")
    assert names(judged) == [v1_again, *newest]
    (rollback,) = [d for d in judged if d.snapshot.name == v1_again]
    assert rollback.why == ["the last good rollback: the newest snapshot of 1.0.0 (aa), the version before the running 2.1.0"]
    # Running 1.0.0 again after a restore: the newest of other code is 2.1.0's, never a replaced one.
    judged = retention(policy, snapshots(checkpoint), now=NOW, running_code="1.0.0 sha256:aa", running_version="1.0.0")
    assert names(judged) == newest
    assert v1_early not in names(judged) and v1_last not in names(judged)


def test_a_running_operation_keeps_everything_and_a_failed_one_keeps_its_way_back(tmp_path: Path):
    checkpoint = stateful_checkpoint(tmp_path, committed=1)
    old = NOW - timedelta(days=10)
    made = [snapshot_at(checkpoint, old + timedelta(hours=h), SCHEDULED) for h in range(4)]
    policy = SnapshotPolicy(every="6 hours", keep_last=1, keep_for="1 hour")
    running = OperationRecord(run_id="manual__r1", what="roll_restart_apps roll", started_at=iso_seconds_utc(old))
    judged = retention(policy, snapshots(checkpoint), now=NOW, operation=running)
    assert names(judged) == made and "roll_restart_apps roll (run manual__r1) is changing the app" in judged[0].why
    failed = OperationRecord(run_id="manual__r2", what="recover_reset_offsets apply",
                             started_at=iso_seconds_utc(old + timedelta(hours=2, minutes=30)), failed_at="x",
                             backups=[str(backups_dir(checkpoint) / made[0])])
    judged = retention(policy, snapshots(checkpoint), now=NOW, operation=failed)
    assert names(judged) == [made[0], made[3]]
    assert judged[0].why == ["taken by recover_reset_offsets apply (run manual__r2), which failed while changing the "
                             "app: its way back, until an operator decides"]


def test_a_restore_plan_holds_its_snapshot_until_its_apply_or_the_hold_ends(tmp_path: Path):
    checkpoint = stateful_checkpoint(tmp_path, committed=1)
    made = [snapshot_at(checkpoint, NOW - timedelta(days=d), SCHEDULED) for d in (3, 2, 1)]
    with pytest.raises(SnapshotGone, match="snapshot 'nope' is not among the app's snapshots"):
        hold(checkpoint, "nope", "manual__r", "recover_restore_checkpoint")
    entry = hold(checkpoint, made[0], "manual__r", "recover_restore_checkpoint", until=NOW + timedelta(hours=1))
    policy = SnapshotPolicy(every="6 hours", keep_last=1, keep_for="1 hour")
    judged = retention(policy, snapshots(checkpoint), now=NOW, held=holds(checkpoint, NOW))
    assert names(judged) == [made[0], made[2]]
    assert judged[0].why == [f"held by run manual__r (recover_restore_checkpoint) until {entry.until}"]
    assert holds(checkpoint, NOW + timedelta(hours=2)) == []  # ended: a rejected plan holds nothing for ever
    release(checkpoint, "manual__r")
    assert holds(checkpoint, NOW) == []


# --- the policy applied -------------------------------------------------------------------------------


def test_the_policy_takes_what_is_due_prunes_exactly_and_a_dry_run_changes_nothing(tmp_path: Path):
    checkpoint = stateful_checkpoint(tmp_path, committed=3)
    write_driver(checkpoint, "1.0.0", "sha256:aa")
    older = [snapshot_at(checkpoint, datetime(2026, 1, d, tzinfo=UTC), SCHEDULED, batch=0) for d in (1, 2, 3)]
    # A prune and a copy cut short earlier: hidden folders, never listed.
    (backups_dir(checkpoint) / f".pruning-{older[0]}").mkdir()
    (backups_dir(checkpoint) / ".partial-20260104T000000.000000Z-scheduled" / "count").mkdir(parents=True)
    app = app_with(checkpoint, every_batches=1, keep_last=2, keep_for="1 hour")

    dry = apply_policy(app, dry_run=True)
    assert dry.due and dry.taken is None and dry.removed == older[:2]  # as if the snapshot due were taken
    assert dry.summary() == (f"my-app: dry run, nothing changed: a snapshot is due (query count committed 3 batch(es) "
                             f"since {older[-1]} (every 1)); would remove 2: {older[0]}, {older[1]}; would keep 2")
    assert [p.name for p in list_backups(checkpoint)] == older

    run = apply_policy(app)
    assert run.taken is not None and run.taken.endswith("-scheduled") and run.removed == older[:2]
    assert [p.name for p in list_backups(checkpoint)] == [older[2], run.taken]
    # Nothing half-removed or half-copied is left (the earlier prune's leftover is gone too).
    assert sorted(p.name for p in backups_dir(checkpoint).iterdir()) == [older[2], run.taken]
    assert batch_marks(backups_dir(checkpoint) / run.taken) == {"count": 3}
    again = apply_policy(app)
    assert again.taken is None and again.why == f"no batch committed since {run.taken}" and again.removed == []

    rows = listing(app)
    assert [(r["name"], r["kept"], r["code_text"]) for r in rows] == [(older[2], True, "1.0.0 (aa)"),
                                                                     (run.taken, True, "1.0.0 (aa)")]
    table = listing_table(app, rows)
    assert "policy: every 1 batches; keep the last 2 and every one younger than 1 hour" in table
    assert "one of the last 2" in table and "count #3" in table


def test_an_operation_defers_the_snapshot(tmp_path: Path):
    checkpoint = stateful_checkpoint(tmp_path, committed=3)
    runtime = AppRuntime(checkpoint)
    runtime.begin_operation("manual__roll", "roll_restart_apps roll")
    run = apply_policy(app_with(checkpoint, every_batches=1, keep_last=1, keep_for="1 hour"))
    assert run.taken is None and run.why == "deferred: roll_restart_apps roll (run manual__roll) is changing it"
    assert list_backups(checkpoint) == []


def test_an_app_without_a_policy_is_left_alone(tmp_path: Path):
    checkpoint = stateful_checkpoint(tmp_path, committed=3)
    snapshot_at(checkpoint, datetime(2020, 1, 1, tzinfo=UTC), "before-reset")
    run = apply_policy(app_with(checkpoint))
    assert run.why == "the app has no snapshot policy" and run.removed == [] and len(list_backups(checkpoint)) == 1
    assert Snapshot.of(list_backups(checkpoint)[0]).code_text() == "1.0.0 (aa)"


# --- the command line -----------------------------------------------------------------------------


def test_the_command_line_lists_the_snapshots_and_reads_only_a_kept_one(tmp_path: Path, monkeypatch):
    from typer.testing import CliRunner

    from streamops.cli import app

    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    checkpoint = stateful_checkpoint(tmp_path, committed=2).rename(tmp_path / "checkpoints" / "presence-notifier")
    write_driver(checkpoint, "2.0.0", "sha256:aa")
    shot = snapshot_at(checkpoint, NOW - timedelta(days=10), "before-2.1.0", "2.0.0", "sha256:aa", batch=2)
    listed = CliRunner().invoke(app, ["app", "snapshots", "presence-notifier"])
    assert listed.exit_code == 0, listed.output
    assert "policy: every 6 hours; keep the last 4 and every one younger than 2 days" in listed.output  # the catalog's
    assert shot in listed.output and "2.0.0 (aa)" in listed.output and "count #2" in listed.output
    as_json = json.loads(CliRunner().invoke(app, ["app", "snapshots", "presence-notifier", "--json"]).output)
    assert [(r["name"], r["kept"], r["why"]) for r in as_json] == [(shot, True, ["one of the last 4"])]
    refused = CliRunner().invoke(app, ["app", "state", "presence-notifier", "--snapshot", "20260101T000000.000000Z-x"])
    assert refused.exit_code != 0
    assert ("refused: snapshot '20260101T000000.000000Z-x' is not among presence-notifier's snapshots; the latest are: "
            f"{shot}") in refused.output


def test_a_checkpoint_that_went_back_is_due_again_and_a_scheduled_copy_gives_way(tmp_path: Path, monkeypatch):
    checkpoint = stateful_checkpoint(tmp_path, committed=2)
    last = snapshot_at(checkpoint, NOW - timedelta(hours=1), SCHEDULED, batch=9)  # before a restore to batch 2
    went_back = due(SnapshotPolicy(every_batches=3), checkpoint, snapshots(checkpoint), NOW)
    assert went_back.due and went_back.why == f"query count committed 3 batch(es) since {last} (every 3)"
    assert not due(SnapshotPolicy(every_batches=4), checkpoint, snapshots(checkpoint), NOW).due

    # A run begins changing the app while the scheduled copy runs: the copy stops, nothing is left.
    app = app_with(checkpoint, every_batches=1, keep_last=5, keep_for="1 hour")
    runtime = AppRuntime(checkpoint)
    import streamops.checkpoints as checkpoints

    real_tree = checkpoints._Copier.tree

    def slow_tree(self, source, target, newest):
        if source.name == "state" and not runtime.operation():
            runtime.begin_operation("manual__reset", "recover_reset_offsets apply")
            self._asked = 0.0  # ask at once
        return real_tree(self, source, target, newest)

    monkeypatch.setattr(checkpoints._Copier, "tree", slow_tree)
    run = apply_policy(app)
    assert run.taken is None and run.why == ("deferred: recover_reset_offsets apply (run manual__reset) began changing "
                                             "the app")
    assert [p.name for p in list_backups(checkpoint)] == [last] and sorted(os.listdir(backups_dir(checkpoint))) == [last]
    runtime.end_operation("manual__reset")
    monkeypatch.undo()

    # Another copy or restore holds the files: the scheduled copy does not wait.
    import fcntl

    with open(runtime.dir / "snapshots.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        other = subprocess.run([sys.executable, "-c", (
            "import sys; from streamops.snapshots import apply_policy; from streamops.catalog import AppSpec; import json;"
            f"app = AppSpec.model_validate_json({app.model_dump_json()!r}); print(apply_policy(app).why)")],
            capture_output=True, text=True, timeout=60)
    busy = f"another copy, restore or prune of {checkpoint} is under way"
    assert other.stdout.strip() == f"deferred: {busy}; pruning deferred: {busy}", other.stderr
