"""The checkpoint floor: the one module that reads and copies an app's checkpoint files.

An app's checkpoint is a folder with one folder per streaming query (Spark's checkpointLocation
of that query), beside the runtime folder the suite writes (streamops.app_runtime) and, next to
the checkpoint, its snapshots:

    <checkpoint>/<query>/metadata          the query's id (JSON)
    <checkpoint>/<query>/offsets/<N>       batch N's offset log entry, written before the batch
                                           runs: "v1", the batch metadata (JSON: watermark, time,
                                           conf), then one JSON line per source, topic ->
                                           partition -> end offset (the next one to read)
    <checkpoint>/<query>/commits/<N>       written after batch N succeeded
    <checkpoint>/<query>/sources/<n>/0     where source n started on this checkpoint: a NUL byte,
                                           "v1", then JSON (a Kafka source: topic -> partition ->
                                           offset)
    <checkpoint>/<query>/state/            the state store of a stateful query
    <checkpoint>/_kafka_cluster.json       the Kafka cluster (id, address) its offsets belong to
                                           (`bind_cluster`, a ClusterBinding): part of every snapshot
    <checkpoint>/_runtime/                 the suite's own files (lease, driver.json, ...): never
                                           a query, never part of a snapshot
    <checkpoint root>/_backups/<app>/<UTC time>-<label>/   a snapshot: the query folders and
                                           `_backup.json` (a BackupInfo: label, time, the driver
                                           that wrote it)

Spark writes each log file atomically (a hidden temporary file, then a rename), so a reader sees
a whole file or none; only files named by a batch number count. A commit whose offset log entry is
missing, or an offset log entry that does not parse, is a damaged checkpoint: reading it raises,
nothing here guesses (a source's start that does not parse is left out: see initial_offsets).

Imported by the Spark apps' driver (streamops.driver): no Airflow, no Kafka client here.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.driver_processes import await_driver_exit
from streamops.runtime_records import BackupInfo, ClusterBinding, InputRange, RuntimeRecordError, UncommittedBatch, checked
from streamops.timestamps import file_stamp, iso_seconds_utc, now_iso, utc_now

log = logging.getLogger("streamops.checkpoints")

Offsets = dict[str, dict[int, int]]  # topic -> partition -> offset

RUNTIME_FOLDER = "_runtime"
BACKUP_INFO = "_backup.json"
CLUSTER_FILE = "_kafka_cluster.json"


# --- queries and batches ----------------------------------------------------------------------------


def query_dirs(checkpoint: str | Path) -> list[Path]:
    """The checkpoint's query folders (those with an offset log), by name."""
    root = Path(checkpoint)
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_") and (p / "offsets").exists())


def query_dir(checkpoint: str | Path, query: str) -> Path:
    """The folder of query `query` in the checkpoint (it may not exist yet)."""
    return Path(checkpoint) / query


def _batch_ids(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.glob("[0-9]*") if p.name.isdigit()) if folder.exists() else []


def committed_batches(query_dir: Path) -> list[int]:
    """The query's committed micro-batches still in its commit log, oldest first."""
    return _batch_ids(query_dir / "commits")


def last_batch_id(query_dir: Path) -> int | None:
    """The query's last committed micro-batch (None: none yet)."""
    committed = committed_batches(query_dir)
    return committed[-1] if committed else None


def _source_offsets(lines: list[str]) -> Offsets:
    merged: Offsets = {}
    for line in lines:
        if line.startswith("{"):
            for topic, partitions in json.loads(line).items():
                merged.setdefault(topic, {}).update({int(p): int(o) for p, o in partitions.items()})
    return merged


def batch_offsets(query_dir: Path, batch: int) -> Offsets | None:
    """topic -> partition -> end offset (the next one to read) of `batch` in the offset log
    (None: the log has no such batch)."""
    path = query_dir / "offsets" / str(batch)
    if not path.exists():
        return None
    return _source_offsets(path.read_text().splitlines()[2:])


def offset_log_entry(query_dir: Path, batch: int) -> str | None:
    """The offset log's entry for `batch` as Spark wrote it (None: no such batch)."""
    path = query_dir / "offsets" / str(batch)
    return path.read_text() if path.exists() else None


def _last_committed_lines(query_dir: Path) -> list[str] | None:
    last = last_batch_id(query_dir)
    if last is None:
        return None
    return (query_dir / "offsets" / str(last)).read_text().splitlines()


def committed_offsets(query_dir: Path) -> Offsets | None:
    """topic -> partition -> next offset, as of the query's last committed batch (None: none yet)."""
    lines = _last_committed_lines(query_dir)
    return None if lines is None else _source_offsets(lines[2:])


def committed_batch_metadata(query_dir: Path) -> dict[str, Any] | None:
    """The metadata of the query's last committed batch (batchWatermarkMs, batchTimestampMs,
    conf); None: none yet."""
    lines = _last_committed_lines(query_dir)
    return None if lines is None else json.loads(lines[1])


def initial_offsets(query_dir: Path) -> Offsets | None:
    """Where the query's Kafka sources started on this checkpoint: sources/<n>/0 of each (None:
    no source has recorded its start yet). A source whose start is not Kafka offsets (a rate
    source writes a number) or not readable is left out."""
    written = sorted((query_dir / "sources").glob("*/0")) if (query_dir / "sources").exists() else []
    merged: Offsets = {}
    found = False
    for path in written:
        try:
            _version, _, payload = path.read_bytes().lstrip(b"\x00").decode().partition("\n")
            for topic, parts in json.loads(payload).items():
                merged.setdefault(topic, {}).update({int(p): int(o) for p, o in parts.items()})
        except (ValueError, AttributeError, TypeError):
            continue
        found = True
    return merged if found else None


def uncommitted_batch(query_dir: Path) -> UncommittedBatch | None:
    """The batch the query planned (offsets/<N>) but did not commit (no commits/<N>): the one a
    failed query stopped on, which a restart runs again with the same offsets. With the input it
    covers: {"batch": N, "ranges": [{"topic", "partition", "first", "last"}, ...]} (last
    inclusive, only partitions with records in it). None: every planned batch was committed."""
    planned, committed = _batch_ids(query_dir / "offsets"), _batch_ids(query_dir / "commits")
    if not planned or (committed and planned[-1] <= committed[-1]):
        return None
    batch = planned[-1]
    ends = batch_offsets(query_dir, batch) or {}
    starts = (batch_offsets(query_dir, committed[-1]) if committed else None) or initial_offsets(query_dir) or {}
    ranges: list[InputRange] = [
        {"topic": topic, "partition": partition, "first": starts.get(topic, {}).get(partition, 0), "last": end - 1}
        for topic, partitions in sorted(ends.items()) for partition, end in sorted(partitions.items())
        if end > starts.get(topic, {}).get(partition, 0)
    ]
    return {"batch": batch, "ranges": ranges}


def has_state(checkpoint: str | Path) -> bool:
    """Does a query of the checkpoint keep a state store?"""
    return any((d / "state").exists() for d in query_dirs(checkpoint))


# --- positions --------------------------------------------------------------------------------------


@dataclass
class QueryPosition:
    query: str
    batch: int | None  # last committed micro-batch (None: none yet)
    offsets: Offsets  # topic -> partition -> next offset to read


def positions(checkpoint: str | Path) -> dict[str, QueryPosition]:
    """Per query of the checkpoint: its last committed batch and the offsets it will read next."""
    return {
        d.name: QueryPosition(d.name, last_batch_id(d), committed_offsets(d) or {})
        for d in query_dirs(checkpoint)
    }


def batch_marks(checkpoint: str | Path) -> dict[str, int | None]:
    """query -> last committed batch: compared between plan and apply to catch a moved checkpoint."""
    return {name: pos.batch for name, pos in positions(checkpoint).items()}


# --- the Kafka cluster a checkpoint belongs to ------------------------------------------------------


class CheckpointOfAnotherCluster(RuntimeError):
    """The checkpoint's offsets were written against another Kafka cluster: nothing was started."""


def checkpoint_cluster(checkpoint: str | Path) -> ClusterBinding | None:
    """The cluster the checkpoint was written against (None: not recorded: a new checkpoint, one
    from before checkpoints recorded it, or a file that is not a ClusterBinding, which the next
    launch binds again)."""
    path = Path(checkpoint) / CLUSTER_FILE
    try:
        return checked(ClusterBinding, json.loads(path.read_text()), str(path))
    except (FileNotFoundError, ValueError):  # RuntimeRecordError too
        return None


def cluster_problem(app: str, checkpoint: str | Path, cluster_id: str | None, bootstrap: str) -> str | None:
    """Why the checkpoint cannot run against `cluster_id` (its offsets belong to another cluster),
    with the ways forward; None when it can (same cluster, no offsets yet, or not recorded)."""
    recorded = checkpoint_cluster(checkpoint)
    if cluster_id is None or recorded is None or recorded["cluster_id"] == cluster_id or not query_dirs(checkpoint):
        return None
    return (f"{app}'s checkpoint ({checkpoint}) was written against Kafka cluster {recorded['cluster_id']} "
            f"({recorded.get('bootstrap') or '?'}), and this environment's cluster is {cluster_id} ({bootstrap}): its "
            "offsets mean nothing there, and Spark would fail on them or skip data. Ways forward: give each environment "
            "a checkpoint root of its own ($STREAMOPS_CHECKPOINT_ROOT, or the app's checkpoint in the environment's "
            "catalog section), or move it onto this cluster on a new checkpoint from the earliest offsets "
            "(recover_rebuild_state; the old checkpoint is backed up)")


def bind_cluster(app: str, checkpoint: str | Path, cluster_id: str | None, bootstrap: str) -> None:
    """Record the cluster a launch runs the checkpoint against; CheckpointOfAnotherCluster if its
    offsets were written against another one. A checkpoint without offsets is (re)bound."""
    if cluster_id is None:
        return
    if problem := cluster_problem(app, checkpoint, cluster_id, bootstrap):
        raise CheckpointOfAnotherCluster(problem)
    recorded = checkpoint_cluster(checkpoint)
    if recorded is not None and recorded["cluster_id"] == cluster_id:
        return
    root = Path(checkpoint)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{CLUSTER_FILE}.tmp"
    # A ClusterBinding (read back through it: checkpoint_cluster).
    tmp.write_text(json.dumps({"cluster_id": cluster_id, "bootstrap": bootstrap,
                               "at": iso_seconds_utc(utc_now())}, sort_keys=True))
    tmp.replace(root / CLUSTER_FILE)


# --- snapshots --------------------------------------------------------------------------------------

_held = threading.local()  # per thread: checkpoint -> how deep its files lock is held


class FilesBusy(RuntimeError):
    """files_lock(wait=False): another copy, restore or prune holds the checkpoint's files."""


def files_lock(checkpoint: str | Path, *, wait: bool = True) -> AbstractContextManager[None]:
    """One copy or replacement of the checkpoint's files, or one pruning of its snapshots, at a
    time: a restore never replaces the queries a scheduled copy is reading, a prune never removes
    the snapshot a restore is copying. A flock on _runtime/snapshots.lock (the kernel releases it
    if the process dies); re-entrant within a thread (a restore takes a backup first). Without
    `wait`, FilesBusy at once when another holds it (a scheduled copy gives way)."""
    return _files_lock(checkpoint, wait)


@contextmanager
def _files_lock(checkpoint: str | Path, wait: bool) -> Iterator[None]:
    key = str(Path(checkpoint).resolve())
    depths: dict[str, int] = getattr(_held, "depths", None) or {}
    _held.depths = depths
    if depths.get(key):
        depths[key] += 1
        try:
            yield
        finally:
            depths[key] -= 1
        return
    runtime_dir = Path(checkpoint) / RUNTIME_FOLDER
    runtime_dir.mkdir(parents=True, exist_ok=True)
    with open(runtime_dir / "snapshots.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FilesBusy(f"another copy, restore or prune of {checkpoint} is under way") from None
        depths[key] = 1
        try:
            yield
        finally:
            depths[key] = 0
            fcntl.flock(lock, fcntl.LOCK_UN)


def backups_dir(checkpoint: str | Path) -> Path:
    """Where the app's snapshots are: <checkpoint root>/_backups/<app>."""
    location = Path(checkpoint)
    return location.parent / "_backups" / location.name


def backup_path(checkpoint: str | Path, name: str) -> Path:
    """The snapshot called `name` (as list_backups names them) of the checkpoint."""
    return backups_dir(checkpoint) / name


def backup_checkpoint(checkpoint: str | Path, label: str, *, wait: bool = True,
                      give_way: Callable[[], str | None] | None = None) -> Path:
    """Copy the checkpoint (not its _runtime folder) to a new timestamped snapshot; keep all (an
    app's snapshot policy prunes them: streamops.snapshots). Safe while the app runs
    (copy_checkpoint). The snapshot says what it holds in `_backup.json`: label, time, and the
    driver that last wrote the checkpoint (version and launch conf, so a restore can start that
    version again), read once the copy holds the files. Written under a hidden name and renamed
    when whole: a copy cut short (a killed task) is never listed as a snapshot. `wait` and
    `give_way`: a scheduled copy's (files_lock's FilesBusy; copy_checkpoint's CopyStopped, the
    partial copy removed)."""
    with files_lock(checkpoint, wait=wait):  # a hidden copy exists only while its writer holds the lock, or left by a dead one
        stamp = file_stamp(utc_now())
        target = backups_dir(checkpoint) / f"{stamp}-{label}"
        partial = backups_dir(checkpoint) / f"{PARTIAL_PREFIX}{stamp}-{label}"
        driver = AppRuntime(str(checkpoint)).driver() or DriverRecord()
        try:
            info = checked(BackupInfo, {
                "label": label,
                "taken_at": now_iso(),
                "version": driver.version,
                "launch": driver.launch.to_json(),
                "code": driver.code.to_json() if driver.code else None,  # the artifact (digest) that wrote it
            }, str(target / BACKUP_INFO))
        except RuntimeRecordError as exc:
            # A backup is never refused for want of a description: it then says its label and time only.
            log.warning("%s: the last driver's record does not describe this snapshot (%s); it records its label "
                        "and time only", checkpoint, exc)
            info = BackupInfo(label=label, taken_at=now_iso())
        try:
            vanished = copy_checkpoint(checkpoint, partial, give_way)
        except CopyStopped:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        if vanished:
            info["skipped_files"] = len(vanished)
            log.info("%s: %d file(s) the running app's maintenance removed during the copy were left out (older "
                     "versions Spark no longer needs), e.g. %s", checkpoint, len(vanished), vanished[0])
        (partial / BACKUP_INFO).write_text(json.dumps(info, indent=1, sort_keys=True))
        partial.rename(target)
    return target


# Hidden names in the snapshots folder: a copy being written, a snapshot being deleted. Never listed.
PARTIAL_PREFIX = ".partial-"
PRUNING_PREFIX = ".pruning-"

# A file of a versioned log or store: batch N's offsets/commit, state version N's delta,
# snapshot, changelog or zip (RocksDB's v2 names add "_<unique id>"), and their ".crc" twins.
_VERSIONED = re.compile(r"^\.?(\d+)(?:[._].*)?$")


class CopyStopped(RuntimeError):
    """A copy gave way (its `give_way` said so): the partial copy is left for its caller to remove."""


class _Copier:
    """One copy: where it is relative to, the files removed meanwhile, hard links or bytes, and
    when to give way (asked at most once a second)."""

    def __init__(self, root: Path, *, link: bool = False, give_way: Callable[[], str | None] | None = None):
        self.root, self.link, self.give_way = root, link, give_way
        self.vanished: list[str] = []
        self._asked = time.monotonic()

    def query(self, query: Path, target: Path) -> None:
        """A query folder, whole as of a commit: its commit log first (its last commit L), then its
        offset log (every entry up to L was written before its commit, so it is there), leaving out
        entries after L + 1 (the batch in flight, which a restart runs again) and commits whose
        offset entry the maintenance removed meanwhile; then the rest, leaving out state of
        versions after L + 1 (what later batches wrote). State version L + 1 is what batch L
        committed, and the maintenance never removes the newest versions."""
        target.mkdir(parents=True)
        self.tree(query / "commits", target / "commits", None)
        committed = committed_batches(target)
        last = committed[-1] if committed else None
        self.tree(query / "offsets", target / "offsets", None if last is None else last + 1)
        planned = set(_batch_ids(target / "offsets"))
        for batch in committed:
            if batch not in planned:  # an old commit whose offsets were purged during the copy
                for stale in (target / "commits").glob(f"*{batch}*"):
                    if (match := _VERSIONED.match(stale.name)) and int(match.group(1)) == batch:
                        stale.unlink()
        for child in sorted(query.iterdir()):
            if child.name not in ("offsets", "commits"):
                self.tree(child, target / child.name, None if last is None else last + 1)

    def tree(self, source: Path, target: Path, newest: int | None) -> None:
        """A file or folder; with `newest`, no versioned file above that version."""
        if self.give_way is not None and time.monotonic() - self._asked >= 1.0:
            self._asked = time.monotonic()
            if why := self.give_way():
                raise CopyStopped(why)
        try:
            if not source.is_dir():
                if source.name.endswith(".tmp"):  # a file Spark is writing (renamed when whole)
                    return
                match = _VERSIONED.match(source.name)
                if newest is not None and match and int(match.group(1)) > newest:
                    return
                if self.link:
                    try:
                        os.link(source, target)
                        return
                    except FileNotFoundError:
                        raise
                    except OSError:  # another file system, or no hard links there: the bytes
                        pass
                shutil.copy2(source, target)
                return
            target.mkdir(exist_ok=True)
            children = sorted(source.iterdir())
        except FileNotFoundError:
            self.vanished.append(str(source.relative_to(self.root)))
            return
        for child in children:
            self.tree(child, target / child.name, newest)


def copy_checkpoint(checkpoint: str | Path, target: Path, give_way: Callable[[], str | None] | None = None) -> list[str]:
    """Copy a checkpoint, running or not, so that each query restarts from the copy: each query
    folder whole as of its last copied commit (_Copier.query). A file removed during the copy (the
    maintenance deleting versions the query no longer needs) is left out; its path relative to
    the checkpoint is returned. Spark writes every checkpoint file by rename, so each file copied
    is whole. Not _runtime. `give_way()` returning a reason stops the copy (CopyStopped)."""
    source = Path(checkpoint)
    target.mkdir(parents=True)
    copier = _Copier(source, give_way=give_way)
    for child in sorted(source.iterdir()):
        if child.name == RUNTIME_FOLDER:
            continue
        if child.is_dir() and (child / "offsets").is_dir():
            copier.query(child, target / child.name)
        else:
            copier.tree(child, target / child.name, None)
    return copier.vanished


def link_query(query: Path, target: Path) -> list[str]:
    """One query folder as copy_checkpoint copies each, as hard links where the file system has
    them (Spark never changes a checkpoint file in place, so a link is as good as a copy for a
    check that only adds files, and takes no space or time): the state check's scratch copy.
    Returns the files removed meanwhile, relative to the checkpoint."""
    copier = _Copier(query.parent, link=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    copier.query(query, target)
    return copier.vanished


def add_empty_batch(query: Path) -> int | None:
    """On a COPY of a query folder only: make the batch after its last commit an empty one (that
    commit's offsets again, planned and not committed, the later entries removed). A restart then
    runs exactly that batch, reading nothing, and Spark's checks of the state against the new plan
    run when it is planned (streamops.driver.state_check). Returns the batch (None: no commit)."""
    committed = committed_batches(query)
    if not committed:
        return None
    last = committed[-1]
    for path in (query / "offsets").iterdir():
        match = _VERSIONED.match(path.name)
        if match and int(match.group(1)) > last:
            path.unlink()
    shutil.copyfile(query / "offsets" / str(last), query / "offsets" / str(last + 1))
    return last + 1


def backup_info(backup: Path) -> BackupInfo:
    """What `backup_checkpoint` recorded about a snapshot (older snapshots, or a description that
    is not a JSON object: the label its name carries only; one that is not a BackupInfo too, with
    a warning naming the file and the field)."""
    path = backup / BACKUP_INFO
    try:
        value = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        value = None
    if isinstance(value, dict):
        try:
            return checked(BackupInfo, value, str(path))
        except RuntimeRecordError as exc:
            log.warning("%s; the snapshot is read by its name", exc)
    return BackupInfo(label=backup.name.split("-", 1)[-1])


def list_backups(checkpoint: str | Path) -> list[Path]:
    """The app's snapshots, oldest first (names start with their UTC time)."""
    root = backups_dir(checkpoint)
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.exists() else []


def restore_checkpoint(checkpoint: str | Path, backup: Path) -> Path:
    """Put `backup` in place of the checkpoint's query folders. What was there is kept as a
    snapshot of its own ("replaced-..."), never deleted. Returns that snapshot. Only once the
    last driver's processes have ended (`await_driver_exit`): its JVM may still write state."""
    await_driver_exit(checkpoint)
    with files_lock(checkpoint):
        if not backup.is_dir():  # removed since the caller chose it: nothing is touched
            raise FileNotFoundError(f"snapshot {backup} is gone (pruned since it was chosen): nothing was restored")
        replaced = backup_checkpoint(checkpoint, "replaced")
        _remove_query_folders(checkpoint)
        for child in backup.iterdir():
            if child.name.startswith("_") and child.name != CLUSTER_FILE:  # _backup.json, never a query folder
                continue
            target = Path(checkpoint) / child.name
            shutil.copytree(child, target) if child.is_dir() else shutil.copy2(child, target)
    return replaced


def retire_queries(checkpoint: str | Path) -> None:
    """Remove the query folders, keeping _runtime (lease, history, ledgers). Callers take a
    backup first: the checkpoint then starts new, and the snapshot is the way back. Only once the
    last driver's processes have ended (`await_driver_exit`): its JVM may still write state."""
    if not Path(checkpoint).exists():
        return
    await_driver_exit(checkpoint)
    with files_lock(checkpoint):
        _remove_query_folders(checkpoint)


def _remove_query_folders(checkpoint: str | Path) -> None:
    """Everything but _runtime, under the files lock the caller holds, its driver gone."""
    for child in Path(checkpoint).iterdir():
        if child.name != RUNTIME_FOLDER:
            shutil.rmtree(child) if child.is_dir() else child.unlink()
