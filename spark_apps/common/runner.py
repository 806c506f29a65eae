"""Start an app's queries, and the spark-submit command line every program shares.

    spark-submit --jars <connector jars> spark_apps/oplog_router.py --app oplog-router \\
        [--catalog FILE] [--bootstrap-servers HOST:PORT] [--checkpoint DIR] \\
        [--trigger "2 seconds" | --trigger available-now] [--starting-offsets earliest|latest] \\
        [--version X.Y.Z]
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from spark_apps.common.kafka_io import kafka_sink_options, read_topics
from spark_apps.common.session import apply_app_conf, build_session
from streamops.catalog import AppSpec, catalog_path, load_catalog

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
    bootstrap_servers: str
    checkpoint: str  # this app's checkpoint root; each query has a folder under it
    trigger: str = "5 seconds"  # a Spark interval, or "available-now" (process what is there, stop)
    starting_offsets: str = "earliest"  # only for a new checkpoint
    version: str | None = None  # overrides the catalog's version label
    max_offsets_per_trigger: int | None = None
    extra: dict = field(default_factory=dict)


Program = Callable[[AppSpec, str, Callable[[list[str]], DataFrame]], list[OutputQuery]]


def start_app(spark: SparkSession, spec: AppSpec, program: ModuleType, options: RunOptions) -> list[StreamingQuery]:
    """Start every query of the app. With available-now, run them one after the other (a later
    query may read an earlier one's output) and return them finished; else return them running."""
    apply_app_conf(spark, spec)
    version = options.version or spec.version

    def source(topics: list[str]) -> DataFrame:
        return read_topics(
            spark, options.bootstrap_servers, topics, options.starting_offsets, options.max_offsets_per_trigger
        )

    started = []
    for output in program.queries(spec, version, source):
        writer = (
            output.frame.writeStream.format("kafka")
            .options(**kafka_sink_options(options.bootstrap_servers))
            .option("checkpointLocation", f"{options.checkpoint}/{output.name}")
            .outputMode(output.output_mode)
            .queryName(f"{spec.name}.{output.name}")
        )
        if options.trigger == AVAILABLE_NOW:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=options.trigger)
        query = writer.start()
        log.info("started query %s (id %s), checkpoint %s/%s", query.name, query.id, options.checkpoint, output.name)
        if options.trigger == AVAILABLE_NOW:
            query.awaitTermination()
            if query.exception():
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")
        started.append(query)
    return started


def observed_totals(queries: list[StreamingQuery]) -> dict[str, int]:
    """Sum of every observed metric (observe()) over the progress Spark still holds."""
    totals: dict[str, int] = {}
    for query in queries:
        for progress in query.recentProgress:
            for metrics in (progress.observedMetrics or {}).values():
                for key, value in metrics.asDict().items():
                    totals[key] = totals.get(key, 0) + int(value or 0)
    return totals


class ProgressLogger(StreamingQueryListener):
    """One line per micro-batch in the driver log: what operators read at 3 a.m."""

    def onQueryStarted(self, event):  # noqa: N802 - Spark's API
        log.info("query %s started (run %s)", event.name, event.runId)

    def onQueryProgress(self, event):  # noqa: N802
        p = event.progress
        observed = {name: row.asDict() for name, row in (p.observedMetrics or {}).items()}
        state_rows = sum(op.numRowsTotal for op in p.stateOperators)
        dropped = sum(op.numRowsDroppedByWatermark for op in p.stateOperators)
        log.info(
            "query %s batch %d: %d rows in, %.1f rows/s processed, %d ms, state rows %d, "
            "dropped as late %d, metrics %s",
            p.name, p.batchId, p.numInputRows, p.processedRowsPerSecond or 0.0,
            (p.durationMs or {}).get("triggerExecution", 0), state_rows, dropped, json.dumps(observed),
        )

    def onQueryIdle(self, event):  # noqa: N802
        pass

    def onQueryTerminated(self, event):  # noqa: N802
        if event.exception:
            log.error("query %s terminated with an error: %s", event.id, event.exception)
        else:
            log.info("query %s stopped", event.id)


def parse_args(argv: list[str], program_name: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=program_name, description=f"Run the {program_name} streaming app.")
    parser.add_argument("--app", required=True, help="app name in the catalog")
    parser.add_argument("--catalog", default=None, help="catalog file (default: $STREAMOPS_CATALOG or catalog/pipelines.yaml)")
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("STREAMOPS_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        help="Kafka bootstrap servers (default: $STREAMOPS_KAFKA_BOOTSTRAP or 127.0.0.1:9092)",
    )
    parser.add_argument("--checkpoint", default=None, help="checkpoint root (default: from the catalog)")
    parser.add_argument("--trigger", default=None, help=f"micro-batch interval such as '2 seconds', or {AVAILABLE_NOW}")
    parser.add_argument("--starting-offsets", default="earliest", choices=["earliest", "latest"])
    parser.add_argument("--version", default=None, help="version label written into dead letters")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str], program_name: str) -> int:
    """The spark-submit entry point of every program (spark_apps/<program_name>.py)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    # Import by package name: run as a script, the program's own module is `__main__`.
    program = importlib.import_module(f"spark_apps.{program_name}")
    args = parse_args(argv, program_name)
    catalog = load_catalog(args.catalog)
    spec = catalog.app(args.app)
    if spec.program != program_name:
        raise SystemExit(f"app {spec.name!r} is a {spec.program} app, not {program_name}; run spark_apps/{spec.program}.py")
    options = RunOptions(
        bootstrap_servers=args.bootstrap_servers,
        checkpoint=args.checkpoint or spec.checkpoint_location(),
        trigger=args.trigger or spec.trigger,
        starting_offsets=args.starting_offsets,
        version=args.version,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    log.info("app %s (%s %s) from %s: %s", spec.name, spec.program, options.version or spec.version, catalog_path(args.catalog), options)
    spark = build_session(f"streamops-{spec.name}")
    spark.sparkContext.setLogLevel("WARN")
    spark.streams.addListener(ProgressLogger())
    queries = start_app(spark, spec, program, options)
    if options.trigger == AVAILABLE_NOW:
        log.info("available-now run finished; totals %s", json.dumps(observed_totals(queries)))
        return 0

    def stop(signum, _frame):
        log.info("signal %s: stopping %d queries", signal.Signals(signum).name, len(queries))
        for query in queries:
            query.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for query in queries:
        query.awaitTermination()
    failed = [q for q in queries if q.exception()]
    for query in failed:
        log.error("query %s failed: %s", query.name, query.exception())
    return 1 if failed else 0
