"""Checkpoint snapshots on a schedule, and which of them are kept (an app's `snapshots` policy in
the catalog: streamops.catalog.SnapshotPolicy).

The snapshot_checkpoints DAG runs every few minutes. For each app with a policy it takes a
snapshot when one is due (`due`: so long since the last scheduled one, or so many batches, and a
batch committed since), copied while the app runs (streamops.checkpoints.copy_checkpoint), then
prunes what the policy does not keep (`retention`). `streamops app snapshots APP` lists the same
decisions, and the restore plan lists the snapshots with their batch, time and code.

Kept, whatever the policy's numbers say:
- the last `keep_last` snapshots and every one younger than `keep_for`;
- every snapshot while a run is changing the app (its roll, cutover or restore may go back to the
  one it took), and the snapshots a run that failed while changing it took (its way back, until an
  operator decides);
- a snapshot a restore plan holds (`hold`: from its plan until its apply, at most HOLD_FOR);
- the last good rollback: the newest snapshot of a version (or code) other than the one running
  now (what rolls the last roll back), not one a restore set aside ("replaced": the checkpoint of
  the version that was rolled back from).

An app without a policy keeps every snapshot, as before policies. Removal renames a snapshot to a
hidden name first, so a prune cut short never leaves a half-deleted snapshot in the list.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tabulate import tabulate

from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec, SnapshotPolicy
from streamops.checkpoints import (
    PARTIAL_PREFIX,
    PRUNING_PREFIX,
    CopyStopped,
    FilesBusy,
    backup_checkpoint,
    backup_info,
    backups_dir,
    batch_marks,
    files_lock,
    list_backups,
)
from streamops.kafka_offsets import duration_ms
from streamops.runtime_files import read_json, write_json_atomic
from streamops.runtime_records import OperationRecord, RuntimeRecordError, SnapshotHold
from streamops.timestamps import file_stamp, iso_seconds_utc, parse_file_stamp, parse_recorded_time, utc_now

log = logging.getLogger("streamops.snapshots")

SCHEDULED = "scheduled"  # the label of the snapshots the policy takes
REPLACED = "replaced"  # the label restore_checkpoint gives the checkpoint it set aside
# A restore plan's hold lasts until its apply ends, at most this long (an approval waits an hour).
HOLD_FOR = timedelta(hours=3)


@dataclass
class Snapshot:
    """One snapshot as the lists show it: its name, why it was taken (label), when, the version and
    code of the driver that last wrote the checkpoint, and each query's last committed batch."""

    name: str
    label: str
    taken_at: str | None
    version: str | None
    batches: dict[str, int | None]
    launch: dict = field(default_factory=dict)  # version and Spark conf of the driver that wrote it
    code: dict | None = None  # the code that driver ran (artifact and digest), when recorded

    @classmethod
    def of(cls, path: Path) -> Snapshot:
        info = backup_info(path)
        return cls(path.name, info.get("label", "?"), info.get("taken_at"), info.get("version"), batch_marks(path),
                   info.get("launch") or {}, info.get("code"))

    def taken(self) -> datetime | None:
        """When it was taken: as recorded, or the UTC stamp its name starts with (older snapshots)."""
        recorded = parse_recorded_time(self.taken_at)
        if recorded is not None:
            return recorded
        return parse_file_stamp(self.name.split("-", 1)[0])

    def code_identity(self) -> str | None:
        """What wrote it: the version, its code and its effective spec (None: not recorded)."""
        return code_identity(self.code, self.version, self.launch)

    def code_text(self) -> str:
        digest = (self.code or {}).get("digest")
        return f"{self.version or '?'} ({digest.removeprefix('sha256:')[:12]})" if digest else (self.version or "-")

    def newest_batch(self) -> int | None:
        marks = [b for b in self.batches.values() if b is not None]
        return max(marks) if marks else None


def code_identity(code: dict | None, version: str | None, launch: dict | None = None) -> str | None:
    """A version, the artifact digest it ran and the digest of its effective spec (settings, Spark
    conf, topics: streamops.effective_spec): a roll to another version is a change even with the
    same code, and so is a roll of settings or conf under the same version. None: nothing recorded."""
    digest = (code or {}).get("digest")
    spec = (launch or {}).get("spec")
    spec_digest = spec.get("digest") if isinstance(spec, dict) else None
    if not digest and not version:
        return None
    return " ".join(str(part) for part in (version or "?", digest, spec_digest) if part)


def snapshots(checkpoint: str | Path) -> list[Snapshot]:
    """The app's snapshots, oldest first."""
    return [Snapshot.of(p) for p in list_backups(checkpoint)]


# --- holds --------------------------------------------------------------------------------------------


def _holds_file(checkpoint: str | Path) -> Path:
    return AppRuntime(checkpoint).dir / "snapshot-holds.json"


def holds(checkpoint: str | Path, now: datetime | None = None) -> list[SnapshotHold]:
    """The holds not yet ended (a hold file that cannot be read holds nothing, with a warning)."""
    now = now or utc_now()
    value = read_json(_holds_file(checkpoint))
    entries: list[SnapshotHold] = []
    for index, item in enumerate(value if isinstance(value, list) else []):
        try:
            entries.append(SnapshotHold.from_file_value(item, f"{_holds_file(checkpoint)} entry {index}"))
        except RuntimeRecordError as exc:
            log.warning("%s; that entry holds no snapshot", exc)
    return [h for h in entries if (until := parse_recorded_time(h.until)) is not None and until > now]


class SnapshotGone(RuntimeError):
    pass


def hold(checkpoint: str | Path, snapshot: str, run_id: str, what: str, *, until: datetime | None = None) -> SnapshotHold:
    """Keep `snapshot` from any prune until `release(run_id)` or `until` (default: HOLD_FOR from
    now). SnapshotGone if it is not (any more) among the app's snapshots."""
    with files_lock(checkpoint):
        if snapshot not in {p.name for p in list_backups(checkpoint)}:
            raise SnapshotGone(f"snapshot {snapshot!r} is not among the app's snapshots (pruned, or never taken)")
        entry = SnapshotHold(snapshot=snapshot, run_id=run_id, what=what,
                             until=iso_seconds_utc(until or utc_now() + HOLD_FOR))
        kept = [h for h in holds(checkpoint) if not (h.run_id == run_id and h.snapshot == snapshot)]
        write_json_atomic(_holds_file(checkpoint), [h.to_json() for h in [*kept, entry]], indent=1)
        return entry


def release(checkpoint: str | Path, run_id: str) -> None:
    """End the holds of `run_id` (and drop the ended ones)."""
    with files_lock(checkpoint):
        kept = [h for h in holds(checkpoint) if h.run_id != run_id]
        if kept or _holds_file(checkpoint).exists():
            write_json_atomic(_holds_file(checkpoint), [h.to_json() for h in kept], indent=1)


# --- when one is due ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Due:
    due: bool
    why: str


def due(policy: SnapshotPolicy, checkpoint: str | Path, taken: list[Snapshot], now: datetime | None = None) -> Due:
    """Is a scheduled snapshot due? Never for a checkpoint without a committed batch, nor when no
    query committed a batch since the last scheduled snapshot (it would copy the same state)."""
    now = now or utc_now()
    marks = batch_marks(checkpoint)
    if not any(b is not None for b in marks.values()):
        return Due(False, "the checkpoint has no committed batch yet")
    scheduled = [s for s in taken if s.label == SCHEDULED]
    if not scheduled:
        return Due(True, "no scheduled snapshot yet")
    last = scheduled[-1]
    if marks == last.batches:
        return Due(False, f"no batch committed since {last.name}")
    # A query whose batches went back (a restore or a reset since) counts its batches from the start.
    advanced = {q: b - before if (before := _or_before_first(last.batches.get(q))) <= b else b + 1
                for q, b in marks.items() if b is not None}
    most = max(advanced.values(), default=0)
    if policy.every_batches is not None and most >= policy.every_batches:
        query = max(advanced, key=lambda q: advanced[q])
        return Due(True, f"query {query} committed {most} batch(es) since {last.name} (every {policy.every_batches})")
    last_taken = last.taken()
    if policy.every is not None:
        if last_taken is None:
            return Due(True, f"{last.name} does not say when it was taken")
        age = now - last_taken
        if age.total_seconds() * 1000 >= duration_ms(policy.every):
            return Due(True, f"{_age(age)} since {last.name} (every {policy.every})")
        return Due(False, f"{_age(age)} since {last.name}, due every {policy.every}"
                          + (f" or {policy.every_batches} batches ({most} so far)" if policy.every_batches else ""))
    return Due(False, f"{most} of {policy.every_batches} batches since {last.name}")


def _or_before_first(batch: int | None) -> int:
    return -1 if batch is None else batch


def _age(age: timedelta) -> str:
    seconds = max(int(age.total_seconds()), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


# --- what is kept ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    snapshot: Snapshot
    kept: bool
    why: list[str]  # every reason it is kept (empty: removed)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self.snapshot), "kept": self.kept, "why": self.why, "code_text": self.snapshot.code_text()}


def retention(policy: SnapshotPolicy | None, taken: list[Snapshot], *, now: datetime | None = None,
              running_code: str | None = None, running_version: str | None = None,
              operation: OperationRecord | None = None, held: list[SnapshotHold] | None = None) -> list[Decision]:
    """Which of `taken` (oldest first) the policy keeps, and why. No policy: every one."""
    now = now or utc_now()
    if policy is None:
        return [Decision(s, True, ["the app has no snapshot policy: every snapshot is kept"]) for s in taken]
    reasons: dict[str, list[str]] = {s.name: [] for s in taken}
    for s in taken[-policy.keep_last:]:
        reasons[s.name].append(f"one of the last {policy.keep_last}")
    for s in taken:
        when = s.taken()
        if when is not None and (now - when).total_seconds() * 1000 < duration_ms(policy.keep_for):
            reasons[s.name].append(f"younger than {policy.keep_for}")
    for h in held or []:
        if h.snapshot in reasons:
            reasons[h.snapshot].append(f"held by run {h.run_id} ({h.what}) until {h.until}")
    if operation is not None:
        if not operation.failed:
            for s in taken:
                reasons[s.name].append(f"{operation.what} (run {operation.run_id}) is changing the app")
        else:
            started = parse_recorded_time(operation.started_at)
            recorded = {Path(b).name for b in operation.backups}
            for s in taken:
                when = s.taken()
                if s.name in recorded or (started is not None and when is not None and when >= started):
                    reasons[s.name].append(f"taken by {operation.what} (run {operation.run_id}), which failed while "
                                           "changing the app: its way back, until an operator decides")
    rollback = last_good_rollback(taken, running_code)
    if rollback is not None:
        reasons[rollback.name].append(f"the last good rollback: the newest snapshot of {rollback.code_text()}, "
                                      f"the version before the running {running_version or 'one'}")
    return [Decision(s, bool(reasons[s.name]), reasons[s.name]) for s in taken]


def last_good_rollback(taken: list[Snapshot], running_code: str | None) -> Snapshot | None:
    """The newest snapshot written by another version or code than `running_code` (a code_identity),
    not one a restore set aside."""
    if running_code is None:
        return None
    candidates = [s for s in taken if s.label != REPLACED and s.code_identity() not in (None, running_code)]
    return candidates[-1] if candidates else None


def decisions(app: AppSpec, *, now: datetime | None = None, due_now: bool = False) -> list[Decision]:
    """The app's snapshots and what its policy does with each, as of now (`due_now`: with the
    scheduled snapshot a dry run would have taken, last)."""
    checkpoint = app.checkpoint_location()
    runtime = AppRuntime(checkpoint)
    driver = runtime.driver()
    code = driver.code.to_json() if driver and driver.code else None
    version = driver.version if driver else None
    launch = driver.launch.to_json() if driver else None
    taken = snapshots(checkpoint)
    if due_now:
        moment = now or utc_now()
        taken.append(Snapshot(f"{file_stamp(moment)}-{SCHEDULED} (due now)", SCHEDULED, iso_seconds_utc(moment), version,
                              batch_marks(checkpoint), launch=launch or {}, code=code))
    return retention(app.snapshots, taken, now=now, running_code=code_identity(code, version, launch),
                     running_version=version,
                     operation=runtime.operation(), held=holds(checkpoint, now))


# --- taking and pruning ---------------------------------------------------------------------------


@dataclass
class PolicyRun:
    """What one run of the policy did for one app (the snapshot_checkpoints task's XCom)."""

    app: str
    due: bool = False
    taken: str | None = None  # the snapshot taken (None: none was due, or a dry run)
    skipped_files: int = 0
    why: str = ""
    removed: list[str] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)  # name, label, why
    dry_run: bool = False

    def summary(self) -> str:
        removed = ", ".join(self.removed) or "none"
        if self.dry_run:
            return (f"{self.app}: dry run, nothing changed: a snapshot is {'due' if self.due else 'not due'} ({self.why}); "
                    f"would remove {len(self.removed)}: {removed}; would keep {len(self.kept)}")
        took = f"took {self.taken}" if self.taken else "no snapshot"
        return f"{self.app}: {took} ({self.why}); removed {len(self.removed)}: {removed}; kept {len(self.kept)}"


def apply_policy(app: AppSpec, *, dry_run: bool = False, now: datetime | None = None) -> PolicyRun:
    """Take the app's scheduled snapshot if one is due, then remove what its policy does not keep."""
    policy = app.snapshots
    if policy is None:
        return PolicyRun(app.name, why="the app has no snapshot policy", dry_run=dry_run)
    checkpoint = app.checkpoint_location()
    runtime = AppRuntime(checkpoint)
    result = PolicyRun(app.name, dry_run=dry_run)
    operation = runtime.operation()
    if operation is not None:
        # A snapshot of a checkpoint in the middle of a change is no point to come back to.
        state = "failed while changing it" if operation.failed else "is changing it"
        result.why = f"deferred: {operation.what} (run {operation.run_id}) {state}"
    else:
        is_due = due(policy, checkpoint, snapshots(checkpoint), now)
        result.due, result.why = is_due.due, is_due.why
        if is_due.due and not dry_run:
            # A scheduled copy gives way: to a copy or restore under way (it does not wait), and
            # to a run that starts changing the app meanwhile (a roll waits on this copy while its
            # app is down). The next scheduled run takes it instead.
            try:
                path = backup_checkpoint(checkpoint, SCHEDULED, wait=False, give_way=lambda: _changing(runtime))
            except (FilesBusy, CopyStopped) as exc:
                result.due, result.why = False, f"deferred: {exc}"
                path = None
            if path is not None:
                result.taken = path.name
                result.skipped_files = int(backup_info(path).get("skipped_files", 0))
    try:
        with files_lock(checkpoint, wait=False):  # nor does the prune wait: the next run prunes
            _prune(app, result, dry_run, now)
    except FilesBusy as exc:
        result.why += f"; pruning deferred: {exc}"
    log.info("%s", result.summary())
    return result


def _prune(app: AppSpec, result: PolicyRun, dry_run: bool, now: datetime | None) -> None:
    checkpoint = app.checkpoint_location()
    for decision in decisions(app, now=now, due_now=dry_run and result.due):
        if decision.kept:
            result.kept.append({"name": decision.snapshot.name, "label": decision.snapshot.label, "why": decision.why})
        else:
            result.removed.append(decision.snapshot.name)
            if not dry_run:
                _remove(backups_dir(checkpoint) / decision.snapshot.name)
    if not dry_run:
        _remove_leftovers(checkpoint)


def _changing(runtime: AppRuntime) -> str | None:
    operation = runtime.operation()
    return f"{operation.what} (run {operation.run_id}) began changing the app" if operation is not None else None


def _remove(snapshot: Path) -> None:
    hidden = snapshot.with_name(f"{PRUNING_PREFIX}{snapshot.name}")
    snapshot.rename(hidden)  # out of the list at once; the files go after
    shutil.rmtree(hidden)


def _remove_leftovers(checkpoint: str | Path) -> None:
    """A prune or a copy cut short (its task killed) left a hidden folder: remove it. Called under
    the files lock, which every copy holds until its snapshot is renamed: no copy is being written."""
    for leftover in _hidden(backups_dir(checkpoint)):
        log.info("removing %s, left by a %s cut short", leftover,
                 "copy" if leftover.name.startswith(PARTIAL_PREFIX) else "prune")
        shutil.rmtree(leftover, ignore_errors=True)


def _hidden(root: Path) -> Iterator[Path]:
    if root.exists():
        yield from (p for p in root.iterdir() if p.is_dir() and p.name.startswith((PARTIAL_PREFIX, PRUNING_PREFIX)))


# --- for people --------------------------------------------------------------------------------


SnapshotRows = list[dict[str, Any]]


def policy_text(policy: SnapshotPolicy | None) -> str:
    if policy is None:
        return "none (snapshots are taken before changes only, and every one is kept)"
    every = " or ".join(filter(None, [policy.every, f"{policy.every_batches} batches" if policy.every_batches else None]))
    return f"every {every}; keep the last {policy.keep_last} and every one younger than {policy.keep_for}"


def listing(app: AppSpec, *, now: datetime | None = None) -> SnapshotRows:
    """Every snapshot of the app, oldest first, with its batch, time, code and what the policy does."""
    return [d.to_json() for d in decisions(app, now=now)]


def listing_table(app: AppSpec, rows: SnapshotRows) -> str:
    head = f"snapshots of {app.name} (oldest first); policy: {policy_text(app.snapshots)}"
    body = tabulate([[r["name"], r["label"], r["taken_at"] or "-", r["code_text"],
                      ", ".join(f"{q} #{b}" for q, b in r["batches"].items()) or "-",
                      "; ".join(r["why"]) if r["kept"] else "REMOVED at the next prune"] for r in rows],
                    headers=["snapshot", "label", "taken at", "code", "batches", "kept because"])
    return f"{head}\n{body}" if rows else f"{head}\n(no snapshots)"

