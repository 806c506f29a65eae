"""Restore a checkpoint snapshot (rollback): choose from the app's snapshot history, put it back
(what is there now is kept as a snapshot too), start the version that wrote it, verify."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from tabulate import tabulate

from streamops.app_runtime import AppRuntime, DriverRecord, LaunchRecord
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import (
    backup_path,
    batch_marks,
    list_backups,
    offset_log_entry,
    positions,
    query_dir,
    restore_checkpoint,
)
from streamops.plans import JsonPlan
from streamops.recovery.common import RecoveryRefused, name_problem, resolve_app
from streamops.snapshots import Snapshot
from streamops.snapshots import snapshots as app_snapshots


def snapshots(app: AppSpec) -> list[Snapshot]:
    return app_snapshots(app.checkpoint_location())


@dataclass
class RestorePlan(JsonPlan):
    DERIVED = ("replayed",)

    app: str
    snapshot: str
    history: list[dict]
    current: dict[str, int | None]  # query -> last committed batch now
    restored: dict[str, int | None]  # query -> last committed batch of the snapshot
    moves: list[dict]  # per query/topic/partition: offset now -> offset restored
    running: bool
    version: str
    spark_conf: dict
    marks: dict[str, int | None] = field(default_factory=dict)

    @property
    def replayed(self) -> int:
        return sum(max(m["now"] - m["restored"], 0) for m in self.moves if m["now"] is not None)

    def table(self) -> str:
        history = tabulate(
            [[("-> " if s["name"] == self.snapshot else "   ") + s["name"], s["label"], s.get("taken_at") or "-",
              Snapshot(**s).code_text(), ", ".join(f"{q} #{b}" for q, b in s["batches"].items()) or "-"]
             for s in self.history],
            headers=["snapshot", "taken", "taken at", "code", "batches"],
        )
        moves = tabulate([[m["query"], m["topic"], m["partition"], "-" if m["now"] is None else m["now"], m["restored"]]
                          for m in self.moves], headers=["query", "topic", "partition", "offset now", "offset restored"])
        return "\n".join([
            f"snapshot history of {self.app} (oldest first):", history, "",
            f"restore {self.snapshot}: batches {self.current or 'none'} -> {self.restored}", moves,
            f"{self.replayed} record(s) read since the snapshot are processed again (their outputs written again)",
            ("will: stop the running app gracefully, " if self.running else "will: ")
            + f"keep the current checkpoint as a snapshot, put {self.snapshot} in its place, start version {self.version}",
        ])

    def summary(self) -> str:
        return f"restore {self.snapshot}: batches {self.current} -> {self.restored}"


def plan_restore(
    catalog: Catalog, app_name: str, snapshot: str, *, stop_if_running: bool, for_apply: bool = False
) -> RestorePlan:
    problems: list[str] = []
    app = resolve_app(catalog, app_name, problems)
    problem = None if snapshot == "latest" else name_problem(snapshot, "snapshot")
    if problem:
        problems.append(problem)
    if app is None or problems:
        raise RecoveryRefused(problems)
    history = snapshots(app)
    if not history:
        raise RecoveryRefused([f"{app.name} has no checkpoint snapshots (they are taken before every restart, reset, "
                               "rebuild, roll and cutover)"])
    names = [s.name for s in history]
    chosen_name = names[-1] if snapshot == "latest" else snapshot
    if chosen_name not in names:
        raise RecoveryRefused([f"snapshot {snapshot!r} is not in {app.name}'s history; the latest are: {', '.join(names[-5:])}"])
    chosen = history[names.index(chosen_name)]
    runtime = AppRuntime(app.checkpoint_location())
    running = runtime.is_running()
    if running and for_apply and not stop_if_running:
        raise RecoveryRefused([f"{app.name} is running; a restore replaces its checkpoint: stop it with stop_apps, or set "
                               "'stop_if_running' to let this DAG stop it gracefully"])
    now = positions(app.checkpoint_location())
    then = positions(backup_path(app.checkpoint_location(), chosen.name))
    moves = [
        {"query": q, "topic": t, "partition": p, "now": now[q].offsets.get(t, {}).get(p) if q in now else None, "restored": o}
        for q, pos in then.items() for t, parts in pos.offsets.items() for p, o in sorted(parts.items())
    ]
    driver = runtime.driver() or DriverRecord()
    # The launch record of the driver that wrote the snapshot (older snapshots: the last driver's).
    info_launch = LaunchRecord.from_json(chosen.launch) if chosen.launch else driver.launch
    return RestorePlan(
        app=app.name, snapshot=chosen.name, history=[asdict(s) for s in history], current=batch_marks(app.checkpoint_location()),
        restored=chosen.batches, moves=moves, running=running,
        version=info_launch.version or chosen.version or driver.version or app.version,
        spark_conf=info_launch.spark_conf or {}, marks=batch_marks(app.checkpoint_location()),
    )


def apply_restore(app: AppSpec, plan: RestorePlan, start, stop_app) -> dict:
    """Stop (if it runs and that was allowed), restore the snapshot, start `plan.version`."""
    checkpoint = app.checkpoint_location()
    # The plan came from another task (XCom): its snapshot must still be a name in the list.
    problem = name_problem(plan.snapshot, "snapshot")
    if problem or plan.snapshot not in {p.name for p in list_backups(checkpoint)}:
        raise RecoveryRefused([problem or f"snapshot {plan.snapshot!r} is not among {app.name}'s snapshots: run the DAG again"])
    runtime = AppRuntime(checkpoint)
    stopped = None
    if runtime.is_running():
        if not plan.running:
            raise RecoveryRefused([f"{app.name} was started since the plan: run the DAG again"])
        stopped = stop_app()
    elif batch_marks(checkpoint) != plan.marks:
        raise RecoveryRefused(
            [f"the checkpoint moved since the plan ({plan.marks} -> {batch_marks(checkpoint)}): run the DAG again"]
        )
    replaced = restore_checkpoint(checkpoint, backup_path(checkpoint, plan.snapshot))
    restored = batch_marks(checkpoint)
    # The code that wrote the snapshot, read from the snapshot itself (not from the plan's XCom).
    code = Snapshot.of(backup_path(checkpoint, plan.snapshot)).code or {}
    pinned = code.get("digest") if code.get("artifact") else None
    started = start(plan.version, plan.spark_conf, pinned)
    return {"stopped": stopped, "replaced_snapshot": str(replaced), "restored_batches": restored, "pid": started.pid,
            "driver_log": started.driver_log,
            "summary": f"restored {plan.snapshot} (batches {restored}); the checkpoint it replaced is kept as "
                       f"{Path(replaced).name}; {app.name} runs version {plan.version} as pid {started.pid}"}


def verify_restore(app: AppSpec, plan: RestorePlan) -> dict:
    """The running checkpoint continues the snapshot's history: each query's offset log holds the
    snapshot's last batch unchanged, and later batches follow it."""
    checkpoint = Path(app.checkpoint_location())
    problems = []
    for query, batch in plan.restored.items():
        if batch is None:
            continue
        ours = offset_log_entry(query_dir(checkpoint, query), batch)
        theirs = offset_log_entry(query_dir(backup_path(checkpoint, plan.snapshot), query), batch)
        if ours is None or ours != theirs:
            problems.append(f"query {query}: batch {batch} of the checkpoint is not the snapshot's")
    if problems:
        raise RuntimeError("the restored checkpoint does not continue the snapshot:\n  " + "\n  ".join(problems))
    return {"batches": batch_marks(checkpoint), "summary": f"the checkpoint continues {plan.snapshot} (batches "
            f"{plan.restored} -> {batch_marks(checkpoint)})"}
