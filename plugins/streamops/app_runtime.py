"""What a running app leaves beside its checkpoint, for every DAG and operator to read.

    <checkpoint>/_runtime/lease/           the one-driver lease with its epochs and heartbeats
                                           (streamops.driver_lease): exactly one driver per
                                           checkpoint, across hosts
    <checkpoint>/_runtime/driver.json      the current or last driver: app, version, conf, pid,
                                           host, Spark application id, started/stopped at
                                           (read as a DriverRecord)
    <checkpoint>/_runtime/runs.jsonl       every start and stop, appended (RunEvent)
    <checkpoint>/_runtime/progress/Q.json  the latest progress of query Q (a StreamingQueryListener)
    <checkpoint>/_runtime/progress/rates.jsonl  input rows per batch over the last hour (the apps page's chart)
    <checkpoint>/_runtime/stop-requested   ask the driver for a graceful stop
    <checkpoint>/_runtime/logs/driver-<time>.log  the output of one driver start (the newest
                                           DRIVER_LOGS_KEPT are kept); driver.json names its own
    <checkpoint>/_runtime/skip-records.json  input records an operator chose to skip
                                           (recover_skip_records); read by the driver at start
    <checkpoint>/_runtime/desired.json     what the app should be doing: running (a deploy, roll or
                                           restart asked for it) or stopped (stop_apps), by whom, when
    <checkpoint>/_runtime/operation.json   a DAG run that is changing the app now (stop, change,
                                           start): the supervisor leaves the app alone meanwhile
    <checkpoint>/_runtime/restarts.jsonl   the supervisor's restarts (streamops.supervision)
    <checkpoint>/_runtime/approved.json    approved changes every later launch keeps that the catalog
                                           does not say yet: a cutover's topics (streamops.effective_spec)
    <checkpoint>/_runtime/launch-catalog.yaml  the catalog the last launch's driver read: the main
                                           catalog with the approved changes applied

Each file that crosses a process boundary has one typed record in `streamops.runtime_records`,
written and read through it (driver.json, the run history, progress, rates, the skip list, stop
requests, desired state, the operation marker, the restarts). A marker that is not an
OperationRecord holds the app like a failed operation (its error names the file and the field);
a line of runs.jsonl or restarts.jsonl that is not its record is refused where it is read.

The lease and files need a POSIX filesystem the drivers and the DAGs share (local mode, or a
shared mount on every host); a checkpoint on an object store keeps its runtime folder on such a
mount.
Imported by the Spark apps, so no Airflow here.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from streamops.driver_lease import DriverLease, Holder, LeaseTaken
from streamops.process_identity import live_process, start_mark
from streamops.refusals import OneLineRefused
from streamops.runtime_files import read_json, read_json_object, write_json_atomic

# The records live in streamops.runtime_records; these three are read through this module by name too.
from streamops.runtime_records import CodeRecord as CodeRecord
from streamops.runtime_records import (
    DesiredState,
    OnCallNotice,
    OperationRecord,
    QueryProgress,
    RateLine,
    RestartEntry,
    RunEvent,
    RuntimeRecordError,
    SkipEntry,
    SkipList,
    StopRequest,
    checked,
    checked_lines,
)
from streamops.runtime_records import DriverRecord as DriverRecord
from streamops.runtime_records import LaunchRecord as LaunchRecord
from streamops.timestamps import file_stamp, now_iso, parse_recorded_time, utc_now

DRIVER_LOGS_KEPT = 20
RATE_HISTORY_S = 3600
RATE_HISTORY_BYTES = 2 * 1024 * 1024  # about 2 hours of 2-second batches of two queries
# An operation recorded from another host counts as in progress for at most this long (its
# process cannot be checked from here); on this host, while its process lives.
OPERATION_MAX_S = 6 * 3600
log = logging.getLogger("streamops.runtime")


class AlreadyRunningError(OneLineRefused, RuntimeError):
    """Another driver holds the app's lease; the message names it and its host."""


class OperationInProgress(OneLineRefused, RuntimeError):
    """Another run (a DAG, or the supervisor) is changing the app now; the message names it."""


def _write_lines_atomic(path: Path, lines: list[str]) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(partial, path)


def shown(value: Any) -> Any:
    """A recorded value as a message shows it: '?' when it is not recorded."""
    return "?" if value is None else value


class AppRuntime:
    def __init__(self, checkpoint: str | os.PathLike[str]):
        location = str(checkpoint)
        if "://" in location and not location.startswith("file://"):
            raise ValueError(
                f"the driver lock needs the checkpoint on a POSIX filesystem, not {location!r}; "
                "keep the app's _runtime folder on a shared mount"
            )
        self.checkpoint = Path(location.removeprefix("file://"))
        self.dir = self.checkpoint / "_runtime"
        self.lease = DriverLease(self.dir)
        self.driver_file = self.dir / "driver.json"
        self.history_file = self.dir / "runs.jsonl"
        self.stop_marker = self.dir / "stop-requested"
        self.progress_dir = self.dir / "progress"
        self.rates_file = self.progress_dir / "rates.jsonl"
        self.skip_file = self.dir / "skip-records.json"
        self.logs_dir = self.dir / "logs"
        self.desired_file = self.dir / "desired.json"
        self.operation_file = self.dir / "operation.json"
        self.restarts_file = self.dir / "restarts.jsonl"
        self.notice_file = self.dir / "notified.json"
        # driver.json is read and rewritten whole: the driver's threads (the query listener and
        # the main one) take turns.
        self._record_lock = threading.Lock()
        self._own_record: dict[str, Any] | None = None  # what this driver last wrote to driver.json

    # --- the one-driver lease --------------------------------------------------------------------

    def acquire(self, info: dict[str, Any]) -> None:
        """Take the lease for this process and record the driver; refuse if a live driver holds
        it, on this host or another (the message names it)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            epoch = self.lease.take({"app": info.get("app")})
        except LeaseTaken as taken:
            raise AlreadyRunningError(self.refusal(info.get("app", "the app"), taken.holder)) from None
        self.stop_marker.unlink(missing_ok=True)
        # Progress files describe the previous driver: a new one starts with none, so nobody
        # mistakes old progress for this driver's.
        for stale in self.progress_dir.glob("*.json") if self.progress_dir.exists() else []:
            stale.unlink()
        # Its pid with its start mark (streamops.process_identity): a pid the OS reuses later is
        # never mistaken for it.
        record = {**info, "pid": os.getpid(), "pid_created": psutil.Process().create_time(), "pid_start": start_mark(),
                  "host": socket.gethostname(),
                  "started_at": now_iso(), "lease_epoch": epoch}
        with self._record_lock:
            if self.fenced:  # taken over already (this driver stalled right after taking it)
                raise AlreadyRunningError(self.refusal(info.get("app", "the app")))
            self._write_record(record)
        self._append_history({"event": "started", **record})
        # A driver that was paused between its check and its write may put back an old record:
        # each heartbeat puts this driver's own record back in place.
        self.lease.on_beat(self._keep_own_record)

    def _write_record(self, record: dict[str, Any]) -> None:
        write_json_atomic(self.driver_file, record, indent=1)
        self._own_record = record

    def _keep_own_record(self) -> None:
        with self._record_lock:
            current = self.driver() or DriverRecord()
            if self._own_record and current.lease_epoch != self.lease.epoch and not self.fenced:
                log.warning("driver.json named lease epoch %s, not this driver's %s (a stale driver wrote it): "
                            "restored", current.lease_epoch, self.lease.epoch)
                write_json_atomic(self.driver_file, self._own_record, indent=1)

    def refusal(self, app: str, holder: Holder | None = None) -> str:
        holder = holder or self.lease.live_holder()
        running = self.driver() or DriverRecord()
        if holder is not None and running.lease_epoch not in (None, holder.epoch):
            running = DriverRecord()  # the record is an earlier driver's: the lease's own words only
        pid = holder.pid if holder else shown(running.pid)
        host = holder.where if holder else shown(running.host)
        beat = f", heartbeat {holder.silent_for_s():.0f}s ago" if holder else ""
        return (
            f"{app} is already running: driver pid {pid} on {host}, version {shown(running.version)}, "
            f"Spark application {shown(running.application_id)}, started {shown(running.started_at)} "
            f"(lease epoch {holder.epoch if holder else '?'}{beat}, {self.lease.dir}); stop it first"
        )

    @property
    def fenced(self) -> bool:
        """True in a driver whose lease is lost (taken over, or run out): it must not write."""
        return self.lease.epoch is not None and not self.lease.still_held()

    def update(self, **fields: Any) -> None:
        """Set DriverRecord fields of this driver's record (a name it does not have is refused)."""
        unknown = sorted(set(fields) - DriverRecord.field_names())
        if unknown:
            raise TypeError(f"driver.json has no field {', '.join(unknown)} (DriverRecord)")
        with self._record_lock:
            if self.fenced:
                return  # driver.json is the new driver's now
            record = {**(self._own_record or self._driver_json() or {}), **fields}
            self._write_record(record)

    def release(self, outcome: str, reason: str = "") -> None:
        """Record how the driver ended, then end the lease. A driver fenced by a newer one records
        only a line in the history: driver.json belongs to the newer driver."""
        with self._record_lock:
            if self.fenced:
                self._append_history({"event": "fenced", "pid": os.getpid(), "host": socket.gethostname(),
                                      "application_id": (self._own_record or {}).get("application_id"),
                                      "lease_epoch": self.lease.epoch, "stopped_at": now_iso(),
                                      "reason": self.lease.lost_reason()})
                self.lease.end("fenced")
                return
            record = {**(self._own_record or self._driver_json() or {}), "stopped_at": now_iso(), "outcome": outcome,
                      "reason": reason}
            self._write_record(record)
        self._append_history({"event": "stopped", **record})
        self.lease.end(outcome)

    def is_running(self) -> bool:
        """True while a live driver holds the lease (on any host: its heartbeat is fresh)."""
        return self.lease.live_holder() is not None

    def driver(self) -> DriverRecord | None:
        """The current or last driver's record (None: never started here, or driver.json is torn)."""
        return DriverRecord.read(self.driver_file)

    def _driver_json(self) -> dict[str, Any] | None:
        """driver.json as written, every key kept: the driver rewrites it from this."""
        return read_json_object(self.driver_file)

    def driver_process(self) -> psutil.Process | None:
        """The recorded driver's process if it is alive on this host and is the same process
        (same start mark), else None: a signal never goes to a pid the record merely names."""
        record = self.driver() or DriverRecord()
        if record.host != socket.gethostname():
            return None
        return live_process(record.pid, record.pid_start, record.pid_created)

    def state(self) -> str:
        """running | stopped | failed (its query failed) | crashed (died unrecorded) | never started."""
        if self.is_running():
            return "running"
        record = self.driver()
        if record is None:
            return "never started"
        return ("crashed" if record.outcome is None else record.outcome) if record.stopped_at else "crashed"

    def history(self) -> list[RunEvent]:
        """Every start and end of a driver here, oldest first; RuntimeRecordError names a line
        that is not a RunEvent."""
        return checked_lines(RunEvent, self.history_file)

    def _append_history(self, entry: dict[str, Any]) -> None:
        """Append a RunEvent (`entry`: a driver record with its event). One that is not a RunEvent
        (a driver.json someone else rewrote) is left out with a warning naming the field: the
        history never keeps a driver from recording its end and ending its lease."""
        try:
            line = json.dumps(checked(RunEvent, entry, str(self.history_file)), sort_keys=True)
        except RuntimeRecordError as exc:
            log.warning("%s; left out of the run history", exc)
            return
        with open(self.history_file, "a", encoding="utf-8") as history:
            history.write(line + "\n")

    # --- driver logs: one file per start -----------------------------------------------------------

    def new_driver_log(self) -> Path:
        """A fresh log file for a driver about to start (two starts never share one, so a refused
        second driver's own words stay readable); the oldest beyond DRIVER_LOGS_KEPT go."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        path = self.logs_dir / f"driver-{file_stamp(utc_now())}-{os.getpid()}.log"
        path.touch()
        current = self.driver_log()  # the running driver's own log stays, however many starts were refused
        for old in sorted(self.logs_dir.glob("driver-*.log"))[:-DRIVER_LOGS_KEPT]:
            if old != current:
                old.unlink(missing_ok=True)
        return path

    def driver_log(self) -> Path | None:
        """The log of the current or last driver (as driver.json names it, if that is one of this
        app's driver logs: driver.json is written by the app's process, so it is not trusted to
        point anywhere else), else the newest."""
        named = (self.driver() or DriverRecord()).driver_log
        if isinstance(named, str) and named:
            path = Path(named).resolve()
            if path.parent == self.logs_dir.resolve() and path.name.startswith("driver-") and path.suffix == ".log" \
                    and path.is_file():
                return path
        logs = sorted(self.logs_dir.glob("driver-*.log")) if self.logs_dir.exists() else []
        return logs[-1] if logs else None

    # --- graceful stop requests -----------------------------------------------------------------

    def request_stop(self, by: str, deadline_s: float | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.stop_marker, StopRequest(requested_at=now_iso(), by=by, deadline_s=deadline_s).to_json(), indent=1)

    def stop_requested(self) -> bool:
        return self.stop_marker.exists()

    def stop_request(self) -> StopRequest:
        """The request (StopRequest() when there is none, or it was torn: a stop all the same)."""
        value = read_json(self.stop_marker)
        try:
            return StopRequest.from_file_value(value, str(self.stop_marker)) if value else StopRequest()
        except RuntimeRecordError as exc:
            log.warning("%s; stopping with the default deadline", exc)
            return StopRequest()

    # --- progress ---------------------------------------------------------------------------------

    def write_progress(self, query: str, progress: QueryProgress) -> None:
        if self.fenced:
            return
        self.progress_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.progress_dir / f"{query}.json", progress.to_json(), indent=1)
        try:
            self._append_rate(query, progress)
        except OSError as exc:  # the chart's history is a nicety: never the reason a batch's commit is skipped
            log.warning("could not record the batch's input rate in %s: %s", self.rates_file, exc)

    def _append_rate(self, query: str, progress: QueryProgress) -> None:
        """One line per batch in progress/rates.jsonl (the apps page's input-rate chart); lines
        older than RATE_HISTORY_S go once the file passes RATE_HISTORY_BYTES."""
        # The batch's figures health is judged on over a window (supervision): input, dead letters,
        # rows dropped as late, state rows updated, and the watermark after it.
        line = json.dumps(RateLine.of(query, progress, now_iso()).to_json())
        with open(self.rates_file, "a", encoding="utf-8") as rates:
            rates.write(line + "\n")
        if self.rates_file.stat().st_size > RATE_HISTORY_BYTES:
            # The last hour, and at most half the limit of it (newest kept): the file is rewritten
            # once per half-limit of new lines, never at every batch.
            lines = [json.dumps(entry.to_json()) for entry in self.rates(within_s=RATE_HISTORY_S)]
            size = sum(len(line) + 1 for line in lines)
            while len(lines) > 1 and size > RATE_HISTORY_BYTES // 2:
                size -= len(lines.pop(0)) + 1
            _write_lines_atomic(self.rates_file, lines)

    def rates(self, within_s: float = RATE_HISTORY_S) -> list[RateLine]:
        """Batches published in the last `within_s` seconds, oldest first."""
        try:
            lines = self.rates_file.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        since = datetime.now(UTC).timestamp() - within_s
        recent = []
        for line in lines:
            try:
                entry = RateLine.model_validate_json(line)
            except ValueError:  # pydantic's ValidationError too
                continue  # a line cut by a crash mid-write
            moment = parse_recorded_time(entry.at)
            if moment is not None and moment.timestamp() >= since:
                recent.append(entry)
        return recent

    def progress(self) -> dict[str, QueryProgress]:
        """Each query's latest progress; a torn file is left out (read again at the next batch), one
        that is not a QueryProgress too, with a warning naming it."""
        found: dict[str, QueryProgress] = {}
        for path in sorted(self.progress_dir.glob("*.json")) if self.progress_dir.exists() else []:
            value = read_json(path)
            if not value:
                continue
            try:
                found[path.stem] = QueryProgress.from_file_value(value, str(path))
            except RuntimeRecordError as exc:
                log.warning("%s", exc)
        return found

    # --- records skipped by an operator ------------------------------------------------------------

    def skip_records(self) -> list[SkipEntry]:
        """Entries of the skip list, oldest first. The driver dead-letters those records with the
        reason; a list that is not a SkipList is refused (RuntimeRecordError naming the entry):
        a driver must never run on while ignoring what an operator skipped."""
        value = read_json(self.skip_file)
        return list(SkipList.from_file_value(value, str(self.skip_file)).entries) if value else []

    def add_skip_records(self, entries: list[SkipEntry]) -> None:
        """Append entries to the skip list (written whole and atomically: a driver starting
        meanwhile reads the old list or the new one, never half of one)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.skip_file, SkipList(entries=[*self.skip_records(), *entries]).to_json(), indent=1)

    # --- desired state, operations in progress, the supervisor's restarts --------------------------

    def desired(self) -> DesiredState | None:
        """What was last asked for (None: never, or the file is torn); RuntimeRecordError names a
        file that is not a DesiredState."""
        value = read_json_object(self.desired_file)  # torn, or not an object: as if never recorded
        return DesiredState.from_file_value(value, str(self.desired_file)) if value else None

    def set_desired(self, state: str, *, run_id: str, by: str | None = None, version: str | None = None) -> None:
        """Record what an operator asked for. It supersedes a failed operation's marker: starting or
        stopping the app is the operator's answer to it."""
        if state not in ("running", "stopped"):
            raise ValueError(f"desired state must be running or stopped, not {state!r}")
        self.dir.mkdir(parents=True, exist_ok=True)
        desired = DesiredState(state=state, run_id=run_id, by=by, at=now_iso(), version=version)  # type: ignore[arg-type]
        write_json_atomic(self.desired_file, desired.to_json(), indent=1)
        with self._operation_lock():
            recorded = self._recorded_operation()
            if recorded is not None and recorded.failed:
                self.operation_file.unlink(missing_ok=True)

    def last_notice(self) -> OnCallNotice | None:
        """The state on-call was last told about (None: none since the app was last fine)."""
        value = read_json_object(self.notice_file)
        return OnCallNotice.from_file_value(value, str(self.notice_file)) if value else None

    def record_notice(self, notice: OnCallNotice | None) -> None:
        """Remember what on-call was told (None: the app is fine again, forget it)."""
        if notice is None:
            self.notice_file.unlink(missing_ok=True)
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.notice_file, notice.to_json(), indent=1)

    def _recorded_operation(self) -> OperationRecord | None:
        """operation.json as recorded (None: none, or torn). One that is not an OperationRecord
        counts as a failed operation whose error names the file and the field: the app is held,
        never left to the supervisor, until an operator's run takes it over."""
        value = read_json_object(self.operation_file)
        if not value:
            return None
        try:
            return OperationRecord.from_file_value(value, str(self.operation_file))
        except RuntimeRecordError as exc:
            return OperationRecord(run_id=str(shown(value.get("run_id"))), what=str(shown(value.get("what"))),
                                   failed_at="unknown", error=str(exc))

    def operation(self) -> OperationRecord | None:
        """The run changing the app now, or the one that FAILED while changing it (`failed_at` set:
        kept until an operator's run takes it over, so nothing restarts a half-changed app); None
        when no run is at it. A run whose process died without ending its operation (killed, its
        worker lost; recorded on another host: begun more than OPERATION_MAX_S ago) counts as failed."""
        record = self._recorded_operation()
        if record is None or record.failed:
            return record
        if record.host == socket.gethostname():
            gone = live_process(record.pid, record.pid_start, record.pid_created) is None
        else:
            started = parse_recorded_time(record.started_at)
            gone = started is None or (datetime.now(UTC) - started).total_seconds() > OPERATION_MAX_S
        if gone:
            return record.model_copy(update={
                "failed_at": "unknown", "error": f"its process (pid {record.pid} on {record.host}) "
                                                 "ended without finishing it (killed, or its worker was lost)"})
        return record

    @contextmanager
    def _operation_lock(self) -> Iterator[None]:
        import fcntl

        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "operation.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def begin_operation(self, run_id: str, what: str, *, over_failed: bool = False) -> OperationRecord | None:
        """Mark the app as being changed by `run_id`. OperationInProgress if another run is changing
        it now, or (unless `over_failed`: an operator's run deciding what happens next) if a run
        failed while changing it. Checked and written under a lock: two runs never both go ahead.
        Returns the failed run's record this one took over (None: there was none)."""
        with self._operation_lock():
            current = self.operation()
            if current and current.run_id != run_id:
                if not current.failed:
                    raise OperationInProgress(
                        f"{self.checkpoint.name} is being changed by another run: {current.what} (run "
                        f"{current.run_id}, since {current.started_at}, pid {current.pid} on "
                        f"{current.host}); try again when it has finished")
                if not over_failed:
                    raise OperationInProgress(
                        f"{self.checkpoint.name} is held: {current.what} (run {current.run_id}) failed while "
                        f"changing it ({current.error}); an operator's start, stop or recovery decides what happens next")
            write_json_atomic(self.operation_file, OperationRecord(
                run_id=run_id, what=what, started_at=now_iso(), host=socket.gethostname(), pid=os.getpid(),
                pid_created=psutil.Process().create_time(), pid_start=start_mark()).to_json(), indent=1)
            return current if current and current.failed else None

    def end_operation(self, run_id: str, restore: OperationRecord | None = None) -> None:
        """End this run's operation; with `restore`, put back the failed run's record it took over
        (this run changed nothing: the hold stands)."""
        with self._operation_lock():
            recorded = self._recorded_operation()
            if recorded is not None and recorded.run_id == run_id:
                if restore:
                    write_json_atomic(self.operation_file, restore.to_json(), indent=1)
                else:
                    self.operation_file.unlink(missing_ok=True)

    def fail_operation(self, run_id: str, error: str, *, state_after: str | None = None,
                       backups: list[str] | None = None) -> None:
        """Keep this run's operation marker, marked failed with the error, the app's state after
        it and the checkpoint snapshots it took."""
        with self._operation_lock():
            recorded = self._recorded_operation()
            if recorded is not None and recorded.run_id == run_id:
                failed = recorded.model_copy(update={"state_after": state_after, "backups": backups or [],
                                                     "failed_at": now_iso(), "error": error[:1000]})
                write_json_atomic(self.operation_file, failed.to_json(), indent=1)

    def restarts(self) -> list[RestartEntry]:
        """The supervisor's restarts, oldest first; RuntimeRecordError names a line that is not a
        RestartEntry (the app's status is then unreadable: the guard cannot count)."""
        return checked_lines(RestartEntry, self.restarts_file)

    def record_restart(self, entry: RestartEntry) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps(checked(RestartEntry, entry, str(self.restarts_file)), sort_keys=True)
        with open(self.restarts_file, "a", encoding="utf-8") as restarts:
            restarts.write(line + "\n")
