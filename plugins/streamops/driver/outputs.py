"""An app's queries as DataFrames, not started: the program's `queries()` over sources that read
the app's input topics, with the operator's skip list as a column and a backfill's end offsets
as a filter. Used by a live run, a standby's rehearsal and the quality reconciliation alike.

Contract: `build_outputs` returns the program's `OutputQuery` list; `operator_skip` is the value of
the column `streamops.records.OPERATOR_SKIP`, which `records.parse` turns into a record's error.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streamops.app_runtime import AppRuntime
from streamops.catalog import REAL_TIME, AppSpec
from streamops.driver.kafka_io import read_topics
from streamops.driver.options import RunOptions
from streamops.driver.session import apply_app_conf
from streamops.failures import error_gist
from streamops.program_contract import OutputQuery, StreamingProgram
from streamops.records import OPERATOR_SKIP, SHARED_PARSE_PREFIX, shared_parses
from streamops.runtime_records import SkipEntry

log = logging.getLogger("streamops.app")


def build_outputs(
    spark: SparkSession, spec: AppSpec, program: StreamingProgram, options: RunOptions,
    sources_read: list[list[str]] | None = None,
) -> list[OutputQuery]:
    """The app's queries as DataFrames, not started. `sources_read` collects the topics of each
    Kafka source the queries read (a real-time run needs a task slot per partition of each)."""
    spec = program.bind(spec)
    apply_app_conf(spark, spec)
    # Read once at start: recover_skip_records writes the list while the app is stopped.
    skipped = options.skip_records if options.skip_records is not None else AppRuntime(options.checkpoint).skip_records()

    def source(topics: list[str], record: bool = True) -> DataFrame:
        if sources_read is not None and record:
            sources_read.append(list(topics))
        # Real-time mode bounds a batch by time (its checkpoint interval), not by a record count.
        limit = None if options.trigger == REAL_TIME else options.max_offsets_per_trigger or spec.max_offsets_per_trigger
        frame = read_topics(
            spark, options.kafka, topics, _starting_offsets(options.starting_offsets, topics),
            limit, group_id_prefix=f"streamops.{spec.name}", real_time=options.trigger == REAL_TIME,
        ).withColumn(OPERATOR_SKIP, operator_skip(skipped, topics))
        ends = {t: e for t, e in (options.ending_offsets or {}).items() if t in topics}
        if not ends:
            return frame
        within = F.lit(False)
        for topic, partitions in ends.items():
            for partition, end in partitions.items():
                within = within | ((F.col("topic") == topic) & (F.col("partition") == int(partition)) & (F.col("offset") < end))
        unbounded = ~F.col("topic").isin(*ends)
        return frame.where(within | unbounded)

    version = options.version or spec.version
    outputs = program.queries(spec, version, source)
    if options.trigger == REAL_TIME:
        return outputs  # real-time mode runs no exchange; the caller warns of a query that reads twice
    return with_shared_parses(
        spec, outputs, lambda: program.queries(spec, version, lambda topics: source(topics, record=False)))


def with_shared_parses(spec: AppSpec, outputs: list[OutputQuery], rebuild: Callable[[], list[OutputQuery]]
                       ) -> list[OutputQuery]:
    """`outputs`, where one reads a source more than once, as `rebuild` gives it under
    `records.shared_parses` (each parse through one exchange Spark reuses for every branch) when
    that reads fewer times: a program that parses one source twice gains nothing from it. A
    rebuild that fails keeps the first build (it ran before the shared parse existed)."""
    if not any(sources_read_more_than_once(o) for o in outputs):
        return outputs
    try:
        with shared_parses():
            rebuilt = {o.name: o for o in rebuild()}
    except Exception as exc:  # noqa: BLE001 - the first build works: start with it, and say why
        log.warning("%s: the queries with a shared parse could not be built (%s); they read each record once per "
                    "branch instead", spec.name, error_gist(f"{type(exc).__name__}: {exc}", limit=300))
        return outputs
    chosen = []
    for output in outputs:
        again = rebuilt.get(output.name)
        reads_before = sum(sources_read_more_than_once(output).values())
        if again is not None and reads_before and sum(sources_read_more_than_once(again).values()) < reads_before:
            output = again
        chosen.append(output)
    return chosen


def operator_skip(entries: list[SkipEntry], topics: list[str]) -> Column:
    """The skip reason of a source record named in the skip list (null for every other record).
    It runs on every record, so it stays cheap: a null literal when no entry names these topics
    (Spark folds it away), else one offset-range comparison per entry."""
    reason = F.lit(None).cast("string")
    for entry in reversed([e for e in entries if e.topic in topics]):
        named = ((F.col("topic") == entry.topic) & (F.col("partition") == entry.partition)
                 & F.col("offset").between(entry.first, entry.last))
        reason = F.when(named, F.lit(entry.reason)).otherwise(reason)
    return reason


def _starting_offsets(starting: str, topics: list[str]) -> str:
    """earliest/latest as given; a JSON of offsets narrowed to these topics (a query's source may
    read a topic the JSON does not name, e.g. the app's own output: that one starts at earliest)."""
    if not starting.lstrip().startswith("{"):
        return starting
    offsets = {t: o for t, o in json.loads(starting).items() if t in topics}
    if not offsets:
        return "earliest"
    missing = [t for t in topics if t not in offsets]
    if missing:
        raise ValueError(f"starting offsets name {sorted(offsets)} but not {missing}, read by the same query")
    return json.dumps(offsets)


_ATTRIBUTE_IDS = re.compile(r"#\d+L?")
_KAFKA_TOPICS = re.compile(r"\b(?:subscribe|assign|subscribePattern)=([^,\]]+(?:,[^=,\]]+(?=,|\]))*)")


def sources_read_more_than_once(output: OutputQuery) -> dict[str, int]:
    """The sources a query reads more than once per batch, with how many times: one source frame
    in two branches of a union (Spark scans, and the program parses, every record once per
    branch), unless the branches meet below a shared parse (`records.shared_parses`: Spark reuses
    its exchange, so its source is read once). Keyed by the Kafka topics the source reads (or the
    plan node, for another source). Found in Spark's analyzed plan, where each read of the source
    is a leaf of its own."""
    seen: dict[str, int] = {}
    shared_seen: set[str] = set()
    pending = [output.frame._jdf.queryExecution().analyzed()]  # noqa: SLF001 - no public API for it
    while pending:
        node = pending.pop()
        if node.nodeName() == "CollectMetrics" and node.name().startswith(SHARED_PARSE_PREFIX):
            if node.name() in shared_seen:
                continue  # a second branch over the same shared parse: Spark reuses the first one's read
            shared_seen.add(node.name())
        children = node.children()
        if children.isEmpty():
            # Without attribute ids: Spark may renumber a repeated relation's columns in one branch.
            text = _ATTRIBUTE_IDS.sub("", node.simpleString(1000))
            seen[text] = seen.get(text, 0) + 1
        pending.extend(children.apply(index) for index in range(children.size()))
    repeated = {}
    for text, times in seen.items():
        if times > 1:
            topics = _KAFKA_TOPICS.search(text)
            repeated[topics.group(1) if topics else text.split("\n")[0][:120]] = times
    return repeated
