"""Reprocessing: recompute an app's outputs from its retained input, as a bounded job.

Kafka keeps the log, so an app can be re-run over any retained range: after a code fix, for a
new derived topic, or to check live output. The job is a driver like the live app's (spark-submit,
the same entry point), running the code of a chosen version (default: the version running live;
for an artifact app, exactly that version's artifact) with Trigger.AvailableNow on a fresh
checkpoint: it starts at the planned offsets and drops records at or past the planned end, so
the run is exactly the planned range.

Targets are never the live topics: *versioned* topics (`<topic>.<version>`, e.g.
`oplog.category.contacts.v2`) or *scratch* topics (`scratch.<tag>.<topic>`), created from the
catalog's definitions of the live ones (partitions, configs, value schema, suite).

    plan = plan_reprocess(admin, catalog, ReprocessRequest(app="oplog-router", start="6 hours"))
    print(plan.table())                  # per input partition: offsets, records, estimate, warnings
    result = run_reprocess(kafka, admin, catalog, plan, work_dir, spark=SparkTarget("local[2]"))
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from tabulate import tabulate

from streamops.app_ops import readable_tail, stop
from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec, Catalog, TopicSpec
from streamops.checkpoints import backup_checkpoint, bind_cluster, positions, restore_checkpoint
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import (
    BACK,
    EARLIEST,
    NOW,
    TIME,
    OffsetSpan,
    parse_moment,
    time_range_spans,
    topic_partitions,
    watermarks,
)
from streamops.name_patterns import VERSION_PATTERN
from streamops.plans import JsonPlan
from streamops.programs import ProgramError, program_info, ran_digest, running_version
from streamops.provisioning import ensure_topics
from streamops.refusals import Refused
from streamops.spark_submit import KAFKA_CLIENT_FILE, SparkTarget, driver_env, submit_spec
from streamops.timestamps import epoch_ms, iso_seconds_utc, run_tag

# Used for the estimate until this machine has measured a run of the app.
log = logging.getLogger(__name__)
DEFAULT_RATE = 5_000.0
# A version suffix becomes part of topic names: "v" and at most 6 digits (the forms use the pattern).
VERSION_SUFFIX_PATTERN = r"^v[0-9]{1,6}$"
_VERSION = re.compile(VERSION_SUFFIX_PATTERN)
TAG_PATTERN = r"^[a-z0-9-]{1,40}$"  # names scratch topics and the run's folder


class ReprocessRefused(Refused):
    """A request that cannot be planned; the message lists every problem."""

    heading = "the reprocessing request was refused before anything was changed:"


@dataclass
class ReprocessRequest:
    app: str
    start: str = "earliest"  # "earliest", an ISO-8601 time with timezone, or a duration back ("6 hours")
    end: str = "now"  # "now" or an ISO-8601 time with timezone
    target: str = "versioned"  # "versioned" or "scratch"
    version: str = "v2"  # suffix of versioned targets
    tag: str = ""  # names scratch targets and the checkpoint; default: a timestamp
    # After the run, hand the live app over to the targets: it continues from the backfill's
    # checkpoint (so the run is not cut at the planned end: it reads what is there when it starts).
    cutover: bool = False
    # The version of the app's code to run ("": the version running live, else the catalog's).
    program_version: str = ""


@dataclass
class PartitionRange:
    """One input partition's planned span; flat in the plan's JSON ("start", "end"), as the
    approval page and the plan's readers have it."""

    topic: str
    partition: int
    start: int
    end: int  # exclusive
    first_timestamp_ms: int | None  # of the record at `start`, if any

    @property
    def span(self) -> OffsetSpan:
        return OffsetSpan(self.start, self.end)

    @property
    def records(self) -> int:
        return self.span.records


@dataclass
class ReprocessPlan(JsonPlan):
    DERIVED = ("records",)

    app: str
    request: dict
    inputs: list[PartitionRange]
    targets: dict[str, str]  # live topic -> target topic
    estimate_s: float
    rate: float
    rate_measured: bool
    warnings: list[str] = field(default_factory=list)
    planned_at: str = ""
    program_version: str = ""  # the code that runs: this version of the app's program
    program_digest: str | None = None  # its artifact's digest (None: the code installed here)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.inputs)

    def starting_offsets(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for p in self.inputs:
            out.setdefault(p.topic, {})[str(p.partition)] = p.start
        return out

    def ending_offsets(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for p in self.inputs:
            out.setdefault(p.topic, {})[str(p.partition)] = p.end
        return out

    def table(self) -> str:
        rows = [
            [p.topic, p.partition, p.start, p.end, p.records,
             iso_seconds_utc(p.first_timestamp_ms) if p.first_timestamp_ms else "-"]
            for p in self.inputs
        ]
        head = tabulate(
            rows, headers=["input topic", "partition", "start offset", "end offset", "records", "first record written"]
        )
        basis = "measured" if self.rate_measured else "assumed (no run of this app measured yet)"
        targets = "\n".join(f"  {live} -> {target}" for live, target in self.targets.items())
        code = f"artifact {self.program_digest}" if self.program_digest else "the code installed here"
        lines = [
            head,
            f"{self.records} record(s); estimated run time {self.estimate_s:.0f} s at {self.rate:,.0f} records/s ({basis})",
            f"code: version {self.program_version} ({code})",
            f"targets:\n{targets}",
        ]
        lines += [f"WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)

    def summary(self) -> str:
        return (f"{self.records} record(s) of {self.app} into {', '.join(self.targets.values())} "
                f"(about {self.estimate_s:.0f} s)")


@dataclass
class ReprocessResult:
    app: str
    records_in: int
    records_out: dict[str, int]  # target topic -> records written
    dead_letters: int
    seconds: float
    checkpoint: str
    catalog_file: str  # the catalog the run used (targets in place of the live outputs)

    @property
    def rate(self) -> float:
        return self.records_in / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        out = ", ".join(f"{t}: {n}" for t, n in self.records_out.items())
        return (f"{self.app}: {self.records_in} record(s) in, out [{out}], {self.dead_letters} dead letter(s), "
                f"{self.seconds:.1f} s = {self.rate:,.0f} records/s")


def target_topics(app: AppSpec, target: str, version: str, tag: str) -> dict[str, str]:
    """Live output topic (and dead-letter topic) -> the topic the reprocessing writes."""
    live = [*app.outputs.values(), app.dead_letter_topic]
    if target == "versioned":
        return {t: f"{t}.{version}" for t in live}
    return {t: f"scratch.{tag}.{t}" for t in live}


def target_catalog(catalog: Catalog, app_name: str, targets: dict[str, str]) -> Catalog:
    """The catalog with the target topics declared (copied from the live ones) and the app
    writing to them; inputs are unchanged."""
    app = catalog.app(app_name)
    copies: list[TopicSpec] = [catalog.topic(live).model_copy(update={"name": new}) for live, new in targets.items()]
    renamed = app.model_copy(
        update={
            "outputs": {role: targets[t] for role, t in app.outputs.items()},
            "dead_letter_topic": targets[app.dead_letter_topic],
            # A fresh checkpoint per run; never the live app's.
            "checkpoint": None,
        }
    )
    known = set(catalog.topic_names())
    return catalog.model_copy(
        update={
            "topics": [*catalog.topics, *[c for c in copies if c.name not in known]],
            "apps": [renamed if a.name == app_name else a for a in catalog.apps],
        }
    )


def _first_timestamps(kafka: KafkaClientConfig, ranges: list[PartitionRange]) -> None:
    """Fill in the write time of each range's first record (one fetch per partition)."""
    wanted = [r for r in ranges if r.records > 0]
    if not wanted:
        return
    consumer = kafka.consumer("streamops-reprocess-plan")
    try:
        for r in wanted:
            consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
            message = consumer.poll(10)
            if message is not None and not message.error():
                r.first_timestamp_ms = message.timestamp()[1]
    finally:
        consumer.close()


def plan_reprocess(
    admin: AdminClient,
    kafka: KafkaClientConfig,
    catalog: Catalog,
    request: ReprocessRequest,
    now: datetime | None = None,
    measured_rate: float | None = None,
) -> ReprocessPlan:
    """Resolve the request to offsets per input partition; refuse bad requests naming each problem."""
    now = now or datetime.now(UTC)
    problems: list[str] = []
    try:
        app = catalog.app(request.app)
    except KeyError as exc:
        raise ReprocessRefused([str(exc.args[0])]) from None
    start_time = end_time = None
    try:
        start_time = parse_moment(request.start, "start", now, allowed={EARLIEST, TIME, BACK},
                                  hint="; or use 'earliest' or a duration such as '6 hours'").at
    except ValueError as exc:
        problems.append(str(exc))
    try:
        end_time = parse_moment(request.end, "end", now, allowed={NOW, TIME}, hint="; or use 'now'").at
    except ValueError as exc:
        problems.append(str(exc))
    if end_time and end_time > now:
        problems.append(f"end {request.end} is in the future; use 'now' to process up to the current end")
    if start_time and (end_time or now) <= start_time:
        problems.append(f"end {request.end} is not after start {request.start}: the range is empty or inverted")
    if request.target not in ("versioned", "scratch"):
        problems.append(f"target {request.target!r} must be 'versioned' or 'scratch'")
    if request.cutover and (request.target != "versioned" or request.end != "now"):
        problems.append("cutover needs target 'versioned' and end 'now' (the live app continues where the backfill ends)")
    if request.target == "versioned" and not _VERSION.fullmatch(request.version or ""):
        problems.append(f"version {request.version!r} must look like v2 (it becomes the topic suffix)")
    running = running_version(app)
    program_version = request.program_version or running
    program_digest = None
    if request.cutover and program_version != running:
        problems.append(f"cutover continues {app.name} with the version it runs ({running}) from the backfill's checkpoint: "
                        f"that backfill must run the same code; leave the code version empty or choose {running}")
    if not re.fullmatch(VERSION_PATTERN, program_version):
        problems.append(f"program version {program_version!r} is not a semantic version such as 1.2.0")
    else:
        try:
            # A version the app ran is pinned to the bytes it ran (a replaced store copy is refused).
            declared = program_info(app, program_version, ran_digest(app, program_version))
            program_digest = declared.artifact.digest if declared.artifact else None
        except ProgramError as exc:
            problems.append(str(exc))
    tag = request.tag or run_tag(now)
    if not re.fullmatch(TAG_PATTERN, tag):
        problems.append(f"tag {tag!r} must be 1-40 lowercase letters, digits or '-'")
    if problems:
        raise ReprocessRefused(problems)

    inputs = sorted(set(app.inputs.values()))
    layout = topic_partitions(admin, inputs)
    missing = [t for t, parts in layout.items() if parts is None]
    if missing:
        raise ReprocessRefused([f"input topic {t!r} does not exist on the broker" for t in missing])
    ranges: list[PartitionRange] = []
    for topic in inputs:
        partitions = layout[topic] or []
        spans = time_range_spans(admin, topic, partitions, start_time, end_time)
        ranges += [PartitionRange(topic, p, span.start, span.end, None) for p, span in spans.items()]
    _first_timestamps(kafka, ranges)

    rate = measured_rate or DEFAULT_RATE
    records = sum(r.records for r in ranges)
    estimate_s = records / rate
    warnings = []
    for r in ranges:
        retention = catalog.topic(r.topic).configs.get("retention.ms")
        if not r.first_timestamp_ms or not isinstance(retention, int) or retention < 0:
            continue
        age_ms = epoch_ms(now) - r.first_timestamp_ms
        if age_ms + estimate_s * 1000 > 0.9 * retention:
            warnings.append(
                f"{r.topic} p{r.partition}: the range starts with a record written {age_ms / 3_600_000:.1f} h ago and "
                f"retention is {retention / 3_600_000:.1f} h; with the estimated {estimate_s:.0f} s of run time the broker "
                "could delete it before the run reads it (the run then fails rather than skip records)"
            )
    targets = target_topics(app, request.target, request.version, tag)
    problems = [f"target topic {t!r} is a topic of the catalog (a live topic): choose another version"
                for t in targets.values() if t in catalog.topic_names()]
    for target, target_partitions in topic_partitions(admin, list(targets.values())).items():
        held = sum(high - low for low, high in watermarks(admin, target, target_partitions).values()) if target_partitions else 0
        if held:
            problems.append(
                f"target topic {target!r} already holds {held} record(s): a second run would mix with them; "
                "choose another version (or tag), or keep the existing output"
            )
    if problems:
        raise ReprocessRefused(problems)
    return ReprocessPlan(
        app=app.name,
        request={**asdict(request), "tag": tag},
        inputs=ranges,
        targets=targets,
        estimate_s=estimate_s,
        rate=rate,
        rate_measured=measured_rate is not None,
        warnings=warnings,
        planned_at=iso_seconds_utc(now),
        program_version=program_version,
        program_digest=program_digest,
    )


class ReprocessFailed(RuntimeError):
    """The backfill's driver failed; the message has its log's last lines."""


def backfill_command(app: AppSpec, plan: ReprocessPlan, kafka: KafkaClientConfig, catalog_file: Path, checkpoint: Path,
                     live_checkpoint: str, spark: SparkTarget) -> list[str]:
    """The backfill driver's spark-submit: the same builder and Spark target as every live launch
    (spark_default's deploy mode, queue and binary reach a backfill too)."""
    spec = submit_spec(
        app, kafka=kafka, catalog=catalog_file, trigger="available-now", checkpoint=str(checkpoint),
        version=plan.program_version or None, starting_offsets=json.dumps(plan.starting_offsets()),
        expected_digest=plan.program_digest,
        # A cutover continues from this checkpoint: cutting at the planned end would drop what
        # arrived since the plan. Otherwise the run is exactly the planned range.
        ending_offsets=None if plan.request.get("cutover") else plan.ending_offsets(),
        # Records an operator skipped in the live app are skipped here too (same input).
        skip_records_of=live_checkpoint,
        # Its progress stays out of the consumer group: streamops.<app> shows the live app's lag.
        consumer_group=False,
        label="backfill",
    )
    return spec.argv(spark)


def run_reprocess(
    kafka: KafkaClientConfig,
    admin: AdminClient,
    catalog: Catalog,
    plan: ReprocessPlan,
    work_dir: Path,
    *,
    spark: SparkTarget,
    launched_by: str = "reprocess",
) -> ReprocessResult:
    """Create the targets, run the planned version of the app over exactly the planned range (a
    driver of its own: spark-submit, as the live app runs), count the output."""
    # A run's folder is never reused: its checkpoint would resume instead of starting at the plan.
    try:
        work_dir.mkdir(parents=True)
    except FileExistsError:
        raise ReprocessRefused([f"the run folder {work_dir} exists already (a run with this tag): choose another tag"]) from None
    targeted = target_catalog(catalog, plan.app, plan.targets)
    ensure_topics(admin, [targeted.topic(t) for t in plan.targets.values()])
    catalog_file = work_dir / "catalog.yaml"
    catalog_file.write_text(targeted.to_yaml())
    app = targeted.app(plan.app)
    checkpoint = work_dir / "checkpoint"
    # The checkpoint knows its Kafka cluster: a cutover hands it to the live app.
    bind_cluster(plan.app, checkpoint, kafka.cluster_id(next(iter(app.inputs.values()))), kafka.bootstrap_servers)
    command = backfill_command(app, plan, kafka, catalog_file, checkpoint, catalog.app(plan.app).checkpoint_location(), spark)
    driver_log = work_dir / "driver.log"
    started = time.monotonic()
    try:
        with driver_log.open("ab") as log_file:
            finished = subprocess.Popen(  # noqa: S603 - argv from the catalog and the checked plan
                command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=work_dir, env=driver_env(STREAMOPS_LAUNCHED_BY=launched_by, STREAMOPS_DRIVER_LOG=str(driver_log)),
            )
            try:
                _report_progress(finished, checkpoint, plan, started)
            except BaseException:
                finished.kill()  # the task is being stopped: its driver goes with it
                finished.wait()
                raise
    finally:
        # The connection's secrets stay on disk only while the driver that reads them runs (a live
        # app's file stays: its restarts read it); the run folder is kept for review.
        (AppRuntime(str(checkpoint)).dir / KAFKA_CLIENT_FILE).unlink(missing_ok=True)
    if finished.returncode:
        raise ReprocessFailed(f"the backfill of {plan.app} (version {plan.program_version or app.version}) failed with exit code "
                              f"{finished.returncode}; last lines of {driver_log}:\n{readable_tail(driver_log, 40)}")
    seconds = time.monotonic() - started
    written = {}
    for target in plan.targets.values():
        marks = watermarks(admin, target, topic_partitions(admin, [target])[target] or [])
        written[target] = sum(high - low for low, high in marks.values())
    dead_letter_target = plan.targets[catalog.app(plan.app).dead_letter_topic]
    return ReprocessResult(
        app=plan.app,
        records_in=_records_read(checkpoint, plan) if plan.request.get("cutover") else plan.records,
        records_out={t: n for t, n in written.items() if t != dead_letter_target},
        dead_letters=written[dead_letter_target],
        seconds=seconds,
        checkpoint=str(checkpoint),
        catalog_file=str(catalog_file),
    )


PROGRESS_EVERY_S = 15.0


def progress_line(app: str, done: int, planned: int, elapsed_s: float) -> str:
    """'backfill of X: 1,200 of 10,000 records (12.0%), 400 records/s, about 22 s left'."""
    share = f" ({done / planned:.1%})" if planned else ""
    if done <= 0:
        return (f"backfill of {app}: 0 of {planned:,} records after {elapsed_s:.0f} s (the driver is starting or "
                "working on its first batch)")
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    left = (planned - done) / rate if rate > 0 and planned > done else 0.0
    return f"backfill of {app}: {done:,} of {planned:,} records{share}, {rate:,.0f} records/s, about {left:.0f} s left"


def _report_progress(driver: subprocess.Popen, checkpoint: Path, plan: ReprocessPlan, started: float) -> None:
    """Wait for the driver, logging records done / planned (its checkpoint's committed offsets),
    rate and time left every PROGRESS_EVERY_S: a long backfill shows how far it is in the task log."""
    while True:
        try:
            driver.wait(timeout=PROGRESS_EVERY_S)
            return
        except subprocess.TimeoutExpired:
            pass
        try:
            done = _records_read(checkpoint, plan) if checkpoint.is_dir() else 0
        except Exception:  # noqa: BLE001 - a commit file half written: the next look reads it; never fail the run
            done = 0
        log.info(progress_line(plan.app, done, plan.records, time.monotonic() - started))


def _records_read(checkpoint: Path, plan: ReprocessPlan) -> int:
    """Records the run read: from the planned start to the offsets its checkpoint committed."""
    read = 0
    for position in positions(checkpoint).values():
        ends = position.offsets
        read += sum(ends.get(p.topic, {}).get(p.partition, p.start) - p.start for p in plan.inputs if p.topic in ends)
    return read


def cutover(live: AppSpec, result: ReprocessResult, start: Callable[[], Any], *, requested_by: str,
            stop_deadline_s: float = 60.0) -> dict:
    """Stop the live app gracefully, put the backfill's checkpoint in place of its own (the old
    one is kept as a snapshot), and `start()` it on the targets from there: no gap, no overlap.
    `start` records the new topics as approved before it launches (the checkpoint is theirs now)."""
    checkpoint = live.checkpoint_location()
    stopped = stop(live, checkpoint=checkpoint, requested_by=requested_by, deadline_s=stop_deadline_s)
    Path(checkpoint).mkdir(parents=True, exist_ok=True)
    snapshot = backup_checkpoint(checkpoint, "before-cutover")
    restore_checkpoint(checkpoint, Path(result.checkpoint))
    started = start()
    return {"stopped": stopped, "backup": str(snapshot), "pid": started.pid, "driver_log": started.driver_log}
