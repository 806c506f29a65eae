"""Start an app's queries: each through the fenced Kafka sink (micro-batch) or straight to Kafka
(real-time), with its checkpoint folder and query name `<app>.<query>`.

Contract: `start_app` returns the started queries (finished ones for available-now, run one after
the other); it raises `RealTimeRefused` before starting anything a real-time run cannot do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from streamops.catalog import REAL_TIME, AppSpec
from streamops.driver.kafka_io import kafka_sink_options
from streamops.driver.options import AVAILABLE_NOW, RunOptions
from streamops.driver.outputs import build_outputs, sources_read_more_than_once
from streamops.driver.real_time import RealTimeRefused, real_time_problems, task_slot_problem
from streamops.driver.sink import LeaseLost, fenced_kafka_writer
from streamops.program_contract import OutputQuery, StreamingProgram
from streamops.records import SHARED_PARSE_PREFIX

log = logging.getLogger("streamops.app")


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
    for output in outputs:
        for source, times in sources_read_more_than_once(output).items():
            log.warning("query %s.%s reads %s %d times per batch (one source in %d branches of a union): every record is "
                        "read and parsed %d times; parse each source once (one streamops.records.parse_input) and build "
                        "every branch on its rows: the driver then shares that parse, or, stateless, build the outputs "
                        "and dead letters in one pass with streamops.records.with_dead_letters (docs/bring-your-own-app.md)",
                        spec.name, output.name, source, times, times, times)
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


def observed_totals(queries: list[StreamingQuery]) -> dict[str, int]:
    """Sum of every observed metric (observe()) over the progress Spark still holds."""
    totals: dict[str, int] = {}
    for query in queries:
        for progress in query.recentProgress:
            for name, metrics in (progress.observedMetrics or {}).items():
                if name.startswith(SHARED_PARSE_PREFIX):
                    continue  # the runtime's own barrier (records.shared_parses), not the program's
                for key, value in metrics.asDict().items():
                    totals[key] = totals.get(key, 0) + int(value or 0)
    return totals
