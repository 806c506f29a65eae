"""The pipeline catalog: the one source of truth for topics (and, later, apps).

The catalog is plain YAML so that DAGs, tests and Terraform (`yamldecode`) read the same file.
It is loaded through pydantic models; every problem is reported as a `CatalogError` that names
the file, the entry (index and name) and the field, with the YAML line where it stands.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from streamops import settings
from streamops.input_contract import DEFAULT_CONTRACT, DEFAULT_MAX_FUTURE, InputContract, field_problems
from streamops.kafka_offsets import DURATION_PATTERN, duration_ms
from streamops.name_patterns import APP_NAME_PATTERN, PATTERN_HINTS, REFERENCE_PATTERN, VERSION_PATTERN
from streamops.paths import PROJECT_ROOT
from streamops.programs import ProgramError, import_program, program_info
from streamops.refusals import Refused

DEFAULT_CATALOG_PATH = PROJECT_ROOT / "catalog" / "pipelines.yaml"
CATALOG_ENV_VAR = settings.CATALOG.name
# Which of the catalog's environments this process works in (Airflow's workers, the drivers they
# start, the CLI and the tests all read it); the catalog's `environments` say what each changes.
ENVIRONMENT_ENV_VAR = settings.ENVIRONMENT.name
DEFAULT_ENVIRONMENT = "local"

# Kafka's own rule for topic names (kafka.common.internals.Topic).
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

# Topic-level configs of Apache Kafka 4.x. A key outside this set is almost always a typo
# (`retention.msec`), which the broker would only reject at apply time, after other topics
# were already changed; refusing it at load time keeps the catalog honest.
KNOWN_TOPIC_CONFIGS = frozenset(
    {
        "cleanup.policy",
        "compression.type",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "follower.replication.throttled.replicas",
        "index.interval.bytes",
        "leader.replication.throttled.replicas",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.type",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
        "remote.storage.enable",
        "retention.bytes",
        "retention.ms",
        "segment.bytes",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
    }
)

_CLEANUP_POLICIES = {"delete", "compact", "compact,delete", "delete,compact"}


def checkpoint_root() -> Path:
    """Where relative app checkpoints live: $STREAMOPS_CHECKPOINT_ROOT, else .run/checkpoints."""
    return Path(settings.CHECKPOINT_ROOT.get() or PROJECT_ROOT / ".run" / "checkpoints")


class CatalogError(Refused):
    """A catalog file that cannot be used. The message lists every problem, one per line."""

    def __init__(self, path: Path, problems: list[str]):
        self.path = path
        super().__init__(problems)

    def render(self, problems: list[str]) -> str:
        head = f"catalog {self.path} is invalid ({len(problems)} problem{'s' * (len(problems) != 1)}):"
        return "\n".join([head, *(f"  - {p}" for p in problems)])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


ConfigValue = StrictInt | bool | str
_FIELD_PATH = re.compile(r"[A-Za-z0-9_-]{1,100}(\.[A-Za-z0-9_-]{1,100}){0,9}")
# Types a value field may have: "json" keeps a nested object as JSON text.
ValueType = Literal["string", "bigint", "double", "boolean", "timestamp", "json"]


class TopicSpec(_Strict):
    """One Kafka topic as the catalog declares it."""

    name: str
    partitions: StrictInt = Field(gt=0)
    replication_factor: StrictInt = Field(gt=0)
    owner: str = Field(min_length=1)
    description: str = Field(min_length=1)
    configs: dict[str, ConfigValue] = Field(default_factory=dict)
    # JSON value fields -> type, for decoding the topic as a batch (validation, reconciliation).
    # Nested fields are dotted paths ("source.offset"); their column is "source_offset".
    value_schema: dict[str, ValueType] | None = None
    # The Great Expectations suite for this topic: a JSON file, relative to the catalog file.
    expectation_suite: str | None = None
    # What only roles allowed sensitive data see (streamops.access.SENSITIVE_DATA) in the message
    # browser: value fields as dotted JSON paths ("user_id", "event.user_id"), and the key.
    sensitive_fields: list[str] = Field(default_factory=list)
    sensitive_key: bool = False

    @field_validator("sensitive_fields")
    @classmethod
    def _field_paths(cls, paths: list[str]) -> list[str]:
        bad = [p for p in paths if not _FIELD_PATH.fullmatch(p)]
        if bad:
            raise ValueError(f"{', '.join(repr(p) for p in bad)}: a sensitive field is a JSON field's dotted path "
                             "(letters, digits, '_' and '-' between dots, e.g. event.user_id)")
        return paths

    @property
    def has_sensitive_data(self) -> bool:
        return self.sensitive_key or bool(self.sensitive_fields)

    @field_validator("name")
    @classmethod
    def _legal_kafka_name(cls, name: str) -> str:
        if name in {".", ".."} or not _TOPIC_NAME.fullmatch(name):
            raise ValueError(
                "must be 1-249 characters of letters, digits, '.', '_' and '-' "
                "(and not '.' or '..'), as Kafka requires"
            )
        if name.startswith("__"):
            raise ValueError("names starting with '__' are reserved for Kafka's internal topics")
        if "." in name and "_" in name:
            raise ValueError(
                "mixes '.' and '_': Kafka maps both to the same metric name, so use one of them"
            )
        return name

    @field_validator("configs")
    @classmethod
    def _known_configs(cls, configs: dict[str, ConfigValue]) -> dict[str, ConfigValue]:
        unknown = sorted(set(configs) - KNOWN_TOPIC_CONFIGS)
        if unknown:
            raise ValueError(
                f"unknown topic config {', '.join(repr(k) for k in unknown)} "
                "(not a Kafka topic-level config; check the spelling)"
            )
        policy = configs.get("cleanup.policy")
        if policy is not None and str(policy).replace(" ", "") not in _CLEANUP_POLICIES:
            raise ValueError(
                f"cleanup.policy must be one of delete, compact or 'compact,delete' (got {policy!r})"
            )
        for key in ("retention.ms", "retention.bytes"):
            value = configs.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < -1):
                raise ValueError(f"{key} must be an integer >= -1, -1 meaning unlimited (got {value!r})")
        return configs

    @model_validator(mode="after")
    def _min_isr_fits_replicas(self) -> TopicSpec:
        min_isr = self.configs.get("min.insync.replicas")
        if min_isr is not None:
            if not isinstance(min_isr, int) or isinstance(min_isr, bool) or min_isr < 1:
                raise ValueError(f"configs.min.insync.replicas must be a positive integer (got {min_isr!r})")
            if min_isr > self.replication_factor:
                raise ValueError(
                    f"configs.min.insync.replicas ({min_isr}) is larger than replication_factor "
                    f"({self.replication_factor}): no write with acks=all could ever succeed"
                )
        return self

    @model_validator(mode="after")
    def _suite_needs_a_schema(self) -> TopicSpec:
        if self.expectation_suite and not self.value_schema:
            raise ValueError("expectation_suite needs value_schema: the suite validates the decoded fields")
        return self

    def value_columns(self) -> dict[str, str]:
        """Decoded column name -> field path ("source.offset" -> "source_offset")."""
        return {path.replace(".", "_"): path for path in (self.value_schema or {})}

    def kafka_configs(self) -> dict[str, str]:
        """The configs as the broker reports them: every value a string."""
        return {key: _kafka_string(value) for key, value in self.configs.items()}


def _kafka_string(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace(" ", "") if isinstance(value, str) else str(value)


# ---------------------------------------------------------------------------------------------
# Apps

# Spark interval strings ("10 minutes", "2 seconds"): used for triggers, windows and watermarks.
# The grammar (DURATION_PATTERN, duration_ms) is the one the forms' "6 hours back" uses: kafka_offsets.
Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN)]


# An app's trigger: a micro-batch interval (a Duration), or Spark's real-time mode (long-running
# tasks, one per input partition, emitting each record as it is processed; stateless queries only).
REAL_TIME = "real-time"
Trigger = Duration | Literal["real-time"]
# Spark refuses a real-time batch shorter than spark.sql.streaming.realTimeMode.minBatchDuration.
REAL_TIME_MIN_CHECKPOINT_MS = 5_000
DEFAULT_REAL_TIME_CHECKPOINT_INTERVAL = "10 seconds"
# A graceful stop waits for the next checkpoint (within $STREAMOPS_STOP_DEADLINE, 60 s by default),
# and status and lag move only at checkpoints: longer intervals would make both misleading.
REAL_TIME_MAX_CHECKPOINT_MS = 60_000


# Kafka's default for a topic's max.message.bytes (the broker's message.max.bytes), used when
# the catalog does not set it on a topic.
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


class ProducerSettings(BaseModel):
    """Producer settings of an app's Kafka sink (Spark's `kafka.*` writer options), reviewed in
    the catalog. acks=all and idempotence are not settings: they keep the zero-loss promise."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # The largest request the sink sends; a dead letter is sized to fit in it (records.py).
    max_request_size: StrictInt = Field(default=1_048_576, ge=65_536, le=104_857_600, alias="max.request.size")
    linger_ms: StrictInt = Field(default=20, ge=0, le=60_000, alias="linger.ms")
    # 256 KiB per partition batch (Kafka's default 16 KiB): the router's drain wrote 15% faster here;
    # linger.ms, not batch.size, bounds how long a record waits.
    batch_size: StrictInt = Field(default=262_144, ge=0, le=16_777_216, alias="batch.size")
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(default="lz4", alias="compression.type")
    buffer_memory: StrictInt = Field(default=33_554_432, ge=1_048_576, le=4_294_967_296, alias="buffer.memory")
    request_timeout_ms: StrictInt = Field(default=30_000, ge=1_000, le=600_000, alias="request.timeout.ms")
    delivery_timeout_ms: StrictInt = Field(default=120_000, ge=1_000, le=86_400_000, alias="delivery.timeout.ms")
    # Idempotence allows at most 5 requests in flight per connection.
    max_in_flight: StrictInt = Field(default=5, ge=1, le=5, alias="max.in.flight.requests.per.connection")

    @model_validator(mode="before")
    @classmethod
    def _fixed_settings(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fixed = sorted(set(data) & {"acks", "enable.idempotence", "transactional.id", "bootstrap.servers"})
            if fixed:
                raise ValueError(
                    f"{', '.join(fixed)} cannot be set here: every sink writes with acks=all and idempotence (zero "
                    "loss, no duplicates from retries), and the servers come from the Kafka connection"
                )
        return data

    def kafka_settings(self) -> dict[str, str]:
        """Every setting by its Kafka name, as text, the fixed ones included."""
        settings = {"acks": "all", "enable.idempotence": "true"}
        for name, field in type(self).model_fields.items():
            settings[field.alias or name] = str(getattr(self, name))
        return settings


# How often the supervisor (the app_status DAG) looks at the apps: its schedule.
SUPERVISOR_EVERY_S = 120


SUPERVISOR_MODES = ("scheduled", "events", "manual")


def supervisor_mode() -> str:
    """$STREAMOPS_SUPERVISOR: scheduled (default: every SUPERVISOR_EVERY_S and at once when a
    driver ends), events (only when a driver ends: no timed run races a test's own steps), manual
    (only when triggered: another supervisor watches the apps)."""
    mode = (settings.SUPERVISOR.get() or "scheduled").lower()
    if mode not in SUPERVISOR_MODES:
        raise ValueError(f"STREAMOPS_SUPERVISOR={mode!r}: use one of {', '.join(SUPERVISOR_MODES)}")
    return mode


def supervisor_schedule() -> timedelta | None:
    """app_status's timed schedule: every SUPERVISOR_EVERY_S, or None unless the mode is scheduled
    (the driver-exit events are added by streamops.dag_tasks.supervisor_schedule)."""
    return timedelta(seconds=SUPERVISOR_EVERY_S) if supervisor_mode() == "scheduled" else None


# The per-batch history beside a checkpoint (app_runtime.RATE_HISTORY_S): health windows fit in it.
HEALTH_HISTORY_S = 3600


class SupervisionSpec(_Strict):
    """How the supervisor (the app_status DAG, streamops.supervision) watches and restarts one app."""

    # never: a crash is reported, an operator restarts. on-failure: the supervisor restarts it from
    # its checkpoint with the version and Spark conf it last ran.
    restart: Literal["never", "on-failure"] = "on-failure"
    # The first restart is at once; restart n waits backoff_initial * 2^(n-2), at most backoff_max,
    # after the one before it (the supervisor runs every 2 minutes: shorter waits end at its next run).
    backoff_initial: Duration = "2 minutes"
    backoff_max: Duration = "30 minutes"
    # Crash-loop guard: after this many restarts within restart_window the app stays down, and
    # the status run fails saying so, until an operator deploys, restarts or stops it.
    max_restarts: StrictInt = Field(default=3, ge=1, le=100)
    restart_window: Duration = "1 hour"
    # Stalled: running, records waiting, and no completed batch for this many trigger intervals
    # (at least stall_min).
    stall_after_triggers: StrictInt = Field(default=10, ge=2, le=10_000)
    stall_min: Duration = "1 minute"
    # Lagging: the oldest unprocessed record is older than this.
    max_time_lag: Duration = "5 minutes"
    # Retention risk: retention would delete an input record the app has not processed within this
    # much time. Unset: 3x the time the app needs to read its backlog at its best rate of the last
    # hour, at least 30 minutes (streamops.retention).
    min_retention_runway: Duration | None = None
    # Degraded: more than this share of the input of the last health_window went to the dead-letter
    # topic, judged once that window holds at least dead_letter_min_records input records (two
    # records with one bad is no evidence of a degraded app).
    max_dead_letter_rate: float = Field(default=0.05, ge=0, le=1)
    dead_letter_min_records: StrictInt = Field(default=100, ge=1)
    # The window of batches the dead-letter rate and "output stopped" are judged on (at most an
    # hour: the per-batch history kept beside the checkpoint).
    health_window: Duration = "5 minutes"

    @model_validator(mode="after")
    def _health_window_kept(self) -> SupervisionSpec:
        if duration_ms(self.health_window) > HEALTH_HISTORY_S * 1000:
            raise ValueError(f"health_window {self.health_window} is longer than the {HEALTH_HISTORY_S // 60} minutes of batch "
                             "history kept beside the checkpoint")
        return self

    @model_validator(mode="after")
    def _backoff_in_order(self) -> SupervisionSpec:
        if duration_ms(self.backoff_max) < duration_ms(self.backoff_initial):
            raise ValueError(f"backoff_max ({self.backoff_max}) is shorter than backoff_initial ({self.backoff_initial})")
        # The guard counts restarts within the window: if max_restarts of them cannot fit in it
        # (backoffs, and the supervisor's own interval between runs), it never trips.
        initial_s, cap_s = duration_ms(self.backoff_initial) / 1000, duration_ms(self.backoff_max) / 1000
        spread_s = sum(max(min(initial_s * 2 ** (n - 2), cap_s), SUPERVISOR_EVERY_S) for n in range(2, self.max_restarts + 1))
        if spread_s >= duration_ms(self.restart_window) / 1000:
            raise ValueError(
                f"max_restarts {self.max_restarts} cannot happen within restart_window ({self.restart_window}): "
                f"their backoffs (from {self.backoff_initial}, at most {self.backoff_max}, "
                f"each at least the supervisor's {SUPERVISOR_EVERY_S} s) "
                f"add up to {spread_s:g} s, so the crash-loop guard would never trip; widen the window or lower max_restarts")
        return self


class SnapshotPolicy(_Strict):
    """When the snapshot_checkpoints DAG copies the app's checkpoint (streamops.snapshots), and
    which of its snapshots it keeps: the last `keep_last`, every one younger than `keep_for`, and
    whatever a running operation, a pending restore or the last good rollback needs. It is due
    `every` so long after the last scheduled snapshot, or once a query has committed
    `every_batches` batches since (whichever comes first), and only if a batch was committed since."""

    every: Duration | None = None
    every_batches: StrictInt | None = Field(default=None, ge=1)
    keep_last: StrictInt = Field(default=3, ge=1, le=1000)
    keep_for: Duration = "1 day"

    @model_validator(mode="after")
    def _has_a_schedule(self) -> SnapshotPolicy:
        if self.every is None and self.every_batches is None:
            raise ValueError("a snapshot policy needs 'every' (a time such as \"6 hours\"), 'every_batches', or both")
        return self


ReconcilePolicy = Literal["report", "approve", "auto"]


class AppSpec(_Strict):
    """One long-running Spark Structured Streaming app."""

    name: Annotated[str, StringConstraints(pattern=APP_NAME_PATTERN)]
    # The program (streamops.program_contract): an importable reference, `package.module` (its
    # `program`) or `package.module:attribute`. The code of `version` comes from the artifact
    # `artifact` (default: the app's name) in the store (streamops.artifacts): a version pins code.
    program: Annotated[str, StringConstraints(pattern=REFERENCE_PATTERN)]
    # `code: installed`, for development only: run the code installed here, whatever the version
    # says (a version is then a label; the apps page says so). No artifact then.
    code: Literal["artifact", "installed"] = "artifact"
    artifact: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{1,62}$")] | None = None
    version: Annotated[str, StringConstraints(pattern=VERSION_PATTERN)]
    owner: str = Field(min_length=1)
    description: str = Field(min_length=1)
    inputs: dict[str, str] = Field(min_length=1)  # role -> topic
    # Input contract, key rule (docs/architecture.md "Input contract"): input role -> the value's string field
    # the Kafka key must equal. Records breaking it are dead letters (never re-keyed).
    input_keys: dict[str, Annotated[str, StringConstraints(pattern=r"^[A-Za-z_@$][A-Za-z0-9_@$.-]{0,99}$")]] = Field(
        default_factory=dict
    )
    # Input contract, per input role (streamops.input_contract): field constraints, the nesting
    # depth and the event-time bounds; a role not named here gets the defaults.
    input_contract: dict[str, InputContract] = Field(default_factory=dict)
    outputs: dict[str, str] = Field(min_length=1)  # role -> topic
    # Output roles the program reads back, as it declares them (checked): Terraform, which cannot
    # ask the program, grants Read on exactly these.
    reads_outputs: list[str] = Field(default_factory=list)
    dead_letter_topic: str
    # Relative: under $STREAMOPS_CHECKPOINT_ROOT (default .run/checkpoints); or an absolute path/URI.
    checkpoint: str | None = None
    # A micro-batch interval such as "5 seconds", or real-time (stateless programs only).
    trigger: Trigger = "5 seconds"
    # Real-time only: how often progress is committed to the checkpoint (Spark's real-time batch
    # duration, at least 5 seconds). Records are written as they come; after a crash, the records
    # of at most one interval are written again (duplicates, never loss).
    checkpoint_interval: Duration | None = None
    # Back pressure: at most this many input records per micro-batch (live runs, backfills and
    # rebuilds alike), so the first batch after an outage is bounded. None: everything available.
    # Not applied in real-time mode, where a batch is bounded by its checkpoint interval.
    max_offsets_per_trigger: StrictInt | None = Field(default=None, ge=1)
    max_record_bytes: StrictInt = Field(default=1_048_576, gt=0)
    spark_conf: dict[str, StrictInt | bool | str] = Field(default_factory=dict)
    # The Kafka sink's producer settings (outputs and dead letters).
    producer: ProducerSettings = Field(default_factory=ProducerSettings)
    # Validated with the program's own settings model when the catalog loads (programs.py); a
    # program's code sees them as that model (StreamingProgram.bind).
    settings: Any = Field(default_factory=dict)
    # Restart policy, crash-loop guard and health thresholds (docs/operating.md "Supervision").
    supervision: SupervisionSpec = Field(default_factory=SupervisionSpec)
    # What the reconcile_desired_state DAG does when what runs differs from this entry (docs/architecture.md
    # "Desired state and drift"): report (show the drift only), approve (plan the roll and wait
    # for an approval), auto (roll compatible changes without one, audited).
    reconcile: ReconcilePolicy = "report"
    # Scheduled checkpoint snapshots and their retention (docs/operating.md "Checkpoint snapshots").
    # None: snapshots are taken only before a change, and every one is kept.
    snapshots: SnapshotPolicy | None = None

    @model_validator(mode="before")
    @classmethod
    def _artifact_by_default(cls, data: Any) -> Any:
        """A version pins code: an app runs its artifact (named after the app unless it says)."""
        if isinstance(data, dict) and data.get("code", "artifact") == "artifact" and not data.get("artifact"):
            return {**data, "artifact": data.get("name")}
        return data

    @model_validator(mode="after")
    def _installed_code_has_no_artifact(self) -> AppSpec:
        if self.code == "installed" and self.artifact is not None:
            raise ValueError(f"code: installed runs the code installed here, and artifact: {self.artifact} names an artifact; "
                             "keep one (artifact for every environment but development)")
        return self

    @model_validator(mode="after")
    def _input_keys_name_inputs(self) -> AppSpec:
        unknown_key_roles = sorted(set(self.input_keys) - set(self.inputs))
        if unknown_key_roles:
            raise ValueError(
                f"input_keys: {unknown_key_roles} are not input roles of this app (inputs: {sorted(self.inputs)})"
            )
        unknown_contract_roles = sorted(set(self.input_contract) - set(self.inputs))
        if unknown_contract_roles:
            raise ValueError(
                f"input_contract: {unknown_contract_roles} are not input roles of this app (inputs: {sorted(self.inputs)})"
            )
        return self

    def contract(self, role: str) -> InputContract:
        """The input contract's rules for one input role (the defaults where the catalog says none)."""
        return self.input_contract.get(role, DEFAULT_CONTRACT)

    @model_validator(mode="after")
    def _checkpoint_interval_fits_trigger(self) -> AppSpec:
        if self.checkpoint_interval is None:
            return self
        if self.trigger != REAL_TIME:
            raise ValueError(
                f"checkpoint_interval ({self.checkpoint_interval}) applies to trigger: real-time only; with a "
                f"micro-batch trigger ({self.trigger}) progress is committed after every batch"
            )
        if duration_ms(self.checkpoint_interval) < REAL_TIME_MIN_CHECKPOINT_MS:
            raise ValueError(
                f"checkpoint_interval {self.checkpoint_interval} is shorter than Spark's real-time minimum of "
                f"{REAL_TIME_MIN_CHECKPOINT_MS // 1000} seconds"
            )
        if duration_ms(self.checkpoint_interval) > REAL_TIME_MAX_CHECKPOINT_MS:
            raise ValueError(
                f"checkpoint_interval {self.checkpoint_interval} is longer than {REAL_TIME_MAX_CHECKPOINT_MS // 1000} seconds: "
                "a graceful stop waits for the next checkpoint, and status and lag move only at checkpoints"
            )
        if duration_ms(self.checkpoint_interval) >= duration_ms(self.supervision.max_time_lag):
            raise ValueError(
                f"checkpoint_interval {self.checkpoint_interval} is not shorter than supervision.max_time_lag "
                f"({self.supervision.max_time_lag}): lag is measured at checkpoints, so the app would always look lagging"
            )
        return self

    @property
    def real_time(self) -> bool:
        return self.trigger == REAL_TIME

    def commit_interval_ms(self) -> int:
        """How often the app commits progress: its micro-batch interval, or in real-time mode its
        checkpoint interval (what a stall is measured in)."""
        if self.real_time:
            return duration_ms(self.checkpoint_interval or DEFAULT_REAL_TIME_CHECKPOINT_INTERVAL)
        return duration_ms(self.trigger)

    def real_time_interval(self) -> str:
        """Spark's real-time batch duration for this app (its checkpoint interval)."""
        return self.checkpoint_interval or DEFAULT_REAL_TIME_CHECKPOINT_INTERVAL

    def topics(self) -> list[str]:
        """Every topic the app touches: inputs, outputs and its dead-letter topic."""
        return [*self.inputs.values(), *self.outputs.values(), self.dead_letter_topic]

    def checkpoint_location(self, root: str | os.PathLike[str] | None = None) -> str:
        location = self.checkpoint or self.name
        if "://" in location or location.startswith("/"):
            return location
        return str(Path(root or checkpoint_root()) / location)


class TopicSettings(_Strict):
    """What an environment sets for topics: defaults for all, or overrides for one."""

    partitions: StrictInt | None = Field(default=None, gt=0)
    replication_factor: StrictInt | None = Field(default=None, gt=0)
    configs: dict[str, ConfigValue] = Field(default_factory=dict)


class AppSettingsOverride(_Strict):
    """What an environment changes of an app."""

    trigger: Trigger | None = None
    checkpoint_interval: Duration | None = None
    max_offsets_per_trigger: StrictInt | None = Field(default=None, ge=1)
    spark_conf: dict[str, StrictInt | bool | str] = Field(default_factory=dict)
    # Fields of the app's supervision this environment sets (e.g. restart: never in dev).
    supervision: dict[str, Any] = Field(default_factory=dict)
    reconcile: ReconcilePolicy | None = None


class EnvironmentSpec(_Strict):
    """One environment of the catalog (local, cluster, ...): the same topics and apps, with the
    values that differ there. Precedence: `topics.<name>` > the topic's own entry > `topic_defaults`;
    an app's `spark_conf` is merged, its `trigger` replaced."""

    description: str = ""
    # How many brokers the environment's cluster has: no topic may ask for more replicas.
    brokers: StrictInt | None = Field(default=None, gt=0)
    # Every topic must survive the loss of one broker with acks=all writes still accepted:
    # min.insync.replicas below replication_factor (and at least 2 replicas).
    tolerate_broker_loss: bool = False
    topic_defaults: TopicSettings = Field(default_factory=TopicSettings)
    topics: dict[str, TopicSettings] = Field(default_factory=dict)
    apps: dict[str, AppSettingsOverride] = Field(default_factory=dict)


# The only environment that may apply a plan that can lose or repeat data with no approval.
UNATTENDED_ENVIRONMENT = "local"


class ApprovalPolicy(_Strict):
    """Who may apply a plan that can lose or repeat data (streamops.access.four_eyes_reason): an
    approver who did not trigger the run, always. `unattended_in` may name the local environment,
    where such a plan may also be applied with no approval ('Wait for approval' off: one person on
    a laptop, the test runs); a self-approval is refused there too."""

    unattended_in: list[str] = Field(default_factory=list)

    @field_validator("unattended_in")
    @classmethod
    def _local_only(cls, names: list[str]) -> list[str]:
        others = [name for name in names if name != UNATTENDED_ENVIRONMENT]
        if others:
            raise ValueError(f"only {UNATTENDED_ENVIRONMENT!r} may apply such plans unattended, not "
                             f"{', '.join(map(repr, others))}: everywhere else a second person approves them")
        return names


def selected_environment(environment: str | None = None) -> str:
    """The environment to work in: the argument, else $STREAMOPS_ENVIRONMENT, else local."""
    return environment or settings.ENVIRONMENT.get() or DEFAULT_ENVIRONMENT


class Catalog(_Strict):
    """The whole catalog file, resolved for one environment."""

    version: Literal[1]
    topics: list[TopicSpec] = Field(min_length=1)
    apps: list[AppSpec] = Field(default_factory=list)
    approvals: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    # Kept so the file can be read again for another environment; a catalog written back
    # (to_yaml) is already resolved and standalone, so it leaves them out.
    environments: dict[str, EnvironmentSpec] = Field(default_factory=dict, exclude=True)
    environment: str = Field(default=DEFAULT_ENVIRONMENT, exclude=True)

    def __eq__(self, other: object) -> bool:
        # Equal catalogs resolve to the same topics and apps, wherever they were resolved from.
        return isinstance(other, Catalog) and self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]

    def app(self, name: str) -> AppSpec:
        for spec in self.apps:
            if spec.name == name:
                return spec
        raise KeyError(f"app {name!r} is not in the catalog (known: {', '.join(self.app_names())})")

    def app_names(self) -> list[str]:
        return [spec.name for spec in self.apps]

    def unattended_allowed(self) -> bool:
        """May this environment apply a plan that can lose or repeat data with no approval?"""
        return self.environment in self.approvals.unattended_in

    def to_yaml(self) -> str:
        """The catalog as YAML that `load_catalog` reads back to an equal catalog."""
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True, by_alias=True), sort_keys=False, allow_unicode=True)

    def with_topic_prefix(self, prefix: str) -> Catalog:
        """The same catalog with every topic renamed `<prefix>.<name>`, references included.

        Used to run an app against its own copies of the topics (tests, scratch targets)."""

        def rename(name: str) -> str:
            return f"{prefix}.{name}"

        return self.model_copy(
            update={
                "topics": [t.model_copy(update={"name": rename(t.name)}) for t in self.topics],
                "apps": [
                    a.model_copy(
                        update={
                            "inputs": {role: rename(t) for role, t in a.inputs.items()},
                            "outputs": {role: rename(t) for role, t in a.outputs.items()},
                            "dead_letter_topic": rename(a.dead_letter_topic),
                        }
                    )
                    for a in self.apps
                ],
            }
        )

    def topic(self, name: str) -> TopicSpec:
        for spec in self.topics:
            if spec.name == name:
                return spec
        raise KeyError(f"topic {name!r} is not in the catalog (known: {', '.join(self.topic_names())})")

    def topic_names(self) -> list[str]:
        return [spec.name for spec in self.topics]

    def writer(self, topic: str) -> tuple[AppSpec, str] | None:
        """The app writing `topic` and its output role ("dead_letters" for its dead-letter topic)."""
        for app in self.apps:
            for role, name in app.outputs.items():
                if name == topic:
                    return app, role
            if app.dead_letter_topic == topic:
                return app, "dead_letters"
        return None

    def validated_topics(self) -> list[str]:
        """Topics that have an expectation suite, in catalog order."""
        return [spec.name for spec in self.topics if spec.expectation_suite]


# ---------------------------------------------------------------------------------------------
# Loading


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


# libyaml's parser when PyYAML has it: about 10x faster, and every DAG file reads the catalog when
# it is parsed, a task several times. A broken file is parsed again by PyYAML's own parser, whose
# error words are the ones operators are shown (libyaml's differ).
class _FastLineLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """_LineLoader on libyaml."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first at line {seen[key]})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_FastLineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for line numbers) and its data, from one parse."""
    try:
        return _parse_with(_FastLineLoader, text)
    except yaml.YAMLError:
        return _parse_with(_LineLoader, text)  # raises again, in PyYAML's words


def _parse_with(loader_class: type, text: str) -> tuple[yaml.Node | None, Any]:
    loader = loader_class(text)
    try:
        root_node = loader.get_single_node()
        return root_node, (loader.construct_document(root_node) if root_node is not None else None)
    finally:
        loader.dispose()


def catalog_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The catalog to use: the argument, else $STREAMOPS_CATALOG, else catalog/pipelines.yaml."""
    if path is not None:
        return Path(path)
    return Path(settings.CATALOG.get() or DEFAULT_CATALOG_PATH)


def load_catalog(path: str | os.PathLike[str] | None = None, environment: str | None = None,
                 check_programs: bool = True) -> Catalog:
    """Read and validate a catalog file for an environment (`selected_environment`); raise
    `CatalogError` naming every problem. A catalog without `environments` is the same in all.
    `check_programs=False` leaves the apps' programs unchecked (and settings unvalidated): for
    building the artifact the catalog names, before it exists."""
    path = catalog_path(path)
    environment = selected_environment(environment)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError(path, ["file not found"]) from None
    except OSError as exc:
        raise CatalogError(path, [f"cannot be read: {exc.strerror}"]) from None

    try:
        root_node, data = _parse(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise CatalogError(path, [f"{where}not valid YAML: {problem}"]) from None

    if not isinstance(data, dict):
        raise CatalogError(path, ["the top level must be a mapping with 'version' and 'topics'"])

    original = data
    data, problems = _apply_environment(data, environment, root_node)
    if problems:
        raise CatalogError(path, problems)
    try:
        catalog = Catalog.model_validate(data)
    except ValidationError as exc:
        problems = [_describe_error(err, original, root_node) for err in exc.errors()]
        raise CatalogError(path, problems) from None

    problems = list(_environment_problems(catalog, original, root_node))
    problems += list(_cross_topic_problems(catalog, data, root_node))
    problems += list(_cross_app_problems(catalog, data, root_node))
    catalog, suite_problems = _resolve_suite_paths(catalog, path.parent, data, root_node)
    problems += suite_problems
    if check_programs:
        catalog, program_problems = _resolve_programs(catalog, data, root_node)
        problems += program_problems
    if problems:
        raise CatalogError(path, problems)
    return catalog


def _apply_environment(data: dict, environment: str, root_node: yaml.Node) -> tuple[dict, list[str]]:
    """The raw catalog with the environment's values applied (before validation, so every value
    is validated as if written in place), or the problems of the `environments` section."""
    if "environment" in data:
        return data, [f"top level key 'environment' (line {_line_of(root_node, ('environment',))}): unknown key; the "
                      f"environment is chosen by ${ENVIRONMENT_ENV_VAR}, and defined under 'environments'"]
    raw = data.get("environments")
    if raw is None:  # the same in every environment; still recorded as the one selected
        return {**data, "environment": environment}, []
    where = f"environments (line {_line_of(root_node, ('environments',))})"
    if not isinstance(raw, dict) or not raw:
        return data, [f"{where}: must be a mapping of environment name -> settings"]
    if environment not in raw:
        return data, [f"{where}: environment {environment!r} (${ENVIRONMENT_ENV_VAR}) is not defined; "
                      f"defined: {', '.join(map(str, raw))}"]
    problems = []
    for name, entry in raw.items():
        try:
            EnvironmentSpec.model_validate(entry)
        except ValidationError as exc:
            for err in exc.errors():
                loc = ("environments", name, *err["loc"])
                problems.append(f"environment {name!r} (line {_line_of(root_node, loc)}), field "
                                f"'{'.'.join(map(str, err['loc']))}': {_friendly_message(err)}")
    if problems:
        return data, problems
    env = EnvironmentSpec.model_validate(raw[environment])
    topics = [t for t in data.get("topics") or [] if isinstance(t, dict)]
    apps = [a for a in data.get("apps") or [] if isinstance(a, dict)]
    for label, names, known in (("topics", env.topics, {t.get("name") for t in topics}),
                                ("apps", env.apps, {a.get("name") for a in apps})):
        for unknown in sorted(set(names) - known):
            problems.append(
                f"environment {environment!r} "
                f"(line {_line_of(root_node, ('environments', environment, label, unknown))}), "
                f"field '{label}.{unknown}': no {label[:-1]} {unknown!r} in the catalog"
            )

    def settings(spec: TopicSettings) -> dict:
        return spec.model_dump(exclude_none=True, exclude={"configs"})

    resolved_topics = []
    for topic in data.get("topics") or []:
        if isinstance(topic, dict):
            topic_override = env.topics.get(str(topic.get("name")), TopicSettings())
            configs = topic.get("configs") if isinstance(topic.get("configs"), dict) else {}
            topic = {**settings(env.topic_defaults), **topic, **settings(topic_override),
                     "configs": {**env.topic_defaults.configs, **(configs or {}), **topic_override.configs}}
        resolved_topics.append(topic)
    resolved_apps = []
    for app in data.get("apps") or []:
        if isinstance(app, dict) and app.get("name") in env.apps:
            override = env.apps[app["name"]]
            conf = app.get("spark_conf") if isinstance(app.get("spark_conf"), dict) else {}
            app = {**app, "spark_conf": {**(conf or {}), **override.spark_conf}}
            for field in ("trigger", "checkpoint_interval", "max_offsets_per_trigger", "reconcile"):
                if getattr(override, field) is not None:
                    app[field] = getattr(override, field)
            if override.trigger is not None and override.trigger != REAL_TIME:
                app.pop("checkpoint_interval", None)  # an environment may put a real-time app on micro-batches
            if override.supervision:
                own = app.get("supervision") if isinstance(app.get("supervision"), dict) else {}
                app["supervision"] = {**(own or {}), **override.supervision}
        resolved_apps.append(app)
    resolved = {**data, "topics": resolved_topics, "environment": environment}
    if "apps" in data:
        resolved["apps"] = resolved_apps
    return resolved, problems


def _environment_problems(catalog: Catalog, data: dict, root_node: yaml.Node) -> Iterator[str]:
    """What the selected environment cannot hold: more replicas than brokers, or topics that stop
    accepting writes when one broker is lost where the environment must tolerate that."""
    env = catalog.environments.get(catalog.environment)
    if env is None:
        return
    for index, topic in enumerate(catalog.topics):
        where = (f"environment {catalog.environment!r}: "
                 + _where(("topics", index), data, root_node, field_path=("topics", index, "replication_factor")))
        if env.brokers is not None and topic.replication_factor > env.brokers:
            yield (f"{where}, field 'replication_factor': {topic.replication_factor} replicas, but the environment has "
                   f"{env.brokers} broker(s)")
        if env.tolerate_broker_loss:
            min_isr = topic.configs.get("min.insync.replicas", 1)
            if topic.replication_factor < 2:
                yield (f"{where}, field 'replication_factor': 1 replica cannot survive the loss of a broker, "
                       "which this environment must tolerate (tolerate_broker_loss)")
            elif isinstance(min_isr, int) and min_isr >= topic.replication_factor:
                yield (f"{where}, field 'configs.min.insync.replicas': {min_isr} with replication_factor "
                       f"{topic.replication_factor} refuses acks=all writes as soon as one broker is down, which this "
                       "environment must tolerate (tolerate_broker_loss): use at most replication_factor - 1")


def _resolve_suite_paths(catalog: Catalog, base: Path, data: dict, root_node: yaml.Node) -> tuple[Catalog, list[str]]:
    """Suite files relative to the catalog become absolute (a catalog copied elsewhere, as the
    tests do, still finds them); a missing file is a problem naming the entry."""
    topics, problems = [], []
    for index, spec in enumerate(catalog.topics):
        if spec.expectation_suite:
            suite = (base / spec.expectation_suite).resolve()
            if not suite.is_file():
                where = _where(("topics", index), data, root_node, field_path=("topics", index, "expectation_suite"))
                problems.append(f"{where}, field 'expectation_suite': file {suite} not found")
            spec = spec.model_copy(update={"expectation_suite": str(suite)})
        topics.append(spec)
    return catalog.model_copy(update={"topics": topics}), problems


def _resolve_programs(catalog: Catalog, data: dict, root_node: yaml.Node) -> tuple[Catalog, list[str]]:
    """Each app checked against its program's declarations (roles, settings, the program's own
    checks); its settings validated with the program's model (defaults filled in)."""
    apps, problems = [], []
    for index, app in enumerate(catalog.apps):
        def where(*path: object, index: int = index) -> str:
            return _where(("apps", index), data, root_node, field_path=("apps", index, *path))

        try:
            info = program_info(app)
        except ProgramError as exc:
            field = "artifact" if app.artifact else "program"
            problems.append(f"{where(field)}, field '{field}': {exc}")
            apps.append(app)
            continue
        for field, message in info.role_problems(set(app.inputs), set(app.outputs), set(app.reads_outputs), app.settings):
            problems.append(f"{where(field)}, field '{field}': {message}")
        for role, contract in app.input_contract.items():
            for path, message in field_problems(contract, info.input_fields.get(role, [])):
                label = f"input_contract.{role}.fields.{path}"
                problems.append(f"{where('input_contract', role, 'fields', *path.split('.'))}, field '{label}': {message} "
                                f"(program {app.program})")
        if app.real_time and info.stateful_operators:
            kept = "; ".join(f"query {q}: {', '.join(ops)}" for q, ops in sorted(info.stateful_operators.items()))
            problems.append(
                f"{where('trigger')}, field 'trigger': real-time mode runs stateless queries only (Spark "
                f"4.2 keeps no state in real-time mode), and program {app.program} keeps state ({kept}); "
                "give this app a micro-batch interval such as '5 seconds'"
            )
        if not isinstance(app.settings, dict):
            problems.append(f"{where('settings')}, field 'settings': must be a mapping (got {type(app.settings).__name__})")
            apps.append(app)
            continue
        if info.artifact is not None:  # the version's code is not imported here: its recorded schema
            settings = app.settings  # as written: defaults follow the version that runs (settings_dict)
            for loc, message in info.settings_problems(app.settings):
                label = ".".join(map(str, ("settings", *loc)))
                problems.append(f"{where('settings', *loc)}, field '{label}': {message} (program {app.program}, "
                                f"artifact {info.artifact.short()})")
        else:
            program = import_program(app.program)
            try:
                model = program.Settings.model_validate(app.settings)
            except ValidationError as exc:
                for err in exc.errors():
                    label = ".".join(map(str, ("settings", *err["loc"])))
                    problems.append(f"{where('settings', *err['loc'])}, field '{label}': {_friendly_message(err)} "
                                    f"(program {app.program})")
                apps.append(app)
                continue
            settings = model.model_dump(mode="json")
            problems += [
                f"{where()}: {problem}" for problem in program.check(program.bind(app.model_copy(update={"settings": model})))
            ]
        app, window_problems = _bounded_for_windows(app, info, settings)
        problems += [f"{where('input_contract', role, 'max_future')}, field 'input_contract.{role}.max_future': {message}"
                     for role, message in window_problems]
        apps.append(app.model_copy(update={"settings": settings}))
    return catalog.model_copy(update={"apps": apps}), problems


def _bounded_for_windows(app: AppSpec, info: Any, settings: Any) -> tuple[AppSpec, list[tuple[str, str]]]:
    """An app with windowed counts: each input's event-time bound must stay below the windows'
    watermark (a record max_future ahead moves the watermark that far, past records still on
    time); an input the catalog gives no max_future gets half the watermark (at most the default)."""
    watermarks = []
    for counted in info.window_counts.values():
        value = settings.get(counted.watermark_setting) if isinstance(settings, dict) else None
        value = value or ((info.settings_schema.get("properties") or {}).get(counted.watermark_setting) or {}).get("default")
        if isinstance(value, str) and re.fullmatch(DURATION_PATTERN, value):
            watermarks.append((counted.watermark_setting, value))
    if not watermarks:
        return app, []
    setting, watermark = min(watermarks, key=lambda named: duration_ms(named[1]))
    limit_ms = duration_ms(watermark)
    contracts, problems = dict(app.input_contract), []
    for role in app.inputs:
        contract = contracts.get(role)
        if contract is None or "max_future" not in contract.model_fields_set:
            seconds = max(min(duration_ms(DEFAULT_MAX_FUTURE), limit_ms // 2) // 1000, 1)
            contracts[role] = (contract or InputContract()).model_copy(
                update={"max_future": f"{seconds} second{'s' if seconds > 1 else ''}"})
        elif contract.max_future is not None and duration_ms(contract.max_future) >= limit_ms:
            problems.append((role, f"max_future {contract.max_future} is not shorter than settings.{setting} ({watermark}): one "
                                   "record that far ahead would move the windows' watermark past records still on time; keep "
                                   "it below (unset, it is half the watermark)"))
    return app.model_copy(update={"input_contract": contracts}), problems


def _cross_topic_problems(catalog: Catalog, data: dict, root_node: yaml.Node) -> Iterator[str]:
    first_by_name: dict[str, int] = {}
    separator_owner: tuple[str, int, str] | None = None  # (separator, index, name)
    for index, spec in enumerate(catalog.topics):
        where = _where(("topics", index), data, root_node, field_path=("topics", index, "name"))
        if spec.name in first_by_name:
            yield (
                f"{where}, field 'name': duplicate topic name {spec.name!r} "
                f"(already declared at topics[{first_by_name[spec.name]}])"
            )
        else:
            first_by_name[spec.name] = index
        separator = "." if "." in spec.name else "_" if "_" in spec.name else None
        if separator is None:
            continue
        if separator_owner is None:
            separator_owner = (separator, index, spec.name)
        elif separator != separator_owner[0]:
            yield (
                f"{where}, field 'name': {spec.name!r} uses {separator!r} but the catalog's names use "
                f"{separator_owner[0]!r} (from topics[{separator_owner[1]}] {separator_owner[2]!r}); "
                "Kafka maps '.' and '_' to the same metric name, so one cluster must use only one"
            )


def _cross_app_problems(catalog: Catalog, data: dict, root_node: yaml.Node) -> Iterator[str]:
    topic_names = set(catalog.topic_names())
    first_by_name: dict[str, int] = {}
    writer_of: dict[str, str] = {}
    for index, app in enumerate(catalog.apps):
        if app.name in first_by_name:
            where = _where(("apps", index), data, root_node, field_path=("apps", index, "name"))
            yield f"{where}, field 'name': duplicate app name {app.name!r} (already declared at apps[{first_by_name[app.name]}])"
        first_by_name.setdefault(app.name, index)
        references: list[tuple[str, str | None, str]] = [("inputs", role, topic) for role, topic in app.inputs.items()]
        references += [("outputs", role, topic) for role, topic in app.outputs.items()]
        references.append(("dead_letter_topic", None, app.dead_letter_topic))
        for field, role, topic in references:
            path = ("apps", index, field) + ((role,) if role else ())
            label = f"{field}.{role}" if role else field
            where = _where(("apps", index), data, root_node, field_path=path)
            if topic not in topic_names:
                yield f"{where}, field '{label}': topic {topic!r} is not declared under 'topics'"
            elif field != "inputs":
                if topic in writer_of and writer_of[topic] != app.name:
                    yield (
                        f"{where}, field '{label}': topic {topic!r} is already written by app "
                        f"{writer_of[topic]!r}; every topic has one writing app"
                    )
                writer_of.setdefault(topic, app.name)
        dead_letters = next((t for t in catalog.topics if t.name == app.dead_letter_topic), None)
        if dead_letters is not None:
            accepts = dead_letters.configs.get("max.message.bytes", KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
            if isinstance(accepts, int) and not isinstance(accepts, bool) and accepts < app.producer.max_request_size:
                where = _where(("apps", index), data, root_node, field_path=("apps", index, "producer", "max.request.size"))
                said = (
                    "its max.message.bytes" if "max.message.bytes" in dead_letters.configs
                    else "Kafka's default max.message.bytes"
                )
                yield (
                    f"{where}, field 'producer.max.request.size': {app.producer.max_request_size} is more than the dead-letter "
                    f"topic {app.dead_letter_topic!r} accepts ({said}, {accepts}): a dead letter is sized to the request "
                    "limit, so raise the topic's max.message.bytes or lower max.request.size"
                )


def _describe_error(err: Mapping[str, Any], data: dict, root_node: yaml.Node) -> str:
    loc = tuple(err["loc"])
    # Pydantic adds union members and discriminator tags to the location: drop them.
    noise = {"int", "bool", "str"}
    loc = tuple(part for part in loc if part not in noise) or loc
    entry_loc = loc[:2] if len(loc) >= 2 and loc[0] in ("topics", "apps") else loc[:1]
    field = ".".join(str(p) for p in loc[len(entry_loc):])
    where = _where(entry_loc, data, root_node, field_path=loc)
    message = _friendly_message(err)
    if field:
        return f"{where}, field '{field}': {message}"
    return f"{where}: {message}"


def _friendly_message(err: Mapping[str, Any]) -> str:
    kind, raw = err["type"], err.get("input")
    if kind == "extra_forbidden":
        return "unknown key (not part of the catalog format; check the spelling)"
    if kind == "missing":
        return "required but missing"
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return f"must be an integer (got {type(raw).__name__} {raw!r})"
    if kind in {"string_type"}:
        return f"must be a string (got {type(raw).__name__} {raw!r})"
    if kind == "greater_than":
        return f"must be a positive integer (got {raw!r})"
    if kind == "greater_than_equal":
        return f"must be at least {err['ctx']['ge']} (got {raw!r})"
    if kind == "less_than_equal":
        return f"must be at most {err['ctx']['le']} (got {raw!r})"
    if kind in {"list_type", "dict_type"}:
        wanted = "a list" if kind == "list_type" else "a mapping"
        return f"must be {wanted} (got {type(raw).__name__})"
    if kind == "value_error":
        return str(err["ctx"]["error"])
    if kind == "literal_error":
        return f"must be one of {err['ctx']['expected']} (got {raw!r})"
    if kind == "string_pattern_mismatch":
        return f"{raw!r} does not have the expected form ({PATTERN_HINTS.get(err['ctx']['pattern'], err['ctx']['pattern'])})"
    return err["msg"]


def _where(entry_loc: tuple, data: Any, root_node: yaml.Node, field_path: tuple | None = None) -> str:
    """'topics[2] 'a.b' (line 14)' for an entry, or the top-level key."""
    if entry_loc and entry_loc[0] in ("topics", "apps") and len(entry_loc) == 2:
        section, index = entry_loc
        label = f"{section}[{index}]"
        entries = data.get(section) if isinstance(data, dict) else None
        if isinstance(entries, list) and index < len(entries) and isinstance(entries[index], dict):
            name = entries[index].get("name")
            if isinstance(name, str):
                label += f" {name!r}"
    else:
        label = "top level" + (f" key '{entry_loc[0]}'" if entry_loc else "")
    line = _line_of(root_node, field_path or entry_loc)
    return f"{label} (line {line})" if line else label


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """The YAML line of the deepest node on `loc` that exists."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == part:
                    child = value_node
                    line = key_node.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line
