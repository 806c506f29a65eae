"""Driver leftovers and the wait for a restarted app to make progress again."""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import asdict, dataclass

import psutil

from streamops.app_ops import driver_log_tail
from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.app_status import app_status
from streamops.catalog import AppSpec
from streamops.kafka_client import KafkaClientConfig
from streamops.waiting import DeadlineExceeded, poll_until


@dataclass
class Leftover:
    pid: int
    name: str
    command: str


def leftovers(driver: DriverRecord) -> list[Leftover]:
    """Processes of the last driver's process group still alive on this host: spark-submit,
    its JVM (which runs the queries) and Python workers. With the lease free the Python driver
    is gone, but a JVM that outlived it could still write to the checkpoint."""
    group = driver.process_group
    if not group or driver.host != socket.gethostname():
        return []
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if proc.pid == os.getpid() or os.getpgid(proc.pid) != group or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(proc.info["cmdline"] or [])
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
        # Only this app's Spark processes (spark-submit, its JVM and the Python driver name the app;
        # Python workers are PySpark's): the group of a driver started from a shell may hold others.
        if f"--app {driver.app} " in f"{command} " or "pyspark.daemon" in command or "pyspark.worker" in command:
            found.append(Leftover(proc.pid, proc.info["name"] or "?", command[:300]))
    return found


def end_leftovers(found: list[Leftover], grace_s: float = 15.0) -> list[dict]:
    """SIGTERM each leftover, SIGKILL what is still there after `grace_s`; wait until all are gone."""
    processes = []
    for item in found:
        try:
            proc = psutil.Process(item.pid)
            proc.send_signal(signal.SIGTERM)
            processes.append(proc)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(alive, timeout=30)
    if still:
        raise RuntimeError(
            f"processes {[p.pid for p in still]} of the dead driver survived SIGKILL; not starting a second driver"
        )
    killed = {p.pid for p in alive}
    return [{**asdict(item), "signal": "SIGKILL" if item.pid in killed else "SIGTERM"} for item in found]


class NotResumed(RuntimeError):
    pass


def await_resumed(
    app: AppSpec, kafka: KafkaClientConfig, lag_before: int | None, deadline_s: float, caught_up: bool = False
) -> dict:
    """Wait until the new driver completes micro-batches (or reports idle with nothing to read)
    and its lag is below `lag_before` (None: any lag; with `caught_up`: zero). Raise NotResumed
    naming why."""
    runtime = AppRuntime(app.checkpoint_location())
    started = time.monotonic()
    seen: dict = {}

    def resumed() -> bool:
        if not runtime.is_running():
            record = runtime.driver() or DriverRecord()
            raise NotResumed(
                f"{app.name} is {runtime.state()} again: {record.reason or 'the driver died'}; last lines of its log:\n"
                f"{driver_log_tail(app.checkpoint_location())}"
            )
        record = runtime.driver() or DriverRecord()
        status = app_status(app, kafka)
        seen.update(batches=status.batches, lag=status.total_lag, idle=bool(record.last_idle_at))
        progressed = set(status.batches) >= set(record.queries_started or ["?"])
        if not (progressed or (seen["idle"] and status.lags and status.total_lag == 0)):
            return False
        if caught_up:
            return status.total_lag == 0
        return lag_before is None or status.total_lag == 0 or status.total_lag < lag_before

    try:
        poll_until(resumed, timeout=deadline_s, what=f"{app.name} to make progress", max_interval=2)
    except DeadlineExceeded:
        raise NotResumed(
            f"{app.name} did not {'catch up' if caught_up else 'make progress'} within {deadline_s:g}s: batches "
            f"{seen.get('batches')}, lag {lag_before} -> {seen.get('lag')}; it is still running, see app_status"
        ) from None
    return {"seconds": round(time.monotonic() - started, 1), "batches": seen["batches"], "lag_before": lag_before,
            "lag_after": seen["lag"]}
