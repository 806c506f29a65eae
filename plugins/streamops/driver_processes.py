"""The processes of an app's driver on this host, after its lease is free: what a dead driver left
behind (recover_restart_app ends them), and the wait before anything replaces or removes the
checkpoint's query folders.

The Python driver releases its lease and exits; its Spark JVM (spark-submit's child, in the same
process group) then runs its shutdown, where the state stores' maintenance may still upload a
RocksDB snapshot into `<query>/state/<operator>/<partition>`. A restore, reset, rebuild, rollback
or cutover that removed the folders then would race that write (a restore's copy met a folder the
JVM had just made). Only this host's processes can be seen: on a cluster, an executor on another
host is told to stop by its driver's SparkContext as the JVM ends, and is not waited for.
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.refusals import OneLineRefused
from streamops.waiting import DeadlineExceeded, poll_until

# A JVM's shutdown takes seconds; on a busy host, tens.
EXIT_WAIT_S = 120.0


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


class DriverStillWriting(OneLineRefused, RuntimeError):
    """The checkpoint's driver holds its lease, or its processes outlived it: nothing in the
    checkpoint was removed or replaced."""


def await_driver_exit(checkpoint: str | Path, timeout_s: float = EXIT_WAIT_S) -> None:
    """Return once no driver can write the checkpoint's query folders: its lease is free and
    every process of its last driver on this host has ended. DriverStillWriting otherwise, naming
    the processes (after `timeout_s`) or the driver that holds the lease (at once)."""
    runtime = AppRuntime(checkpoint)
    running = runtime.is_running()
    record = runtime.driver() or DriverRecord()  # read after: a driver that just took the lease is named
    if running:
        raise DriverStillWriting(
            f"driver pid {record.pid} on {record.host} holds the lease of {checkpoint}: its folders were not touched; "
            "stop the app first")
    try:
        poll_until(lambda: not leftovers(record), timeout=timeout_s, interval=0.1, max_interval=1.0,
                   what=f"the processes of driver pid {record.pid} to end")
    except DeadlineExceeded:
        left = "; ".join(f"pid {p.pid} {p.name}" for p in leftovers(record)) or "none any more"
        raise DriverStillWriting(
            f"the last driver of {checkpoint} (pid {record.pid}) released its lease, but its processes were still alive "
            f"{timeout_s:g}s later ({left}; `ps -g {record.process_group}`): its Spark JVM may still be writing "
            "state files, so the checkpoint's folders were not touched. Wait for them to end, or end them "
            "(recover_restart_app does), then run this again") from None
