"""The Kafka sink of every micro-batch query, fenced by the driver's lease.

Contract: `fenced_kafka_writer` returns Spark's foreachBatch function; it raises `LeaseLost` when
this driver no longer holds the app (nothing written or committed), `StoppedBeforeBatch` once a
graceful stop began (the batch runs on restart), `SinkWriteFailed` with the Java error's gist.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pyspark.sql import DataFrame

from streamops.failures import error_gist


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
