"""Status and lag of the streaming apps, read from their checkpoints and the broker.

Spark keeps its offsets in the checkpoint, not in a consumer group, so lag is computed here:
for each query, the offsets of its last committed micro-batch (streamops.checkpoints.positions)
against the topics' end offsets. Time lag is the age of the oldest unprocessed record.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from confluent_kafka import KafkaException, TopicPartition

from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.catalog import AppSpec
from streamops.checkpoints import cluster_problem, positions
from streamops.failures import describe_failed_batches
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import duration_ms, end_offsets
from streamops.retention import SIZE_SAMPLE_RECORDS, Runway, TopicRetention, record_bytes, topic_retentions
from streamops.runtime_records import RateLine
from streamops.timestamps import parse_recorded_time

log = logging.getLogger(__name__)


@dataclass
class PartitionLag:
    query: str
    topic: str
    partition: int
    processed_to: int  # next offset the query will read
    end: int
    lag: int
    time_lag_s: float | None  # age of the oldest unprocessed record; None when caught up
    earliest: int = 0  # the partition's first offset on the broker (retention moves it)
    in_checkpoint: bool = True  # False: the checkpoint has no position for it (a new partition)


@dataclass
class QueryWindow:
    """One query's batches of the last health window (supervision.health_window), summed."""

    window_s: float
    batches: int = 0
    input_rows: int = 0
    dead_letters: int = 0
    dropped_by_watermark: int = 0
    state_rows_updated: int = 0
    stateful: bool = False
    # Per batch: (input rows, state rows updated, rows dropped as late), oldest first.
    per_batch: list[tuple[int, int, int]] = field(default_factory=list)
    watermark: str | None = None  # after the newest batch (Spark's eventTime.watermark)


def query_windows(rates: list[RateLine], window_s: float) -> dict[str, QueryWindow]:
    """The per-batch history (AppRuntime.rates) summed per query."""
    windows: dict[str, QueryWindow] = {}
    for entry in rates:
        window = windows.setdefault(str(entry.query), QueryWindow(window_s))
        rows, updated, dropped = entry.input_rows, entry.state_rows_updated, entry.dropped_by_watermark
        window.batches += 1
        window.input_rows += rows
        window.dead_letters += entry.dead_letters
        window.dropped_by_watermark += dropped
        window.state_rows_updated += updated
        window.stateful = window.stateful or entry.stateful
        window.per_batch.append((rows, updated, dropped))
        window.watermark = entry.watermark or window.watermark
    return windows


def minute_rates(rates: list[RateLine], now: datetime, minutes: int = 60) -> list[float]:
    """Input rows/s per minute over the last `minutes` (every query of the app summed), from
    the per-batch lines of AppRuntime.rates(); the last entry is the current minute so far."""
    rows = [0] * minutes
    for entry in rates:
        moment = parse_recorded_time(entry.at)
        if moment is None:
            continue
        age_minutes = int((now - moment).total_seconds() // 60)
        if 0 <= age_minutes < minutes:
            rows[minutes - 1 - age_minutes] += entry.input_rows
    return [count / 60 for count in rows]


@dataclass
class AppStatus:
    app: str
    state: str  # running | stopped | failed | crashed | never started
    version: str | None = None
    # The code that runs: its artifact's digest (sha256:...), or "installed" (the code on the host).
    code: str | None = None
    pid: int | None = None
    application_id: str | None = None
    # Where it runs: Spark master, driver host, the driver's UI and the hosts of its live executors.
    spark_master: str | None = None
    driver_host: str | None = None
    spark_ui: str | None = None
    executor_hosts: list[str] | None = None  # None: not known (local mode, or the UI did not answer)
    # The driver's lease: its latest heartbeat's age and the ttl after which another may take over.
    heartbeat_age_s: float | None = None
    lease_ttl_s: float | None = None
    started_at: str | None = None
    stopped_at: str | None = None
    reason: str | None = None
    last_progress_at: str | None = None
    last_idle_at: str | None = None  # the driver's latest "nothing to read" from Spark (onQueryIdle)
    progress_age_s: float | None = None
    batches: dict[str, int] = field(default_factory=dict)
    dead_letters_last_batch: int = 0
    input_rows_last_batch: int = 0
    # Per query, its latest batch: input_rows, input/processed rows per second, batch_duration_ms,
    # state_rows, dead_letters (what the metrics endpoint exports).
    queries: dict[str, dict] = field(default_factory=dict)
    # Per query, its batches of the last health window (what health is judged on).
    recent: dict[str, QueryWindow] = field(default_factory=dict)
    lags: list[PartitionLag] = field(default_factory=list)
    # The Kafka cluster the suite's connection reaches (its id), and why the app's checkpoint cannot
    # run there (written against another cluster: streamops.checkpoints.cluster_problem).
    kafka_cluster: str | None = None
    cluster_problem: str | None = None
    # Per input partition: how long until retention deletes what the app has not read (streamops.retention).
    runways: list[Runway] = field(default_factory=list)

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.lags)

    @property
    def max_time_lag_s(self) -> float | None:
        ages = [p.time_lag_s for p in self.lags if p.time_lag_s is not None]
        return max(ages) if ages else None

    def code_short(self) -> str:
        """'(sha256:1a2b3c4d)' for an artifact, '(installed)' for the host's code, '' if unknown."""
        if not self.code:
            return ""
        return f"({self.code[:15]})" if self.code.startswith("sha256:") else f"({self.code})"

    def to_dict(self) -> dict:
        return {**asdict(self), "total_lag": self.total_lag, "max_time_lag_s": self.max_time_lag_s,
                "runways": [r.to_json() for r in self.runways]}


def _age_seconds(iso: str | None) -> float | None:
    moment = parse_recorded_time(iso)
    if moment is None:
        return None
    return round((datetime.now(UTC) - moment).total_seconds(), 1)


@dataclass
class _Sample:
    """What was read at an app's position in one partition."""

    timestamp_ms: int  # the first unread record's
    records: int = 0  # read for the size estimate
    bytes: int = 0  # their record_bytes


def _read_at_positions(kafka: KafkaClientConfig, positions: list[TopicPartition],
                       wanted: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]) -> dict[tuple[str, int], _Sample]:
    """The record at each position, and from there up to `wanted` records' bytes (1: the timestamp
    only), or up to the partition's end (`ends`: offsets hold transaction markers and compaction
    gaps, so fewer records than offsets may come). Bounded: at most 10 s in all; what was read by
    then is the sample."""
    if not positions:
        return {}
    consumer = kafka.consumer("streamops-status")
    found: dict[tuple[str, int], _Sample] = {}
    done: set[tuple[str, int]] = set()
    try:
        consumer.assign(positions)
        deadline = time.monotonic() + 10
        batch = min(sum(wanted.get((tp.topic, tp.partition), 1) for tp in positions), 1000)
        while len(done) < len(positions) and time.monotonic() < deadline:
            # consume() returns after the timeout unless every message asked for came: keep it short.
            for message in consumer.consume(num_messages=batch, timeout=0.05):
                where = (message.topic(), message.partition())
                if message.error() is not None or where in done:
                    continue
                sample = found.setdefault(where, _Sample(message.timestamp()[1]))
                want = wanted.get(where, 1)
                if want > 1:
                    sample.records += 1
                    sample.bytes += record_bytes(message.key(), message.value(), message.headers())
                if want <= 1 or sample.records >= want or message.offset() + 1 >= ends.get(where, 0):
                    done.add(where)
                    consumer.pause([TopicPartition(*where)])
    finally:
        consumer.close()
    return found


def app_status(spec: AppSpec, kafka: KafkaClientConfig | None, checkpoint: str | None = None) -> AppStatus:
    location = checkpoint or spec.checkpoint_location()
    runtime = AppRuntime(location)
    record = runtime.driver() or DriverRecord()
    status = AppStatus(
        app=spec.name,
        state=runtime.state(),
        version=record.version,
        code=record.code.label if record.code else None,
        pid=record.pid,
        application_id=record.application_id,
        spark_master=record.spark_master,
        driver_host=record.driver_host,
        spark_ui=record.spark_ui,
        started_at=record.started_at,
        stopped_at=record.stopped_at,
        reason=record.reason,
        last_idle_at=record.last_idle_at,
    )
    holder = runtime.lease.holder()
    if holder is not None and holder.epoch == record.lease_epoch:
        status.heartbeat_age_s = round(holder.silent_for_s(), 1)
        status.lease_ttl_s = float(holder.record.get("ttl_s") or 0) or None
        if status.state == "crashed":
            # Died without a word; on another host nothing here can tell more than the silence.
            status.reason = (f"the driver (pid {holder.pid} on {holder.where}) stopped heartbeating "
                             f"{status.heartbeat_age_s:.0f}s ago without recording a stop")
    if status.state == "running" and status.spark_ui and status.application_id \
            and not (status.spark_master or "").startswith("local"):
        status.executor_hosts = executor_hosts(status.spark_ui, status.application_id)
    if status.state == "failed" and record.failed_batches:  # the batch a restart would run again

        status.reason = f"{describe_failed_batches(record.failed_batches)}: {status.reason or ''}"
    progress = runtime.progress()
    if progress:
        latest = max((p.published_at or "" for p in progress.values()), default="")
        status.last_progress_at = latest or None
        status.progress_age_s = _age_seconds(latest)
        status.batches = {name: p.batch_id for name, p in progress.items()}
        status.queries = {name: {
            "batch_id": p.batch_id, "published_at": p.published_at, "input_rows": p.input_rows,
            "input_rows_per_second": p.input_rows_per_second or 0.0,
            "processed_rows_per_second": p.processed_rows_per_second or 0.0,
            "batch_duration_ms": p.batch_duration_ms, "state_rows": p.state_rows,
            "dead_letters": p.observed_total("dead_letters"),
        } for name, p in progress.items()}
        status.dead_letters_last_batch = sum(q["dead_letters"] for q in status.queries.values())
        status.input_rows_last_batch = sum(q["input_rows"] for q in status.queries.values())
        window_s = duration_ms(spec.supervision.health_window) / 1000
        status.recent = query_windows(runtime.rates(within_s=window_s), window_s)

    if kafka is None:  # the runtime files alone (no broker to compare with)
        return status
    try:
        status.kafka_cluster = kafka.cluster_id(next(iter(spec.inputs.values())), timeout=5)
    except KafkaException:
        status.kafka_cluster = None  # the lag below says what is wrong with the connection
    status.cluster_problem = cluster_problem(spec.name, runtime.checkpoint, status.kafka_cluster, kafka.bootstrap_servers)
    if status.cluster_problem:  # its offsets belong to another cluster: a lag against this one means nothing
        return status
    ends_cache: dict[str, dict[int, tuple[int, int]]] = {}
    behind: list[TopicPartition] = []
    for query, position in positions(runtime.checkpoint).items():
        for topic, partitions in position.offsets.items():
            if topic not in ends_cache:
                ends_cache[topic] = end_offsets(kafka, topic)
            for partition, (low, high) in ends_cache[topic].items():
                done = partitions.get(partition, 0)
                lag = max(high - done, 0)
                status.lags.append(PartitionLag(query, topic, partition, done, high, lag, None, low,
                                                partition in partitions))
                if lag:
                    behind.append(TopicPartition(topic, partition, done))
    retentions = _input_retentions(kafka, spec, status.lags)
    # The unread records' bytes are sampled only where a size limit may delete them first.
    wanted = {(p.topic, p.partition): min(p.lag, SIZE_SAMPLE_RECORDS) for p in status.lags
              if p.lag and p.topic in retentions and retentions[p.topic].retention_bytes is not None}
    samples = _read_at_positions(kafka, behind, wanted, {(p.topic, p.partition): p.end for p in status.lags})
    now_ms = time.time() * 1000
    for behind_by in status.lags:
        sample = samples.get((behind_by.topic, behind_by.partition)) if behind_by.lag else None
        behind_by.time_lag_s = round((now_ms - sample.timestamp_ms) / 1000, 1) if sample and sample.timestamp_ms else None
    status.runways = _runways(spec, status.lags, retentions, samples)
    return status


def _input_retentions(kafka: KafkaClientConfig, spec: AppSpec, lags: list[PartitionLag]) -> dict[str, TopicRetention]:
    """The retention of the app's inputs as the broker has it ({}: none read, no runway)."""
    inputs = {p.topic for p in lags if p.topic in set(spec.inputs.values()) and p.in_checkpoint}
    if not inputs:
        return {}
    try:
        return topic_retentions(kafka.admin(), inputs)
    except Exception as exc:  # noqa: BLE001 - no DescribeConfigs, a slow broker: no runway, the status still reads
        log.warning("%s: the inputs' retention cannot be read (%s: %s): no retention runway", spec.name,
                    type(exc).__name__, exc)
        return {}


def _runways(spec: AppSpec, lags: list[PartitionLag], retentions: dict[str, TopicRetention],
             samples: dict[tuple[str, int], _Sample]) -> list[Runway]:
    """The app's input partitions' runways."""
    inputs = set(spec.inputs.values())
    runways = []
    for p in lags:
        if p.topic not in inputs or not p.in_checkpoint:
            continue
        kept = retentions.get(p.topic, TopicRetention(None, None))
        sample = samples.get((p.topic, p.partition)) if p.lag else None
        unread_bytes = round(sample.bytes / sample.records * p.lag) if sample and sample.records else None
        runways.append(Runway(p.topic, p.partition, p.processed_to, p.earliest, p.time_lag_s if p.lag else None,
                              kept.retention_ms, kept.retention_bytes, unread_bytes, p.lag))
    return runways


_SPARK_UI = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+:\d{1,5}")
_APPLICATION_ID = re.compile(r"[A-Za-z0-9_\-]+")


def is_spark_ui_address(address: object) -> bool:
    """An http(s) host:port address and nothing else: driver.json is the app's own record, so its
    Spark UI address is checked before it is asked or linked."""
    return isinstance(address, str) and _SPARK_UI.fullmatch(address) is not None


def executor_hosts(spark_ui: str, application_id: str) -> list[str] | None:
    """Hosts of the app's live executors (each once), from its driver's REST API; None when that
    cannot be asked or does not answer: status must not fail because a UI is slow or a
    driver.json is damaged, and it asks nothing but a driver UI address."""
    import httpx

    if not is_spark_ui_address(spark_ui) or not _APPLICATION_ID.fullmatch(application_id):
        return None
    try:
        response = httpx.get(f"{spark_ui}/api/v1/applications/{application_id}/executors", timeout=5)
        executors = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, httpx.InvalidURL, ValueError):
        return None
    if not isinstance(executors, list):
        return None
    return sorted({e["hostPort"].rsplit(":", 1)[0] for e in executors
                   if isinstance(e, dict) and e.get("id") != "driver" and e.get("isActive", True)
                   and isinstance(e.get("hostPort"), str)})


def status_table(statuses: list[AppStatus]) -> str:
    from tabulate import tabulate

    rows = [
        [
            s.app, _state(s), f"{s.version or '-'} {s.code_short()}".strip(), s.pid or "-",
            f"{s.progress_age_s:.0f}s ago" if s.progress_age_s is not None else "-",
            ", ".join(f"{q} #{b}" for q, b in sorted(s.batches.items())) or "-",
            s.total_lag, f"{s.max_time_lag_s:.0f}s" if s.max_time_lag_s is not None else "0s",
            _where(s),
        ]
        for s in statuses
    ]
    return tabulate(rows, headers=["app", "state", "version", "pid", "last progress", "batches", "lag (records)", "time lag",
                                   "driver @ master (executors); UI"])


def _state(s: AppStatus) -> str:
    """The state, and a running driver's silence once it is past half its lease ttl (a driver
    paused or cut off on another host: another takes over when the ttl runs out)."""
    if s.state == "running" and s.heartbeat_age_s is not None and s.lease_ttl_s and s.heartbeat_age_s > s.lease_ttl_s / 2:
        return f"running (no heartbeat for {s.heartbeat_age_s:.0f}s of {s.lease_ttl_s:.0f}s)"
    return s.state


def _where(s: AppStatus) -> str:
    if not s.spark_master:
        return "-"
    if s.executor_hosts is None:
        executors = "" if s.spark_master.startswith("local") else " (executors ?)"
    else:
        executors = f" ({', '.join(s.executor_hosts)})" if s.executor_hosts else " (no executors)"
    return f"{s.driver_host or '?'} @ {s.spark_master}{executors}; {s.spark_ui or '-'}"


def lag_table(status: AppStatus) -> str:
    from tabulate import tabulate

    rows = [
        [p.query, p.topic, p.partition, p.processed_to, p.end, p.lag, p.time_lag_s if p.time_lag_s is not None else "-"]
        for p in status.lags
    ]
    return tabulate(rows, headers=["query", "topic", "partition", "processed to", "end", "lag", "time lag (s)"])
