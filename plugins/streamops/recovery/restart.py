"""Restart a crashed app: check it is down, end what its dead driver left, restart it from its
checkpoint with the version and Spark conf it last ran with, and wait for progress."""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, field

from streamops.app_runtime import AppRuntime
from streamops.app_status import app_status
from streamops.catalog import AppSpec, Catalog
from streamops.recovery.common import RecoveryRefused, batch_marks, query_dirs, resolve_app
from streamops.recovery.lifecycle import end_leftovers, leftovers


@dataclass
class RestartPlan:
    app: str
    state: str  # crashed | failed | stopped
    last_driver: dict  # pid, host, version, started/stopped at, reason
    leftovers: list[dict]
    lag: int
    batches: dict[str, int | None]  # query -> last committed batch
    version: str  # what will be started
    spark_conf: dict
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        d = self.last_driver
        lines = [
            f"{self.app} is {self.state.upper()}: last driver pid {d.get('pid')} on {d.get('host')}, version {d.get('version')}, "
            f"started {d.get('started_at')}, ended {d.get('stopped_at') or 'unrecorded (it died)'}"
            + (f": {d.get('reason')}" if d.get("reason") else ""),
            "checkpoint: " + (", ".join(f"{q} at batch {b}" for q, b in self.batches.items()) or "no committed batch"),
            f"lag: {self.lag} record(s) waiting",
            "left behind by the dead driver: "
            + ("; ".join(f"pid {p['pid']} {p['name']}: {p['command'][:120]}" for p in self.leftovers) or "nothing"),
            f"will: {'end those processes, ' if self.leftovers else ''}back up the checkpoint, start version {self.version}"
            f"{' with conf ' + str(self.spark_conf) if self.spark_conf else ''} from the checkpoint, and wait for progress",
        ]
        return "\n".join(lines + [f"NOTE: {n}" for n in self.notes])

    def to_json(self) -> dict:
        return asdict(self)


def plan_restart(catalog: Catalog, app_name: str, bootstrap: str) -> RestartPlan:
    problems: list[str] = []
    app = resolve_app(catalog, app_name, problems)
    if app is None:
        raise RecoveryRefused(problems)
    runtime = AppRuntime(app.checkpoint_location())
    state = runtime.state()
    driver = runtime.driver() or {}
    if state == "running":
        status = app_status(app, bootstrap)
        age = f"{status.progress_age_s:.0f} s ago" if status.progress_age_s is not None else "never"
        raise RecoveryRefused([
            f"{app.name} is running (driver pid {driver.get('pid')} on {driver.get('host')}, last progress {age}, "
            f"lag {status.total_lag}): there is nothing to restart. If it is stuck, stop it with stop_apps "
            "(it escalates to SIGTERM and SIGKILL), then run this DAG"
        ])
    if state == "never started":
        raise RecoveryRefused([f"{app.name} has never been started here: start it with deploy_apps"])
    notes = []
    if state == "stopped":
        notes.append(f"{app.name} was stopped on purpose ({driver.get('reason') or 'a stop request'}), not crashed")
    if driver.get("host") and driver.get("host") != socket.gethostname():
        notes.append(f"the last driver ran on {driver['host']}, not here: its processes there cannot be checked "
                     "(the lock is free, so its Python driver is gone)")
    if not query_dirs(app.checkpoint_location()):
        notes.append("the checkpoint holds no query yet: the app starts from the catalog's starting position")
    launched = driver.get("launch") or {}
    return RestartPlan(
        app=app.name, state=state,
        last_driver={k: driver.get(k) for k in ("pid", "host", "version", "started_at", "stopped_at", "outcome", "reason")},
        leftovers=[asdict(p) for p in leftovers(driver)],
        lag=app_status(app, bootstrap).total_lag,
        batches=batch_marks(app.checkpoint_location()),
        version=launched.get("version") or driver.get("version") or app.version,
        spark_conf=launched.get("spark_conf") or {},
        notes=notes,
    )


def apply_restart(app: AppSpec, plan: RestartPlan, start) -> dict:
    """End leftovers, back up the checkpoint, start the app via `start(version, spark_conf)`."""
    from streamops.rollout import backup_checkpoint

    checkpoint = app.checkpoint_location()
    runtime = AppRuntime(checkpoint)
    if runtime.is_locked():
        raise RecoveryRefused([f"{app.name} was started by someone else since the plan ({runtime.refusal(app.name)})"])
    # Re-scan: the plan may be minutes old.
    ended = end_leftovers(leftovers(runtime.driver() or {}))
    backup = str(backup_checkpoint(checkpoint, "before-restart")) if query_dirs(checkpoint) else None
    started = start(plan.version, plan.spark_conf)
    return {"ended_processes": ended, "backup": backup, "pid": started.pid, "version": plan.version,
            "driver_log": started.driver_log, "summary": f"restarted {app.name} as pid {started.pid} (version {plan.version})"
            + (f"; ended {len(ended)} leftover process(es)" if ended else "") + (f"; backup {backup}" if backup else "")}

