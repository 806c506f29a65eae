"""Parsing input records, and the dead-letter envelope for the ones that do not parse.

Values are parsed with Spark's VARIANT functions (`try_parse_json`, `try_variant_get`), so a bad
record never fails the query: each row gets an `error` column with the first reason it is bad
(null when it is good). Good rows go on; bad rows become dead letters with their provenance.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

FieldType = Literal["string", "bigint", "timestamp"]

_TYPE_NAMES = {"string": "a string", "bigint": "an integer", "timestamp": "an ISO-8601 timestamp string"}
# An ISO-8601 time must say its offset: a naive time means different instants on different hosts.
_HAS_OFFSET = r"(Z|z|[+-][0-9]{2}:?[0-9]{2})$"


@dataclass(frozen=True)
class Field:
    """One required field of an input record's JSON object."""

    path: str  # key in the JSON object
    type: FieldType
    column: str  # column name in the parsed DataFrame
    allowed: tuple[str, ...] = ()  # for strings: the only values accepted (empty: any)


def with_source_columns(raw: DataFrame) -> DataFrame:
    """Raw Kafka rows plus `event_id` (topic/partition/offset: unique per source record)."""
    return raw.withColumn(
        "event_id", F.concat_ws("/", F.col("topic"), F.col("partition").cast("string"), F.col("offset").cast("string"))
    )


def parse(raw: DataFrame, fields: list[Field], max_record_bytes: int) -> DataFrame:
    """Add a column per field, `event_json` (the whole value as VARIANT) and `error`.

    Two paths: `from_json` with the expected schema (fast, code-generated) decides whether a
    record is good; only records it rejects get the VARIANT checks that name the exact reason
    (CASE WHEN evaluates that branch for those rows only).
    """
    text = F.col("value").cast("string")
    schema = ", ".join(f"`{f.path}` {'BIGINT' if f.type == 'bigint' else 'STRING'}" for f in fields)
    staged = (
        with_source_columns(raw)
        .withColumn("_fast", F.from_json(text, schema))
        .withColumn("event_json", F.try_parse_json(text))
    )
    size = F.length(F.col("value"))
    good_so_far = F.col("value").isNotNull() & (size <= max_record_bytes)
    for field in fields:
        fast_value = F.col("_fast").getField(field.path)
        if field.type == "timestamp":
            staged = staged.withColumn(field.column, F.try_to_timestamp(fast_value))
            good_so_far = good_so_far & F.col(field.column).isNotNull() & fast_value.rlike(_HAS_OFFSET)
        else:
            staged = staged.withColumn(field.column, fast_value)
            good_so_far = good_so_far & F.col(field.column).isNotNull()
            if field.allowed:
                good_so_far = good_so_far & F.col(field.column).isin(*field.allowed)
    # The reason is built inside a lambda so that subexpression elimination cannot hoist its
    # VARIANT calls out of the CASE and run them on every row (measured: 3x slower).
    reason = F.transform(F.array(F.col("event_json")), lambda doc: _reason(doc, fields, max_record_bytes))[0]
    error = F.when(F.coalesce(good_so_far, F.lit(False)), F.lit(None).cast("string")).otherwise(reason)
    return staged.withColumn("error", error).drop("_fast")


def _reason(doc: Column, fields: list[Field], max_record_bytes: int) -> Column:
    """The first thing wrong with a rejected record, in words."""
    size = F.length(F.col("value"))
    checks: list[tuple[Column, Column]] = [
        (F.col("value").isNull(), F.lit("empty value (null)")),
        (size > max_record_bytes, F.format_string(f"record is %d bytes, over the {max_record_bytes}-byte limit", size)),
        (doc.isNull(), F.lit("value is not valid JSON")),
        (~F.schema_of_variant(doc).startswith("OBJECT"), F.lit("value is not a JSON object")),
    ]
    for field in fields:
        path = f"$.{field.path}" if field.path.isidentifier() else f"$['{field.path}']"
        present = F.variant_get(doc, path, "variant")
        actual_type = F.schema_of_variant(present)
        missing = present.isNull() | F.is_variant_null(present)
        if field.type == "timestamp":
            as_text = F.try_variant_get(doc, path, "string")
            checks += [
                (missing, F.lit(f"missing field '{field.path}'")),
                (actual_type != "STRING", F.format_string(f"field '{field.path}' must be {_TYPE_NAMES['timestamp']} (got %s)", actual_type)),
                (F.try_to_timestamp(as_text).isNull(), F.format_string(f"field '{field.path}' is not an ISO-8601 timestamp: '%s'", as_text)),
                (~as_text.rlike(_HAS_OFFSET), F.format_string(f"field '{field.path}' has no timezone offset: '%s'", as_text)),
            ]
        else:
            # JSON integers arrive as the narrowest integer type that holds them.
            type_ok = actual_type.isin("TINYINT", "SMALLINT", "INT", "BIGINT") if field.type == "bigint" else actual_type == "STRING"
            checks += [
                (missing, F.lit(f"missing field '{field.path}'")),
                (~type_ok, F.format_string(f"field '{field.path}' must be {_TYPE_NAMES[field.type]} (got %s)", actual_type)),
            ]
            if field.allowed:
                value = F.try_variant_get(doc, path, field.type)
                allowed = ", ".join(field.allowed)
                checks.append(
                    (~value.isin(*field.allowed), F.format_string(f"field '{field.path}' must be one of {allowed} (got '%s')", value))
                )
    # Reached only if from_json refused a record the checks above accept (e.g. a number too
    # large for BIGINT): still a dead letter, never a silent pass.
    reason = F.lit("value does not match the expected fields and types")
    for failed, message in reversed(checks):
        reason = F.when(F.coalesce(failed, F.lit(False)), message).otherwise(reason)
    return reason


def dead_letter_value(app: str, version: str) -> Column:
    """The dead-letter envelope (JSON text) of a parsed row with an error.

    It keeps the original key and value byte for byte (base64), so a replay can put them back
    exactly, plus a readable preview, the source coordinates, the app and the reason.
    """
    envelope = F.struct(
        F.lit(app).alias("app"),
        F.lit(version).alias("app_version"),
        F.col("error").alias("reason"),
        F.date_format(F.current_timestamp(), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("failed_at"),
        F.struct(
            F.col("topic").alias("topic"),
            F.col("partition").alias("partition"),
            F.col("offset").alias("offset"),
            F.date_format(F.col("timestamp"), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("timestamp"),
        ).alias("source"),
        F.base64(F.col("key")).alias("original_key_base64"),
        F.base64(F.col("value")).alias("original_value_base64"),
        F.substring(F.col("value").cast("string"), 1, 512).alias("original_value_preview"),
    )
    return F.to_json(envelope)


def dead_letters(parsed: DataFrame, app: str, version: str, topic: str) -> DataFrame:
    """Rows with an error as dead-letter records (key, value, topic) for the Kafka sink."""
    return parsed.where(F.col("error").isNotNull()).select(
        F.col("key"), dead_letter_value(app, version).alias("value"), F.lit(topic).alias("topic")
    )


def good(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("error").isNull())


def iso_ms(epoch_ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC text with milliseconds (Python side, same format)."""
    return datetime.fromtimestamp(int(epoch_ms) / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def iso_time(column: str | Column) -> Column:
    """A timestamp as ISO-8601 text in UTC with milliseconds, as every output writes times."""
    return F.date_format(column, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")


def windowed_counts(
    frame: DataFrame, key: str, event_time: str, window: str, slide: str, watermark: str, topic: str
) -> DataFrame:
    """Rows per `key` in `window` windows every `slide` on event time, as update records
    (key `<key>|<window start>`, value {key, window_start, window_end, count})."""
    counted = (
        frame.withWatermark(event_time, watermark)
        .groupBy(F.window(event_time, window, slide), key)
        .count()
    )
    start, end = iso_time("window.start"), iso_time("window.end")
    value = F.struct(F.col(key), start.alias("window_start"), end.alias("window_end"), F.col("count"))
    return counted.select(
        F.concat_ws("|", F.col(key), start).alias("key"), F.to_json(value).alias("value"), F.lit(topic).alias("topic")
    )
