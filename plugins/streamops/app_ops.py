"""Launch and stop the streaming apps as detached drivers (used by the DAGs and the CLI).

The Spark provider's SparkSubmitHook.submit() runs spark-submit in the foreground and, in client
mode, holds the Airflow worker slot for the life of the driver. We use the hook for what it is
good at, turning the `spark_default` connection and our SubmitSpec into a spark-submit command,
and start that command detached so the app outlives the task. The one-driver guard is the app's
own lease (streamops.driver_lease), checked here first for a clear refusal and enforced again by
the driver itself, so a launch by hand is refused the same way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from streamops.app_runtime import AlreadyRunningError, AppRuntime
from streamops.catalog import AppSpec
from streamops.spark_submit import SubmitSpec, driver_env, with_task_slots
from streamops.waiting import DeadlineExceeded, poll_until


class LaunchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Launch:
    app: str
    pid: int
    version: str
    application_id: str | None
    driver_log: str
    command: list[str]


def spark_submit_command(spec: SubmitSpec, conn_id: str = "spark_default") -> list[str]:
    """The spark-submit argv for `spec`, built by the Spark provider's hook from `conn_id`."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    hook = SparkSubmitHook(
        conn_id=conn_id,
        conf=spec.conf,
        jars=",".join(spec.jars),
        py_files=",".join(spec.py_files) or None,
        name=spec.name,
        application_args=spec.application_args,
    )
    command = hook._build_spark_submit_command(spec.application)  # noqa: SLF001 - see module doc
    if "--master" in command:  # a local master gets the threads a real-time app needs
        at = command.index("--master") + 1
        command[at] = with_task_slots(command[at], spec.min_task_slots)
    return command


def launch(
    app: AppSpec,
    command: list[str],
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
    runtime = AppRuntime(checkpoint)
    if runtime.is_running():
        raise AlreadyRunningError(runtime.refusal(app.name))
    if record_desired:
        from streamops.audit import acting_user

        runtime.set_desired("running", run_id=launched_by, by=desired_by or acting_user(), version=version)
    driver_log = runtime.new_driver_log()
    with open(driver_log, "ab") as log:
        log.write(f"\n===== launch by {launched_by}: {' '.join(command)}\n".encode())
        log.flush()
        process = subprocess.Popen(  # noqa: S603 - argv built from the catalog by the provider hook
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=driver_env(
                STREAMOPS_LAUNCHED_BY=launched_by,
                STREAMOPS_DRIVER_LOG=str(driver_log),
                # Recorded by the driver, so a rollback can start exactly this again.
                STREAMOPS_LAUNCH=json.dumps({"version": version, "spark_conf": spark_conf or {}}),
            ),
            start_new_session=True,  # the driver outlives the Airflow task that started it
            # Not the project folder: Spark's Python workers put their working folder first on the
            # path, where an installed copy of a package would hide the artifact's.
            cwd=runtime.dir,
        )
    expected_queries = _query_names(app, version)

    def started() -> bool:
        if process.poll() is not None:
            raise LaunchError(
                f"{app.name}: the driver exited with code {process.returncode} during start-up; last lines of "
                f"{driver_log}:\n{readable_tail(driver_log)}"
            )
        record = runtime.driver() or {}
        return (
            runtime.is_running()
            and record.get("launched_by") == launched_by
            and expected_queries <= set(record.get("queries_started") or [])
        )

    try:
        poll_until(started, timeout=wait_for_start_s, what=f"{app.name} to start its queries", max_interval=2)
    except DeadlineExceeded:
        os.killpg(process.pid, signal.SIGTERM)
        raise LaunchError(
            f"{app.name} did not start its queries within {wait_for_start_s:g}s and was stopped; last lines of "
            f"{driver_log}:\n{readable_tail(driver_log)}"
        ) from None
    record = runtime.driver() or {}
    return Launch(app.name, int(record["pid"]), version, record.get("application_id"), str(driver_log), command)


def _query_names(app: AppSpec, version: str) -> set[str]:
    from streamops.programs import program_info

    return set(program_info(app, version).query_names)


def stop(app: AppSpec, *, checkpoint: str, requested_by: str, deadline_s: float = 60.0) -> str:
    """Ask the driver to stop after its in-flight micro-batch; escalate only if it will not."""
    runtime = AppRuntime(checkpoint)
    if not runtime.is_running():
        return f"{app.name} is not running (state: {runtime.state()})"
    pid = (runtime.driver() or {}).get("pid")
    process = runtime.driver_process()
    runtime.request_stop(by=requested_by, deadline_s=deadline_s)
    # The driver's own deadline (STREAMOPS_STOP_DEADLINE) covers the batch; allow for exit too.
    try:
        poll_until(lambda: not runtime.is_running(), timeout=deadline_s + 60, what=f"{app.name} to stop", max_interval=1)
        record = runtime.driver() or {}
        if record.get("pid") == pid and not record.get("stopped_at"):
            # Its lease ran out without a recorded stop: paused or cut off where it runs. If it
            # wakes up it finds its lease lapsed and stops without committing.
            return (f"{app.name} did not record a stop, but its lease ran out (no heartbeat from driver pid {pid} on "
                    f"{record.get('host')}): it is paused or cut off there, and stops without committing if it wakes")
        return f"{app.name} stopped (pid {pid}): {record.get('reason', '')}"
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
