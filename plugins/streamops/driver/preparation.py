"""What a driver builds before its queries start (a live start and a warm standby alike): the
session, the progress listener, the queries' plans and the stateful operators its program declares.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import SparkSession

from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec
from streamops.driver.options import RunOptions
from streamops.driver.outputs import build_outputs
from streamops.driver.progress import ProgressPublisher
from streamops.driver.session import build_session
from streamops.program_contract import OutputQuery, StreamingProgram

log = logging.getLogger("streamops.app")


LISTENER_DRAIN_MS = 5000  # at a driver's exit: Spark's queued listener events are delivered within this (usually ms)


@dataclass
class Prepared:
    """What a driver builds before its queries start: the session, the listener that publishes
    progress, the queries' plans and the stateful operators its program declares (per query)."""

    spark: SparkSession
    publisher: ProgressPublisher
    outputs: list[OutputQuery]
    sources_read: list[list[str]]
    stateful_operators: dict[str, list[str]]

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
    spark = build_session(f"streamops-{spec.name}", launcher_names=True)
    spark.sparkContext.setLogLevel("WARN")
    publisher = ProgressPublisher(runtime, group_id, options.kafka)
    spark.streams.addListener(publisher)
    sources_read: list[list[str]] = []
    outputs = build_outputs(spark, spec, program, options, sources_read)
    return Prepared(spark, publisher, outputs, sources_read, declared_state(program))


def declared_state(program: StreamingProgram) -> dict[str, list[str]]:
    """Per query, the stateful operators the program declares: what the driver record says it
    keeps (whether a restart must carry state over is Spark's to judge: driver.state_check)."""
    return {query: list(operators) for query, operators in program.stateful_operators.items()}
