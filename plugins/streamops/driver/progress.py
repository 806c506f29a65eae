"""Per micro-batch progress, published where the control plane reads it: a log line, the
progress file beside the checkpoint (`AppRuntime.write_progress`), and the processed offsets
committed to the consumer group `streamops.<app>` (so Kafka's lag tools see the app).
"""

from __future__ import annotations

import json
import logging
import threading

from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryProgress,
)

from streamops.app_runtime import AppRuntime
from streamops.driver.sink import STOPPED_BEFORE_BATCH
from streamops.kafka_client import KafkaClientConfig
from streamops.records import SHARED_PARSE_PREFIX
from streamops.runtime_records import QueryProgress
from streamops.timestamps import now_iso

log = logging.getLogger("streamops.app")

# The names of driver.state_check's queries end so (defined here: that module imports this one's users).
STATE_CHECK_SUFFIX = ".state-check"


def offsets_of(progress: StreamingQueryProgress) -> dict[str, dict[str, int]]:
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

    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802 - Spark's API
        log.info("query %s started (run %s)", event.name, event.runId)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802
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

    def publish(self, p: StreamingQueryProgress) -> None:
        name = p.name or str(p.id)  # every query the driver starts is named <app>.<query>
        if name.endswith(STATE_CHECK_SUFFIX):
            return  # the state check's batch on a copy of the checkpoint: not the app's progress
        with self._lock:
            if self._published.get(name, -1) >= p.batchId:
                return
            self._published[name] = p.batchId
            self._publish(p)

    def _publish(self, p: StreamingQueryProgress) -> None:
        if self.runtime is not None and self.runtime.fenced:
            return  # a newer driver owns the progress files and the consumer group now
        observed = {name: row.asDict() for name, row in (p.observedMetrics or {}).items()
                    if not name.startswith(SHARED_PARSE_PREFIX)}  # the runtime's barrier, not the program's
        state_rows = sum(op.numRowsTotal for op in p.stateOperators)
        dropped = sum(op.numRowsDroppedByWatermark for op in p.stateOperators)
        # Rows the stateful operators added or changed: a windowed count's updates (its output in
        # update mode). Input that arrives with none of it, all dropped as late, is output stopped.
        updated = sum(op.numRowsUpdated for op in p.stateOperators)
        memory_bytes = sum(op.memoryUsedBytes for op in p.stateOperators)
        files_bytes = sum(int((op.customMetrics or {}).get("rocksdbSstFileSize") or 0) for op in p.stateOperators)
        duration_ms = (p.durationMs or {}).get("triggerExecution", 0)
        log.info(
            "query %s batch %d: %d rows in, %.1f rows/s processed, %d ms (%s), state rows %d, "
            "dropped as late %d, metrics %s",
            p.name, p.batchId, p.numInputRows, p.processedRowsPerSecond or 0.0, duration_ms, batch_phases(p.durationMs),
            state_rows, dropped, json.dumps(observed),
        )
        offsets = offsets_of(p)
        if self.runtime is not None:
            name = p.name or str(p.id)
            self.runtime.write_progress(
                name.rsplit(".", 1)[-1],
                QueryProgress(
                    query=name,
                    batch_id=p.batchId,
                    timestamp=p.timestamp,
                    published_at=now_iso(),
                    input_rows=p.numInputRows,
                    input_rows_per_second=p.inputRowsPerSecond,
                    processed_rows_per_second=p.processedRowsPerSecond,
                    batch_duration_ms=duration_ms,
                    state_rows=state_rows,
                    dropped_by_watermark=dropped,
                    state_rows_updated=updated,
                    state_memory_bytes=memory_bytes,
                    state_files_bytes=files_bytes,
                    stateful=bool(p.stateOperators),
                    watermark=(p.eventTime or {}).get("watermark"),
                    end_offsets=offsets,
                    observed=observed,
                ),
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

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802
        if self.runtime is not None and not self._closed:
            self.runtime.update(last_idle_at=now_iso())

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802
        if event.exception and STOPPED_BEFORE_BATCH in event.exception:
            log.info("query %s stopped before its next micro-batch (graceful stop)", event.id)
        elif event.exception:
            log.error("query %s terminated with an error: %s", event.id, event.exception)
        else:
            log.info("query %s stopped", event.id)


def batch_phases(duration_ms: dict[str, int] | None) -> str:
    """Where a batch's time went, longest first, from Spark's durationMs ('addBatch 1840, queryPlanning
    95, walCommit 12, ...'): the writing (addBatch), the planning, the offset and commit logs."""
    phases = sorted(((ms, name) for name, ms in (duration_ms or {}).items() if name != "triggerExecution" and ms),
                    reverse=True)
    return ", ".join(f"{name} {ms}" for ms, name in phases) or "no phases"
