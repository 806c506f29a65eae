"""The warm standby's handshake (streamops.standby): the files a rollout and its standby driver
talk through. The roll itself, with real drivers, is in test_rolling_restart and test_real_time."""

import sys
import threading

import psutil
import pytest

from streamops.app_ops import LaunchError, start_standby
from streamops.catalog import load_catalog
from streamops.standby import ABORT, GO, StandbySlot, new_token
from streamops.waiting import DeadlineExceeded


def test_the_standby_hears_go_with_who_said_it(tmp_path):
    slot = StandbySlot(tmp_path, new_token())
    assert slot.ready() is None
    slot.report_ready(state_check={"checked": [], "problems": []}, application_id="local-1")
    assert slot.ready()["state_check"] == {"checked": [], "problems": []} and slot.ready()["application_id"] == "local-1"

    timer = threading.Timer(0.3, lambda: slot.say(GO, by="manual__roll"))
    timer.start()
    try:
        assert slot.await_word(30, interrupted=lambda: False) == {"word": GO, "by": "manual__roll"}
    finally:
        timer.cancel()
    slot.clear()
    assert slot.ready() is None and not list((tmp_path / "standby").iterdir())


def test_a_standby_that_hears_nothing_gives_up(tmp_path):
    slot = StandbySlot(tmp_path, new_token())
    with pytest.raises(DeadlineExceeded, match="the rollout's word"):
        slot.await_word(0.3, interrupted=lambda: False)


def test_a_signal_while_waiting_is_an_abort(tmp_path):
    slot = StandbySlot(tmp_path, new_token())
    assert slot.await_word(30, interrupted=lambda: True) == {"word": ABORT, "why": "signalled while waiting"}


def test_a_token_cannot_name_a_path(tmp_path):
    with pytest.raises(ValueError, match=r"a standby token is 6-64 lowercase letters, digits or dashes, not '\.\./\.\./x'"):
        StandbySlot(tmp_path, "../../x")


# --- start_standby with stand-in drivers: real processes, no Spark ------------------------------------

STAND_IN = """
import sys
from pathlib import Path
from streamops.standby import StandbySlot
mode = sys.argv[1]
token = sys.argv[sys.argv.index("--standby") + 1]
if mode == "crash":
    print("cannot run oplog-router: spark_apps.oplog_router has no attribute 'program'", file=sys.stderr)
    sys.exit(1)
slot = StandbySlot(Path.cwd(), token)  # launchers start drivers in the runtime folder
if mode == "slow":
    slot.await_word(60, interrupted=lambda: False)
    sys.exit(0)
slot.report_ready(state_check={"checked": ["count"], "problems": ["query 'count': Spark refuses it"]}, pid=4242,
                  host="standby-host")
word = slot.await_word(60, interrupted=lambda: False)
print("heard", word["word"], word.get("why"), flush=True)
sys.exit(0)
"""


@pytest.fixture
def router():
    return load_catalog(check_programs=False).app("oplog-router")


def stand_in(mode: str) -> list[str]:
    return [sys.executable, "-c", STAND_IN, mode]


def test_a_ready_standby_reports_its_state_check_and_leaves_when_sent_away(router, tmp_path):
    standby = start_standby(router, stand_in("ready"), checkpoint=str(tmp_path), launched_by="manual__roll", version="1.1.0")
    assert standby.state_problems == ["query 'count': Spark refuses it"]
    assert standby.describe() == f"driver pid 4242 on standby-host, log {standby.start.driver_log}"
    assert standby.abort("the new version changes its stateful operators") == "the standby exited without starting"
    assert standby.start.process.returncode == 0
    assert "heard abort the new version changes its stateful operators" in standby.start.driver_log.read_text()
    assert list((tmp_path / "_runtime" / "standby").iterdir()) == []


def test_a_standby_that_crashes_says_how_with_its_log(router, tmp_path):
    with pytest.raises(LaunchError) as crashed:
        start_standby(router, stand_in("crash"), checkpoint=str(tmp_path), launched_by="r", version="1.1.0")
    assert "oplog-router: the driver exited with code 1 before it was ready as a standby" in str(crashed.value)
    assert "has no attribute 'program'" in str(crashed.value)


def test_a_standby_not_ready_in_time_is_stopped(router, tmp_path):
    with pytest.raises(LaunchError, match="oplog-router: the standby was not ready within 2s and was stopped") as late:
        start_standby(router, stand_in("slow"), checkpoint=str(tmp_path), launched_by="r", version="1.1.0", wait_ready_s=2)
    assert "last lines of" in str(late.value)
    assert not [p.pid for p in psutil.process_iter() if _cwd(p) == str(tmp_path / "_runtime")]  # none left


def _cwd(process: psutil.Process) -> str | None:
    try:
        return process.cwd()
    except psutil.Error:
        return None


# --- the graceful stop a roll begins with ----------------------------------------------------------


class _Untouchable:
    """A micro-batch that must not be read or written."""

    def __getattr__(self, name):
        raise AssertionError(f"the refused batch was touched ({name})")


def test_once_stopping_a_query_starts_no_batch_and_writes_nothing():
    from streamops.driver.sink import StoppedBeforeBatch, fenced_kafka_writer

    stopping = threading.Event()
    write = fenced_kafka_writer({"kafka.bootstrap.servers": "127.0.0.1:9"}, still_held=lambda: True, stopping=stopping)
    stopping.set()
    with pytest.raises(StoppedBeforeBatch, match=r"^batch 14 not started: the driver is stopping \(it runs on restart\)$"):
        write(_Untouchable(), 14)
