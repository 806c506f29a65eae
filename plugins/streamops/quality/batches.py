"""A bounded Kafka range as a Spark batch, decoded with the catalog's value schema.

Spark's batch Kafka reader takes exact start and end offsets per partition, so a range of any
size is read in parallel and never has to fit in the driver's memory.

Decoded columns: `key` and `value` (text), `partition`, `offset`, `timestamp` (Kafka's),
`is_tombstone`, `value_is_json` (null for tombstones), then one column per value field of the
topic's `value_schema` (nested paths as "source.offset" -> `source_offset`).
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from streamops.catalog import TopicSpec
from streamops.driver.kafka_io import BOUNDED_READ_OPTIONS
from streamops.kafka_client import KafkaClientConfig
from streamops.quality.ranges import TopicRange

KAFKA_COLUMNS = ("key", "value", "partition", "offset", "timestamp", "is_tombstone", "value_is_json")
_SPARK_TYPES = {
    "string": "STRING", "bigint": "BIGINT", "double": "DOUBLE", "boolean": "BOOLEAN", "timestamp": "STRING", "json": "STRING",
}


def read_range(spark: SparkSession, kafka: KafkaClientConfig, topic_range: TopicRange, compacted: bool = False) -> DataFrame:
    """The raw records of the range (key, value, topic, partition, offset, timestamp, ...)."""
    spans = {p: span for p, span in topic_range.partitions.items() if not span.empty}
    if not spans:
        return spark.createDataFrame(
            [], "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, timestampType int"
        )
    topic = topic_range.topic
    return (
        spark.read.format("kafka")
        .options(**kafka.spark_options())
        .options(**BOUNDED_READ_OPTIONS)  # no half-second wait at the end of each partition
        .option("assign", json.dumps({topic: sorted(spans)}))
        .option("startingOffsets", json.dumps({topic: {str(p): span.start for p, span in spans.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): span.end for p, span in spans.items()}}))
        # Compaction leaves offset gaps that are not a loss; on other topics a gap means
        # retention deleted the range while we read it, which must fail the run.
        .option("failOnDataLoss", "false" if compacted else "true")
        .load()
    )


def value_struct_schema(spec: TopicSpec) -> str:
    """The from_json schema of the topic's values: nested paths become nested structs."""
    tree: dict = {}
    for path, kind in (spec.value_schema or {}).items():
        node = tree
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _SPARK_TYPES[kind]

    def render(node: dict) -> str:
        return ", ".join(f"`{k}` {render_type(v)}" for k, v in node.items())

    def render_type(value) -> str:
        return f"STRUCT<{render(value)}>" if isinstance(value, dict) else value

    return render(tree)


def decode(raw: DataFrame, spec: TopicSpec) -> DataFrame:
    """Kafka columns plus one column per value field, typed as the catalog says."""
    clashes = sorted(set(spec.value_columns()) & set(KAFKA_COLUMNS))
    if clashes:
        raise ValueError(f"topic {spec.name}: value fields {clashes} clash with the Kafka columns {list(KAFKA_COLUMNS)}")
    text = F.col("value").cast("string")
    parsed_doc = F.try_parse_json(text)
    frame = raw.select(
        F.col("key").cast("string").alias("key"),
        text.alias("value"),
        "partition",
        "offset",
        "timestamp",
        F.col("value").isNull().alias("is_tombstone"),
        F.when(F.col("value").isNotNull(), F.coalesce(F.schema_of_variant(parsed_doc).startswith("OBJECT"), F.lit(False))).alias(
            "value_is_json"
        ),
        F.from_json(text, value_struct_schema(spec)).alias("_fields"),
    )
    columns = []
    for column, path in spec.value_columns().items():
        value = F.col("_fields")
        for part in path.split("."):
            value = value.getField(part)
        if (spec.value_schema or {}).get(path) == "timestamp":
            value = F.try_to_timestamp(value)
        columns.append(value.alias(column))
    return frame.select(*KAFKA_COLUMNS, *columns)


def read_decoded(spark: SparkSession, kafka: KafkaClientConfig, topic_range: TopicRange, spec: TopicSpec) -> DataFrame:
    compacted = "compact" in str(spec.configs.get("cleanup.policy", "delete"))
    return decode(read_range(spark, kafka, topic_range, compacted), spec)


def aggregated(frame: DataFrame) -> Row:
    """The one row of a global aggregation (`frame.agg(...)`, no grouping): Spark returns exactly one."""
    row = frame.first()
    if row is None:  # only a grouped aggregation can come back empty
        raise ValueError("expected the one row of a global aggregation, got none")
    return row
