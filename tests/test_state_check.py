"""Spark's own check of a restart from a checkpoint (streamops.driver.state_check), on the shared
local Spark session: a stateful query's checkpoint, then new versions of it judged on a copy for
one empty batch. Spark refuses a changed state value, a changed key and an added operator, each
with its error class; a query gone and a declared state setting changed are refused in words;
the same plan passes; the live checkpoint is never written and the copies are removed."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec
from streamops.checkpoints import committed_batches
from streamops.driver.state_check import SCRATCH, check_state
from streamops.program_contract import OutputQuery, StreamingProgram
from streamops.waiting import poll_until


class CountingSettings(BaseModel):
    window: str = "10 minutes"


class Counting(StreamingProgram):
    name = "counting"
    input_roles = ("events",)
    output_roles = ("counts",)
    Settings = CountingSettings
    input_fields = {}
    query_names = ("count",)
    stateful_operators = {"count": ("groupBy(k).count",)}
    state_settings = {"count": ("window",)}


def app(checkpoint: Path, window: str = "10 minutes") -> AppSpec:
    return AppSpec.model_validate({
        "name": "counting", "program": "tests.test_state_check", "code": "installed", "version": "1.0.0", "owner": "o",
        "description": "d", "inputs": {"events": "t.events"}, "outputs": {"counts": "t.counts"}, "dead_letter_topic": "t.dlq",
        "checkpoint": str(checkpoint), "settings": {"window": window}})


def counted(frame: DataFrame) -> DataFrame:
    return frame.withColumn("k", F.col("value") % 5).groupBy("k").count()


def running_tasks(spark) -> int:
    """Tasks running in this Spark, as its task scheduler counts them: a task, a killed one too, leaves
    the count only once its thread has reported its end (the status tracker's counts come earlier)."""
    counts = spark.sparkContext._jsc.sc().taskScheduler().runningTasksByExecutors().values().iterator()
    total = 0
    while counts.hasNext():
        total += counts.next()
    return total


def files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")
            if p.is_file() and "_runtime" not in p.parts}


def test_spark_judges_each_new_version_on_a_copy_for_one_empty_batch(spark, tmp_path):
    checkpoint = tmp_path / "counting"
    rate = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    running = (counted(rate).writeStream.format("noop").outputMode("update")
               .option("checkpointLocation", str(checkpoint / "count")).trigger(processingTime="500 milliseconds").start())
    try:
        poll_until(lambda: len(committed_batches(checkpoint / "count")) >= 3, timeout=120, what="3 committed batches")
    finally:
        running.stop()
    # stop() returns once the query's thread has ended; a task of the batch it cancelled may still be
    # committing its state store (a changelog written after the snapshot below). No task runs afterwards.
    poll_until(lambda: not running_tasks(spark), timeout=60, what="the stopped query's tasks to end")
    runtime = AppRuntime(checkpoint)
    runtime.dir.mkdir(parents=True, exist_ok=True)
    runtime.driver_file.write_text(json.dumps({"launch": {"version": "1.0.0", "spec": {"settings": {"window": "10 minutes"}}}}))
    before = files(checkpoint)

    def judged(build, mode="update", spec=None):
        frame = build(spark.readStream.format("rate").option("rowsPerSecond", 50).load())
        return check_state(spark, spec or app(checkpoint), Counting(), [OutputQuery("count", frame, mode)], str(checkpoint))

    same = judged(counted)
    assert (same.checked, same.problems) == (["count"], [])

    value = judged(lambda df: df.withColumn("k", F.col("value") % 5).groupBy("k").agg(F.sum("value").alias("s")))
    (problem,) = value.problems
    assert problem.startswith("query 'count': Spark refuses to restart it from the running version's checkpoint: Provided "
                              "value schema does not match existing state value schema.")
    assert problem.endswith("(STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE)") and "StructField(sum,LongType,true)" in problem

    key = judged(lambda df: df.withColumn("k", (F.col("value") % 5).cast("string")).groupBy("k").count())
    assert key.problems[0].endswith("(STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE)"), key.problems

    added = judged(lambda df: counted(df.dropDuplicates(["value"])))
    assert added.problems[0].endswith("(STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA)"), added.problems

    gone = check_state(spark, app(checkpoint), Counting(), [], str(checkpoint))
    assert gone.problems == ["query 'count' keeps state in the checkpoint but is gone from the new version (its state would "
                             "be orphaned)"]

    wider = judged(counted, spec=app(checkpoint, window="11 minutes"))
    assert wider.problems == [
        "query 'count': setting window changes from 10 minutes to 11 minutes, and the state holds what 10 minutes made (the "
        "program declares it shapes the state; Spark checks the state's schema, not this)"]

    assert files(checkpoint) == before  # the live checkpoint: not a file written, none touched
    assert list((runtime.dir / SCRATCH).iterdir()) == []  # every copy removed
