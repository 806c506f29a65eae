"""The one-driver lease (streamops.driver_lease) with real processes: one holder across racing
takers, a paused holder taken over after its ttl and fencing itself when it wakes, a killed holder
freed at once, the holder's own refusal text. No Spark here: the Spark-side fencing (the sink's
check, a SIGSTOPped driver) is in test_spark_cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamops.app_runtime import AlreadyRunningError, AppRuntime
from streamops.app_status import app_status, status_table
from streamops.catalog import load_catalog
from streamops.driver_lease import DriverLease, LeaseTaken, lease_ttl_s
from streamops.runtime_records import QueryProgress
from streamops.waiting import poll_until

# A holder in its own process: take the lease (or say who has it), then report every 0.2 s
# whether it still holds it; once it does not, write why and exit 4 (as a fenced driver does).
HOLDER = r"""
import json, sys, time
from pathlib import Path
from streamops.driver_lease import DriverLease, LeaseTaken
runtime_dir, ttl, out = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
lease = DriverLease(runtime_dir)
try:
    epoch = lease.take({"app": "demo"}, ttl_s=ttl)
except LeaseTaken as taken:
    out.write_text(json.dumps({"refused": str(taken), "holder_pid": taken.holder.pid}))
    sys.exit(3)
out.write_text(json.dumps({"epoch": epoch}))
while True:
    held = lease.still_held()
    out.with_suffix(".held").write_text(json.dumps({"held": held, "at": time.time()}))
    if not held:
        out.with_suffix(".lost").write_text(lease.lost_reason())
        lease.end("fenced")
        sys.exit(4)
    time.sleep(0.2)
"""


def _holder(runtime_dir: Path, ttl: float, name: str, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.json"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(runtime_dir), str(ttl), str(out)])
    return process, out


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() and path.read_text() else {}


def _stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait(timeout=30)


def test_of_drivers_racing_for_a_free_lease_exactly_one_wins_and_the_others_name_it(tmp_path):
    runtime_dir = tmp_path / "_runtime"
    racers = [_holder(runtime_dir, 30, f"racer{i}", tmp_path) for i in range(6)]
    try:
        poll_until(lambda: all(_read(out) for _, out in racers), timeout=120, what="every racer to take or be refused")
        won = [(p, _read(out)) for p, out in racers if "epoch" in _read(out)]
        refused = [_read(out) for _, out in racers if "refused" in _read(out)]
        assert len(won) == 1 and len(refused) == 5
        winner, record = won[0]
        assert record == {"epoch": 1}
        for other in refused:
            assert other["holder_pid"] == winner.pid
            assert f"driver pid {winner.pid} on {socket.gethostname()}" in other["refused"]
        assert DriverLease(runtime_dir).live_holder().pid == winner.pid
    finally:
        _stop(*(p for p, _ in racers))


def test_a_paused_holder_is_taken_over_after_its_ttl_and_stops_when_it_wakes(tmp_path):
    runtime_dir = tmp_path / "_runtime"
    old, old_out = _holder(runtime_dir, 3, "old", tmp_path)
    try:
        poll_until(lambda: _read(old_out).get("epoch") == 1, timeout=60, what="the first holder to take epoch 1")
        # While it heartbeats, nobody else gets the lease, however long they try.
        lease = DriverLease(runtime_dir)
        with pytest.raises(LeaseTaken, match=f"the lease is held \\(epoch 1: driver pid {old.pid} on "):
            lease.take({"app": "demo"})
        old.send_signal(signal.SIGSTOP)  # paused: no heartbeat, no check
        poll_until(lambda: DriverLease(runtime_dir).live_holder() is None, timeout=60,
                   what="the paused holder's lease to run out")
        assert lease.take({"app": "demo"}, ttl_s=30) == 2
        assert lease.still_held()
        old.send_signal(signal.SIGCONT)
        assert old.wait(timeout=60) == 4  # it noticed the later epoch and stopped
        reason = old_out.with_suffix(".lost").read_text()
        assert reason.startswith(f"the lease of epoch 1 was taken over by driver pid {os.getpid()} on {socket.gethostname()} "
                                 "(epoch 2) while this driver was silent")
        assert _read(old_out.with_suffix(".held"))["held"] is False
        assert lease.still_held() and lease.live_holder().pid == os.getpid()  # the new holder is untouched
    finally:
        _stop(old)
        lease.end("stopped")


def test_a_killed_holder_of_this_host_frees_the_lease_at_once(tmp_path):
    runtime_dir = tmp_path / "_runtime"
    holder, out = _holder(runtime_dir, 600, "killed", tmp_path)
    try:
        poll_until(lambda: _read(out).get("epoch") == 1, timeout=60, what="the holder to take epoch 1")
        assert DriverLease(runtime_dir).live_holder().pid == holder.pid
        holder.kill()
        holder.wait(timeout=30)
        # A 600 s ttl, but the holder is a process of this host that is gone: no need to wait.
        assert DriverLease(runtime_dir).live_holder() is None
        assert DriverLease(runtime_dir).take({"app": "demo"}) == 2
    finally:
        _stop(holder)


def test_a_holder_on_another_host_is_trusted_until_its_heartbeat_is_older_than_its_ttl(tmp_path):
    lease_dir = tmp_path / "_runtime" / "lease"
    lease_dir.mkdir(parents=True)
    now = time.time()
    # A driver on another host (its pid means nothing here), last heard of 20 s ago, ttl 30 s.
    (lease_dir / "epoch-0000000004.json").write_text(json.dumps(
        {"epoch": 4, "host": "worker-b.example", "pid": 1, "pid_created": 0.0, "ttl_s": 30, "taken_at_s": now - 300}))
    (lease_dir / "beat-0000000004.json").write_text(json.dumps({"at_s": now - 20}))
    runtime = AppRuntime(tmp_path)
    assert runtime.is_running() and runtime.state() == "running"
    with pytest.raises(AlreadyRunningError) as refused:
        runtime.acquire({"app": "demo"})
    assert "demo is already running: driver pid 1 on worker-b.example" in str(refused.value)
    assert re.search(r"\(lease epoch 4, heartbeat 2\ds ago", str(refused.value))
    # driver.json as that driver wrote it; status shows its silence, then calls it crashed, naming its host.
    (tmp_path / "_runtime" / "driver.json").write_text(json.dumps(
        {"app": "oplog-router", "pid": 1, "host": "worker-b.example", "lease_epoch": 4, "version": "1.0.0"}))
    router = load_catalog().app("oplog-router")
    (lease_dir / "beat-0000000004.json").write_text(json.dumps({"at_s": time.time() - 20}))
    silent = app_status(router, kafka=None, checkpoint=str(tmp_path))
    assert (silent.state, silent.lease_ttl_s) == ("running", 30) and 20 <= silent.heartbeat_age_s < 29
    assert re.search(r"running \(no heartbeat for 2\ds of 30s\)", status_table([silent]))
    (lease_dir / "beat-0000000004.json").write_text(json.dumps({"at_s": time.time() - 31}))
    assert not runtime.is_running()
    crashed = app_status(router, kafka=None, checkpoint=str(tmp_path))
    assert crashed.state == "crashed"
    assert re.fullmatch(r"the driver \(pid 1 on worker-b\.example\) stopped heartbeating 3\ds ago without recording a stop",
                        crashed.reason)
    runtime.acquire({"app": "demo"})
    try:
        assert runtime.driver().lease_epoch == 5 and runtime.driver().host == socket.gethostname()
    finally:
        runtime.release("stopped", "test")
    assert runtime.state() == "stopped" and not runtime.is_running()


def test_a_fenced_driver_leaves_the_new_drivers_record_alone(tmp_path):
    old = AppRuntime(tmp_path)
    old.acquire({"app": "demo", "version": "1"})
    # Another driver takes over (as after the old one's ttl): write its epoch as a taker would.
    new = DriverLease(old.dir)
    (new.dir / "epoch-0000000002.json").write_text(json.dumps(
        {"epoch": 2, "host": "worker-b.example", "pid": 7, "pid_created": 0.0, "ttl_s": 30, "taken_at_s": time.time()}))
    record = {**json.loads(old.driver_file.read_text()), "pid": 7, "host": "worker-b.example", "lease_epoch": 2, "version": "2"}
    (old.dir / "driver.json").write_text(json.dumps(record))
    assert old.fenced
    old.update(application_id="stale")
    old.write_progress("route", QueryProgress(query="demo.route", batch_id=99))
    old.release("stopped", "the old driver ends")
    assert json.loads(old.driver_file.read_text()) == record  # untouched: the new driver's
    assert old.progress() == {}
    last = old.history()[-1]
    assert (last["event"], last["lease_epoch"]) == ("fenced", 1)
    assert "taken over by driver pid 7 on worker-b.example (epoch 2)" in last["reason"]


@pytest.mark.parametrize(("raw", "message"), [
    ("soon", "STREAMOPS_LEASE_TTL_S must be a number of seconds, not 'soon'"),
    ("1", "STREAMOPS_LEASE_TTL_S must be between 2 and 3600 seconds, not 1"),
])
def test_a_bad_lease_ttl_is_named(monkeypatch, raw, message):
    monkeypatch.setenv("STREAMOPS_LEASE_TTL_S", raw)
    with pytest.raises(ValueError, match=message):
        lease_ttl_s()


def test_a_holder_that_stayed_silent_past_its_ttl_stops_even_when_nobody_took_over(tmp_path):
    """A driver paused longer than its ttl may be declared dead any moment (a stop, a restore):
    when it wakes it must not write, whether or not another driver has taken over yet."""
    runtime_dir = tmp_path / "_runtime"
    holder, out = _holder(runtime_dir, 3, "sleeper", tmp_path)
    try:
        poll_until(lambda: _read(out).get("epoch") == 1, timeout=60, what="the holder to take epoch 1")
        holder.send_signal(signal.SIGSTOP)
        poll_until(lambda: DriverLease(runtime_dir).live_holder() is None, timeout=60, what="its lease to run out")
        holder.send_signal(signal.SIGCONT)
        assert holder.wait(timeout=60) == 4
        assert out.with_suffix(".lost").read_text().startswith(
            "the lease of epoch 1 ran out: this driver wrote no heartbeat for more than its ttl (3s;")
        assert DriverLease(runtime_dir).latest_epoch() == 1  # nobody took over, yet it stopped
    finally:
        _stop(holder)
