"""What the test processes of one run share when pytest-xdist runs two of them: one Kafka broker,
started by the first process that needs it and stopped by the controlling process at the end, and
file locks for work only one of them may do at a time (building the drivers' class archive).

The controlling process makes the shared folder before its test processes start (they inherit its
environment); a run without xdist has none, and each fixture does its work in its own process."""

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


def shared_broker(shared: Path, free_port_pair):
    """The run's one broker: started here if no test process started it yet, else found."""
    from streamops.local_stack.broker import LocalBroker

    record = shared / "broker.json"
    with locked(shared / "broker.lock"):
        if record.exists():
            return LocalBroker(state_dir=shared / "kafka", port=json.loads(record.read_text())["port"])
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
