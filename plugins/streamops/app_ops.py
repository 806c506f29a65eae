"""Launch and stop the streaming apps as detached drivers (used by the DAGs and the CLI).

A driver starts detached (the app outlives the task), from the command streamops.spark_submit
builds (SubmitSpec.argv on the spark_default connection's SparkTarget). The one-driver guard is the app's
own lease (streamops.driver_lease), checked here first for a clear refusal and enforced again by
the driver itself, so a launch by hand is refused the same way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from streamops.app_runtime import AlreadyRunningError, AppRuntime, DriverRecord, LaunchRecord
from streamops.audit import acting_user
from streamops.catalog import AppSpec
from streamops.programs import program_info
from streamops.spark_submit import driver_env
from streamops.standby import ABORT, GO, StandbyReady, StandbySlot, new_token
from streamops.waiting import DeadlineExceeded, poll_until


class LaunchError(RuntimeError):
    pass


@dataclass(frozen=True)
class LaunchCommand:
    """A driver's spark-submit argv and the effective spec it runs (streamops.effective_spec), which
    the driver records in its launch record. `spec` None: a launch outside the control plane (the
    bench); such a driver shows drift "unknown"."""

    argv: list[str]
    spec: dict | None = None


def as_launch_command(command: LaunchCommand | list[str]) -> LaunchCommand:
    return command if isinstance(command, LaunchCommand) else LaunchCommand(list(command))


@dataclass(frozen=True)
class Launch:
    app: str
    pid: int
    version: str
    application_id: str | None
    driver_log: str
    command: list[str]


def launch(
    app: AppSpec,
    command: LaunchCommand | list[str],
    *,
    checkpoint: str,
    launched_by: str,
    version: str,
    spark_conf: dict[str, str] | None = None,
    wait_for_start_s: float = 240.0,
    desired_by: str | None = None,
    record_desired: bool = True,
) -> Launch:
    """Start the driver detached, then wait until it holds its lease and has started every query;
    on failure, raise with the driver log's tail. (Progress is the health gate's business: an
    idle query reports none.) Records that the app should run (asked for by `desired_by` in run
    `launched_by`), before it starts, so a start that fails shows as a crash; the supervisor's own
    restarts do not (`record_desired=False`), so they count against its crash-loop guard."""
    command = as_launch_command(command)
    runtime = AppRuntime(checkpoint)
    if runtime.is_running():
        raise AlreadyRunningError(runtime.refusal(app.name))
    if record_desired:
        _record_desired(runtime, launched_by, desired_by, version)
    started = _start_driver(runtime, command, launched_by=launched_by, version=version, spark_conf=spark_conf)
    return _await_queries(app, runtime, started, command, version=version, wait_for_start_s=wait_for_start_s)


def _record_desired(runtime: AppRuntime, launched_by: str, desired_by: str | None, version: str) -> None:
    runtime.set_desired("running", run_id=launched_by, by=desired_by or acting_user(), version=version)


@dataclass(frozen=True)
class _Started:
    process: subprocess.Popen
    driver_log: Path
    # Names this start in the driver's record: the launcher waits for its own driver, not for
    # another one launched by the same run (a roll's old driver, a standby's predecessor).
    launch_id: str


def _start_driver(runtime: AppRuntime, command: LaunchCommand, *, launched_by: str, version: str,
                  spark_conf: dict[str, str] | None) -> _Started:
    driver_log = runtime.new_driver_log()
    launch_id = uuid.uuid4().hex
    with open(driver_log, "ab") as log:
        log.write(f"\n===== launch by {launched_by}: {' '.join(command.argv)}\n".encode())
        if command.spec:
            log.write(f"===== effective spec {command.spec.get('digest')}: {json.dumps(command.spec, sort_keys=True)}\n".encode())
        log.flush()
        process = subprocess.Popen(  # noqa: S603 - argv built from the catalog by the provider hook
            command.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=driver_env(
                STREAMOPS_LAUNCHED_BY=launched_by,
                STREAMOPS_DRIVER_LOG=str(driver_log),
                # Recorded by the driver, so a rollback can start exactly this again.
                STREAMOPS_LAUNCH=LaunchRecord(version=version, spark_conf=spark_conf or {}, launch_id=launch_id,
                                              spec=command.spec).to_env(),
            ),
            start_new_session=True,  # the driver outlives the Airflow task that started it
            # Not the project folder: Spark's Python workers put their working folder first on the
            # path, where an installed copy of a package would hide the artifact's.
            cwd=runtime.dir,
        )
    return _Started(process, driver_log, launch_id)


def _exited(app: AppSpec, process: subprocess.Popen, driver_log: Path, when: str) -> LaunchError | None:
    if process.poll() is None:
        return None
    return LaunchError(f"{app.name}: the driver exited with code {process.returncode} {when}; last lines of "
                       f"{driver_log}:\n{readable_tail(driver_log)}")


def _await_queries(app: AppSpec, runtime: AppRuntime, start: _Started, command: LaunchCommand, *, version: str,
                   wait_for_start_s: float) -> Launch:
    expected_queries = _query_names(app, version)
    process, driver_log = start.process, start.driver_log

    def started() -> bool:
        if error := _exited(app, process, driver_log, "during start-up"):
            raise error
        record = runtime.driver() or DriverRecord()
        return (
            runtime.is_running()
            and record.launch.launch_id == start.launch_id
            and expected_queries <= set(record.queries_started)
        )

    try:
        # Polled often: during a roll, the time to see the start is part of the reported downtime.
        poll_until(started, timeout=wait_for_start_s, what=f"{app.name} to start its queries", interval=0.05,
                   max_interval=0.5)
    except DeadlineExceeded:
        os.killpg(process.pid, signal.SIGTERM)
        raise LaunchError(
            f"{app.name} did not start its queries within {wait_for_start_s:g}s and was stopped; last lines of "
            f"{driver_log}:\n{readable_tail(driver_log)}"
        ) from None
    record = runtime.driver()
    if record is None or record.pid is None:  # seen started a moment ago: only a record replaced since
        raise LaunchError(f"{app.name} started, but its driver record ({runtime.driver_file}) no longer names its pid")
    return Launch(app.name, int(record.pid), version, record.application_id, str(driver_log), command.argv)


@dataclass
class Standby:
    """A warm standby driver (streamops.standby): started, ready, waiting for `take_over` or
    `abort`."""

    app: AppSpec
    runtime: AppRuntime
    slot: StandbySlot
    start: _Started
    command: LaunchCommand
    launched_by: str
    version: str
    ready_record: StandbyReady | None = None  # what it reported when ready (kept: it clears its file)
    told_go: bool = False

    @property
    def state_problems(self) -> list[str] | None:
        """Why Spark (or the program's declared state settings) refuses this version's restart from
        the running version's checkpoint ([]: it does not); None: it reported no verdict."""
        check = self.ready_record.get("state_check") if self.ready_record else None
        return list(check["problems"]) if check is not None else None

    @property
    def state_check_deferred(self) -> str | None:
        """Why the standby did not judge the restart itself (no executor to run it on): the
        rollout asks a --check-state driver instead. None: it judged (or reported nothing)."""
        check = self.ready_record.get("state_check") if self.ready_record else None
        return check.get("deferred") if check is not None else None

    def describe(self) -> str:
        pid, host = (self.ready_record["pid"], self.ready_record["host"]) if self.ready_record else ("?", "?")
        return f"driver pid {pid} on {host}, log {self.start.driver_log}"

    def gone(self) -> LaunchError | None:
        """Why it can no longer take over (it exited), or None."""
        return _exited(self.app, self.start.process, self.start.driver_log, "while it waited as a standby")

    def take_over(self, wait_for_start_s: float = 240.0, desired_by: str | None = None) -> Launch:
        """Tell it to go (the old driver has stopped) and wait until it has started its queries."""
        if error := self.gone():
            raise error
        _record_desired(self.runtime, self.launched_by, desired_by, self.version)
        self.slot.say(GO, by=self.launched_by)
        self.told_go = True
        return _await_queries(self.app, self.runtime, self.start, self.command, version=self.version,
                              wait_for_start_s=wait_for_start_s)

    def abort(self, why: str, wait_s: float = 30.0) -> str:
        """Send it away before it was told to go (it never took the lease); kill it if it will not
        go. Never raises: it runs while a rollout is already handling a failure."""
        process = self.start.process
        try:
            if process.poll() is not None:
                return f"the standby had exited (code {process.returncode})"
            self.slot.say(ABORT, why=why)
            try:
                poll_until(lambda: process.poll() is not None, timeout=wait_s, what=f"the {self.app.name} standby to exit")
                return "the standby exited without starting"
            except DeadlineExceeded:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
                return f"the standby did not exit within {wait_s:g}s and was killed"
        except (OSError, subprocess.SubprocessError) as exc:  # gone meanwhile, or stuck in the kernel
            return f"the standby could not be stopped cleanly ({exc}); its process group is {process.pid}"
        finally:
            self.slot.clear()


def start_standby(
    app: AppSpec,
    command: LaunchCommand | list[str],
    *,
    checkpoint: str,
    launched_by: str,
    version: str,
    spark_conf: dict[str, str] | None = None,
    wait_ready_s: float = 240.0,
    standby_timeout_s: float = 900.0,
) -> Standby:
    """Start `command` as a warm standby beside the running driver and wait until it is ready
    (session and plans built); raise LaunchError with its log's tail if it exits or is not ready
    in time (it is stopped then). The running driver is not touched."""
    command = as_launch_command(command)
    runtime = AppRuntime(checkpoint)
    slot = StandbySlot(runtime.dir, new_token())
    full = LaunchCommand([*command.argv, "--standby", slot.token, "--standby-timeout", f"{standby_timeout_s:g}"], command.spec)
    start = _start_driver(runtime, full, launched_by=launched_by, version=version, spark_conf=spark_conf)
    process, driver_log = start.process, start.driver_log
    standby = Standby(app, runtime, slot, start, command, launched_by, version)

    def ready() -> bool:
        if error := _exited(app, process, driver_log, "before it was ready as a standby"):
            raise error
        return slot.ready() is not None

    try:
        poll_until(ready, timeout=wait_ready_s, what=f"the {app.name} standby to be ready", max_interval=0.5)
    except DeadlineExceeded:
        standby.abort(f"not ready within {wait_ready_s:g}s", wait_s=5)
        raise LaunchError(f"{app.name}: the standby was not ready within {wait_ready_s:g}s and was stopped; last lines of "
                          f"{driver_log}:\n{readable_tail(driver_log)}") from None
    except LaunchError:
        slot.clear()
        raise
    except BaseException:  # the task was killed or timed out: no standby is left behind
        standby.abort("the rollout that started it stopped", wait_s=5)
        raise
    standby.ready_record = slot.ready()
    return standby


def _query_names(app: AppSpec, version: str) -> set[str]:
    return set(program_info(app, version).query_names)


def stop(app: AppSpec, *, checkpoint: str, requested_by: str, deadline_s: float = 60.0) -> str:
    """Ask the driver to stop after its in-flight micro-batch; escalate only if it will not."""
    runtime = AppRuntime(checkpoint)
    if not runtime.is_running():
        return f"{app.name} is not running (state: {runtime.state()})"
    pid = (runtime.driver() or DriverRecord()).pid
    process = runtime.driver_process()
    runtime.request_stop(by=requested_by, deadline_s=deadline_s)
    # The driver's own deadline (STREAMOPS_STOP_DEADLINE) covers the batch; allow for exit too.
    try:
        # Polled often: during a roll the next driver waits for this.
        poll_until(lambda: not runtime.is_running(), timeout=deadline_s + 60, what=f"{app.name} to stop", interval=0.05,
                   max_interval=0.25)
        record = runtime.driver() or DriverRecord()
        if record.pid == pid and not record.stopped_at:
            # Its lease ran out without a recorded stop: paused or cut off where it runs. If it
            # wakes up it finds its lease lapsed and stops without committing.
            return (f"{app.name} did not record a stop, but its lease ran out (no heartbeat from driver pid {pid} on "
                    f"{record.host}): it is paused or cut off there, and stops without committing if it wakes")
        return f"{app.name} stopped (pid {pid}): {record.reason or ''}"
    except DeadlineExceeded:
        pass
    if process is None:
        raise LaunchError(f"{app.name} did not stop within {deadline_s + 60:g}s, and its driver (pid {pid}) is not a process "
                          "on this host that the record names (another host, or the record is not that process's): "
                          "stop it where it runs")
    # Still running: a second signal makes the driver stop its queries at once (safe to restart
    # from: an interrupted micro-batch is re-run). Two signals sent together arrive as one, so
    # the second follows once the first has had a moment.
    _signal(process, signal.SIGTERM)
    try:
        poll_until(lambda: not runtime.is_running(), timeout=5, what=f"{app.name} to take the first SIGTERM")
        return f"{app.name} did not stop within {deadline_s + 60:g}s; stopped with SIGTERM (pid {pid})"
    except DeadlineExceeded:
        _signal(process, signal.SIGTERM)
    try:
        poll_until(lambda: not runtime.is_running(), timeout=30, what=f"{app.name} to exit after SIGTERM")
        return f"{app.name} did not stop within {deadline_s + 60:g}s; stopped with SIGTERM (pid {pid})"
    except DeadlineExceeded:
        _signal(process, signal.SIGKILL)
        poll_until(lambda: not runtime.is_running(), timeout=30, what=f"{app.name} to die")
        return f"{app.name} ignored SIGTERM; killed (pid {pid}); the checkpoint is safe to restart from"


def _signal(process, sig: int) -> None:
    try:
        process.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


# Lines of Spark's plan trees ("+- Project [...]", ":  +- ...") that follow a query's error.
_PLAN_TREE_LINE = re.compile(r"^\s*([:|]\s*)*[+:]- ")
_LINE_CHARS = 300


def readable_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a driver log an operator can read: without Spark's plan trees (the
    error's own line names the cause), each line cut at 300 characters."""
    if not path.exists():
        return f"(no log at {path})"
    kept = [line if len(line) <= _LINE_CHARS else line[: _LINE_CHARS - 3] + "..."
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if not _PLAN_TREE_LINE.match(line)]
    return "\n".join(kept[-lines:]) or f"(log {path} is empty)"


def driver_log_tail(checkpoint: str, lines: int = 30) -> str:
    """The last readable lines of the current or last driver's own log."""
    path = AppRuntime(checkpoint).driver_log()
    return readable_tail(path, lines) if path else "(no driver log: the app was not started by the suite here)"
