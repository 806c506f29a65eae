"""What the test processes of one run share when pytest-xdist runs two of them: one Kafka broker,
started by the first process that needs it and stopped by the controlling process at the end, and
file locks for work only one of them may do at a time (building the drivers' class archive).

The controlling process makes the shared folder before its test processes start (they inherit its
environment); a run without xdist has none, and each fixture does its work in its own process.

Kept components: when STREAMOPS_TEST_SHARED_DIR is set before pytest starts, that folder is the
shared one and what starts in it outlives the run. The next run with the same folder (one module,
one scenario, `-n 0` or not) finds the broker running and uses it instead of starting one;
`python -m tests.support.shared stop <folder>` stops it. Tests never share topics, so a kept broker
is as good as a fresh one."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

SHARED_DIR_ENV = "STREAMOPS_TEST_SHARED_DIR"


def make_shared_dir() -> Path:
    """In the controlling process, before the test processes start."""
    shared = Path(tempfile.mkdtemp(prefix="streamops-tests-shared-"))
    os.environ[SHARED_DIR_ENV] = str(shared)
    return shared


def shared_dir() -> Path | None:
    """The run's shared folder in a test process under xdist; None otherwise."""
    value = os.environ.get(SHARED_DIR_ENV)
    return Path(value) if value else None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the block; others wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def locked_unless_busy(path: Path) -> Iterator[bool]:
    """Hold an exclusive lock on `path` for the block if nobody holds it: True; else False at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def kept_dir_requested() -> bool:
    """True when the folder was set before pytest started: its components outlive the run."""
    return bool(os.environ.get(SHARED_DIR_ENV))


def shared_broker(shared: Path, free_port_pair):
    """The run's one broker: started here if no test process (nor a run before, in a kept folder)
    started it yet, else found. A recorded broker that no longer answers is started afresh."""
    from streamops.local_stack.broker import LocalBroker

    record = shared / "broker.json"
    with locked(shared / "broker.lock"):
        if record.exists():
            found = LocalBroker(state_dir=shared / "kafka", port=json.loads(record.read_text())["port"])
            if found.healthy():
                return found
            found.stop()  # (a no-op when its process is gone) then a fresh one: old data is no one's
            shutil.rmtree(shared / "kafka", ignore_errors=True)
            record.unlink()
        broker = LocalBroker(state_dir=shared / "kafka", port=free_port_pair())
        broker.start()
        record.write_text(json.dumps({"port": broker.port, "pid": broker.pid()}))
        return broker


def stop_shared(shared: Path) -> None:
    """In the controlling process, after every test process ended: stop the broker, remove the folder."""
    from streamops.local_stack.broker import LocalBroker

    record = shared / "broker.json"
    try:
        if record.exists():
            LocalBroker(state_dir=shared / "kafka", port=json.loads(record.read_text())["port"]).stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":  # python -m tests.support.shared stop <folder>
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "stop":
        sys.exit("usage: python -m tests.support.shared stop <STREAMOPS_TEST_SHARED_DIR>")
    folder = Path(sys.argv[2])
    if not (folder / "broker.json").exists():
        sys.exit(f"{folder} holds no kept broker (no broker.json): nothing to stop")
    stop_shared(folder)
    print(f"stopped the kept test components in {folder} and removed it")
