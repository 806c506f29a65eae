"""What a running app leaves beside its checkpoint, for every DAG and operator to read.

    <checkpoint>/_runtime/lease/           the one-driver lease with its epochs and heartbeats
                                           (streamops.driver_lease): exactly one driver per
                                           checkpoint, across hosts
    <checkpoint>/_runtime/driver.json      the current or last driver: app, version, conf, pid,
                                           host, Spark application id, started/stopped at
                                           (read as a DriverRecord)
    <checkpoint>/_runtime/runs.jsonl       every start and stop, appended
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
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from streamops.driver_lease import DriverLease, Holder, LeaseTaken
from streamops.refusals import OneLineRefused
from streamops.runtime_files import read_json, read_json_object, write_json_atomic

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


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _write_lines_atomic(path: Path, lines: list[str]) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(partial, path)


def shown(value: Any) -> Any:
    """A recorded value as a message shows it: '?' when it is not recorded."""
    return "?" if value is None else value


def parse_recorded_time(moment: Any) -> datetime | None:
    """An ISO-8601 time as written here ('...Z'), or None for nothing or something else."""
    try:
        return datetime.fromisoformat(str(moment).replace("Z", "+00:00")) if moment else None
    except ValueError:
        return None


# --- driver.json, typed --------------------------------------------------------------------------
#
# The driver writes driver.json as a JSON object (AppRuntime.acquire, update, release: the keys
# streamops.driver.run hands over, kept as written); everyone else reads it through
# DriverRecord.from_json. A driver of an older artifact writes it too, so every key may be missing
# (None, or an empty list or object), and a key this version does not know is ignored here and
# kept when the driver rewrites the file. The file is on a shared volume: values are kept as the
# file has them, not converted, and whatever of them reaches a command line, a path or a signal
# is checked where it is used (checked_version and checked_spark_conf in
# streamops.launch_overrides, running_version, driver_process, driver_log), with the error naming
# it. Only the nested records must be objects: `launch` or `code` of another kind counts as absent.


@dataclass(frozen=True)
class LaunchRecord:
    """How a launcher started a driver, so that a restart, rollback or restore can start exactly
    that again: the version, the trigger's Spark conf overrides, and the id naming this one start
    (a launcher waits for its own driver). It travels to the driver in STREAMOPS_LAUNCH (`to_env`)
    and the driver records it, as it got it, as driver.json's `launch`; `from_json` reads it back.
    None: not recorded (launchers before launch ids wrote version and spark_conf only; a driver
    started by hand, or by a launcher before launch records, has none)."""

    version: str | None = None
    spark_conf: dict[str, str] | None = None
    launch_id: str | None = None
    # The effective spec this launch runs, with its digest (streamops.effective_spec); None: a
    # launch outside the control plane (the bench, a driver by hand) or from before specs.
    spec: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, value: object) -> LaunchRecord:
        if not isinstance(value, dict):
            return cls()
        spec = value.get("spec")
        return cls(version=value.get("version"), spark_conf=value.get("spark_conf"), launch_id=value.get("launch_id"),
                   spec=spec if isinstance(spec, dict) else None)

    def to_json(self) -> dict[str, Any]:
        """The JSON object (without the keys that are None): what the driver records."""
        return {key: value for key, value in (("version", self.version), ("spark_conf", self.spark_conf),
                                              ("launch_id", self.launch_id), ("spec", self.spec)) if value is not None}

    def to_env(self) -> str:
        """STREAMOPS_LAUNCH's value for the driver."""
        return json.dumps(self.to_json())


@dataclass(frozen=True)
class CodeRecord:
    """The code a driver ran: an artifact (its zip and digest) or the installed module (its file
    and that file's digest)."""

    artifact: str | None = None
    installed: str | None = None
    digest: str | None = None

    @classmethod
    def from_json(cls, value: object) -> CodeRecord | None:
        """None for a record from before artifacts (no `code`, or an empty one)."""
        if not isinstance(value, dict) or not value:
            return None
        return cls(artifact=value.get("artifact"), installed=value.get("installed"), digest=value.get("digest"))

    def to_json(self) -> dict[str, Any]:
        """The JSON object as the driver wrote it ({artifact, digest} or {installed, digest})."""
        return {key: value for key, value in (("artifact", self.artifact), ("installed", self.installed),
                                              ("digest", self.digest)) if value is not None}

    @property
    def artifact_digest(self) -> str | None:
        """The artifact's digest (None: installed code)."""
        return self.digest if self.artifact else None

    @property
    def label(self) -> str | None:
        """What status shows: the artifact's digest, or 'installed'."""
        return self.digest if self.artifact else "installed"


@dataclass(frozen=True)
class DriverRecord:
    """driver.json: the current or last driver of an app (see the notes above on missing keys and
    on values). `DriverRecord()`, every field absent, stands for no record where callers need one."""

    # What runs, as the driver started (AppRuntime.acquire's info).
    app: str | None = None
    program: str | None = None
    version: str | None = None
    code: CodeRecord | None = None  # None: a driver from before artifacts
    trigger: str | None = None
    checkpoint_interval: str | None = None  # real-time apps only
    spark_conf: dict[str, str] = field(default_factory=dict)  # the catalog's, as the driver got it
    catalog: str | None = None
    kafka: str | None = None  # where and as whom it connects (KafkaClientConfig.describe)
    environment: str | None = None
    launched_by: str | None = None  # a DAG run id, "streamops app run (pid N)", "command line"
    launch: LaunchRecord = field(default_factory=LaunchRecord)  # empty: none recorded
    # The process, and its lease (acquire).
    pid: int | None = None
    pid_created: float | None = None  # the process's start time: a reused pid is never taken for it
    host: str | None = None
    process_group: int | None = None  # spark-submit's, shared with its JVM
    jvm_pid: int | None = None
    driver_log: str | None = None
    lease_epoch: int | None = None
    started_at: str | None = None
    # Where Spark runs it, and its queries (update).
    application_id: str | None = None
    spark_master: str | None = None
    spark_ui: str | None = None
    driver_host: str | None = None
    plan_fingerprint: dict[str, list[str]] = field(default_factory=dict)  # query -> its stateful operators
    queries_started: list[str] = field(default_factory=list)
    queries_started_at: str | None = None
    last_idle_at: str | None = None
    failed_batches: list[dict[str, Any]] = field(default_factory=list)  # streamops.checkpoints.uncommitted_batch
    # How it ended (release); none while it runs, or after it died unrecorded.
    stopped_at: str | None = None
    outcome: str | None = None  # stopped | failed | fenced
    reason: str | None = None

    @classmethod
    def from_json(cls, value: object) -> DriverRecord | None:
        """The record in a parsed driver.json; None if it is not a JSON object."""
        if not isinstance(value, dict):
            return None
        found: dict[str, Any] = {}
        for item in fields(cls):
            raw = value.get(item.name)
            if item.name == "launch":
                found[item.name] = LaunchRecord.from_json(raw)
            elif item.name == "code":
                found[item.name] = CodeRecord.from_json(raw)
            elif item.default_factory is not MISSING:  # a list or an object: missing, null or empty alike
                found[item.name] = raw or item.default_factory()
            else:
                found[item.name] = raw
        return cls(**found)

    @classmethod
    def read(cls, path: Path) -> DriverRecord | None:
        """The record in a driver.json file; None when there is none, or it cannot be read (torn)."""
        return cls.from_json(read_json(path))

    @property
    def launched_version(self) -> str | None:
        """The version to start again: the launch record's, else (no launch record) the one the
        driver recorded. Unchecked: see checked_version."""
        return self.launch.version or self.version

    @property
    def launched_spark_conf(self) -> dict[str, str]:
        """The Spark conf overrides to start again ({}: none). Unchecked: see checked_spark_conf."""
        return self.launch.spark_conf or {}

    @property
    def artifact_digest(self) -> str | None:
        """The artifact digest it ran (None: installed code, or a record from before artifacts)."""
        return self.code.artifact_digest if self.code else None


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
        # The process's start time with its pid: a pid the OS reuses later is never mistaken for it.
        record = {**info, "pid": os.getpid(), "pid_created": psutil.Process().create_time(), "host": socket.gethostname(),
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
        (same start time), else None: a signal never goes to a pid the record merely names."""
        record = self.driver() or DriverRecord()
        pid, created = record.pid, record.pid_created
        if record.host != socket.gethostname() or not isinstance(pid, int) or not isinstance(created, (int, float)):
            return None
        try:
            process = psutil.Process(pid)
            return process if abs(process.create_time() - created) < 0.01 else None
        except psutil.Error:
            return None

    def state(self) -> str:
        """running | stopped | failed (its query failed) | crashed (died unrecorded) | never started."""
        if self.is_running():
            return "running"
        record = self.driver()
        if record is None:
            return "never started"
        return ("crashed" if record.outcome is None else record.outcome) if record.stopped_at else "crashed"

    def history(self) -> list[dict[str, Any]]:
        if not self.history_file.exists():
            return []
        return [json.loads(line) for line in self.history_file.read_text().splitlines() if line.strip()]

    def _append_history(self, entry: dict[str, Any]) -> None:
        with open(self.history_file, "a", encoding="utf-8") as history:
            history.write(json.dumps(entry, sort_keys=True) + "\n")

    # --- driver logs: one file per start -----------------------------------------------------------

    def new_driver_log(self) -> Path:
        """A fresh log file for a driver about to start (two starts never share one, so a refused
        second driver's own words stay readable); the oldest beyond DRIVER_LOGS_KEPT go."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        path = self.logs_dir / f"driver-{stamp}-{os.getpid()}.log"
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
        write_json_atomic(self.stop_marker, {"requested_at": now_iso(), "by": by, "deadline_s": deadline_s}, indent=1)

    def stop_requested(self) -> bool:
        return self.stop_marker.exists()

    def stop_request(self) -> dict[str, Any]:
        return read_json(self.stop_marker) or {}

    # --- progress ---------------------------------------------------------------------------------

    def write_progress(self, query: str, progress: dict[str, Any]) -> None:
        if self.fenced:
            return
        self.progress_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.progress_dir / f"{query}.json", progress, indent=1)
        try:
            self._append_rate(query, progress)
        except OSError as exc:  # the chart's history is a nicety: never the reason a batch's commit is skipped
            log.warning("could not record the batch's input rate in %s: %s", self.rates_file, exc)

    def _append_rate(self, query: str, progress: dict[str, Any]) -> None:
        """One line per batch in progress/rates.jsonl (the apps page's input-rate chart); lines
        older than RATE_HISTORY_S go once the file passes RATE_HISTORY_BYTES."""
        # The batch's figures health is judged on over a window (supervision): input, dead letters,
        # rows dropped as late, state rows updated, and the watermark after it.
        observed = progress.get("observed") or {}
        line = json.dumps({"at": progress.get("published_at") or now_iso(), "query": query,
                           "input_rows": progress.get("input_rows", 0),
                           "dead_letters": sum(int(m.get("dead_letters") or 0) for m in observed.values()),
                           "dropped_by_watermark": progress.get("dropped_by_watermark", 0),
                           "state_rows_updated": progress.get("state_rows_updated", 0),
                           "stateful": bool(progress.get("stateful")),
                           "watermark": progress.get("watermark")})
        with open(self.rates_file, "a", encoding="utf-8") as rates:
            rates.write(line + "\n")
        if self.rates_file.stat().st_size > RATE_HISTORY_BYTES:
            # The last hour, and at most half the limit of it (newest kept): the file is rewritten
            # once per half-limit of new lines, never at every batch.
            lines = [json.dumps(entry) for entry in self.rates(within_s=RATE_HISTORY_S)]
            size = sum(len(line) + 1 for line in lines)
            while len(lines) > 1 and size > RATE_HISTORY_BYTES // 2:
                size -= len(lines.pop(0)) + 1
            _write_lines_atomic(self.rates_file, lines)

    def rates(self, within_s: float = RATE_HISTORY_S) -> list[dict[str, Any]]:
        """Batches published in the last `within_s` seconds: {at, query, input_rows, dead_letters,
        dropped_by_watermark, state_rows_updated, stateful, watermark} (lines older than the fields: input_rows only)."""
        try:
            lines = self.rates_file.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        since = datetime.now(UTC).timestamp() - within_s
        recent = []
        for line in lines:
            try:
                entry = json.loads(line)
                moment = parse_recorded_time(entry["at"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a crash mid-write
            if moment is not None and moment.timestamp() >= since:
                recent.append(entry)
        return recent

    def progress(self) -> dict[str, dict[str, Any]]:
        if not self.progress_dir.exists():
            return {}
        return {path.stem: read_json(path) for path in sorted(self.progress_dir.glob("*.json")) if read_json(path)}

    # --- records skipped by an operator ------------------------------------------------------------

    def skip_records(self) -> list[dict[str, Any]]:
        """Entries of the skip list, oldest first: topic, partition, first, last (inclusive),
        reason, run_id, user, at, note. The driver dead-letters those records with the reason."""
        return list((read_json(self.skip_file) or {}).get("entries") or [])

    def add_skip_records(self, entries: list[dict[str, Any]]) -> None:
        """Append entries to the skip list (written whole and atomically: a driver starting
        meanwhile reads the old list or the new one, never half of one)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.skip_file, {"entries": [*self.skip_records(), *entries]}, indent=1)

    # --- desired state, operations in progress, the supervisor's restarts --------------------------

    def desired(self) -> dict[str, Any] | None:
        """{state: running | stopped, by, run_id, at, version} as last asked for (None: never)."""
        return read_json_object(self.desired_file)

    def set_desired(self, state: str, *, run_id: str, by: str | None = None, version: str | None = None) -> None:
        """Record what an operator asked for. It supersedes a failed operation's marker: starting or
        stopping the app is the operator's answer to it."""
        if state not in ("running", "stopped"):
            raise ValueError(f"desired state must be running or stopped, not {state!r}")
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.desired_file, {"state": state, "run_id": run_id, "by": by, "at": now_iso(), "version": version}, indent=1)
        with self._operation_lock():
            if (read_json(self.operation_file) or {}).get("failed_at"):
                self.operation_file.unlink(missing_ok=True)

    def operation(self) -> dict[str, Any] | None:
        """The run changing the app now, or the one that FAILED while changing it (`failed_at` set:
        kept until an operator's run takes it over, so nothing restarts a half-changed app); None
        when no run is at it. A run whose process died without ending its operation (killed, its
        worker lost; recorded on another host: begun more than OPERATION_MAX_S ago) counts as failed."""
        record = read_json_object(self.operation_file)
        if not record or record.get("failed_at"):
            return record or None
        if record.get("host") == socket.gethostname():
            try:
                process = psutil.Process(int(record["pid"]))
                alive = abs(process.create_time() - float(record["pid_created"])) < 0.01
            except (psutil.Error, KeyError, TypeError, ValueError):
                alive = False
            gone = not alive
        else:
            started = parse_recorded_time(record.get("started_at"))
            gone = started is None or (datetime.now(UTC) - started).total_seconds() > OPERATION_MAX_S
        if gone:
            return {**record, "failed_at": "unknown", "error": f"its process (pid {record.get('pid')} on {record.get('host')}) "
                                                                "ended without finishing it (killed, or its worker was lost)"}
        return record

    @contextmanager
    def _operation_lock(self) -> Iterator[None]:
        import fcntl

        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "operation.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def begin_operation(self, run_id: str, what: str, *, over_failed: bool = False) -> dict[str, Any] | None:
        """Mark the app as being changed by `run_id`. OperationInProgress if another run is changing
        it now, or (unless `over_failed`: an operator's run deciding what happens next) if a run
        failed while changing it. Checked and written under a lock: two runs never both go ahead.
        Returns the failed run's record this one took over (None: there was none)."""
        with self._operation_lock():
            current = self.operation()
            if current and current.get("run_id") != run_id:
                if not current.get("failed_at"):
                    raise OperationInProgress(
                        f"{self.checkpoint.name} is being changed by another run: {current.get('what')} (run "
                        f"{current.get('run_id')}, since {current.get('started_at')}, pid {current.get('pid')} on "
                        f"{current.get('host')}); try again when it has finished")
                if not over_failed:
                    raise OperationInProgress(
                        f"{self.checkpoint.name} is held: {current.get('what')} (run {current.get('run_id')}) failed while "
                        f"changing it ({current.get('error')}); an operator's start, stop or recovery decides what happens next")
            write_json_atomic(self.operation_file, {"run_id": run_id, "what": what, "started_at": now_iso(),
                                                    "host": socket.gethostname(), "pid": os.getpid(),
                                                    "pid_created": psutil.Process().create_time()}, indent=1)
            return current if current and current.get("failed_at") else None

    def end_operation(self, run_id: str, restore: dict[str, Any] | None = None) -> None:
        """End this run's operation; with `restore`, put back the failed run's record it took over
        (this run changed nothing: the hold stands)."""
        with self._operation_lock():
            if (read_json(self.operation_file) or {}).get("run_id") == run_id:
                if restore:
                    write_json_atomic(self.operation_file, restore, indent=1)
                else:
                    self.operation_file.unlink(missing_ok=True)

    def fail_operation(self, run_id: str, error: str, **details: Any) -> None:
        """Keep this run's operation marker, marked failed with the error and `details`."""
        with self._operation_lock():
            record = read_json(self.operation_file) or {}
            if record.get("run_id") == run_id:
                write_json_atomic(self.operation_file, {**record, **details, "failed_at": now_iso(), "error": error[:1000]}, indent=1)

    def restarts(self) -> list[dict[str, Any]]:
        if not self.restarts_file.exists():
            return []
        return [json.loads(line) for line in self.restarts_file.read_text().splitlines() if line.strip()]

    def record_restart(self, entry: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.restarts_file, "a", encoding="utf-8") as restarts:
            restarts.write(json.dumps(entry, sort_keys=True) + "\n")
