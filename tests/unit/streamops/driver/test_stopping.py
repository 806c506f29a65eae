"""streamops.driver.stopping.ended_by: what an operator reads when a driver ended by an exception."""

import os
import signal
import subprocess
import sys

import pytest
from py4j.protocol import Py4JError

from streamops.driver.stopping import StopSignals, ended_by


@pytest.fixture
def stops():
    """The driver's signal handlers, and pytest's own back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield StopSignals()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_lost_gateway_waits_for_the_killed_jvm_to_be_seen_gone(stops):
    # The gateway's socket closes before the killed JVM is a zombie: the driver may see the Py4J
    # error while the process still exists. A process that ends a moment later stands in for it.
    jvm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        outcome, reason = ended_by(Py4JError("An error occurred while calling o2220.isActive"), True, 9.0,
                                   stops, jvm.pid)
    finally:
        jvm.kill()
        jvm.wait()
    assert outcome == "failed"
    assert reason == (f"the driver's Spark JVM (pid {jvm.pid}) went away after 9 s of running (killed, or out of memory: "
                      "see the driver log); the app stopped with it. Last error: Py4JError: An error occurred while "
                      "calling o2220.isActive")


def test_an_error_of_the_drivers_own_with_its_jvm_alive_is_told_at_once(stops):
    outcome, reason = ended_by(ValueError("no such column: op"), False, 3.0, stops, os.getpid())
    assert (outcome, reason) == ("failed", "the driver failed during start-up (3 s): ValueError: no such column: op")


@pytest.mark.parametrize("interruption", [Py4JError("An error occurred while calling o31.stop"), KeyboardInterrupt()])
def test_a_stop_signal_s_handler_failing_during_the_wait_does_not_take_the_end_record_with_it(
    stops, monkeypatch, interruption
):
    # A second stop signal in the wait runs the handler's stop of the queries (through the dead
    # gateway: a Py4J error) or interrupts start-up (KeyboardInterrupt), inside the wait.
    def interrupted(*_args, **_kwargs):
        raise interruption

    monkeypatch.setattr("streamops.driver.stopping.poll_until", interrupted)
    outcome, reason = ended_by(Py4JError("An error occurred while calling o2220.isActive"), True, 9.0, stops, os.getpid())
    assert (outcome, reason) == ("failed", "the driver failed after 9 s of running: Py4JError: An error occurred while "
                                           "calling o2220.isActive")
