"""Operation-log router (seed 000: LINE's loopback replicator; seed 002: dynamic routing).

Reads the operation log and writes each event to every category topic whose op-type set holds
its op type; the topic is chosen per record (the Kafka sink's `topic` column, the counterpart of
Kafka Streams' TopicNameExtractor). Keys are kept, so per-user order holds within a partition.
An event whose op type is in no category is a dead letter naming the op type (never dropped
silently); the observed metric `unknown_op_type` counts them among `dead_letters`.

Output value: {"event_id", "category", "seq", "user_id", "op_type", "event_time", "event"}
where event_id is the source topic/partition/offset and "event" is the original JSON object,
byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from streamops import records
from streamops.catalog import AppSpec
from streamops.program_contract import LineageOutput, OutputQuery, StreamingProgram


class RouterSettings(BaseModel):
    """Which op types go to which category (each category is an output role)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    categories: dict[str, Annotated[list[str], Field(min_length=1)]] = Field(min_length=1)


FIELDS = [
    records.Field("seq", "bigint", "seq"),
    records.Field("user_id", "string", "user_id", min_length=1),
    records.Field("op_type", "string", "op_type", min_length=1),
    records.Field("event_time", "timestamp", "event_time"),
]


def routes(spec: AppSpec) -> dict[str, list[tuple[str, str]]]:
    """op type -> [(category, topic), ...], from the catalog's category map."""
    settings = program.bind(spec).settings
    table: dict[str, list[tuple[str, str]]] = {}
    for category, op_types in settings.categories.items():
        for op_type in op_types:
            table.setdefault(op_type, []).append((category, spec.outputs[category]))
    return table


class OplogRouter(StreamingProgram):
    """The router of the module doc: one stateless query, `route`."""

    name = "oplog_router"
    input_roles = ("operations",)
    output_roles = None
    output_roles_setting = "categories"  # one output role per category
    Settings = RouterSettings
    input_fields = {"operations": FIELDS}
    query_names = ("route",)
    # Every routed record names its source record (event_id): the quality reconciliation checks
    # that each input record of a range reached every category it belongs to.
    lineage_outputs = {"*": LineageOutput("route", "operations")}

    def queries(self, app: AppSpec, version: str, source: Callable[[list[str]], DataFrame]) -> list[OutputQuery]:
        return queries(app, version, source)


def queries(spec: AppSpec, version: str, source: Callable[[list[str]], DataFrame]) -> list[OutputQuery]:
    table = routes(spec)
    parsed = records.parse_input(source([spec.inputs["operations"]]), spec, "operations", FIELDS)
    # Valid input whose op type no category holds: a dead letter, routed nowhere by surprise.
    unknown = F.col("error").isNull() & ~F.col("op_type").isin(*table)
    categories = ", ".join(sorted(spec.outputs))
    parsed = parsed.withColumn(
        "unknown_op_type", unknown
    ).withColumn(
        "error",
        F.when(
            F.col("unknown_op_type"),
            F.format_string(
                f"op type '%s' is in no category ({categories}) of the catalog's settings.categories "
                "(router contract: every op type is routed or refused)",
                records.shown(F.col("op_type")),
            ),
        ).otherwise(F.col("error")),
    )
    parsed = parsed.observe(
        "router",
        F.count(F.lit(1)).alias("records_in"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("dead_letters"),
        F.sum(F.when(F.col("unknown_op_type"), 1).otherwise(0)).alias("unknown_op_type"),
    )
    # op type -> the (category, topic) pairs it is routed to.
    route_map = F.create_map(
        *[
            item
            for op_type, targets in sorted(table.items())
            for item in (
                F.lit(op_type),
                F.array(*[F.struct(F.lit(c).alias("category"), F.lit(t).alias("topic")) for c, t in targets]),
            )
        ]
    )

    def routed(target: Column) -> Column:
        head = F.to_json(F.struct(
            F.col("event_id"),
            target["category"].alias("category"),
            F.col("seq"),
            F.col("user_id"),
            F.col("op_type"),
            records.iso_time("event_time").alias("event_time"),
        ))
        # "event" is the original JSON text, byte for byte (a replicator re-encodes nothing:
        # 1E2 stays 1E2, 1e400 stays a number): the contract made it exactly one I-JSON object.
        value = F.concat(head.substr(F.lit(1), F.length(head) - 1), F.lit(',"event":'), records.original_json(), F.lit("}"))
        return F.struct(F.col("key").alias("key"), value.alias("value"), target["topic"].alias("topic"))

    # One output record per matching category, or one dead letter: one read of each source record.
    routed_records = F.transform(F.element_at(route_map, F.col("op_type")), routed)
    return [OutputQuery("route", records.with_dead_letters(parsed, spec, version, routed_records))]


program = OplogRouter()
