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
    <checkpoint>/_runtime/                 the suite's own files (lease, driver.json, ...): never
                                           a query, never part of a snapshot
    <checkpoint root>/_backups/<app>/<UTC time>-<label>/   a snapshot: the query folders and
                                           `_backup.json` (label, time, the driver that wrote it)

Spark writes each log file atomically (a hidden temporary file, then a rename), so a reader sees
a whole file or none; only files named by a batch number count. A commit whose offset log entry is
missing, or an entry that does not parse, is a damaged checkpoint: reading it raises, nothing here
guesses.

Imported by the Spark apps' driver (spark_apps.common.runner): no Airflow, no Kafka client here.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

RUNTIME_FOLDER = "_runtime"
BACKUP_INFO = "_backup.json"


# --- snapshots --------------------------------------------------------------------------------------


def backups_dir(checkpoint: str | Path) -> Path:
    """Where the app's snapshots are: <checkpoint root>/_backups/<app>."""
    location = Path(checkpoint)
    return location.parent / "_backups" / location.name


def backup_checkpoint(checkpoint: str | Path, label: str) -> Path:
    """Copy the checkpoint (not its _runtime folder) to a new timestamped snapshot; keep all.
    The snapshot says what it holds in `_backup.json`: label, time, and the driver that last
    wrote the checkpoint (version and launch conf, so a restore can start that version again)."""
    from streamops.app_runtime import AppRuntime

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = backups_dir(checkpoint) / f"{stamp}-{label}"
    shutil.copytree(checkpoint, target, ignore=shutil.ignore_patterns(RUNTIME_FOLDER))
    driver = AppRuntime(str(checkpoint)).driver() or {}
    info = {
        "label": label,
        "taken_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "version": driver.get("version"),
        "launch": driver.get("launch") or {},
        "code": driver.get("code"),  # the artifact (digest) that wrote it
    }
    (target / BACKUP_INFO).write_text(json.dumps(info, indent=1, sort_keys=True))
    return target


def backup_info(backup: Path) -> dict:
    """What `backup_checkpoint` recorded about a snapshot (older snapshots: the label only)."""
    try:
        return json.loads((backup / BACKUP_INFO).read_text())
    except (FileNotFoundError, ValueError):
        return {"label": backup.name.split("-", 1)[-1]}


def list_backups(checkpoint: str | Path) -> list[Path]:
    """The app's snapshots, oldest first (names start with their UTC time)."""
    root = backups_dir(checkpoint)
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def restore_checkpoint(checkpoint: str | Path, backup: Path) -> Path:
    """Put `backup` in place of the checkpoint's query folders. What was there is kept as a
    snapshot of its own ("replaced-..."), never deleted. Returns that snapshot."""
    replaced = backup_checkpoint(checkpoint, "replaced")
    retire_queries(checkpoint)
    for child in backup.iterdir():
        if child.name.startswith("_"):  # _backup.json, never a query folder
            continue
        target = Path(checkpoint) / child.name
        shutil.copytree(child, target) if child.is_dir() else shutil.copy2(child, target)
    return replaced


def retire_queries(checkpoint: str | Path) -> None:
    """Remove the query folders, keeping _runtime (lease, history, ledgers). Callers take a
    backup first: the checkpoint then starts new, and the snapshot is the way back."""
    for child in Path(checkpoint).iterdir() if Path(checkpoint).exists() else []:
        if child.name != RUNTIME_FOLDER:
            shutil.rmtree(child) if child.is_dir() else child.unlink()
