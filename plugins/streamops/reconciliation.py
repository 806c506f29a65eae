"""Scheduled reconciliation of stateful apps: recompute every closed window from the earliest
retained input into scratch topics (a reprocessing run of the app's own code) and compare it with
what the live app emitted for the same windows.

A window is compared once it is closed for the live app: its end is at or before the watermark
of the live count query's last committed micro-batch (read from the checkpoint), so Spark will
not update it again. Without a live checkpoint, the recomputation's own watermark is used (its
newest window start minus the app's watermark delay). Counts are the last (largest) update of
each window. Records the live app dropped as late show up as differences.

The scratch topics are deleted afterwards: they were created by this run and hold nothing else.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import UTC

from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import committed_batch_metadata, query_dir
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import duration_ms
from streamops.programs import ProgramError, program_info, settings_dict
from streamops.quality.batches import aggregated, read_decoded
from streamops.quality.ranges import whole_topics
from streamops.timestamps import epoch_ms, iso_seconds, iso_seconds_utc

EXAMPLES = 5

log = logging.getLogger(__name__)


@dataclass
class WindowComparison:
    app: str
    live_topic: str
    scratch_topic: str
    closed_before: str  # the closing bound used, ISO-8601
    closed_by: str  # "live watermark" or "recomputed watermark"
    compared: int = 0
    matching: int = 0
    differ: int = 0
    only_live: int = 0
    only_recomputed: int = 0
    open_skipped: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def mismatched(self) -> int:
        return self.differ + self.only_live + self.only_recomputed

    @property
    def mismatch_ratio(self) -> float:
        return self.mismatched / self.compared if self.compared else 0.0

    def summary(self) -> str:
        return (
            f"{self.app} {self.live_topic}: {self.compared} closed window(s) compared (closed before {self.closed_before}, "
            f"{self.closed_by}), {self.matching} match, {self.differ} differ, {self.only_live} only in the live output, "
            f"{self.only_recomputed} only in the recomputation; {self.open_skipped} still open, skipped"
        )

    def to_json(self) -> dict:
        return {**asdict(self), "mismatched": self.mismatched, "mismatch_ratio": self.mismatch_ratio}


def window_outputs(catalog: Catalog) -> list[tuple[AppSpec, str]]:
    """(app, output role) of every windowed count the catalog's apps write."""
    found = []
    for app in catalog.apps:
        try:
            counted = program_info(app).window_counts
        except ProgramError as exc:  # named where the app is used; a DAG form still lists the others
            log.warning("%s: %s", app.name, exc)
            continue
        found += [(app, role) for role in app.outputs if role in counted]
    return found


def live_watermark_ms(checkpoint: str, query: str) -> int | None:
    """The watermark of the query's last committed micro-batch (0 or None: none yet)."""
    metadata = committed_batch_metadata(query_dir(checkpoint, query))
    if metadata is None:
        return None
    return int(metadata.get("batchWatermarkMs") or 0) or None


def _final_counts(
    spark: SparkSession, kafka: KafkaClientConfig, admin: AdminClient, catalog: Catalog, topic: str, key: str, name: str
) -> DataFrame:
    spec = catalog.topic(topic)
    (whole,) = whole_topics(admin, [topic])
    return (
        read_decoded(spark, kafka, whole, spec)
        .where(F.col(key).isNotNull() & F.col("window_start").isNotNull())
        .groupBy(key, "window_start", "window_end")
        .agg(F.max("count").alias(name))
    )


def compare_windows(
    spark: SparkSession,
    kafka: KafkaClientConfig,
    admin: AdminClient,
    catalog: Catalog,
    app: AppSpec,
    role: str,
    scratch_topic: str,
    scratch_catalog: Catalog,
) -> WindowComparison:
    counted = program_info(app).window_counts[role]
    query, key = counted.query, counted.key_column
    live_topic = app.outputs[role]
    live = _final_counts(spark, kafka, admin, catalog, live_topic, key, "live_count")
    recomputed = _final_counts(spark, kafka, admin, scratch_catalog, scratch_topic, key, "recomputed_count").persist()
    bound_ms = live_watermark_ms(app.checkpoint_location(), query)
    closed_by = "live watermark"
    if bound_ms is None:
        newest = aggregated(recomputed.agg(F.max("window_start")))[0]
        bound_ms = epoch_ms(newest) - duration_ms(settings_dict(app)[counted.watermark_setting]) if newest else 0
        closed_by = "recomputed watermark (no committed live batch)"
    window = [key, "window_start", "window_end"]
    lined_up = live.join(recomputed, window, "full_outer").persist()
    closed = F.unix_millis("window_end") <= F.lit(bound_ms)
    counts = aggregated(lined_up.agg(
        F.sum(closed.cast("int")).alias("compared"),
        F.sum((~closed).cast("int")).alias("open"),
        F.sum((closed & (F.col("live_count") == F.col("recomputed_count"))).cast("int")).alias("matching"),
        F.sum((closed & (F.col("live_count") != F.col("recomputed_count"))).cast("int")).alias("differ"),
        F.sum((closed & F.col("recomputed_count").isNull()).cast("int")).alias("only_live"),
        F.sum((closed & F.col("live_count").isNull()).cast("int")).alias("only_recomputed"),
    ))
    mismatched = lined_up.where(
        closed
        & (
            F.col("live_count").isNull()
            | F.col("recomputed_count").isNull()
            | (F.col("live_count") != F.col("recomputed_count"))
        )
    ).orderBy(key, "window_start").limit(EXAMPLES).collect()
    result = WindowComparison(
        app=app.name,
        live_topic=live_topic,
        scratch_topic=scratch_topic,
        closed_before=iso_seconds_utc(bound_ms),
        closed_by=closed_by,
        compared=int(counts["compared"] or 0),
        matching=int(counts["matching"] or 0),
        differ=int(counts["differ"] or 0),
        only_live=int(counts["only_live"] or 0),
        only_recomputed=int(counts["only_recomputed"] or 0),
        open_skipped=int(counts["open"] or 0),
        examples=[
            f"{key} {row[key]!r} window {_utc(row['window_start'])}..{_utc(row['window_end'])}: "
            f"live {row['live_count']}, recomputed {row['recomputed_count']}"
            for row in mismatched
        ],
    )
    lined_up.unpersist()
    recomputed.unpersist()
    return result


def _utc(moment) -> str:
    # Spark hands timestamps back as naive datetimes in the session time zone, which is UTC.
    return iso_seconds(moment.replace(tzinfo=UTC))


def delete_scratch_topics(admin: AdminClient, topics: list[str]) -> list[str]:
    """Delete this run's scratch topics (only names under 'scratch.'); return the deleted ones."""
    doomed = [t for t in topics if t.startswith("scratch.")]
    existing = set(admin.list_topics(timeout=15).topics)
    doomed = [t for t in doomed if t in existing]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            future.result()
    return doomed
