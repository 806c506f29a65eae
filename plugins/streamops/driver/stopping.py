"""How a driver stops, and how it says why it ended.

Contract: `graceful_stop` lets each query finish its micro-batch (or, real-time, reach its next
checkpoint) within one deadline and returns what happened in words; `StopSignals` turns SIGTERM
and SIGINT into a graceful stop (a second: at once); `ended_by` words an ending by exception for
status; `record_failed_batches` puts each failed query's uncommitted batch in driver.json.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from functools import partial
from types import FrameType

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.sql.streaming import StreamingQuery

from streamops.app_runtime import AppRuntime
from streamops.checkpoints import query_dir, uncommitted_batch
from streamops.driver.sink import STOPPED_BEFORE_BATCH, StoppedBeforeBatch
from streamops.failures import error_gist
from streamops.runtime_records import FailedBatch, UncommittedBatch
from streamops.waiting import DeadlineExceeded, poll_until

log = logging.getLogger("streamops.app")


def graceful_stop(queries: list[StreamingQuery], deadline_s: float, real_time: bool = False,
                  stopping: threading.Event | None = None) -> str:
    """Let each query finish its in-flight micro-batch, then stop it; with `stopping` (the
    queries' writers watch it) a query running batches back to back ends at the start of its
    next one. Past the deadline, stop anyway: an interrupted batch is not committed and is re-run
    on restart, so the checkpoint stays consistent either way. Real-time queries are always in a
    batch (the next starts as one commits): each is stopped right after its next checkpoint."""
    outcomes = []
    ends_at = time.monotonic() + deadline_s  # one deadline for all the app's queries
    if stopping is not None:
        stopping.set()
    for query in queries:
        if not query.isActive:
            if _ended_before_batch(query):
                outcomes.append(f"{query.name}: stopped before its next micro-batch")
            continue
        if real_time:
            outcomes.append(_stop_after_checkpoint(query, max(0.0, ends_at - time.monotonic())))
            continue
        try:
            poll_until(
                partial(_between_batches, query),
                timeout=deadline_s,
                what=f"{query.name} to finish its micro-batch",
                interval=0.05,
                max_interval=0.2,
            )
            ended_before_batch = _ended_before_batch(query)
            query.stop()
            outcomes.append(f"{query.name}: " + ("stopped before its next micro-batch" if ended_before_batch
                                                 else "stopped between micro-batches"))
        except DeadlineExceeded:
            query.stop()
            outcomes.append(f"{query.name}: batch still running after {deadline_s:g}s, interrupted (it re-runs on restart)")
    for outcome in outcomes:
        log.info("graceful stop: %s", outcome)
    return "; ".join(outcomes)


def _ended_before_batch(query: StreamingQuery) -> bool:
    return not query.isActive and STOPPED_BEFORE_BATCH in str(query.exception() or "")


def _between_batches(query: StreamingQuery) -> bool:
    """Is the query stopped, or between two micro-batches (none running)?"""
    return not query.isActive or not query.status["isTriggerActive"]


def not_a_stop_refusal(record: logging.LogRecord) -> bool:
    """py4j logs every exception of a Python callback with its traceback; a batch refused by a
    graceful stop is not an error (the app logs its own line)."""
    return not (record.exc_info and isinstance(record.exc_info[1], StoppedBeforeBatch))


def _stop_after_checkpoint(query: StreamingQuery, deadline_s: float) -> str:
    """Stop a real-time query right after its next commit: only what it wrote since then (a few
    milliseconds' worth) is written again on restart, never lost."""
    last = query.lastProgress
    committed = last.batchId if last is not None else -1
    try:
        poll_until(
            lambda: not query.isActive or (query.lastProgress is not None and query.lastProgress.batchId > committed),
            timeout=deadline_s, what=f"{query.name} to reach its next checkpoint", interval=0.02, max_interval=0.05,
        )
        query.stop()
        return f"{query.name}: stopped right after checkpoint {query.lastProgress.batchId if query.lastProgress else '?'}"
    except DeadlineExceeded:
        query.stop()
        return (f"{query.name}: no checkpoint within {deadline_s:g}s, stopped (records since checkpoint {committed} are "
                "written again on restart)")


def record_failed_batches(runtime: AppRuntime, failed: list[StreamingQuery]) -> None:
    """Record in driver.json, per failed query, the micro-batch it failed on and the input
    offsets that batch covers: a restart runs exactly that batch again, so recover_restart_app
    can say when it failed twice and name the records to skip (recover_skip_records)."""
    found: list[FailedBatch] = []
    for query in failed:
        name = query.name.rsplit(".", 1)[-1]
        batch = uncommitted_batch(query_dir(runtime.checkpoint, name)) or UncommittedBatch(batch=None, ranges=[])
        found.append({"query": name, **batch, "error": error_gist(str(query.exception()))})
    try:
        runtime.update(failed_batches=found)
    except OSError as exc:  # the failure itself is recorded by release(); this is a detail of it
        log.warning("could not record the failed batches %s: %s", found, exc)


class StopSignals:
    """SIGTERM and SIGINT, from the start: the first asks for a graceful stop (the running
    micro-batch finishes); a second stops the queries at once, or ends a start-up."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.queries: list[StreamingQuery] = []
        self._stop_now = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def watch(self, queries: list[StreamingQuery]) -> None:
        self.queries = queries
        if self._stop_now:
            self._stop_queries()

    def stop_now(self, why: str) -> None:
        """Stop the queries at once from any thread (they may not have started yet)."""
        log.error("stopping the queries at once: %s", why)
        self._stop_now = True
        self._stop_queries()

    def _stop_queries(self) -> None:
        for query in self.queries:  # still restart-safe: an interrupted batch re-runs
            query.stop()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signal.Signals(signum).name)
        if len(self.received) > 1:
            if not self.queries:
                raise KeyboardInterrupt(f"a second signal ({self.received[-1]}) during start-up")
            self._stop_queries()

    def describe(self) -> str:
        if not self.received:
            return ""
        said = f"signal {self.received[0]}" + (" (Ctrl-C)" if self.received[0] == "SIGINT" else "")
        return said + (f", then {self.received[1]}: stopped at once" if len(self.received) > 1 else "")


# A killed JVM's gateway socket closes while the kernel tears the process down, before it is a
# zombie (let alone reaped): the lost connection can reach Python first. So a Py4J error that is not
# a Java exception waits this long for the JVM to be seen gone before calling it the driver's own.
JVM_EXIT_WAIT_S = 10.0


def _jvm_exited(jvm_pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(jvm_pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:  # gone (or reaped meanwhile)
        return True


def _jvm_gone(jvm_pid: int | None, exc: BaseException) -> bool:
    if jvm_pid is None:
        return False
    if _jvm_exited(jvm_pid):
        return True
    if not isinstance(exc, Py4JError) or isinstance(exc, Py4JJavaError):
        return False  # the JVM answered: a Java exception, or an error of Python's own
    try:
        return poll_until(lambda: _jvm_exited(jvm_pid), timeout=JVM_EXIT_WAIT_S, interval=0.1,
                          what=f"the Spark JVM (pid {jvm_pid}) to end")
    except DeadlineExceeded:
        return False
    except (Exception, KeyboardInterrupt):  # noqa: BLE001 - a second stop signal's handler, mid-wait
        # (it stops the queries through the dead gateway, or interrupts): the end record is still written.
        return _jvm_exited(jvm_pid)


def ended_by(exc: BaseException, running: bool, seconds: float, stops: StopSignals, jvm_pid: int | None) -> tuple[str, str]:
    """(outcome, reason) of a driver that ended by an exception: what an operator reads in status."""
    phase = f"after {seconds:.0f} s of running" if running else f"during start-up ({seconds:.0f} s)"
    gist = error_gist(f"{type(exc).__name__}: {exc}")
    if stops.received:
        return "stopped", (f"{stops.describe()} {phase}; the graceful stop did not finish ({gist}): a micro-batch in "
                           "flight re-runs on restart")
    if _jvm_gone(jvm_pid, exc):
        return "failed", (f"the driver's Spark JVM (pid {jvm_pid}) went away {phase} (killed, or out of memory: see the "
                          f"driver log); the app stopped with it. Last error: {gist}")
    return "failed", f"the driver failed {phase}: {gist}"
