"""streamops.process_identity: a recorded process is known by its pid and a start mark that a
stepped wall clock does not move (psutil's create time does)."""

import os
import subprocess
import sys

import psutil
import pytest

from streamops import process_identity
from streamops.process_identity import certainly_gone, live_process, start_mark


def test_the_start_mark_names_this_process_and_no_other():
    mark = start_mark()
    assert mark == start_mark(psutil.Process(os.getpid()))
    assert live_process(os.getpid(), mark).pid == os.getpid()
    assert not certainly_gone(os.getpid(), mark)
    # The same pid with another start: the pid was reused by another process.
    other = mark.rsplit("+", 1)[0] + "+1"
    assert live_process(os.getpid(), other) is None and certainly_gone(os.getpid(), other)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="the start mark is read from /proc")
def test_a_stepped_wall_clock_moves_the_create_time_but_not_the_start_mark(monkeypatch):
    mark, created = start_mark(), psutil.Process().create_time()
    stepped = psutil._pslinux.boot_time() + 5.0  # what /proc/stat's btime says after `date -s` 5 s ahead
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: stepped)
    assert abs(psutil.Process().create_time() - created) >= 4.99  # what the records compared before
    assert start_mark() == mark
    assert live_process(os.getpid(), mark) is not None and not certainly_gone(os.getpid(), mark)


def test_an_ended_process_is_gone_and_a_record_without_a_start_is_never_judged():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    mark = start_mark(psutil.Process(child.pid))
    child.wait()
    assert live_process(child.pid, mark) is None and certainly_gone(child.pid, mark)
    assert not certainly_gone(os.getpid(), None, None)  # nothing to tell it by: never "gone"
    assert live_process(os.getpid(), None, None) is None  # nor taken for the recorded one
    assert live_process(-3, "x") is None and live_process("12", "x") is None


def test_a_record_from_before_the_mark_is_judged_by_its_create_time():
    created = psutil.Process().create_time()
    assert live_process(os.getpid(), None, created) is not None
    assert live_process(os.getpid(), None, created - 3600) is None and certainly_gone(os.getpid(), None, created - 3600)


def test_without_proc_the_mark_is_the_create_time_judged_a_second_apart(monkeypatch):
    boot_mark = start_mark()
    monkeypatch.setattr(process_identity, "_BOOT", None)
    created = psutil.Process().create_time()
    assert start_mark() == f"created:{created:.2f}"
    # As clock-bound as psutil's create time: a small step is still this process, a large one not.
    assert live_process(os.getpid(), f"created:{created - 0.4:.2f}") is not None
    assert certainly_gone(os.getpid(), f"created:{created - 60:.2f}")
    # A boot's mark read where /proc is not: nothing to compare it with, so never "gone", never signalled.
    assert not certainly_gone(os.getpid(), boot_mark) and live_process(os.getpid(), boot_mark) is None
    assert live_process(os.getpid(), "created:garbled") is None and not certainly_gone(os.getpid(), "created:garbled")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="the start mark is read from /proc")
def test_a_service_started_before_the_clock_was_stepped_is_still_found_and_stopped(tmp_path, monkeypatch):
    # What CI saw: every service of the cluster profile "not running" at its stop, while its tests had
    # just used them (the pid files held create times, which a stepped clock moves).
    from streamops.local_stack.process import ServiceProcess

    service = ServiceProcess("sleeper", tmp_path / "sleeper.pid", tmp_path / "sleeper.log")
    pid = service.spawn([sys.executable, "-c", "import time; time.sleep(120)"], os.environ, tmp_path)
    try:
        stepped = psutil._pslinux.boot_time() - 3.0  # the clock set 3 s back
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: stepped)
        assert service.pid() == pid
    finally:
        stopped = service.stop(timeout=30)
    assert stopped == f"sleeper stopped (pid {pid})" and not psutil.pid_exists(pid)


def test_a_pid_file_from_before_the_mark_is_still_read(tmp_path):
    from streamops.local_stack.process import ServiceProcess

    service = ServiceProcess("me", tmp_path / "me.pid", tmp_path / "me.log")
    service.pid_file.write_text(f"{os.getpid()} {psutil.Process().create_time()}\n")
    assert service.pid() == os.getpid()
    service.pid_file.write_text(f"{os.getpid()} {start_mark().rsplit('+', 1)[0]}+1\n")  # the pid, another start
    assert service.pid() is None and not service.pid_file.exists()
