"""streamops.checkpoints on checkpoint folders written by hand in the layout Spark writes (no Spark,
no broker): query folders, positions, committed and uncommitted batches, initial offsets, and
snapshots (backup, list, restore, retire)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from streamops.app_runtime import AppRuntime
from streamops.checkpoints import (
    BACKUP_INFO,
    QueryPosition,
    backup_checkpoint,
    backup_info,
    backup_path,
    backups_dir,
    batch_marks,
    batch_offsets,
    committed_batch_metadata,
    committed_offsets,
    has_state,
    initial_offsets,
    last_batch_id,
    list_backups,
    offset_log_entry,
    positions,
    query_dir,
    query_dirs,
    restore_checkpoint,
    retire_queries,
    uncommitted_batch,
)
from streamops.driver_processes import DriverStillWriting, await_driver_exit
from streamops.runtime_files import write_json_atomic

EVENTS, TICKS = "app.events", "app.ticks"


# --- Spark's layout, written by hand ------------------------------------------------------------------
# Each file as Spark 4 writes it (see a test run's checkpoint): no newline at the end, a hidden
# .<N>.crc beside each log file, sources/<n>/0 starting with a NUL byte.


def new_query(checkpoint: Path, name: str) -> Path:
    folder = checkpoint / name
    (folder / "offsets").mkdir(parents=True)
    (folder / "commits").mkdir()
    (folder / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    return folder


def plan_batch(query: Path, batch: int, *sources: dict[str, dict[str, int]], watermark_ms: int = 0) -> None:
    """offsets/<batch>: the log version, the batch metadata, one line per source."""
    metadata = {"batchWatermarkMs": watermark_ms, "batchTimestampMs": 1795574571765 + batch,
                "conf": {"spark.sql.shuffle.partitions": "4"}}
    lines = ["v1", json.dumps(metadata, separators=(",", ":")), *(json.dumps(s, separators=(",", ":")) for s in sources)]
    (query / "offsets" / str(batch)).write_text("\n".join(lines))
    (query / "offsets" / f".{batch}.crc").write_bytes(b"crc")


def commit_batch(query: Path, batch: int) -> None:
    (query / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (query / "commits" / f".{batch}.crc").write_bytes(b"crc")


def record_start(query: Path, source: int, payload: bytes) -> None:
    folder = query / "sources" / str(source)
    folder.mkdir(parents=True)
    (folder / "0").write_bytes(b"\x00v1\n" + payload)


def kafka_start(offsets: dict[str, dict[str, int]]) -> bytes:
    return json.dumps(offsets, separators=(",", ":")).encode()


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """An app's checkpoint: query `route` committed batches 0 and 1 and planned 2 (it failed on
    it); query `count` planned its first batch only; a runtime folder and a folder that is no query."""
    root = tmp_path / "checkpoints" / "my-app"
    route = new_query(root, "route")
    record_start(route, 0, kafka_start({EVENTS: {"0": 0, "1": 5}}))
    plan_batch(route, 0, {EVENTS: {"0": 10, "1": 5}})
    commit_batch(route, 0)
    plan_batch(route, 1, {EVENTS: {"0": 25, "1": 9}}, watermark_ms=1_700_000_000_000)
    commit_batch(route, 1)
    plan_batch(route, 2, {EVENTS: {"0": 40, "1": 9}})
    # A log file being written: Spark writes a hidden temporary file, then renames it.
    (route / "commits" / f".2.{uuid.uuid4()}.tmp").write_text("v1\n")
    count = new_query(root, "count")
    record_start(count, 0, kafka_start({EVENTS: {"0": 3, "1": 0}}))
    plan_batch(count, 0, {EVENTS: {"0": 7, "1": 2}})
    (root / "scratch").mkdir()  # no offset log: not a query
    runtime = AppRuntime(root)
    runtime.dir.mkdir(parents=True)
    write_json_atomic(runtime.driver_file, {
        "app": "my-app", "version": "1.2.0", "code": {"artifact": "my-app", "digest": "sha256:ab"},
        "launch": {"version": "1.2.0", "spark_conf": {"spark.sql.shuffle.partitions": "4"}},
    })
    return root


def tree(folder: Path) -> dict[str, bytes]:
    """The files under `folder` and their bytes (not the snapshots' lock file, an empty file the
    first copy leaves in the runtime folder)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "snapshots.lock"}


# --- queries, positions, batches --------------------------------------------------------------------


def test_queries_and_their_positions(checkpoint: Path):
    assert [d.name for d in query_dirs(checkpoint)] == ["count", "route"]
    assert query_dir(checkpoint, "route") == checkpoint / "route"
    assert last_batch_id(checkpoint / "route") == 1  # batch 2 was planned, not committed
    assert last_batch_id(checkpoint / "count") is None
    assert positions(checkpoint) == {
        "count": QueryPosition("count", None, {}),
        "route": QueryPosition("route", 1, {EVENTS: {0: 25, 1: 9}}),
    }
    assert batch_marks(checkpoint) == {"count": None, "route": 1}
    assert committed_offsets(checkpoint / "route") == {EVENTS: {0: 25, 1: 9}}
    assert committed_offsets(checkpoint / "count") is None
    assert committed_batch_metadata(checkpoint / "route")["batchWatermarkMs"] == 1_700_000_000_000
    assert committed_batch_metadata(checkpoint / "count") is None


def test_a_checkpoint_not_written_yet(tmp_path: Path):
    missing = tmp_path / "checkpoints" / "never-started"
    assert query_dirs(missing) == [] and positions(missing) == {} and batch_marks(missing) == {}
    assert not has_state(missing)
    new_query(missing, "route")  # a query that has not planned a batch
    assert positions(missing) == {"route": QueryPosition("route", None, {})}
    assert uncommitted_batch(missing / "route") is None and initial_offsets(missing / "route") is None


def test_a_query_reading_several_sources(tmp_path: Path):
    """One JSON line per source; a topic read by two sources is one topic of the position."""
    query = new_query(tmp_path / "app", "notify")
    plan_batch(query, 0, {EVENTS: {"0": 101, "1": 49}}, {TICKS: {"0": 258}}, {EVENTS: {"2": 33}})
    commit_batch(query, 0)
    assert committed_offsets(query) == {EVENTS: {0: 101, 1: 49, 2: 33}, TICKS: {0: 258}}
    assert batch_offsets(query, 0) == committed_offsets(query)
    assert batch_offsets(query, 1) is None
    assert offset_log_entry(query, 0) == (query / "offsets" / "0").read_text()
    assert offset_log_entry(query, 1) is None


def test_the_batch_a_failed_query_stopped_on(checkpoint: Path):
    """From the last committed batch's ends to the planned batch's; partitions without new
    records in it are not named."""
    assert uncommitted_batch(checkpoint / "route") == {
        "batch": 2, "ranges": [{"topic": EVENTS, "partition": 0, "first": 25, "last": 39}],
    }
    commit_batch(checkpoint / "route", 2)
    assert uncommitted_batch(checkpoint / "route") is None


def test_a_first_batch_starts_at_the_initial_offsets(checkpoint: Path):
    assert initial_offsets(checkpoint / "count") == {EVENTS: {0: 3, 1: 0}}
    assert uncommitted_batch(checkpoint / "count") == {
        "batch": 0, "ranges": [{"topic": EVENTS, "partition": 0, "first": 3, "last": 6},
                               {"topic": EVENTS, "partition": 1, "first": 0, "last": 1}],
    }


def test_initial_offsets_of_every_kafka_source(tmp_path: Path):
    query = new_query(tmp_path / "app", "notify")
    assert initial_offsets(query) is None  # no source has started
    record_start(query, 0, kafka_start({EVENTS: {"0": 0, "1": 12}}))
    record_start(query, 1, kafka_start({TICKS: {"0": 4}}))
    record_start(query, 2, b"1795574571765")  # a rate source records its start time, not offsets
    assert initial_offsets(query) == {EVENTS: {0: 0, 1: 12}, TICKS: {0: 4}}


def test_a_half_written_start_is_not_a_start(tmp_path: Path):
    query = new_query(tmp_path / "app", "route")
    record_start(query, 0, kafka_start({EVENTS: {"0": 0, "1": 12}})[:-7])
    assert initial_offsets(query) is None
    record_start(query, 1, kafka_start({TICKS: {"0": 4}}))
    assert initial_offsets(query) == {TICKS: {0: 4}}


def test_a_damaged_offset_log_is_not_guessed(checkpoint: Path):
    """A commit whose offset log entry is missing, or an entry cut short, raises: a position
    read from a damaged checkpoint would be a wrong one."""
    route = checkpoint / "route"
    (route / "offsets" / "1").unlink()
    with pytest.raises(FileNotFoundError):
        committed_offsets(route)
    with pytest.raises(FileNotFoundError):
        positions(checkpoint)
    plan_batch(route, 1, {EVENTS: {"0": 25, "1": 9}})
    (route / "offsets" / "1").write_text((route / "offsets" / "1").read_text()[:-10])
    with pytest.raises(ValueError):
        committed_offsets(route)


def test_state_stores(checkpoint: Path):
    assert not has_state(checkpoint)
    (checkpoint / "count" / "state" / "0" / "0").mkdir(parents=True)
    assert has_state(checkpoint)


# --- snapshots ----------------------------------------------------------------------------------------


def test_backup_and_restore_round_trip(checkpoint: Path):
    before = tree(checkpoint)
    # Neither the runtime folder nor a log file Spark is still writing (a restart writes it again).
    queries = {k: v for k, v in before.items() if not k.startswith("_runtime") and not k.endswith(".tmp")}
    backup = backup_checkpoint(checkpoint, "before-test")

    assert backup.parent == backups_dir(checkpoint) == checkpoint.parent / "_backups" / "my-app"
    assert backup.name.endswith("-before-test") and backup_path(checkpoint, backup.name) == backup
    assert tree(backup) == {**queries, BACKUP_INFO: (backup / BACKUP_INFO).read_bytes()}  # no _runtime
    info = backup_info(backup)
    assert info["taken_at"] and {k: v for k, v in info.items() if k != "taken_at"} == {
        "label": "before-test", "version": "1.2.0", "code": {"artifact": "my-app", "digest": "sha256:ab"},
        "launch": {"version": "1.2.0", "spark_conf": {"spark.sql.shuffle.partitions": "4"}},
    }
    assert batch_marks(backup) == {"count": None, "route": 1}

    # The app goes on: batch 2 committed, 3 planned, a new query.
    commit_batch(checkpoint / "route", 2)
    plan_batch(checkpoint / "route", 3, {EVENTS: {"0": 41, "1": 9}})
    commit_batch(checkpoint / "route", 3)
    plan_batch(new_query(checkpoint, "extra"), 0, {TICKS: {"0": 1}})
    moved = tree(checkpoint)

    replaced = restore_checkpoint(checkpoint, backup)
    # The queries as backed up, the runtime folder untouched.
    assert tree(checkpoint) == {k: v for k, v in before.items() if not k.endswith(".tmp")}
    assert positions(checkpoint)["route"] == QueryPosition("route", 1, {EVENTS: {0: 25, 1: 9}})
    assert backup_info(replaced)["label"] == "replaced"
    assert tree(replaced) == {**{k: v for k, v in moved.items() if not k.startswith("_runtime") and not k.endswith(".tmp")},
                              BACKUP_INFO: (replaced / BACKUP_INFO).read_bytes()}
    assert batch_marks(replaced) == {"count": None, "extra": None, "route": 3}
    assert list_backups(checkpoint) == [backup, replaced]  # oldest first; nothing deleted


def test_retire_keeps_the_runtime_folder(checkpoint: Path):
    runtime = tree(checkpoint / "_runtime")
    (checkpoint / "stray-file").write_text("x")
    retire_queries(checkpoint)
    assert [p.name for p in checkpoint.iterdir()] == ["_runtime"] and tree(checkpoint / "_runtime") == runtime
    assert positions(checkpoint) == {}
    retire_queries(checkpoint.parent / "never-started")  # nothing there: nothing to do


def test_snapshots_without_or_with_a_damaged_description(tmp_path: Path):
    checkpoint = tmp_path / "checkpoints" / "my-app"
    assert list_backups(checkpoint) == []
    old = backup_path(checkpoint, "20250101T000000.000000Z-before-reset")
    old.mkdir(parents=True)
    assert backup_info(old) == {"label": "before-reset"}  # taken before snapshots described themselves
    cut = backup_path(checkpoint, "20250102T000000.000000Z-before-rebuild")
    cut.mkdir()
    (cut / BACKUP_INFO).write_text('{"label": "before-reb')
    assert backup_info(cut) == {"label": "before-rebuild"}
    (backups_dir(checkpoint) / "notes.txt").write_text("not a snapshot")
    assert list_backups(checkpoint) == [old, cut]


def test_a_driver_record_that_cannot_describe_the_snapshot_does_not_stop_the_backup(checkpoint: Path):
    runtime = AppRuntime(str(checkpoint))
    write_json_atomic(runtime.driver_file, {**json.loads(runtime.driver_file.read_text()), "version": 12})  # not text
    backup = backup_checkpoint(checkpoint, "before-test")
    assert batch_marks(backup) == {"count": None, "route": 1}  # the queries were backed up
    info = backup_info(backup)
    assert info["label"] == "before-test" and info["taken_at"] and "version" not in info


def test_a_restore_waits_for_the_last_drivers_jvm_to_end_and_refuses_while_a_driver_holds_the_lease(checkpoint: Path):
    """The Python driver has released its lease; its JVM (same process group, a real process
    here) still uploads a state snapshot as it shuts down. The restore waits for it to end: the
    late file is in the replaced snapshot and the restored checkpoint is exactly the backup."""
    backup = backup_checkpoint(checkpoint, "before-reset")
    go = checkpoint.parent / "go"
    late = checkpoint / "count" / "state" / "0" / "0" / "1.zip"
    # Waits for `go`, then writes late (as RocksDB's maintenance does, a moment later) and exits.
    jvm = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, sys, time\ngo, late = map(pathlib.Path, sys.argv[1:3])\n"
         "while not go.exists(): time.sleep(0.01)\ntime.sleep(0.5)\nlate.parent.mkdir(parents=True)\n"
         "late.write_bytes(b'snapshot')", str(go), str(late), "org.apache.spark.deploy.SparkSubmit", "--app", "my-app"],
        start_new_session=True)
    try:
        runtime = AppRuntime(checkpoint)
        record = json.loads(runtime.driver_file.read_text())
        write_json_atomic(runtime.driver_file, {**record, "pid": 999999, "host": socket.gethostname(),
                                                "process_group": jvm.pid, "stopped_at": "2026-12-07T20:18:09Z"})
        before = tree(checkpoint)
        with pytest.raises(DriverStillWriting, match=rf"released its lease, but its processes were still alive 0.3s later "
                                                      rf"\(pid {jvm.pid} .*`ps -g {jvm.pid}`.*folders were not touched"):
            await_driver_exit(checkpoint, timeout_s=0.3)
        assert tree(checkpoint) == before
        go.touch()
        replaced = restore_checkpoint(checkpoint, backup)
        assert jvm.poll() == 0
        assert (replaced / "count" / "state" / "0" / "0" / "1.zip").read_bytes() == b"snapshot"
        assert {k: v for k, v in tree(checkpoint).items() if not k.startswith("_runtime")} == \
            {k: v for k, v in tree(backup).items() if k != BACKUP_INFO}
    finally:
        if jvm.poll() is None:
            jvm.kill()
        jvm.wait()

    runtime.acquire({"app": "my-app"})  # a driver holds the lease: refused at once, nothing touched
    try:
        with pytest.raises(DriverStillWriting, match=f"driver pid {os.getpid()} on .* holds the lease of .*stop the app first"):
            retire_queries(checkpoint)
        assert query_dirs(checkpoint)
    finally:
        runtime.release("stopped", "test")
