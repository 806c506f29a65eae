"""Start an app's queries, and the driver command line every program shares.

    spark-submit --jars <connector jars> [--py-files <artifact.zip>] \\
        plugins/streamops/entrypoints/driver.py --app oplog-router --program spark_apps.oplog_router \\
        [--artifact <artifact.zip> --artifact-digest sha256:...] \\
        [--catalog FILE] [--kafka-config FILE | --bootstrap-servers HOST:PORT] [--checkpoint DIR] \\
        [--trigger "2 seconds" | --trigger available-now | --trigger real-time] \\
        [--starting-offsets earliest|latest|JSON] \\
        [--ending-offsets JSON] [--skip-records-of CHECKPOINT] [--version X.Y.Z] [--standby TOKEN]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from spark_apps.common.kafka_io import BOUNDED_READ_OPTIONS, kafka_sink_options, read_topics
from spark_apps.common.session import apply_app_conf, build_session
from streamops.app_runtime import AlreadyRunningError, AppRuntime, now_iso
from streamops.catalog import REAL_TIME, AppSpec, catalog_path, load_catalog
from streamops.checkpoints import query_dir, uncommitted_batch
from streamops.failures import error_gist
from streamops.program_contract import StreamingProgram
from streamops.refusals import OneLineRefused
from streamops.spark_submit import LOCAL_MASTER
from streamops.standby import StandbySlot
from streamops.kafka_client import KafkaClientConfig, KafkaConfigError
from streamops.waiting import DeadlineExceeded, poll_until
from streamops import settings

log = logging.getLogger("streamops.app")

AVAILABLE_NOW = "available-now"


@dataclass(frozen=True)
class OutputQuery:
    """One streaming query of an app: rows of (key, value, topic) for the Kafka sink."""

    name: str
    frame: DataFrame
    output_mode: str = "append"


@dataclass(frozen=True)
class RunOptions:
    kafka: KafkaClientConfig  # where and as whom the app connects (secrets masked in its repr)
    checkpoint: str  # this app's checkpoint root; each query has a folder under it
    # A Spark interval, "available-now" (process what is there, stop), or "real-time" (Spark's
    # real-time mode: records emitted as they come, progress committed every checkpoint_interval).
    trigger: str = "5 seconds"
    checkpoint_interval: str = "10 seconds"  # real-time only
    # Only for a new checkpoint: earliest, latest, or Spark's JSON of offsets per topic and partition.
    starting_offsets: str = "earliest"
    # Bounded runs (reprocessing): topic -> partition -> first offset NOT processed. Records at or
    # past it are dropped at the source, so an available-now run covers exactly the planned range.
    ending_offsets: dict[str, dict[str, int]] | None = None
    version: str | None = None  # overrides the catalog's version label
    max_offsets_per_trigger: int | None = None
    # Records an operator skipped (recover_skip_records); None: the list beside the checkpoint.
    # A backfill runs on a checkpoint of its own and passes the live app's list here.
    skip_records: list[dict] | None = None



def build_outputs(
    spark: SparkSession, spec: AppSpec, program: StreamingProgram, options: RunOptions,
    sources_read: list[list[str]] | None = None,
) -> list[OutputQuery]:
    """The app's queries as DataFrames, not started. `sources_read` collects the topics of each
    Kafka source the queries read (a real-time run needs a task slot per partition of each)."""
    spec = program.bind(spec)
    apply_app_conf(spark, spec)
    # Read once at start: recover_skip_records writes the list while the app is stopped.
    skipped = options.skip_records if options.skip_records is not None else AppRuntime(options.checkpoint).skip_records()

    def source(topics: list[str]) -> DataFrame:
        if sources_read is not None:
            sources_read.append(list(topics))
        # Real-time mode bounds a batch by time (its checkpoint interval), not by a record count.
        limit = None if options.trigger == REAL_TIME else options.max_offsets_per_trigger or spec.max_offsets_per_trigger
        frame = read_topics(
            spark, options.kafka, topics, _starting_offsets(options.starting_offsets, topics),
            limit, group_id_prefix=f"streamops.{spec.name}", real_time=options.trigger == REAL_TIME,
        ).withColumn(OPERATOR_SKIP, operator_skip(skipped, topics))
        ends = {t: e for t, e in (options.ending_offsets or {}).items() if t in topics}
        if not ends:
            return frame
        within = F.lit(False)
        for topic, partitions in ends.items():
            for partition, end in partitions.items():
                within = within | ((F.col("topic") == topic) & (F.col("partition") == int(partition)) & (F.col("offset") < end))
        unbounded = ~F.col("topic").isin(*ends)
        return frame.where(within | unbounded)

    return program.queries(spec, options.version or spec.version, source)


# The column `records.parse` turns into a record's error: the skip reason, or null.
OPERATOR_SKIP = "_operator_skip"


def operator_skip(entries: list[dict], topics: list[str]) -> Column:
    """The skip reason of a source record named in the skip list (null for every other record).
    It runs on every record, so it stays cheap: a null literal when no entry names these topics
    (Spark folds it away), else one offset-range comparison per entry."""
    reason = F.lit(None).cast("string")
    for entry in reversed([e for e in entries if e["topic"] in topics]):
        named = ((F.col("topic") == entry["topic"]) & (F.col("partition") == int(entry["partition"]))
                 & F.col("offset").between(int(entry["first"]), int(entry["last"])))
        reason = F.when(named, F.lit(entry["reason"])).otherwise(reason)
    return reason


def _starting_offsets(starting: str, topics: list[str]) -> str:
    """earliest/latest as given; a JSON of offsets narrowed to these topics (a query's source may
    read a topic the JSON does not name, e.g. the app's own output: that one starts at earliest)."""
    if not starting.lstrip().startswith("{"):
        return starting
    offsets = {t: o for t, o in json.loads(starting).items() if t in topics}
    if not offsets:
        return "earliest"
    missing = [t for t in topics if t not in offsets]
    if missing:
        raise ValueError(f"starting offsets name {sorted(offsets)} but not {missing}, read by the same query")
    return json.dumps(offsets)


class LeaseLost(RuntimeError):
    """Another driver took over this app's lease: this one must not write or commit."""


class SinkWriteFailed(RuntimeError):
    """Writing a micro-batch to Kafka failed; the message is the Java error's gist."""


class StoppedBeforeBatch(RuntimeError):
    """The driver is stopping: this micro-batch was not started (nothing written, nothing
    committed; Spark runs it again on restart from its offset log)."""


# In a query's error, the sign that it ended because the driver stopped it before a batch.
STOPPED_BEFORE_BATCH = "StoppedBeforeBatch"


def fenced_kafka_writer(sink_options: dict[str, str], still_held: Callable[[], bool] | None,
                        stopping: threading.Event | None = None) -> Callable[[DataFrame, int], None]:
    """The sink of every query: write the micro-batch to Kafka (each row's `topic`), checking the
    driver's lease before the write and again before Spark commits the batch (it commits when
    this returns). A driver that lost its lease (paused while another took over) raises, so the
    batch is neither written by it nor committed; the new driver runs it instead. Once `stopping`
    is set (a graceful stop), a batch that starts is refused before it writes anything: a query
    that runs batches back to back (falling behind) stops at its next boundary, not after a deadline."""

    def check(batch_id: int, when: str) -> None:
        if still_held is not None and not still_held():
            raise LeaseLost(f"batch {batch_id} not {when}: this driver's lease is lost (taken over, or run out)")

    def write(batch: DataFrame, batch_id: int) -> None:
        from py4j.protocol import Py4JJavaError

        if stopping is not None and stopping.is_set():
            raise StoppedBeforeBatch(f"batch {batch_id} not started: the driver is stopping (it runs on restart)")
        check(batch_id, "written")
        try:
            batch.write.format("kafka").options(**sink_options).save()
        except Py4JJavaError as exc:
            # Spark wraps this function's error in its own; the one line that names the cause
            # (e.g. RecordTooLargeException) goes first, where status and recovery read it.
            raise SinkWriteFailed(f"batch {batch_id}: {error_gist(str(exc.java_exception), limit=2000)}") from None
        check(batch_id, "committed")

    return write


class RealTimeRefused(OneLineRefused):
    """The app cannot run in Spark's real-time mode here; the message says why and what to do."""


def real_time_problems(program: StreamingProgram, outputs: list[OutputQuery]) -> list[str]:
    """Why these queries cannot run in real-time mode: Spark runs stateless queries only there
    (the program's declared state, or a stateful operator in a query's plan)."""
    problems = [f"query {query}: keeps state ({', '.join(ops)}, declared by the program)"
                for query, ops in sorted(program.stateful_operators.items())]
    # Joins and window expansions are left to Spark's own allow-list (a broadcast stream-static
    # join and windows without state are allowed); aggregations, deduplication and group state are not.
    for query, lines in sorted(plan_fingerprint(outputs).items()):
        stateful = [line for line in lines if any(node in line for node in _STATE_KEEPING)]
        if stateful and query not in program.stateful_operators:
            problems.append(f"query {query}: its plan has stateful operators ({'; '.join(stateful)[:300]})")
    return problems


_STATE_KEEPING = ("FlatMapGroups", "Aggregate", "Deduplicate", "TransformWithState")


def task_slots(context) -> int | None:
    """Tasks this Spark runs at once: a local master's threads, or the executors' cores divided
    by spark.task.cpus (defaultParallelism can be set to anything by spark.default.parallelism);
    None when it cannot be told (cluster executors without spark.executor.cores)."""
    conf = context.getConf()
    match = LOCAL_MASTER.match(context.master)
    if match:
        threads = match["threads"]
        return context._jvm.java.lang.Runtime.getRuntime().availableProcessors() if threads == "*" else int(threads or 1)  # noqa: SLF001
    task_cpus = int(conf.get("spark.task.cpus", "1"))
    if conf.get("spark.default.parallelism", None) is None:
        return context.defaultParallelism // task_cpus
    cores = conf.get("spark.executor.cores", None)
    if cores is None:
        return None
    executors = context._jsc.sc().getExecutorMemoryStatus().size() - 1  # noqa: SLF001 - the driver is listed too
    return executors * int(cores) // task_cpus


def task_slot_problem(spark: SparkSession, kafka: KafkaClientConfig, sources_read: list[list[str]], wait_s: float = 30) -> str | None:
    """Real-time mode runs one long-lived task per input partition, all at once: with fewer task
    slots than that, the partitions left over are never read (no error, just a silent stall).
    Executors may still be registering, so a short slot count is waited on for up to `wait_s`."""
    from streamops.kafka_offsets import end_offsets

    partitions = {topic: len(end_offsets(kafka, topic)) for topics in sources_read for topic in topics}
    needed = sum(partitions[topic] for topics in sources_read for topic in topics)
    context = spark.sparkContext
    if LOCAL_MASTER.match(context.master or ""):
        wait_s = 0  # a local master has all its threads from the start
    try:
        poll_until(lambda: (task_slots(context) or needed) >= needed, timeout=wait_s, what="task slots", interval=0.5)
        if task_slots(context) is None:
            log.warning("real-time mode needs %d task slots at once; this cluster's cannot be counted (set "
                        "spark.executor.cores): if it has fewer, some partitions are never read", needed)
        return None
    except DeadlineExceeded:
        listed = ", ".join(f"{t} ({n})" for t, n in sorted(partitions.items()))
        return (f"real-time mode needs one task slot per input partition, {needed} here ({listed}), but this Spark "
                f"({context.master}) has {task_slots(context)}: give it at least {needed} (local[{needed}], or "
                "more executor cores), or run the app on a micro-batch trigger")


def start_app(
    spark: SparkSession,
    spec: AppSpec,
    program: StreamingProgram,
    options: RunOptions,
    outputs: list[OutputQuery] | None = None,
    still_held: Callable[[], bool] | None = None,
    sources_read: list[list[str]] | None = None,
    stopping: threading.Event | None = None,
) -> list[StreamingQuery]:
    """Start every query of the app. With available-now, run them one after the other (a later
    query may read an earlier one's output) and return them finished; else return them running.
    `still_held` is the driver's lease check (None: no lease, e.g. a test's own session).

    Real-time: each query writes straight to Kafka (Spark's real-time mode has no foreachBatch),
    so the lease is not checked per batch: a driver that loses it stops its queries at once (the
    lease's on_lost), and a second writer of the same checkpoint fails on Spark's offset log."""
    started = []
    sink_options = kafka_sink_options(options.kafka, spec.producer)
    if outputs is None:
        sources_read = []
        outputs = build_outputs(spark, spec, program, options, sources_read)
    if options.trigger == REAL_TIME:
        problems = real_time_problems(program, outputs)
        if problems:
            raise RealTimeRefused(f"{spec.name} cannot run in real-time mode, which runs stateless queries only: "
                                  + "; ".join(problems) + "; give it a micro-batch trigger such as '5 seconds'")
        slots = task_slot_problem(spark, options.kafka, sources_read or [list(spec.inputs.values())])
        if slots:
            raise RealTimeRefused(f"{spec.name}: {slots}")
    for output in outputs:
        if options.trigger == REAL_TIME:
            # Stateless queries: update and append emit the same rows; real-time accepts update only.
            writer = (output.frame.writeStream.format("kafka").options(**sink_options).outputMode("update")
                      # PySpark's type stubs lack realTime, which 4.2 has.
                      .trigger(realTime=options.checkpoint_interval))  # type: ignore[call-overload]
        else:
            writer = output.frame.writeStream.foreachBatch(fenced_kafka_writer(sink_options, still_held, stopping)).outputMode(
                output.output_mode)
            if options.trigger == AVAILABLE_NOW:
                writer = writer.trigger(availableNow=True)
            else:
                writer = writer.trigger(processingTime=options.trigger)
        writer = writer.option("checkpointLocation", f"{options.checkpoint}/{output.name}").queryName(
            f"{spec.name}.{output.name}")
        query = writer.start()
        log.info("started query %s (id %s), checkpoint %s/%s", query.name, query.id, options.checkpoint, output.name)
        if options.trigger == AVAILABLE_NOW:
            query.awaitTermination()
            if still_held is not None and not still_held():
                raise LeaseLost(f"query {query.name} stopped: this driver's lease is lost (taken over, or run out)")
            if query.exception():
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")
        started.append(query)
    return started


_STATEFUL = ("FlatMapGroups", "Aggregate", "Deduplicate", "Join", "TransformWithState")
# Expression ids, query ids and watermark delays (a changed watermark is restart-safe).
_VOLATILE = re.compile(r"#\d+L?|-T\d+ms|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def plan_fingerprint(outputs: list[OutputQuery]) -> dict[str, list[str]]:
    """Per query, its stateful operators and window definitions as plan text with expression
    ids removed: what must stay the same for a restart from the existing checkpoint."""
    fingerprint = {}
    for output in outputs:
        plan = output.frame._jdf.queryExecution().analyzed().toString()  # noqa: SLF001 - no public API for it
        lines = [
            _VOLATILE.sub("", line.strip().lstrip(":+- ~"))
            for line in plan.splitlines()
            if any(node in line for node in _STATEFUL) or ("window" in line and "Expand" in line)
        ]
        fingerprint[output.name] = lines
    return fingerprint


def stateful_fingerprint(program: StreamingProgram, outputs: list[OutputQuery]) -> dict[str, list[str]]:
    """`plan_fingerprint`, with the operators the program declares stateful (program contract)
    first: a changed declaration is a changed state layout even where the plan text looks alike."""
    fingerprint = plan_fingerprint(outputs)
    for query, operators in program.stateful_operators.items():
        fingerprint[query] = [f"declared: {op}" for op in operators] + fingerprint.get(query, [])
    return fingerprint


def observed_totals(queries: list[StreamingQuery]) -> dict[str, int]:
    """Sum of every observed metric (observe()) over the progress Spark still holds."""
    totals: dict[str, int] = {}
    for query in queries:
        for progress in query.recentProgress:
            for metrics in (progress.observedMetrics or {}).values():
                for key, value in metrics.asDict().items():
                    totals[key] = totals.get(key, 0) + int(value or 0)
    return totals


def offsets_of(progress) -> dict[str, dict[str, int]]:
    """topic -> partition -> next offset to read, from a progress event's Kafka sources."""
    merged: dict[str, dict[str, int]] = {}
    for source in progress.sources:
        if source.endOffset and source.endOffset.startswith("{"):
            for topic, partitions in json.loads(source.endOffset).items():
                merged.setdefault(topic, {}).update({str(p): int(o) for p, o in partitions.items()})
    return merged


class ProgressPublisher(StreamingQueryListener):
    """Per micro-batch: a log line, the progress file beside the checkpoint (for status DAGs),
    and the processed offsets committed to the consumer group `streamops.<app>` so standard
    Kafka lag tools see the app (Spark itself keeps offsets only in its checkpoint).

    Spark delivers listener events asynchronously: a driver that ends right after its last
    batch (an available-now run, a stop) may exit before the event arrives, so the driver also
    publishes each query's last progress itself (`publish_last`). Publishing is idempotent and
    never goes back to an older batch, whichever of the two comes first."""

    def __init__(self, runtime: AppRuntime | None = None, group_id: str | None = None, kafka: KafkaClientConfig | None = None):
        super().__init__()
        self.runtime = runtime
        self.group = None
        self._lock = threading.Lock()
        self._published: dict[str, int] = {}  # query name -> newest batch published
        self._closed = False
        if group_id and kafka:
            self.group = kafka.consumer(group_id)

    def onQueryStarted(self, event):  # noqa: N802 - Spark's API
        log.info("query %s started (run %s)", event.name, event.runId)

    def onQueryProgress(self, event):  # noqa: N802
        self.publish(event.progress)

    def publish_last(self, queries: list[StreamingQuery]) -> None:
        """Publish each query's last progress now, in this thread (see the class doc)."""
        for query in queries:
            progress = query.lastProgress
            if progress is not None:
                self.publish(progress)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.group is not None:
                self.group.close()
                self.group = None

    def publish(self, p) -> None:
        with self._lock:
            if self._published.get(p.name, -1) >= p.batchId:
                return
            self._published[p.name] = p.batchId
            self._publish(p)

    def _publish(self, p) -> None:
        if self.runtime is not None and self.runtime.fenced:
            return  # a newer driver owns the progress files and the consumer group now
        observed = {name: row.asDict() for name, row in (p.observedMetrics or {}).items()}
        state_rows = sum(op.numRowsTotal for op in p.stateOperators)
        dropped = sum(op.numRowsDroppedByWatermark for op in p.stateOperators)
        # Rows the stateful operators added or changed: a windowed count's updates (its output in
        # update mode). Input that arrives with none of it, all dropped as late, is output stopped.
        updated = sum(op.numRowsUpdated for op in p.stateOperators)
        duration_ms = (p.durationMs or {}).get("triggerExecution", 0)
        log.info(
            "query %s batch %d: %d rows in, %.1f rows/s processed, %d ms, state rows %d, "
            "dropped as late %d, metrics %s",
            p.name, p.batchId, p.numInputRows, p.processedRowsPerSecond or 0.0, duration_ms, state_rows, dropped,
            json.dumps(observed),
        )
        offsets = offsets_of(p)
        if self.runtime is not None:
            self.runtime.write_progress(
                p.name.rsplit(".", 1)[-1],
                {
                    "query": p.name,
                    "batch_id": p.batchId,
                    "timestamp": p.timestamp,
                    "published_at": now_iso(),
                    "input_rows": p.numInputRows,
                    "input_rows_per_second": p.inputRowsPerSecond,
                    "processed_rows_per_second": p.processedRowsPerSecond,
                    "batch_duration_ms": duration_ms,
                    "state_rows": state_rows,
                    "dropped_by_watermark": dropped,
                    "state_rows_updated": updated,
                    "stateful": bool(p.stateOperators),
                    "watermark": (p.eventTime or {}).get("watermark"),
                    "end_offsets": offsets,
                    "observed": observed,
                },
            )
        if self.group is not None and offsets:
            from confluent_kafka import TopicPartition

            try:
                self.group.commit(
                    offsets=[TopicPartition(t, int(part), off) for t, parts in offsets.items() for part, off in parts.items()],
                    asynchronous=False,
                )
            except Exception as exc:  # noqa: BLE001 - lag visibility must never stop the app
                log.warning("could not commit offsets to consumer group for %s: %s", p.name, exc)

    def onQueryIdle(self, event):  # noqa: N802
        if self.runtime is not None and not self._closed:
            self.runtime.update(last_idle_at=now_iso())

    def onQueryTerminated(self, event):  # noqa: N802
        if event.exception and STOPPED_BEFORE_BATCH in event.exception:
            log.info("query %s stopped before its next micro-batch (graceful stop)", event.id)
        elif event.exception:
            log.error("query %s terminated with an error: %s", event.id, event.exception)
        else:
            log.info("query %s stopped", event.id)


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


def _not_a_stop_refusal(record: logging.LogRecord) -> bool:
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
    found = []
    for query in failed:
        name = query.name.rsplit(".", 1)[-1]
        batch = uncommitted_batch(query_dir(runtime.checkpoint, name)) or {"batch": None, "ranges": []}
        found.append({"query": name, **batch, "error": error_gist(str(query.exception()))})
    try:
        runtime.update(failed_batches=found)
    except OSError as exc:  # the failure itself is recorded by release(); this is a detail of it
        log.warning("could not record the failed batches %s: %s", found, exc)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="streamops-driver", description="Run one streaming app of the catalog.")
    parser.add_argument("--app", required=True, help="app name in the catalog")
    parser.add_argument("--program", required=True, help="the app's program reference, as the catalog names it")
    parser.add_argument("--artifact", default=None, help="the artifact zip the program's code comes from (checked by the launcher)")
    parser.add_argument("--artifact-digest", default=None, help="its sha256 digest")
    parser.add_argument("--catalog", default=None, help="catalog file (default: $STREAMOPS_CATALOG or catalog/pipelines.yaml)")
    connection = parser.add_mutually_exclusive_group()
    connection.add_argument(
        "--kafka-config", default=None,
        help="file of the Kafka connection's librdkafka settings, secrets included, readable by this user "
             "only (launchers write it: streamops.kafka_client.KafkaClientConfig.write_private)",
    )
    connection.add_argument(
        "--bootstrap-servers",
        default=settings.KAFKA_BOOTSTRAP.get() or "127.0.0.1:9092",
        help="a PLAINTEXT Kafka without credentials (default: $STREAMOPS_KAFKA_BOOTSTRAP or 127.0.0.1:9092)",
    )
    parser.add_argument("--checkpoint", default=None, help="checkpoint root (default: from the catalog)")
    parser.add_argument("--trigger", default=None,
                        help=f"micro-batch interval such as '2 seconds', {AVAILABLE_NOW}, or {REAL_TIME} (stateless apps)")
    parser.add_argument(
        "--starting-offsets", default="earliest",
        help="earliest, latest, or a JSON of offsets per topic and partition (new checkpoints only)",
    )
    parser.add_argument(
        "--ending-offsets", default=None,
        help="a JSON of offsets per topic and partition: records at or past them are not read (bounded backfills)",
    )
    parser.add_argument(
        "--skip-records-of", default=None,
        help="skip the records an operator skipped in the app on this checkpoint (a backfill of a live app)",
    )
    parser.add_argument(
        "--no-consumer-group", action="store_true",
        help="do not commit progress to the consumer group streamops.<app> (a backfill: the group is the live app's)",
    )
    parser.add_argument("--version", default=None, help="the version that runs (written into dead letters)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument(
        "--standby", default=None, metavar="TOKEN",
        help="a warm standby for a rolling restart: build the session and the plans, report ready, and wait "
             "for the rollout's word before taking the lease (streamops.standby)",
    )
    parser.add_argument("--standby-timeout", type=float, default=900.0,
                        help="seconds a standby waits for the rollout's word before it exits by itself")
    return parser.parse_args(argv)


def _between_batches(query: StreamingQuery) -> bool:
    """Is the query stopped, or between two micro-batches (none running)?"""
    return not query.isActive or not query.status["isTriggerActive"]


def _write_nowhere(frame: DataFrame) -> None:
    """Run the frame's plan as a batch job that writes nothing (Spark's noop sink)."""
    frame.write.format("noop").mode("overwrite").save()


def code_record(program: StreamingProgram, args: argparse.Namespace) -> dict:
    """Which code runs: the artifact (path, digest) or the installed module (its file's digest)."""
    from streamops.artifacts import file_digest
    from streamops.programs import ProgramError

    if args.artifact:
        return {"artifact": args.artifact, "digest": args.artifact_digest}
    module_file = sys.modules[type(program).__module__].__file__
    if module_file is None:  # a program is a module with a file (program_contract); never a bare namespace
        raise ProgramError(f"program {type(program).__module__} has no file to pin its code by")
    return {"installed": module_file, "digest": file_digest(module_file)}


def app_problems(spec: AppSpec, program: StreamingProgram) -> list[str]:
    """How the catalog's app does not fit this version of its program (roles, settings, checks):
    the catalog checked another version, or the installed code, when it loaded."""
    from pydantic import ValidationError

    from streamops.program_contract import describe
    from streamops.programs import ProgramInfo

    info = ProgramInfo.from_description(spec.program, describe(program))
    problems = [f"{field}: {message}" for field, message in
                info.role_problems(set(spec.inputs), set(spec.outputs), set(spec.reads_outputs), spec.settings)]
    try:
        bound = program.bind(spec)
    except ValidationError as exc:
        return problems + [f"settings.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return problems + program.check(bound)


def main(argv: list[str]) -> int:
    """The driver of every app (spark-submit runs streamops/entrypoints/driver.py, which checks
    the artifact and calls this)."""
    from streamops.programs import ProgramError, import_program

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j.clientserver").addFilter(_not_a_stop_refusal)
    args = parse_args(argv)
    # Only this app's program is checked (app_problems, against the code that runs): another
    # app's missing artifact is no reason not to start this one.
    catalog = load_catalog(args.catalog, check_programs=False)
    spec = catalog.app(args.app)
    if spec.program != args.program:
        raise SystemExit(f"app {spec.name!r} runs program {spec.program}, not {args.program}")
    try:
        program = import_program(args.program)
    except ProgramError as exc:
        raise SystemExit(f"cannot run {spec.name}: {exc}") from None
    problems = app_problems(spec, program)
    if (args.trigger or spec.trigger) == REAL_TIME and program.stateful_operators:
        problems.append(f"trigger real-time: the program keeps state ({', '.join(sorted(program.stateful_operators))}) "
                        "and real-time mode runs stateless queries only; use a micro-batch interval")
    if problems:
        raise SystemExit(f"cannot run {spec.name} with this version of {spec.program}: " + "; ".join(problems))
    try:
        kafka = (KafkaClientConfig.read_file(args.kafka_config, private=True) if args.kafka_config
                 else KafkaClientConfig.plaintext(args.bootstrap_servers, source="--bootstrap-servers"))
    except KafkaConfigError as exc:
        raise SystemExit(f"cannot connect {spec.name} to Kafka: {exc}") from None
    options = RunOptions(
        kafka=kafka,
        checkpoint=args.checkpoint or spec.checkpoint_location(),
        trigger=args.trigger or spec.trigger,
        checkpoint_interval=spec.real_time_interval(),
        starting_offsets=args.starting_offsets,
        version=args.version,
        max_offsets_per_trigger=args.max_offsets_per_trigger or spec.max_offsets_per_trigger,
        ending_offsets=json.loads(args.ending_offsets) if args.ending_offsets else None,
        skip_records=AppRuntime(args.skip_records_of).skip_records() if args.skip_records_of else None,
    )
    log.info("app %s (%s %s) from %s: %s", spec.name, spec.program, options.version or spec.version, catalog_path(args.catalog), options)
    runtime = AppRuntime(options.checkpoint)
    # Under spark-submit the Python driver is a child of the Spark JVM it talks to.
    jvm_pid = os.getppid() if "PYSPARK_GATEWAY_PORT" in os.environ else None
    stops = StopSignals()
    stopping = threading.Event()  # set by the graceful stop; the queries' writers start no batch after it
    prepared: Prepared | None = None
    if args.standby:
        prepared = prepare(spec, program, options, runtime, group_id=None if args.no_consumer_group else f"streamops.{spec.name}")
        log.info("warm standby %s: %s", args.standby,
                 warm_up(prepared.spark, spec, program, options, interrupted=lambda: bool(stops.received)))
        if not await_go(StandbySlot(runtime.dir, args.standby), prepared, args.standby_timeout, stops):
            return 0
    try:
        runtime.acquire(
            {
                "app": spec.name,
                "program": spec.program,
                "version": options.version or spec.version,
                "code": code_record(program, args),
                "trigger": options.trigger,
                **({"checkpoint_interval": options.checkpoint_interval} if options.trigger == REAL_TIME else {}),
                "spark_conf": {k: str(v) for k, v in spec.spark_conf.items()},
                "catalog": str(catalog_path(args.catalog)),
                "kafka": options.kafka.describe(),
                "environment": catalog.environment,
                "launched_by": settings.LAUNCHED_BY.get() or "command line",
                # The launcher's record (streamops.app_runtime.LaunchRecord.to_env), kept as it came:
                # readers parse it with LaunchRecord.from_json.
                "launch": json.loads(settings.LAUNCH.get() or "{}"),
                # spark-submit and its JVM share it: a recovery can find what a dead driver left.
                "process_group": os.getpgrp(),
                "jvm_pid": jvm_pid,
                "driver_log": settings.DRIVER_LOG.get(),
            }
        )
    except AlreadyRunningError as exc:
        log.error("refused: %s", exc)
        return 3
    # A driver that finds another has taken its lease over stops its queries at once: the batch
    # in flight is not committed (the sink checks too) and the new driver runs it.
    runtime.lease.on_lost(lambda _taker: stops.stop_now("lease lost"))
    began = time.monotonic()
    running = False  # queries started (an available-now run is running while start_app works)
    queries: list[StreamingQuery] = []
    publisher: ProgressPublisher | None = None
    outcome, reason = "failed", "driver exited during start-up"
    try:
        if prepared is None:
            prepared = prepare(spec, program, options, runtime,
                               group_id=None if args.no_consumer_group else f"streamops.{spec.name}")
        spark, publisher = prepared.spark, prepared.publisher
        context = spark.sparkContext
        # Where it runs: the driver's host, its master and its UI (status lists executors from it).
        runtime.update(application_id=context.applicationId, spark_master=context.master, spark_ui=context.uiWebUrl,
                       driver_host=context.getConf().get("spark.driver.host", None) or socket.gethostname(),
                       plan_fingerprint=prepared.fingerprint)
        running = options.trigger == AVAILABLE_NOW
        queries = start_app(spark, spec, program, options, prepared.outputs, still_held=runtime.lease.still_held,
                            sources_read=prepared.sources_read, stopping=stopping)
        running = True
        stops.watch(queries)
        # Launchers wait for this: an idle query reports no progress, but it has started.
        runtime.update(queries_started=[q.name.rsplit(".", 1)[-1] for q in queries], queries_started_at=now_iso())
        if options.trigger == AVAILABLE_NOW:
            publisher.publish_last(queries)
            log.info("available-now run finished; totals %s", json.dumps(observed_totals(queries)))
            outcome, reason = "stopped", "available-now run finished"
            return 0

        poll_until(
            lambda: stops.received or runtime.fenced or runtime.stop_requested() or any(not q.isActive for q in queries),
            timeout=10 * 365 * 86400,
            what="a stop request",
            # Often: a rolling restart's output gap starts when the old driver notices its stop.
            interval=0.1,
            max_interval=0.2,
        )
        if runtime.fenced:
            graceful_stop(queries, deadline_s=0)
            outcome, reason = "fenced", runtime.lease.lost_reason()
            return 4
        failed = [q for q in queries if not q.isActive and q.exception()]
        if failed:
            record_failed_batches(runtime, failed)
            # The whole exception (with Spark's logical plan) is in the driver log; the record
            # keeps the line that says what went wrong.
            reason = "; ".join(f"query {q.name} failed: {error_gist(str(q.exception()))}" for q in failed)
            log.error("%s", "; ".join(f"query {q.name} failed: {q.exception()}" for q in failed))
            log.error("in short: %s", reason)
            graceful_stop(queries, deadline_s=30, real_time=options.trigger == REAL_TIME, stopping=stopping)
            publisher.publish_last(queries)
            return 1
        request = runtime.stop_request()
        why = stops.describe() or f"stop requested by {request.get('by') or 'an operator'}"
        deadline = request.get("deadline_s") or float(settings.STOP_DEADLINE.get() or 60)
        stopped = graceful_stop(queries, deadline_s=float(deadline), real_time=options.trigger == REAL_TIME, stopping=stopping)
        reason = f"{why}; {stopped}"
        publisher.publish_last(queries)
        outcome = "stopped"
        return 0
    except BaseException as exc:
        if runtime.fenced:
            outcome, reason = "fenced", runtime.lease.lost_reason()
            log.error("%s", reason)
            return 4
        outcome, reason = ended_by(exc, running, time.monotonic() - began, stops, jvm_pid)
        log.error("%s", reason)
        raise
    finally:
        if prepared is not None:
            prepared.release()
        runtime.release(outcome, reason)


LISTENER_DRAIN_MS = 5000  # at a driver's exit: Spark's queued listener events are delivered within this (usually ms)


@dataclass
class Prepared:
    """What a driver builds before its queries start: the session, the listener that publishes
    progress, the queries' plans and their stateful fingerprint."""

    spark: SparkSession
    publisher: "ProgressPublisher"
    outputs: list[OutputQuery]
    sources_read: list[list[str]]
    fingerprint: dict[str, list[str]]

    def release(self) -> None:
        """Stop listening before the driver exits. Spark posts a query's last events after
        Python's callback server has closed; each would put a py4j stack trace at the end of the
        driver log, where an operator (and a failed run's report) reads the cause."""
        try:
            # The events already posted are delivered first (Spark's listener bus is asynchronous).
            self.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(LISTENER_DRAIN_MS)  # noqa: SLF001 - no public API
        except Exception as exc:  # noqa: BLE001 - still busy after the wait: the removal below stops what is left
            log.debug("listener events not all delivered before exit: %s", exc)
        try:
            self.spark.streams.removeListener(self.publisher)
        except Exception as exc:  # noqa: BLE001 - the JVM is going away already: nothing left to tell it
            log.debug("progress listener not removed: %s", exc)
        self.publisher.close()


def prepare(spec: AppSpec, program: StreamingProgram, options: RunOptions, runtime: AppRuntime,
            group_id: str | None) -> Prepared:
    spark = build_session(f"streamops-{spec.name}")
    spark.sparkContext.setLogLevel("WARN")
    publisher = ProgressPublisher(runtime, group_id, options.kafka)
    spark.streams.addListener(publisher)
    sources_read: list[list[str]] = []
    outputs = build_outputs(spark, spec, program, options, sources_read)
    return Prepared(spark, publisher, outputs, sources_read, stateful_fingerprint(program, outputs))


WARM_UP_RECORDS = 500  # per input partition
WARM_UP_LIMIT_S = 60.0
WARM_UP_TAG = "streamops-warm-up"
WARM_UP_EXECUTOR_WAIT_S = 10.0


def _has_executor(context, wait_s: float) -> bool:
    """An executor besides the driver has registered (waited for up to `wait_s`)."""
    def registered() -> bool:
        return context._jsc.sc().getExecutorMemoryStatus().size() > 1  # noqa: SLF001 - the driver is listed too

    try:
        return poll_until(registered, timeout=wait_s, what="an executor", interval=0.5, max_interval=1)
    except DeadlineExceeded:
        return False


def warm_up(spark: SparkSession, spec: AppSpec, program: StreamingProgram, options: RunOptions,
            interrupted: Callable[[], bool] = lambda: False) -> str:
    """A standby's rehearsal, so the first micro-batch after a roll's stop does not pay for what
    a fresh JVM does once: each query's plan run as a batch job over the latest records of its
    inputs (WARM_UP_RECORDS per partition) into Spark's no-op sink, which compiles the plan's
    generated code, loads the Kafka client and lets the JIT see the parser; and one empty write
    through the Kafka sink, which opens the producer (Spark pools it with the sink's options).
    Nothing is written to any topic, no offset is committed. Best effort, within WARM_UP_LIMIT_S:
    a step that fails (a plan that runs only on streams, e.g. applyInPandasWithState) is skipped."""
    from streamops.kafka_offsets import end_offsets

    bound = program.bind(spec)
    skipped = options.skip_records if options.skip_records is not None else AppRuntime(options.checkpoint).skip_records()

    def recent_records(topics: list[str]) -> DataFrame:
        starts: dict[str, dict[str, int]] = {}
        ends: dict[str, dict[str, int]] = {}
        for topic in topics:
            for partition, (low, high) in end_offsets(options.kafka, topic).items():
                starts.setdefault(topic, {})[str(partition)] = max(low, high - WARM_UP_RECORDS)
                ends.setdefault(topic, {})[str(partition)] = high
        return (spark.read.format("kafka").options(**options.kafka.spark_options()).options(**BOUNDED_READ_OPTIONS)
                .option("subscribe", ",".join(topics))
                .option("startingOffsets", json.dumps(starts)).option("endingOffsets", json.dumps(ends))
                .option("groupIdPrefix", f"streamops.{spec.name}").load()  # the prefix its ACLs allow
                .withColumn(OPERATOR_SKIP, operator_skip(skipped, topics)))

    began = time.monotonic()
    context = spark.sparkContext
    if not LOCAL_MASTER.match(context.master or "") and not _has_executor(context, WARM_UP_EXECUTOR_WAIT_S):
        # The running version may hold every core the cluster gives these apps (spark.cores.max):
        # the standby gets its executors when that driver stops.
        return (f"rehearsal skipped: no executor registered within {WARM_UP_EXECUTOR_WAIT_S:g}s (the running version "
                "may hold the cluster's cores; this driver gets executors when it stops)")
    # Bounded: on a cluster without a spare executor its jobs would wait for ever. Tagged, so the
    # timer cancels only these jobs; untagged after, so the queries started later are not.
    context.addJobTag(WARM_UP_TAG)
    timer = threading.Timer(WARM_UP_LIMIT_S, lambda: context.cancelJobsWithTag(WARM_UP_TAG))
    timer.daemon = True
    timer.start()
    done, skipped_steps = [], []

    def step(what: str, run: Callable[[], None]) -> None:
        if interrupted() or time.monotonic() - began > WARM_UP_LIMIT_S:
            skipped_steps.append(f"{what} (not reached)")
            return
        try:
            run()
            done.append(what)
        except Exception as exc:  # noqa: BLE001 - a rehearsal: the real start reports real problems
            if time.monotonic() - began >= WARM_UP_LIMIT_S:
                skipped_steps.append(f"{what} (cut off after {WARM_UP_LIMIT_S:g}s)")
            else:
                skipped_steps.append(f"{what} ({error_gist(f'{type(exc).__name__}: {exc}', limit=200)})")

    try:
        try:
            outputs = program.queries(bound, options.version or spec.version, recent_records)
        except Exception as exc:  # noqa: BLE001 - e.g. a plan that runs only on streams
            outputs = []
            skipped_steps.append(f"the queries as batch jobs ({error_gist(f'{type(exc).__name__}: {exc}', limit=200)})")
        for output in outputs:
            step(f"query {output.name}", partial(_write_nowhere, output.frame))
        # One task and no rows (rand() is never above 2, and the optimizer cannot know it).
        empty = spark.range(0, 1, 1, 1).where(F.rand() > 2).select(
            F.lit(None).cast("binary").alias("value"), F.lit(spec.dead_letter_topic).alias("topic"))
        step("the Kafka producer", lambda: empty.write.format("kafka").options(**kafka_sink_options(options.kafka, spec.producer)).save())
    finally:
        timer.cancel()
        context.removeJobTag(WARM_UP_TAG)
    summary = f"warmed up in {time.monotonic() - began:.1f}s ({', '.join(done) or 'nothing'})"
    return summary + (f"; skipped: {'; '.join(skipped_steps)}" if skipped_steps else "")


def await_go(slot: StandbySlot, prepared: Prepared, timeout_s: float, stops: "StopSignals") -> bool:
    """As a warm standby: report ready (with the plan's fingerprint, which the rollout compares
    with the running version's), then wait for the rollout's word. True: go and take the lease."""
    if stops.received:  # signalled while it prepared: the rollout is gone or gave up
        log.warning("warm standby %s: %s while it prepared; exiting without starting", slot.token, stops.describe())
        prepared.release()
        return False
    slot.report_ready(plan_fingerprint=prepared.fingerprint, application_id=prepared.spark.sparkContext.applicationId)
    log.info("warm standby %s ready; waiting up to %gs for the rollout's word", slot.token, timeout_s)
    try:
        word = slot.await_word(timeout_s, interrupted=lambda: bool(stops.received))
    except DeadlineExceeded:
        word = {"word": "abort", "why": f"no word from the rollout within {timeout_s:g}s (it is gone)"}
    finally:
        slot.clear()
    if word.get("word") != "go":
        log.warning("warm standby %s not needed, exiting without starting: %s", slot.token, word.get("why") or word)
        prepared.release()
        return False
    log.info("warm standby %s: go from %s", slot.token, word.get("by") or "the rollout")
    return True


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

    def _on_signal(self, signum, _frame):
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


def _jvm_gone(jvm_pid: int | None) -> bool:
    import psutil

    if jvm_pid is None:
        return False
    try:
        return psutil.Process(jvm_pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone (or reaped meanwhile)
        return True


def ended_by(exc: BaseException, running: bool, seconds: float, stops: StopSignals, jvm_pid: int | None) -> tuple[str, str]:
    """(outcome, reason) of a driver that ended by an exception: what an operator reads in status."""
    phase = f"after {seconds:.0f} s of running" if running else f"during start-up ({seconds:.0f} s)"
    gist = error_gist(f"{type(exc).__name__}: {exc}")
    if stops.received:
        return "stopped", (f"{stops.describe()} {phase}; the graceful stop did not finish ({gist}): a micro-batch in "
                           "flight re-runs on restart")
    if _jvm_gone(jvm_pid):
        return "failed", (f"the driver's Spark JVM (pid {jvm_pid}) went away {phase} (killed, or out of memory: see the "
                          f"driver log); the app stopped with it. Last error: {gist}")
    return "failed", f"the driver failed {phase}: {gist}"
