"""The records of the files beside a checkpoint that cross a process boundary (the driver and the
control plane; a DAG task and the supervisor), one typed record per file (and per record format:
the dead-letter envelope), used by the writer and every reader. A unit test round-trips each
(tests/unit/streamops/test_runtime_records.py).

driver.json (`DriverRecord`, with `LaunchRecord` and `CodeRecord`) is lenient by design (below):
every field may be missing, values are kept as the file has them. The others are checked by
pydantic, and a value of the wrong type is refused where it is read, with a RuntimeRecordError
naming the file (or line) and the field; each reader says what it does then (some count a bad
file as absent, as they count a torn one, because their callers rely on it). Optional fields are
those older writers did not write. They are pydantic models (`to_json` is what the writer puts in
the file, `from_file_value` reads it back): progress, rates, the skip list, the stop request,
desired state, the operation marker, a failed reconcile roll, the replay ledger and the
dead-letter envelope. Or, where readers index them by key, TypedDicts (`checked` reads and checks
them, `checked_lines` a JSON-lines file of them): the run history, the restarts, a checkpoint
snapshot's _backup.json and the checkpoint's cluster binding. The standby handshake's files and
the lease's live with their protocols (streamops.standby, streamops.driver_lease).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Required, Self, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, with_config

# pydantic reads a TypedDict of typing_extensions only, before Python 3.12.
from typing_extensions import TypedDict

from streamops.runtime_files import read_json

# --- a failed query's batch, in driver.json and the run history ---------------------------------


class InputRange(TypedDict):
    """Input records of one topic partition: offsets `first` to `last`, inclusive."""

    topic: str
    partition: int
    first: int
    last: int


class UncommittedBatch(TypedDict):
    """A query's planned and uncommitted micro-batch (streamops.checkpoints.uncommitted_batch): the
    one a failed query stopped on, which a restart runs again with the same offsets."""

    batch: int | None  # None: the checkpoint holds no uncommitted batch (it failed outside one)
    ranges: list[InputRange]  # the partitions with records in it


class FailedBatch(UncommittedBatch, total=False):
    """One entry of driver.json's `failed_batches` (streamops.driver.stopping.record_failed_batches):
    the batch a failed query stopped on, with its error's gist. Not checked where driver.json is
    read (DriverRecord keeps values as the file has them); typed for the code that writes and reads it."""

    query: Required[str]
    error: str


# --- driver.json, typed --------------------------------------------------------------------------
#
# The driver writes driver.json from a DriverRecord (streamops.driver.run: DriverRecord.to_json, then
# AppRuntime.acquire, update, release); everyone else reads it through DriverRecord.from_json.
# Records of older drivers are read too, so every key may be missing
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
    and the driver records it (read with `from_json`: keys it does not know are dropped) as
    driver.json's `launch`; `from_json` reads it back.
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
    pid_created: float | None = None  # its create time (wall clock), for people to read
    pid_start: str | None = None  # process_identity.start_mark: a reused pid is never taken for it
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
    # query -> the stateful operators its program declares (drivers before Spark's state check
    # recorded their plan's stateful lines as `plan_fingerprint`: read as this).
    stateful_operators: dict[str, list[str]] = field(default_factory=dict)
    queries_started: list[str] = field(default_factory=list)
    queries_started_at: str | None = None
    last_idle_at: str | None = None
    failed_batches: list[FailedBatch] = field(default_factory=list)
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
            if item.name == "stateful_operators" and raw is None:
                raw = value.get("plan_fingerprint")
            if item.name == "launch":
                found[item.name] = LaunchRecord.from_json(raw)
            elif item.name == "code":
                found[item.name] = CodeRecord.from_json(raw)
            elif item.default_factory is not MISSING:  # a list or an object: missing, null or empty alike
                found[item.name] = raw or item.default_factory()
            else:
                found[item.name] = raw
        return cls(**found)

    def to_json(self) -> dict[str, Any]:
        """The JSON object the driver writes (AppRuntime.acquire adds the process and the lease):
        fields not recorded (None, or an empty list or object) are left out; from_json reads it
        back to an equal record."""
        written: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "launch":
                written["launch"] = value.to_json()
            elif item.name == "code":
                if value is not None:
                    written["code"] = value.to_json()
            elif value is not None and not (item.default_factory is not MISSING and not value):
                written[item.name] = value
        return written

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(item.name for item in fields(cls))

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


# --- the pydantic records -----------------------------------------------------------------------


class RuntimeRecordError(ValueError):
    """A runtime file whose content is not its record; the message names the file and the field."""


def _refusal(kind: str, where: str, exc: ValidationError) -> RuntimeRecordError:
    problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the value'}: {e['msg']}" for e in exc.errors())
    return RuntimeRecordError(f"{where}: not a {kind} ({problems})")


class _Record(BaseModel):
    # Frozen values; keys this version does not know (a newer writer's) are ignored, not refused.
    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_file_value(cls, value: object, where: str) -> Self:
        """The record in a parsed file (or one entry of it); RuntimeRecordError names `where`."""
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            raise _refusal(cls.__name__, where, exc) from None


# --- the JSON-object records ----------------------------------------------------------------------
#
# Records their readers index by key (operators' scripts and the integration tests read
# `runtime.history()[-1]["event"]`, `backup_info(path)["label"]`, a standby's word ==
# {"word": "go", ...}) stay plain JSON objects: TypedDicts, checked by pydantic like the models
# above (`checked`), so a reader gets the same dict it always did, typed, and a bad file is
# refused naming the file and the field.

_T = TypeVar("_T")
_ADAPTERS: dict[object, TypeAdapter[Any]] = {}


def checked(kind: type[_T], value: object, where: str) -> _T:
    """`value` (a parsed file, a line of one, or what a writer is about to write) as the record
    `kind` (a TypedDict, or one of the models); RuntimeRecordError names `where` and the field.
    Keys `kind` does not declare are dropped, unless it keeps them (RunEvent)."""
    adapter = _ADAPTERS.get(kind) or _ADAPTERS.setdefault(kind, TypeAdapter(kind))
    try:
        return cast(_T, adapter.validate_python(value))
    except ValidationError as exc:
        raise _refusal(kind.__name__, where, exc) from None


def checked_lines(kind: type[_T], path: Path) -> list[_T]:
    """The records of a JSON-lines file, oldest first ([] when there is none); RuntimeRecordError
    names the file and line of one that is not a `kind` (a line cut by a crash too: nothing
    here guesses what it said)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    found = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise RuntimeRecordError(f"{path}:{number}: not a {kind.__name__} (not JSON: {exc})") from None
        found.append(checked(kind, value, f"{path}:{number}"))
    return found


class QueryProgress(_Record):
    """progress/<query>.json: a query's latest micro-batch, as the driver's listener publishes it
    (streamops.driver.progress); status, the health gate and the bench read it."""

    query: str
    batch_id: int
    timestamp: str | None = None  # Spark's, of the batch's trigger
    published_at: str | None = None  # when the driver wrote it (now_iso)
    input_rows: int = 0
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    batch_duration_ms: int = 0
    state_rows: int = 0
    dropped_by_watermark: int = 0
    state_rows_updated: int = 0  # rows the stateful operators added or changed (a windowed count's updates)
    state_memory_bytes: int = 0  # the stateful operators' memoryUsedBytes (RocksDB: its own estimate)
    state_files_bytes: int = 0  # RocksDB's SST files (customMetrics rocksdbSstFileSize; 0 for other stores)
    stateful: bool = False
    watermark: str | None = None
    end_offsets: dict[str, dict[str, int]] = Field(default_factory=dict)  # topic -> partition -> next offset
    observed: dict[str, dict[str, Any]] = Field(default_factory=dict)  # observe() name -> its metrics

    def observed_total(self, metric: str) -> int:
        """One observed metric (records_in, dead_letters) summed over the batch's observations."""
        return sum(int(metrics.get(metric) or 0) for metrics in self.observed.values())


class RateLine(_Record):
    """One line of progress/rates.jsonl per batch: what health windows and the apps page's chart
    are computed from (lines older than the fields have input_rows only)."""

    at: str
    query: str | None = None
    input_rows: int = 0
    dead_letters: int = 0
    dropped_by_watermark: int = 0
    state_rows_updated: int = 0
    stateful: bool = False
    watermark: str | None = None

    @classmethod
    def of(cls, query: str, progress: QueryProgress, at: str) -> RateLine:
        return cls(at=progress.published_at or at, query=query, input_rows=progress.input_rows,
                   dead_letters=progress.observed_total("dead_letters"), dropped_by_watermark=progress.dropped_by_watermark,
                   state_rows_updated=progress.state_rows_updated, stateful=progress.stateful, watermark=progress.watermark)


class SkipEntry(_Record):
    """One entry of skip-records.json: input records an operator chose to skip
    (recover_skip_records); the driver dead-letters them with `reason`."""

    topic: str
    partition: int
    first: int  # offsets, inclusive
    last: int
    reason: str
    run_id: str | None = None
    user: str | None = None
    at: str | None = None
    note: str | None = None


class SkipList(_Record):
    """skip-records.json: the entries, oldest first (written whole and atomically)."""

    entries: list[SkipEntry] = Field(default_factory=list)


class StopRequest(_Record):
    """stop-requested: an operator's (or a rollout's) request for a graceful stop."""

    requested_at: str | None = None
    by: str | None = None
    deadline_s: float | None = None  # None: STREAMOPS_STOP_DEADLINE, else 60


class DesiredState(_Record):
    """desired.json: what an operator last asked the app to be doing (the supervisor keeps to it)."""

    state: Literal["running", "stopped"]
    run_id: str | None = None
    by: str | None = None
    at: str | None = None
    version: str | None = None
    # Not written by set_desired: supervision's reading of an app deployed before desired states
    # were recorded (running unless its last driver stopped on request).
    inferred: bool = False


class OnCallNotice(_Record):
    """notified.json: the state on-call was last told the app is in (streamops.notifications), so
    one crash loop pages once."""

    state: str
    at: str
    run_id: str | None = None


class OperationRecord(_Record):
    """operation.json: the run changing the app now (a DAG run's step, the supervisor's restart),
    or the one that failed while changing it (`failed_at` set: the app is held until an
    operator's run takes the marker over). Written by AppRuntime.begin_operation and
    fail_operation, read through AppRuntime.operation (supervision, streamops.dag_tasks)."""

    run_id: str
    what: str  # "<DAG> <step>", or "supervisor restart"
    started_at: str | None = None
    host: str | None = None
    pid: int | None = None
    pid_created: float | None = None  # its create time (wall clock), for people to read
    pid_start: str | None = None  # process_identity.start_mark: a reused pid is never taken for it
    failed_at: str | None = None  # "unknown": its process ended without ending the operation
    error: str | None = None
    state_after: str | None = None  # the app's state when the run failed
    backups: list[str] = Field(default_factory=list)  # the checkpoint snapshots the failed run took

    @property
    def failed(self) -> bool:
        return bool(self.failed_at)


class SnapshotHold(_Record):
    """One entry of _runtime/snapshot-holds.json (streamops.snapshots): a run that will read a snapshot (a restore plan
    awaiting its approval and apply), so no prune removes it before `until`."""

    snapshot: str
    run_id: str
    what: str
    until: str


class FailedRoll(_Record):
    """reconcile-failed.json: the catalog entry (its declared spec's digest) a reconcile roll failed
    to bring in (health gate failed, rolled back): not rolled again until it changes
    (streamops.desired_state)."""

    declared_digest: str | None = None
    run_id: str | None = None
    at: str | None = None
    error: str | None = None


class RestartAttempt(TypedDict, total=False):
    """What the supervisor records of a restart attempt before its outcome (and audits with it)."""

    at: Required[str]
    run_id: Required[str]
    attempt: int  # the restart it was within the guard's window
    backoff_s: float
    not_before: str | None
    version: str
    after: str | None  # how the driver before it ended


class RestartEntry(RestartAttempt, total=False):
    """One line of restarts.jsonl: a restart attempt of the supervisor (streamops.supervision.act:
    started or failed, both counted by the crash-loop guard), or the guard giving up."""

    outcome: Required[Literal["started", "failed", "gave up"]]
    error: str  # failed: why
    pid: int  # started: the new driver's
    backup: str | None  # started: the checkpoint snapshot taken before it
    restarts: int  # gave up: the restarts within the window


@with_config(ConfigDict(extra="allow"))
class RunEvent(TypedDict, total=False):
    """One line of runs.jsonl, every start and end of a driver (AppRuntime.acquire, release):
    `started` and `stopped` carry the driver's record as driver.json had it then (every key of
    it kept, as the file had it: see DriverRecord), `fenced` (a driver whose lease was taken
    over) its pid, host, epoch, stopped_at and why. Declared here: what the suite reads back."""

    event: Required[Literal["started", "stopped", "fenced"]]
    outcome: str | None  # stopped: stopped | failed
    reason: str | None
    failed_batches: list[FailedBatch]  # stopped: the batches its queries failed on


class BackupInfo(TypedDict, total=False):
    """_backup.json in a checkpoint snapshot, what it holds (streamops.checkpoints.backup_checkpoint).
    A snapshot from before snapshots described themselves has the label its name carries only."""

    label: Required[str]
    taken_at: str
    version: str | None  # of the driver that last wrote the checkpoint
    launch: dict[str, Any]  # that driver's LaunchRecord ({}: none recorded)
    code: dict[str, Any] | None  # its CodeRecord (None: a driver from before artifacts)
    skipped_files: int  # files the running app's maintenance removed during the copy (left out)


class ClusterBinding(TypedDict, total=False):
    """_kafka_cluster.json in a checkpoint: the Kafka cluster its offsets belong to
    (streamops.checkpoints.bind_cluster)."""

    cluster_id: Required[str]
    bootstrap: str
    at: str


# --- the dead-letter envelope ---------------------------------------------------------------------
#
# Not a file: the JSON value of every dead letter, written by Spark SQL in the driver
# (streamops.records.dead_letter_record, whose struct is built from these fields in this order)
# and read back by recover_replay_dead_letters (streamops.recovery.replay). Spark's to_json
# leaves out null fields, so every field a dead letter may lack is optional; the bench writes the
# first three only.


class DeadLetterSource(_Record):
    """Where the original record was: its input topic, partition, offset and Kafka timestamp."""

    topic: str
    partition: int
    offset: int
    timestamp: str | None = None


class DeadLetterEnvelope(_Record):
    """A dead letter's value: why the input record was refused, where it was, and the original key
    and value, byte for byte in base64 when they fit the dead-letter limit, else by reference
    (stored "reference": read back from the source, checked against the sha256)."""

    app: str | None = None
    app_version: str | None = None
    reason: str
    failed_at: str | None = None
    source: DeadLetterSource
    original_key_base64: str | None = None
    original_value_base64: str | None = None
    original_key_stored: Literal["null", "inline", "reference"] | None = None
    original_value_stored: Literal["null", "inline", "reference"] | None = None
    original_key_bytes: int | None = None
    original_value_bytes: int | None = None
    original_key_sha256: str | None = None
    original_value_sha256: str | None = None
    original_value_preview: str | None = None

    @classmethod
    def field_names(cls) -> list[str]:
        """The envelope's fields in the order the writer puts them."""
        return list(cls.model_fields)


class ReplayLedgerEntry(_Record):
    """One line of _runtime/replay-ledger.jsonl: a dead letter's original that
    recover_replay_dead_letters produced again (streamops.recovery.replay), never replayed twice."""

    source: str  # the original's topic/partition/offset
    dead_letter: str | None = None  # the dead letter's topic/partition/offset
    to: str | None = None  # where it was produced: topic/partition/offset
    run_id: str | None = None
    at: str | None = None
