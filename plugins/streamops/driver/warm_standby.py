"""A driver started as a warm standby for a rolling restart (`--standby TOKEN`): it rehearses its
queries as batch jobs that write nothing, lets Spark judge a restart from the running version's
checkpoint (driver.state_check), reports ready with that verdict, and waits for the rollout's word
(`streamops.standby.StandbySlot` is the other side of that exchange).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamops.app_runtime import AppRuntime
from streamops.catalog import REAL_TIME, AppSpec
from streamops.driver.kafka_io import BOUNDED_READ_OPTIONS, kafka_sink_options
from streamops.driver.options import RunOptions
from streamops.driver.outputs import operator_skip, with_shared_parses
from streamops.driver.preparation import Prepared
from streamops.driver.state_check import StateCheck
from streamops.driver.stopping import StopSignals
from streamops.failures import error_gist
from streamops.kafka_offsets import end_offsets
from streamops.program_contract import StreamingProgram
from streamops.records import OPERATOR_SKIP
from streamops.spark_submit import LOCAL_MASTER
from streamops.standby import StandbySlot
from streamops.waiting import DeadlineExceeded, poll_until

log = logging.getLogger("streamops.app")


WARM_UP_RECORDS = 500  # per input partition


WARM_UP_LIMIT_S = 60.0


WARM_UP_TAG = "streamops-warm-up"


WARM_UP_EXECUTOR_WAIT_S = 10.0


def _has_executor(context: SparkContext, wait_s: float) -> bool:
    """An executor besides the driver has registered (waited for up to `wait_s`)."""
    def registered() -> bool:
        return bool(context._jsc.sc().getExecutorMemoryStatus().size() > 1)  # noqa: SLF001 - the driver is listed too

    try:
        return poll_until(registered, timeout=wait_s, what="an executor", interval=0.5, max_interval=1)
    except DeadlineExceeded:
        return False


def without_executor(spark: SparkSession) -> str | None:
    """Why this standby cannot run a job yet (None: it can): on a cluster, the running version may
    hold every core the cluster gives these apps (spark.cores.max), and the standby gets executors
    only when that driver stops. Its rehearsal is skipped then, and its state check is left to a
    driver that runs Spark on its own host (the rollout's --check-state)."""
    context = spark.sparkContext
    if LOCAL_MASTER.match(context.master or "") or _has_executor(context, WARM_UP_EXECUTOR_WAIT_S):
        return None
    return (f"no executor registered within {WARM_UP_EXECUTOR_WAIT_S:g}s on {context.master} (the running version may "
            "hold the cluster's cores; this driver gets executors when it stops)")


def _write_nowhere(frame: DataFrame) -> None:
    """Run the frame's plan as a batch job that writes nothing (Spark's noop sink)."""
    frame.write.format("noop").mode("overwrite").save()


def warm_up(spark: SparkSession, spec: AppSpec, program: StreamingProgram, options: RunOptions,
            interrupted: Callable[[], bool] = lambda: False, no_executor: str | None = None) -> str:
    """A standby's rehearsal, so the first micro-batch after a roll's stop does not pay for what
    a fresh JVM does once: each query's plan run as a batch job over the latest records of its
    inputs (WARM_UP_RECORDS per partition) into Spark's no-op sink, which compiles the plan's
    generated code, loads the Kafka client and lets the JIT see the parser; and one empty write
    through the Kafka sink, which opens the producer (Spark pools it with the sink's options).
    Nothing is written to any topic, no offset is committed. Best effort, within WARM_UP_LIMIT_S:
    a step that fails (a plan that runs only on streams, e.g. applyInPandasWithState) is skipped;
    all of it when the session has no executor (`no_executor`, from `without_executor`)."""
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
    if no_executor:
        return f"rehearsal skipped: {no_executor}"
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
            version = options.version or spec.version
            outputs = program.queries(bound, version, recent_records)
            if options.trigger != REAL_TIME:  # the plans the queries will run with (driver.outputs)
                outputs = with_shared_parses(bound, outputs, lambda: program.queries(bound, version, recent_records))
        except Exception as exc:  # noqa: BLE001 - e.g. a plan that runs only on streams
            outputs = []
            skipped_steps.append(f"the queries as batch jobs ({error_gist(f'{type(exc).__name__}: {exc}', limit=200)})")
        for output in outputs:
            step(f"query {output.name}", partial(_write_nowhere, output.frame))
        # One task and no rows (rand() is never above 2, and the optimizer cannot know it).
        empty = spark.range(0, 1, 1, 1).where(F.rand() > 2).select(
            F.lit(None).cast("binary").alias("value"), F.lit(spec.dead_letter_topic).alias("topic"))
        step("the Kafka producer",
             lambda: empty.write.format("kafka").options(**kafka_sink_options(options.kafka, spec.producer)).save())
    finally:
        timer.cancel()
        context.removeJobTag(WARM_UP_TAG)
    summary = f"warmed up in {time.monotonic() - began:.1f}s ({', '.join(done) or 'nothing'})"
    return summary + (f"; skipped: {'; '.join(skipped_steps)}" if skipped_steps else "")


def await_go(slot: StandbySlot, prepared: Prepared, timeout_s: float, stops: StopSignals, state: StateCheck) -> bool:
    """As a warm standby: report ready (with Spark's verdict on restarting from the running
    version's checkpoint, which the rollout acts on), then wait for the rollout's word. True: go
    and take the lease."""
    if stops.received:  # signalled while it prepared: the rollout is gone or gave up
        log.warning("warm standby %s: %s while it prepared; exiting without starting", slot.token, stops.describe())
        prepared.release()
        return False
    slot.report_ready(state_check=state.to_json(), application_id=prepared.spark.sparkContext.applicationId)
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
