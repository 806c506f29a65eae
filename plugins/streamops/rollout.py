"""Rolling restart (upgrade) of the streaming apps: one app at a time, with a backup of the
checkpoint, a health gate, and a rollback to the previous version and checkpoint on failure.

Per app: (1) start the new version as a warm standby beside the running one (streamops.standby:
session and plans built, no lease), which lets Spark judge a restart from a copy of the running
checkpoint (driver.state_check); (2) refuse, stopping only the standby, if Spark (or a declared
state setting) says the checkpoint cannot carry over; (3) stop the running
version gracefully; (4) back up the checkpoint (taken while stopped, so the snapshot is
consistent); (5) tell the standby to take over: it takes the lease and starts its queries, so the
output gap is the stop plus a query start, not a JVM start; (6) health gate; (7) on failure stop
it, restore the backup, start the previous version, and fail.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from streamops.app_ops import Launch, LaunchCommand, LaunchError, as_launch_command, launch, start_standby, stop
from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.app_status import app_status
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import backup_checkpoint, restore_checkpoint
from streamops.driver.arguments import STATE_CHECK_FLAG, STATE_CHECK_LINE
from streamops.kafka_client import KafkaClientConfig
from streamops.refusals import OneLineRefused
from streamops.spark_submit import driver_env
from streamops.waiting import DeadlineExceeded, poll_until


class RolloutRefused(OneLineRefused, RuntimeError):
    """Refused before the running app was touched."""

    label = "rolling restart refused"


class RolloutFailed(RuntimeError):
    """The new version failed its health gate; the previous one was restored."""


def dependency_order(catalog: Catalog, names: list[str]) -> list[str]:
    """Apps that write a topic another chosen app reads go first; ties keep catalog order."""
    chosen = [app for app in catalog.apps if app.name in set(names)]
    writers = {topic: app.name for app in chosen for topic in [*app.outputs.values(), app.dead_letter_topic]}
    upstream = {app.name: {writers[t] for t in app.inputs.values() if t in writers and writers[t] != app.name} for app in chosen}
    ordered: list[str] = []
    while len(ordered) < len(chosen):
        ready = [app.name for app in chosen if app.name not in ordered and upstream[app.name] <= set(ordered)]
        if not ready:
            cycle = sorted(set(upstream) - set(ordered))
            raise RolloutRefused(f"the chosen apps read each other's outputs in a cycle: {', '.join(cycle)}")
        ordered.append(ready[0])
    return ordered


# --- the state check ------------------------------------------------------------------------------


STATE_CHECK_S = 900  # a --check-state driver: its start, the copies, one empty batch per query


def state_check(command: LaunchCommand | list[str]) -> list[str]:
    """Why the version a launch command runs cannot restart from the app's checkpoint ([]: it
    can), asked before anything stops (the reconcile of a stateful app, a roll whose standby had
    no executor): its driver's --check-state lets Spark judge on a copy of the checkpoint
    (driver.state_check) and starts nothing else. It runs Spark on this host (`on_this_host`):
    one empty batch on a copy never waits for the cluster's cores, nor takes any from the running
    app. A roll asks its warm standby first, which reports the verdict when ready."""
    try:
        result = subprocess.run(  # noqa: S603 - argv from the catalog
            [*on_this_host(as_launch_command(command).argv), STATE_CHECK_FLAG], capture_output=True, text=True,
            timeout=STATE_CHECK_S, env=driver_env())
    except subprocess.TimeoutExpired:
        raise RolloutRefused(f"could not judge the new version's restart from the checkpoint: its --check-state driver "
                             f"did not answer within {STATE_CHECK_S} s") from None
    for line in result.stdout.splitlines():
        if line.startswith(STATE_CHECK_LINE):
            return list(json.loads(line.removeprefix(STATE_CHECK_LINE))["problems"])
    raise RolloutRefused(
        f"could not judge the new version's restart from the checkpoint (exit {result.returncode}):\n"
        f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
    )


CHECK_MASTER = "local[1]"


def on_this_host(argv: list[str]) -> list[str]:
    """A spark-submit argv with Spark in this process's host (CHECK_MASTER, client mode) instead of
    the app's master: everything else (the program, its jars, its conf) as the launch has it."""
    local = list(argv)
    for flag, value in (("--master", CHECK_MASTER), ("--deploy-mode", "client")):
        if flag in local[:-1]:
            local[local.index(flag) + 1] = value
    return local


# --- health gate ----------------------------------------------------------------------------------------


@dataclass
class GateResult:
    healthy: bool
    reason: str
    batches: dict[str, int] = field(default_factory=dict)
    lag_at_start: int = 0
    lag_at_end: int = 0
    dead_letter_rate: float = 0.0


def health_gate(
    app: AppSpec, kafka: KafkaClientConfig, deadline_s: float, max_dead_letter_rate: float, min_batches: int = 2
) -> GateResult:
    """Within the deadline: the driver keeps running, it catches up (lag 0) or completes
    `min_batches` batches per query without its lag growing, and dead letters stay under the
    rate. Fails fast when the driver dies."""
    runtime = AppRuntime(app.checkpoint_location())
    first = app_status(app, kafka)
    start_batches = dict(first.batches)
    result = GateResult(False, "", lag_at_start=first.total_lag)
    seen: dict[str, int] = {}
    records = dead = 0

    def check() -> bool:
        nonlocal records, dead
        if not runtime.is_running():
            raise _GateFailure(f"the new driver is {runtime.state()}: {_reason(runtime.driver())}")
        for name, progress in runtime.progress().items():
            if progress.batch_id != seen.get(name):
                seen[name] = progress.batch_id
                records += progress.observed_total("records_in")
                dead += progress.observed_total("dead_letters")
        status = app_status(app, kafka)
        result.batches = status.batches
        result.lag_at_end = status.total_lag
        result.dead_letter_rate = dead / records if records else 0.0
        if result.dead_letter_rate > max_dead_letter_rate and records >= 20:
            raise _GateFailure(
                f"dead-letter rate {result.dead_letter_rate:.1%} over {records} records is above {max_dead_letter_rate:.1%}"
            )
        # Healthy: caught up (an idle app completes no new batches, and needs none), or still
        # behind but completing batches while its lag does not grow.
        progressed = bool(status.batches) and all(
            status.batches.get(q, -1) - start_batches.get(q, -1) >= min_batches for q in status.batches
        )
        return status.total_lag == 0 or (progressed and status.total_lag <= result.lag_at_start)

    try:
        poll_until(check, timeout=deadline_s, what=f"{app.name} to pass its health gate", max_interval=2)
    except _GateFailure as failure:
        result.reason = str(failure)
        return result
    except DeadlineExceeded:
        result.reason = (
            f"not healthy within {deadline_s:g}s: batches {result.batches} (needed {min_batches} new per query), "
            f"lag {result.lag_at_start} -> {result.lag_at_end}"
        )
        return result
    result.healthy = True
    result.reason = (
        f"healthy: batches {result.batches}, lag {result.lag_at_start} -> {result.lag_at_end}, "
        f"dead letters {result.dead_letter_rate:.1%}"
    )
    return result


class _GateFailure(Exception):
    pass


def _reason(record: DriverRecord | None) -> str:
    return "it died" if record is None or record.reason is None else record.reason


# --- the roll -----------------------------------------------------------------------------------------


def roll_restart(
    app: AppSpec,
    *,
    new_command: LaunchCommand | list[str],
    previous_command: Callable[[DriverRecord], LaunchCommand | list[str]] | None,
    new_version: str,
    kafka: KafkaClientConfig,
    new_spark_conf: dict | None = None,
    run_id: str,
    gate_deadline_s: float = 180.0,
    max_dead_letter_rate: float = 0.05,
    stop_deadline_s: float = 60.0,
    log: Callable[[str], None] = print,
) -> dict:
    """Roll one app to `new_command`. Returns a summary; raises RolloutRefused (nothing was
    touched) or RolloutFailed (rolled back to the previous version and checkpoint)."""
    checkpoint = app.checkpoint_location()
    runtime = AppRuntime(checkpoint)
    previous = runtime.driver() or DriverRecord()
    if runtime.state() != "running":
        raise RolloutRefused(f"{app.name} is {runtime.state()}, not running: deploy it with deploy_apps instead")
    # The new version starts beside the running one as a warm standby: session and plans built,
    # waiting for the word. A version that cannot get that far never stops the running one.
    log(f"{app.name}: starting version {new_version} as a warm standby beside version {previous.version}")
    try:
        standby = start_standby(app, new_command, checkpoint=checkpoint, launched_by=run_id, version=new_version,
                                spark_conf=new_spark_conf)
    except LaunchError as exc:
        raise RolloutRefused(f"{app.name}: version {new_version} could not start as a standby, so nothing was "
                             f"stopped: {exc}") from None
    problems = standby.state_problems
    log(f"{app.name}: standby ready ({standby.describe()})")
    try:
        if deferred := standby.state_check_deferred:
            log(f"{app.name}: the standby could not judge the restart from the checkpoint ({deferred}); a --check-state "
                f"driver judges it on this host ({CHECK_MASTER})")
            problems = state_check(new_command)
        if problems is None:
            raise RolloutRefused(f"{app.name}: version {new_version}'s standby reported no state check, so nothing was "
                                 f"stopped; see its log ({standby.describe()})")
        if problems:
            raise RolloutRefused(
                f"{app.name}: the new version cannot restart from the running version's checkpoint, so nothing was "
                f"stopped:\n  " + "\n  ".join(problems) + "\nDeploy it on a new checkpoint (rebuild state) instead."
            )
        if not runtime.is_running():
            raise RolloutRefused(f"{app.name} stopped while its standby started ({runtime.state()}): nothing was rolled; "
                                 "see its status")
        if gone := standby.gone():
            raise RolloutRefused(f"{app.name}: version {new_version}'s standby is gone, so nothing was stopped: {gone}")
    except BaseException as exc:  # any start failure is a failed gate: roll back
        log(f"{app.name}: {standby.abort(f'the rollout stopped: {exc}')}")
        raise
    log(f"{app.name}: the checkpoint carries over to the new version; stopping version {previous.version} "
        f"(pid {previous.pid})")
    stop_began = time.monotonic()
    try:
        log(stop(app, checkpoint=checkpoint, requested_by=run_id, deadline_s=stop_deadline_s))
        backup = backup_checkpoint(checkpoint, f"before-{new_version}")
    except BaseException as exc:
        log(f"{app.name}: {standby.abort(f'the running version could not be stopped: {exc}')}")
        raise
    log(f"{app.name}: checkpoint backed up to {backup}; the standby takes over")
    try:
        started: Launch = standby.take_over()
        downtime = time.monotonic() - stop_began
        log(f"{app.name}: version {new_version} running (pid {started.pid}) after {downtime:.1f}s down; health gate")
    except BaseException as exc:
        if not standby.told_go:
            log(f"{app.name}: {standby.abort(f'it did not take over: {exc}')}")
        if not isinstance(exc, Exception):
            raise
        gate = GateResult(False, f"the new version did not start: {exc}")
        downtime = time.monotonic() - stop_began
    else:
        try:
            gate = health_gate(app, kafka, gate_deadline_s, max_dead_letter_rate)
        except Exception as exc:  # noqa: BLE001 - a gate that cannot judge has not passed: roll back
            gate = GateResult(False, f"the health gate could not be checked: {exc}")
    if gate.healthy:
        log(f"{app.name}: {gate.reason}")
        return {"app": app.name, "version": new_version, "previous_version": previous.version,
                "backup": str(backup), "downtime_s": round(downtime, 1), "gate": gate.reason}

    if previous_command is None:
        # The running version could not have been started again (its artifact predates this
        # platform's driver): said before anything stopped. The new version stays as it is.
        state = "keeps running" if runtime.is_running() else f"is {runtime.state()}"
        raise RolloutFailed(
            f"{app.name}: version {new_version} failed its health gate ({gate.reason}); there is no rollback: version "
            f"{previous.version} cannot start on this platform's driver. Version {new_version} {state}; the checkpoint "
            f"backup from before it is {backup}. Fix forward (roll to a fixed version), or stop_apps"
        )
    log(f"{app.name}: HEALTH GATE FAILED: {gate.reason}; rolling back to version {previous.version}")
    if runtime.is_running():
        log(stop(app, checkpoint=checkpoint, requested_by=f"{run_id} (rollback)", deadline_s=stop_deadline_s))
    if not standby.told_go:
        # It never started a query, so the checkpoint is as the previous version left it.
        on = "its checkpoint, untouched (the new version never started a query)"
        log(f"{app.name}: the standby never took over: the checkpoint needs no restore")
    else:
        replaced = restore_checkpoint(checkpoint, backup)
        on = f"the checkpoint backup {backup}"
        log(f"{app.name}: checkpoint restored from {backup} (the failed version's checkpoint is kept at {replaced})")
    # The version and conf previous_command was built from (and checked with): the launch record's.
    restored = launch(
        app, previous_command(previous), checkpoint=checkpoint, launched_by=f"{run_id} (rollback)",
        version=str(previous.launched_version), spark_conf=previous.launched_spark_conf,
    )
    raise RolloutFailed(
        f"{app.name}: version {new_version} failed its health gate ({gate.reason}); rolled back to version "
        f"{previous.version} on {on}, running again as pid {restored.pid}"
    )
