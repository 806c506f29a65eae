"""Cross-record checks: recompute what the app should have written and line it up with what it
did write. The result is a small "reconciliation batch" that the suite's reconciliation
expectations validate like any other batch (so their failures list the exact rows).

Both recomputations run the app's own transformation code (its `queries()`), fed by bounded
batch reads instead of streams; nothing here re-implements an app.

Which outputs support which check is the writing program's declaration (program contract):

router (its `lineage_outputs`, e.g. the router's category topics): the range's output records name their source (event_id =
  topic/partition/offset). Per input partition, the covered range is [lowest, highest] source
  offset seen. The router is re-run over exactly that input range; its records for this topic
  are the expected set. The actual set is every record of the topic written since the first
  input record of the range (so records outside the chosen output range still count).
  Rows: event_id, source_partition, source_offset, op_type, expected, copies.

window_counts (its `window_counts`): for every window in the range, the last (largest)
  count the app emitted for it, from the range's start to the topic's end, against the count
  recomputed from the app's whole retained input. Only windows the watermark has closed are
  compared (the newest window start seen, minus the watermark): open ones can still change.
  Records the app dropped as late show up as differences; the query's progress counts them.
  Rows: <key>, window_start, window_end, emitted_count, recomputed_count.

Both re-runs honour the app's skip list (recover_skip_records): a record an operator skipped is a
dead letter with the operator's reason there as in the live run, so it is neither expected nor
counted, and the summary names the skipped offsets. Records the app dead-lettered are not
expected either (the router's summary counts them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec, Catalog
from streamops.driver.outputs import operator_skip
from streamops.driver.session import apply_app_conf
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import OffsetSpan, duration_ms, time_range_spans, topic_partitions, watermarks
from streamops.program_contract import LineageOutput, WindowCountOutput
from streamops.programs import load_program, program_info, running_version, settings_dict
from streamops.quality.batches import aggregated, read_decoded, read_range
from streamops.quality.ranges import TopicRange, whole_topics
from streamops.records import OPERATOR_SKIP
from streamops.runtime_records import SkipEntry
from streamops.timestamps import epoch_ms, from_epoch_ms

# Output records are written after their input; allow this much clock skew between hosts.
CLOCK_SKEW_MS = 60_000
_EVENT_ID = r"^(.*)/([0-9]+)/([0-9]+)$"



@dataclass
class Reconciliation:
    frame: DataFrame | None  # None: nothing to compare (the summary says why)
    summary: dict = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class Sources:
    """Where reconciliation reads from."""

    spark: SparkSession | None  # None: every range is empty, nothing is read
    kafka: KafkaClientConfig
    admin: AdminClient
    catalog: Catalog

    def session(self) -> SparkSession:
        """The Spark session, for a range that has records to read."""
        if self.spark is None:
            raise ValueError("a range with records was given to a validation started without a Spark session")
        return self.spark


def build(kind: str, sources: Sources, topic: str, topic_range: TopicRange, batch: DataFrame) -> Reconciliation:
    writer = sources.catalog.writer(topic)
    if writer is None:
        raise ValueError(f"topic {topic!r}: its suite asks for a '{kind}' reconciliation but no app writes it")
    app, role = writer
    declared = program_info(app, running_version(app))  # what the code that wrote it declares
    lineage = declared.lineage_outputs.get(role) or declared.lineage_outputs.get("*")
    if kind == "router" and role in app.outputs and lineage is not None:
        return _router(sources, app, lineage, topic, batch)
    if kind == "window_counts" and role in declared.window_counts:
        return _window_counts(sources, app, declared.window_counts[role], topic, topic_range, batch)
    raise ValueError(
        f"topic {topic!r}: its suite asks for a '{kind}' reconciliation, which {app.program} ({role}) does not support"
    )


def _app_query(sources: Sources, app: AppSpec, name: str, source) -> DataFrame:
    """The frame of one of the app's own queries, built over `source` (a batch reader)."""
    program = load_program(app, running_version(app))  # before the runtime's own import: it may be the artifact's

    apply_app_conf(sources.session(), app)
    for output in program.queries(program.bind(app), running_version(app), source):
        if output.name == name:
            return output.frame
    raise ValueError(f"app {app.name}: program {app.program} has no query {name!r}")


def _skip_entries(app: AppSpec) -> list[SkipEntry]:
    """The live app's skip list (beside its checkpoint), as its driver reads it at start."""
    return AppRuntime(app.checkpoint_location()).skip_records()


def _skipping(frame: DataFrame, entries: list[SkipEntry], topics: list[str]) -> DataFrame:
    """A batch read of input topics with the column the live source adds: each record's skip
    reason (streamops.driver.outputs.operator_skip), so the app's own parse dead-letters skipped records."""
    return frame.withColumn(OPERATOR_SKIP, operator_skip(entries, topics))


def _skipped_in(entries: list[SkipEntry], ranges: list[TopicRange]) -> tuple[list[str], int]:
    """The skip list's offsets inside the ranges, as 'topic:partition:first-last' (a single offset
    alone), and how many records they are."""
    named, count = [], 0
    for topic_range in ranges:
        for entry in entries:
            if entry.topic != topic_range.topic or entry.partition not in topic_range.partitions:
                continue
            read = topic_range.partitions[entry.partition]
            first, last = max(entry.first, read.start), min(entry.last, read.end - 1)
            if first <= last:
                span = str(first) if first == last else f"{first}-{last}"
                named.append(f"{entry.topic}:{entry.partition}:{span}")
                count += last - first + 1
    return named, count


def _with_source(frame: DataFrame) -> DataFrame:
    return frame.select(
        "*",
        F.regexp_extract("event_id", _EVENT_ID, 1).alias("source_topic"),
        F.regexp_extract("event_id", _EVENT_ID, 2).cast("int").alias("source_partition"),
        F.regexp_extract("event_id", _EVENT_ID, 3).cast("bigint").alias("source_offset"),
    )


def _router(sources: Sources, app: AppSpec, lineage: LineageOutput, topic: str, batch: DataFrame) -> Reconciliation:
    input_topic = app.inputs[lineage.input_role]
    covered = (
        _with_source(batch.where(F.col("event_id").isNotNull()))
        .where(F.col("source_topic") == input_topic)
        .groupBy("source_partition")
        .agg(F.min("source_offset").alias("low"), F.max("source_offset").alias("high"))
        .collect()
    )
    if not covered:
        return Reconciliation(None, {"input_records": 0}, f"no record in the range names a source in {input_topic}")
    spans = {row["source_partition"]: OffsetSpan(row["low"], row["high"] + 1) for row in covered}
    input_range = TopicRange(input_topic, spans, "the input range the output range covers")
    spark, kafka = sources.session(), sources.kafka
    entries = _skip_entries(app)

    def source(topics: list[str]) -> DataFrame:
        assert topics == [input_topic], topics
        return _skipping(read_range(spark, kafka, input_range), entries, topics)

    outputs = _app_query(sources, app, lineage.query, source).persist()
    dead_lettered = outputs.where(F.col("topic") == app.dead_letter_topic).count()
    routed = outputs.where(F.col("topic") == topic)
    expected = routed.select(
        F.from_json(F.col("value").cast("string"), "event_id STRING, op_type STRING").alias("v")
    ).select(F.col("v.event_id").alias("event_id"), F.col("v.op_type").alias("op_type"), F.lit(True).alias("expected"))

    # Every output of the covered input range was written after its input record was.
    first_input_ms = aggregated(read_range(spark, kafka, input_range).agg(F.min(F.unix_millis("timestamp"))))[0] or 0
    partitions = topic_partitions(sources.admin, [topic])[topic] or []
    since = from_epoch_ms(max(0, first_input_ms - CLOCK_SKEW_MS))
    written_range = TopicRange(
        topic, time_range_spans(sources.admin, topic, partitions, since, None), "written since the input range began"
    )
    in_covered = F.lit(False)
    for partition, span in spans.items():
        in_covered = in_covered | (
            (F.col("source_partition") == partition) & F.col("source_offset").between(span.start, span.end - 1)
        )
    actual = (
        _with_source(read_decoded(spark, kafka, written_range, sources.catalog.topic(topic)).where(F.col("event_id").isNotNull()))
        .where((F.col("source_topic") == input_topic) & in_covered)
        .groupBy("event_id")
        .agg(F.count(F.lit(1)).alias("copies"), F.first("op_type").alias("written_op_type"))
    )
    frame = _with_source(
        expected.join(actual, "event_id", "full_outer").select(
            "event_id",
            F.coalesce("op_type", "written_op_type").alias("op_type"),
            F.coalesce("expected", F.lit(False)).alias("expected"),
            F.coalesce("copies", F.lit(0)).alias("copies"),
        )
    ).drop("source_topic")
    frame = frame.persist()
    totals = aggregated(frame.agg(
        F.sum(F.col("expected").cast("int")).alias("expected"),
        F.sum(F.when(F.col("copies") > 0, 1).otherwise(0)).alias("written"),
        F.sum(F.when(F.col("expected") & (F.col("copies") == 0), 1).otherwise(0)).alias("missing"),
        F.sum(F.when(~F.col("expected"), 1).otherwise(0)).alias("unexpected"),
        F.sum(F.greatest(F.col("copies") - 1, F.lit(0))).alias("duplicates"),
    ))
    outputs.unpersist()
    skipped, skipped_count = _skipped_in(entries, [input_range])
    summary = {
        "input_range": input_range.to_json(),
        **{key: int(totals[key] or 0) for key in ("expected", "written", "missing", "unexpected", "duplicates")},
        "skipped_by_operator": skipped,
        "dead_lettered": dead_lettered,
    }
    note = (
        f"{input_topic} {input_range.spans()}: {summary['expected']} record(s) of this category expected, "
        f"{summary['written']} written, {summary['missing']} missing, {summary['unexpected']} unexpected, "
        f"{summary['duplicates']} duplicate copies; not expected: {dead_lettered} dead-lettered with a reason"
        + (f" ({skipped_count} of them skipped by an operator, recover_skip_records: {', '.join(skipped)})" if skipped else "")
    )
    return Reconciliation(frame, summary, note)


def _window_counts(
    sources: Sources, app: AppSpec, counted: WindowCountOutput, topic: str, topic_range: TopicRange, batch: DataFrame
) -> Reconciliation:
    query, key_column = counted.query, counted.key_column
    window = [key_column, "window_start", "window_end"]
    windows = batch.where(F.col(key_column).isNotNull() & F.col("window_start").isNotNull()).select(*window).distinct()
    spark, kafka, spec = sources.session(), sources.kafka, sources.catalog.topic(topic)

    # The last emitted count of a window is its largest: counts only grow as updates arrive.
    ends = watermarks(sources.admin, topic, sorted(topic_range.partitions))
    since_range = TopicRange(
        topic, {p: OffsetSpan(span.start, max(span.start, ends[p][1])) for p, span in topic_range.partitions.items()},
        "from the range start to the end",
    )
    emitted = read_decoded(spark, kafka, since_range, spec).groupBy(*window).agg(F.max("count").alias("emitted_count"))

    entries = _skip_entries(app)
    read_whole: list[TopicRange] = []

    def source(topics: list[str]) -> DataFrame:
        ranges = whole_topics(sources.admin, topics)
        read_whole.extend(ranges)
        frames = [read_range(spark, kafka, whole) for whole in ranges]
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        return _skipping(union, entries, topics)

    recounted = _app_query(sources, app, query, source).select(
        F.from_json(
            F.col("value").cast("string"), f"`{key_column}` STRING, window_start STRING, window_end STRING, count BIGINT"
        ).alias("v")
    ).select(
        F.col(f"v.{key_column}").alias(key_column),
        F.try_to_timestamp("v.window_start").alias("window_start"),
        F.try_to_timestamp("v.window_end").alias("window_end"),
        F.col("v.count").alias("recomputed_count"),
    ).persist()
    newest_start = aggregated(recounted.agg(F.max("window_start")))[0]
    watermark_ms = duration_ms(settings_dict(app)[counted.watermark_setting])
    lined_up = (
        windows.join(emitted, window, "left")
        .join(recounted, window, "left")
        .select(
            *window,
            F.coalesce("emitted_count", F.lit(0)).alias("emitted_count"),
            F.coalesce("recomputed_count", F.lit(0)).alias("recomputed_count"),
        )
        .persist()
    )
    if newest_start is None:
        closed = F.lit(True)
    else:
        closed = F.unix_millis("window_end") <= F.lit(epoch_ms(newest_start) - watermark_ms)
    totals = aggregated(lined_up.agg(
        F.count(F.lit(1)).alias("windows"),
        F.sum(closed.cast("int")).alias("closed"),
        F.sum((closed & (F.col("emitted_count") != F.col("recomputed_count"))).cast("int")).alias("differ"),
    ))
    summary: dict = {key: int(totals[key] or 0) for key in ("windows", "closed", "differ")}
    skipped, skipped_count = _skipped_in(entries, read_whole)
    summary["skipped_by_operator"] = skipped
    frame = lined_up.where(closed)
    note = (
        f"{summary['windows']} window(s) in the range, {summary['closed']} closed by the watermark and compared with "
        f"the app's own '{query}' query re-run over its whole retained input, {summary['differ']} differ"
        + (f"; {skipped_count} record(s) skipped by an operator not counted (recover_skip_records: {', '.join(skipped)})"
           if skipped else "")
    )
    return Reconciliation(frame, summary, note)
