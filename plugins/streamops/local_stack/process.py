"""A background service process tracked by a pid file: start once, check, stop cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from streamops.process_identity import live_process, start_mark
from streamops.settings import Setting
from streamops.waiting import DeadlineExceeded, poll_until


class ServiceError(RuntimeError):
    """A service could not be started or stopped; the message says why and what to do."""


class AlreadyRunning(ServiceError):
    pass


def ports_from_env(setting: Setting, names: Sequence[str], error: type[Exception] = ServiceError) -> dict[str, Any]:
    """The ports a service's CLI manages, from `setting` ("p1,p2,...", one per name, in order):
    {} when unset (the service's defaults), else each name -> port; `error` names the variable and
    the expected order when the value is not that many ports. (Any: they are keyword arguments of a
    service's constructor, next to its other settings.)"""
    variable, raw = setting.name, setting.get()
    if not raw:
        return {}
    parts = [part.strip() for part in raw.split(",")]
    if len(parts) != len(names) or not all(part.isdigit() and 0 < int(part) < 65536 for part in parts):
        count = {2: "two", 3: "three", 4: "four"}.get(len(names), str(len(names)))
        raise error(f"{variable} {raw!r} is not {count} ports: "
                    f"{','.join(n.removesuffix('_port').replace('_', '-') for n in names)}")
    return dict(zip(names, map(int, parts), strict=True))


def log_tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"(no log at {path})"
    content = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(content[-lines:]) or f"(log {path} is empty)"


@dataclass
class ServiceProcess:
    """One long-running process. The pid file holds the pid and the process's start mark
    (streamops.process_identity), so a recycled pid that now belongs to something else is never
    mistaken for the service (the command line is no proof: Airflow rewrites its process titles)."""

    name: str
    pid_file: Path
    log_file: Path

    def pid(self) -> int | None:
        """The pid of the running service, or None (a stale pid file is removed)."""
        try:
            pid_text, started_text = self.pid_file.read_text().split()
            pid = int(pid_text)
        except (FileNotFoundError, ValueError):
            return None
        try:  # a file written before the start mark holds the create time
            mark, created = None, float(started_text)
        except ValueError:
            mark, created = started_text, None
        if live_process(pid, mark, created) is None:
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, **as_user) -> int:
        """Start the service detached; `as_user` (user, group, extra_groups) runs it as another user."""
        running = self.pid()
        if running is not None:
            raise AlreadyRunning(f"{self.name} is already running (pid {running}); log: {self.log_file}")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            # A new session so the service outlives the command that started it and can be
            # signalled as a group (Airflow components fork workers).
            proc = subprocess.Popen(  # noqa: S603 - argv built by this package, no shell
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                **as_user,
            )
        self.pid_file.write_text(f"{proc.pid} {start_mark(psutil.Process(proc.pid))}\n")
        return proc.pid

    def exited(self) -> bool:
        return self.pid() is None

    def await_ready(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until `ready()` or the process exits; if it is not ready then, stop it and raise
        ServiceError naming `what` with the last lines of its log."""
        try:
            poll_until(lambda: self.exited() or ready(), timeout=timeout, what=what)
        except DeadlineExceeded:
            pass
        if not ready():
            tail = log_tail(self.log_file, 30)
            self.stop(timeout=30)
            raise ServiceError(f"{what} did not happen within {timeout:g}s; last lines of {self.log_file}:\n{tail}")

    def stop(self, timeout: float = 60.0, sig: int = signal.SIGTERM) -> str:
        """`sig` (SIGTERM) to the process group, wait for it to exit, SIGKILL only past the deadline."""
        pid = self.pid()
        if pid is None:
            return f"{self.name} is not running"
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        try:
            poll_until(lambda: _gone(pid), timeout=timeout, what=f"{self.name} (pid {pid}) to exit")
            outcome = f"{self.name} stopped (pid {pid})"
        except DeadlineExceeded:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            poll_until(lambda: _gone(pid), timeout=10, what=f"{self.name} (pid {pid}) to die")
            outcome = f"{self.name} did not stop within {timeout:g}s and was killed (pid {pid})"
        self.pid_file.unlink(missing_ok=True)
        return outcome


def _gone(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    try:
        zombie = proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    if zombie:
        # Our own child that has exited: reap it so the pid is released. A JVM's main thread shows
        # as a zombie while its other threads still exit; waitpid says 0 then: not gone yet.
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child: its parent reaps it
            return True
        return reaped == pid
    return False
