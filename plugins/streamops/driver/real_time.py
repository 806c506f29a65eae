"""Whether an app can run in Spark's real-time mode here: stateless queries only, and one task
slot per input partition at once (else partitions are never read, silently).

Contract: `real_time_problems` and `task_slot_problem` return the reasons in words (empty/None:
it can); `driver.queries.start_app` raises `RealTimeRefused` with them.
"""

from __future__ import annotations

import logging

from pyspark import SparkContext
from pyspark.sql import SparkSession

from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import end_offsets
from streamops.program_contract import OutputQuery, StreamingProgram
from streamops.refusals import OneLineRefused
from streamops.spark_submit import LOCAL_MASTER
from streamops.waiting import DeadlineExceeded, poll_until

log = logging.getLogger("streamops.app")


class RealTimeRefused(OneLineRefused):
    """The app cannot run in Spark's real-time mode here; the message says why and what to do."""


def real_time_problems(program: StreamingProgram, outputs: list[OutputQuery]) -> list[str]:
    """Why these queries cannot run in real-time mode: Spark runs stateless queries only there
    (the program's declared state, or a stateful operator in a query's plan)."""
    problems = [f"query {query}: keeps state ({', '.join(ops)}, declared by the program)"
                for query, ops in sorted(program.stateful_operators.items())]
    # Joins and window expansions are left to Spark's own allow-list (a broadcast stream-static
    # join and windows without state are allowed); aggregations, deduplication and group state are
    # not. An early refusal in words, from the analyzed plan's node names (Spark has no public API
    # for a plan's operators; its real-time mode refuses them at start too, in its own words).
    for output in sorted(outputs, key=lambda o: o.name):
        plan = output.frame._jdf.queryExecution().analyzed().toString()  # noqa: SLF001 - no public API
        stateful = sorted({node for node in _STATE_KEEPING for line in plan.splitlines() if node in line})
        if stateful and output.name not in program.stateful_operators:
            problems.append(f"query {output.name}: its plan has stateful operators ({', '.join(stateful)})")
    return problems


_STATE_KEEPING = ("FlatMapGroups", "Aggregate", "Deduplicate", "TransformWithState")


def task_slots(context: SparkContext) -> int | None:
    """Tasks this Spark runs at once: a local master's threads, or the executors' cores divided
    by spark.task.cpus (defaultParallelism can be set to anything by spark.default.parallelism);
    None when it cannot be told (cluster executors without spark.executor.cores)."""
    conf = context.getConf()
    match = LOCAL_MASTER.match(context.master or "")
    if match:
        threads = match["threads"]
        if threads != "*":
            return int(threads or 1)
        jvm = context._jvm  # noqa: SLF001 - the JVM's processor count: Spark's own for local[*]
        return int(jvm.java.lang.Runtime.getRuntime().availableProcessors()) if jvm is not None else None
    task_cpus = int(conf.get("spark.task.cpus", "1"))
    if conf.get("spark.default.parallelism", None) is None:
        return int(context.defaultParallelism) // task_cpus
    cores = conf.get("spark.executor.cores", None)
    if cores is None:
        return None
    executors = context._jsc.sc().getExecutorMemoryStatus().size() - 1  # noqa: SLF001 - the driver is listed too
    return int(executors) * int(cores) // task_cpus


def task_slot_problem(
    spark: SparkSession, kafka: KafkaClientConfig, sources_read: list[list[str]], wait_s: float = 30
) -> str | None:
    """Real-time mode runs one long-lived task per input partition, all at once: with fewer task
    slots than that, the partitions left over are never read (no error, just a silent stall).
    Executors may still be registering, so a short slot count is waited on for up to `wait_s`."""
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
