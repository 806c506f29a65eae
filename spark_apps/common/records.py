"""Parsing input records, and the dead-letter envelope for the ones that do not parse.

Values are parsed with Spark's VARIANT functions (`try_parse_json`, `try_variant_get`), so a bad
record never fails the query: each row gets an `error` column with the first reason it is bad
(null when it is good). Good rows go on; bad rows become dead letters with their provenance.
What "good" means is the input contract below, one for every app.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from streamops.catalog import AppSpec

FieldType = Literal["string", "bigint", "timestamp"]

# ---------------------------------------------------------------------------------------------
# The input contract, the same for every app and input topic (README "Input contract").
# A record is valid input only if every rule holds; otherwise it is a dead letter whose reason
# names the first rule it breaks:
#   value-present   the value is not null (a tombstone is not an event)
#   size            the value is at most the app's max_record_bytes
#   utf-8           the value is UTF-8 (RFC 8259 §8.1), without a byte order mark
#   json            the value is JSON text (RFC 8259): no NaN/Infinity, no single quotes, no raw
#                   control characters in strings, no trailing commas; at most 998 levels of
#                   nesting and numbers of at most 1000 digits (the JSON parser's limits)
#   one-value       exactly one JSON value; only whitespace may follow it
#   unicode         no lone surrogate escapes such as \ud800 (I-JSON, RFC 7493 §2.1)
#   unique-names    no member name twice in any object (I-JSON, RFC 7493 §2.3)
#   object          the value is a JSON object
#   field-present   every field the app needs is there and not null
#   field-type      exact JSON types: a string is a JSON string, an integer is an integral JSON
#                   number within int64 (no 1.0, no 1e3, no quoted numbers)
#   timestamp       RFC 3339 date-time with an offset, YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM),
#                   upper-case T and Z, a fraction of at most 6 digits (Spark keeps microseconds:
#                   more would be cut silently), an offset within ±18:00 and seconds 00-59 (Java
#                   time has no leap seconds), whose instant lies in years 0001-9999 UTC (outputs
#                   write it in that form)
#   allowed-value   a field with a value set (e.g. action: Open/Close) holds one of them
#   key             where the catalog declares a key field for the input (apps[].input_keys),
#                   the Kafka key is UTF-8 and equals that field: the key picks the partition,
#                   so a wrong key breaks per-user order and is refused, never silently re-keyed
# Extra fields are allowed and kept. Whitespace around the value is allowed (RFC 8259 §2).
# ---------------------------------------------------------------------------------------------

_TYPE_NAMES = {"string": "a string", "bigint": "an integer", "timestamp": "an ISO-8601 timestamp string"}
_INTEGER_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")
# An instant must say its offset: a naive time means different instants on different hosts.
# (\z, not $: Java's $ also matches before a final line break, which would pass '...Z\n'.)
_NO_OFFSET = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?\z"
_RFC3339 = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})\z"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_FIRST_MICROS = (datetime(1, 1, 1, tzinfo=timezone.utc) - _EPOCH) // timedelta(microseconds=1)
_LAST_MICROS = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc) - _EPOCH) // timedelta(microseconds=1)
# A lone surrogate escape: read the text token by token from its start (possessively, so in
# linear time): any character but a backslash, an escape other than \u, a \u escape that is not
# a surrogate, or a high-low surrogate pair; the first \uD800-\uDFFF escape that is left over is
# lone (group 1). (In valid JSON a backslash only occurs inside strings.)
_LONE_SURROGATE = (
    r"^(?:[^\\]|\\[^u]|\\u(?![dD][89a-fA-F])[0-9a-fA-F]{4}"
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})*+(\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
)
_JSON_WHITESPACE = " \t\n\r"
_STRICT_JACKSON = {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false", "mode": "PERMISSIVE"}


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


def _capped(text: Column, limit: int) -> Column:
    return F.when(F.length(text) > limit, F.concat(F.substring(text, 1, limit - 3), F.lit("..."))).otherwise(text)


def shown(value: Column) -> Column:
    """A value of the record quoted in a reason, at most 100 characters (a reason stays short)."""
    return _capped(value, 100)


def _json_path(field: Field) -> str:
    return f"$.{field.path}" if field.path.isidentifier() else f"$['{field.path}']"


def _text() -> Column:
    # A binary-to-string cast keeps the bytes as they are, so invalid UTF-8 stays detectable.
    return F.col("value").cast("string")


def _in_brackets(text: Column) -> Column:
    """The text parsed as `[text]`. Spark's JSON functions read the first value and ignore what
    follows it ('{} {}', '{}x'), so the brackets make the parser look past it: a valid `[text]` of
    one element means nothing but whitespace follows the value, or a ']' does (`{...}]x`):
    `_nothing_after_a_bracket` rules that out."""
    return F.try_parse_json(F.concat(F.lit("["), text, F.lit("]")))


def _nothing_after_a_bracket(text: Column) -> Column:
    # In `[text,0]` a ']' right after the value ends the array before the 0: one element, not two.
    # Counted only for the (fewer) texts that hold a ']' at all.
    return (F.instr(text, "]") == 0) | (F.json_array_length(F.concat(F.lit("["), text, F.lit(",0]"))) == 2)


def _starts_an_object(text: Column) -> Column:
    # Valid JSON text whose first non-whitespace character is '{' is an object.
    return F.substring(F.ltrim(text, F.lit(_JSON_WHITESPACE)), 1, 1) == "{"


def _no_lone_surrogate(text: Column) -> Column:
    # The regex runs only on values with a \u escape (rare), so the common case stays cheap.
    return (F.instr(text, "\\u") == 0) | ~text.rlike(_LONE_SURROGATE)


def _timestamp_in_range(ts: Column) -> Column:
    micros = F.unix_micros(ts)
    return (micros >= F.lit(_FIRST_MICROS)) & (micros <= F.lit(_LAST_MICROS))


def parse(raw: DataFrame, fields: list[Field], max_record_bytes: int, key_field: str | None = None) -> DataFrame:
    """Add a column per field, `event_json` (the whole value as VARIANT) and `error`.

    `key_field`: the catalog's key rule for this input (apps[].input_keys): the Kafka key must
    equal this string field. Two paths: cheap checks decide whether a record is good; only
    records they reject get the checks that name the exact rule (CASE WHEN evaluates that
    branch for those rows only).
    """
    if key_field is not None and not any(f.path == key_field and f.type == "string" for f in fields):
        raise ValueError(
            f"key rule: the key must equal field {key_field!r}, but the input's fields have no string field of that name "
            f"(fields: {', '.join(f.path for f in fields)})"
        )
    text = _text()
    staged = with_source_columns(raw).withColumn("_in_brackets", _in_brackets(text))
    staged = staged.withColumn("event_json", F.variant_get(F.col("_in_brackets"), "$[0]", "variant"))
    doc = F.col("event_json")
    size = F.length(F.col("value"))
    good_so_far = (
        F.col("value").isNotNull()
        & (size <= max_record_bytes)
        & F.is_valid_utf8(text)
        # Null when not JSON, and for duplicate member names at any depth
        # (spark.sql.variant.allowDuplicateKeys is false, Spark's default).
        & doc.isNotNull()
        # (An array or scalar has no fields, so the field checks below refuse it.)
        & F.variant_get(F.col("_in_brackets"), "$[1]", "variant").isNull()
        & _nothing_after_a_bracket(text)
        & _no_lone_surrogate(text)
    )
    # Each field's JSON value once (a small VARIANT), then its exact type and typed value from it.
    staged = staged.select("*", *[F.variant_get(doc, _json_path(f), "variant").alias(f"_json_{f.column}") for f in fields])
    for field in fields:
        present = F.col(f"_json_{field.column}")
        actual_type = F.schema_of_variant(present)
        if field.type == "bigint":
            staged = staged.withColumn(field.column, F.try_variant_get(present, "$", "bigint"))
            good_so_far = good_so_far & actual_type.isin(*_INTEGER_TYPES)
            continue
        as_text = F.try_variant_get(present, "$", "string")
        good_so_far = good_so_far & (actual_type == "STRING")
        if field.type == "timestamp":
            staged = staged.withColumn(field.column, F.try_to_timestamp(as_text))
            good_so_far = good_so_far & as_text.rlike(_RFC3339) & _timestamp_in_range(F.col(field.column))
        else:
            staged = staged.withColumn(field.column, as_text)
            if field.allowed:
                good_so_far = good_so_far & F.col(field.column).isin(*field.allowed)
    if key_field is not None:
        good_so_far = good_so_far & (F.col("key").cast("string") == F.col(_column_of(fields, key_field)))
    # The reason is built inside a lambda so that subexpression elimination cannot hoist its
    # checks out of the CASE and run them on every row (measured: 3x slower).
    reason = F.transform(
        F.array(F.col("_in_brackets")), lambda wrapped: _reason(wrapped, fields, max_record_bytes, key_field)
    )[0]
    error = F.when(F.coalesce(good_so_far, F.lit(False)), F.lit(None).cast("string")).otherwise(reason)
    # Named in the app's skip list by an operator (recover_skip_records; the runner's source adds
    # the column): the operator's reason is the error, before any check of the record itself.
    if "_operator_skip" in raw.columns:
        error = F.coalesce(F.col("_operator_skip"), error)
    return staged.withColumn("error", error).drop("_operator_skip", "_in_brackets", *[f"_json_{f.column}" for f in fields])


def _column_of(fields: list[Field], path: str) -> str:
    return next(f.column for f in fields if f.path == path)


def _reason(wrapped: Column, fields: list[Field], max_record_bytes: int, key_field: str | None = None) -> Column:
    """The first input-contract rule a rejected record breaks, in words, naming the rule.

    `wrapped` is the text parsed as `[text]` (see _in_brackets). Each check runs only where it can
    apply (Spark's AND stops at the first false): the JSON-level ones only for text that did not
    parse, so the common rejects (a missing field, a wrong type) cost little.
    """
    text = _text()
    doc = F.variant_get(wrapped, "$[0]", "variant")
    size = F.length(F.col("value"))
    # `[text]` does not parse although its first value does: something follows that value.
    something_after = doc.isNull() & F.try_parse_json(text).isNotNull()
    keys = F.json_object_keys(text)
    duplicates = F.filter(keys, lambda k: F.size(F.filter(keys, lambda j: j == k)) > 1)
    surrogate = F.regexp_extract(text, _LONE_SURROGATE, 1)
    checks: list[tuple[Column, Column]] = [
        (F.col("value").isNull(), F.lit("empty value (null)")),
        (size > max_record_bytes, F.format_string(f"record is %d bytes, over the {max_record_bytes}-byte limit", size)),
        (~F.is_valid_utf8(text), F.lit("value is not UTF-8 (input contract utf-8: RFC 8259 §8.1)")),
        (text.startswith("\ufeff"), F.lit("value starts with a byte order mark (input contract utf-8: RFC 8259 §8.1 forbids it)")),
        (
            # The parser's depth limit (1000, and the brackets add one level).
            # The first value parses alone but not inside brackets, with more than 998 openings;
            # or 999 arrays open in a row. (No repeated group here: Java's regex recursion over
            # a hostile value would overflow the stack and fail the query.)
            doc.isNull() & ((something_after & (F.size(F.split(text, r"[\[{]")) > 999)) | text.rlike(r"\[{999}")),
            F.lit("value is nested more than 998 levels deep (input contract json: the parser's limit)"),
        ),
        (
            something_after
            | (doc.isNotNull() & (F.variant_get(wrapped, "$[1]", "variant").isNotNull() | ~_nothing_after_a_bracket(text))),
            F.lit("value has content after the JSON value (input contract one-value: exactly one JSON value per record)"),
        ),
        (
            # Tab, line feed and carriage return are whitespace between tokens; others never are.
            doc.isNull() & text.rlike(r"[\x00-\x08\x0b\x0c\x0e-\x1f]"),
            F.lit("value has an unescaped control character (input contract json: RFC 8259 §7 requires \\u escapes)"),
        ),
        (
            doc.isNull() & text.rlike(r"[:,\[]\s*[-+]?(NaN|Infinity)\b"),
            F.lit("value has NaN or Infinity, which are not JSON numbers (input contract json: RFC 8259 §6)"),
        ),
        # Before the JSON-level checks: Spark 4.2's VARIANT parser refuses a lone surrogate, which
        # would otherwise read as a nested duplicate name or as not JSON.
        (
            (F.instr(text, "\\u") > 0) & (surrogate != ""),
            F.format_string("value has a lone surrogate escape '%s' (input contract unicode: I-JSON, RFC 7493 §2.1)", surrogate),
        ),
        (
            # (The parser refuses a name twice, so a text that parsed has none.)
            doc.isNull() & F.coalesce(F.size(duplicates) > 0, F.lit(False)),
            F.format_string(
                "duplicate member name '%s' (input contract unique-names: I-JSON, RFC 7493 §2.3: member names must be unique)",
                shown(duplicates[0]),
            ),
        ),
        (
            # Jackson without Spark's leniencies accepts it, VARIANT (no duplicates) does not.
            doc.isNull() & F.from_json(text, "MAP<STRING, STRING>", _STRICT_JACKSON).isNotNull(),
            F.lit("duplicate member name in a nested object (input contract unique-names: I-JSON, RFC 7493 §2.3)"),
        ),
        (
            doc.isNull() & text.rlike("[0-9]{1001}"),
            F.lit("value has a number of more than 1000 digits (input contract json: the parser's limit)"),
        ),
        (doc.isNull(), F.lit("value is not valid JSON")),
        (~_starts_an_object(text), F.lit("value is not a JSON object")),
    ]
    for field in fields:
        path = _json_path(field)
        present = F.variant_get(doc, path, "variant")
        actual_type = F.schema_of_variant(present)
        missing = present.isNull() | F.is_variant_null(present)
        checks.append((missing, F.lit(f"missing field '{field.path}'")))
        if field.type == "bigint":
            literal = F.to_json(present)
            checks += [
                (
                    # An integral literal of 19+ digits; shorter DECIMAL(p,0) values came from '1.0'.
                    actual_type.rlike(r"^DECIMAL\((19|[2-9][0-9]),0\)\z"),
                    F.format_string(f"field '{field.path}' is an integer outside the int64 range: %s (input contract field-type)", shown(literal)),
                ),
                (
                    ~actual_type.isin(*_INTEGER_TYPES),
                    F.format_string(f"field '{field.path}' must be an integer (got %s)", shown(actual_type)),
                ),
            ]
            continue
        as_text = F.try_variant_get(doc, path, "string")
        checks.append(
            (
                actual_type != "STRING",
                F.format_string(f"field '{field.path}' must be {_TYPE_NAMES[field.type]} (got %s)", shown(actual_type)),
            )
        )
        if field.type == "timestamp":
            ts = F.try_to_timestamp(as_text)
            checks += [
                (as_text.rlike(_NO_OFFSET), F.format_string(f"field '{field.path}' has no timezone offset: '%s'", shown(as_text))),
                (
                    ~as_text.rlike(_RFC3339),
                    F.format_string(
                        f"field '{field.path}' is not an RFC 3339 date-time YYYY-MM-DDTHH:MM:SS[.ffffff](Z|±HH:MM): '%s' "
                        "(input contract timestamp)",
                        shown(as_text),
                    ),
                ),
                (
                    ts.isNull(),
                    F.format_string(
                        f"field '{field.path}' is not a valid date and time: '%s' (a day the month has, seconds 00-59, an "
                        "offset within ±18:00; input contract timestamp)",
                        shown(as_text),
                    ),
                ),
                (
                    ~_timestamp_in_range(ts),
                    F.format_string(f"field '{field.path}' is outside years 0001-9999 in UTC: '%s' (input contract timestamp)", shown(as_text)),
                ),
            ]
        elif field.allowed:
            allowed = ", ".join(field.allowed)
            checks.append(
                (~as_text.isin(*field.allowed), F.format_string(f"field '{field.path}' must be one of {allowed} (got '%s')", shown(as_text)))
            )
    if key_field is not None:
        key = F.col("key").cast("string")
        expected = F.try_variant_get(doc, _json_path(Field(key_field, "string", key_field)), "string")
        rule = f"(input contract key: the catalog keys this input by field '{key_field}')"
        checks += [
            (F.col("key").isNull(), F.lit(f"record has no key; it must equal field '{key_field}' {rule}")),
            (~F.is_valid_utf8(key), F.lit(f"key is not UTF-8 {rule}")),
            (key != expected, F.format_string(f"key '%s' does not equal field '{key_field}' '%s' {rule}", shown(key), shown(expected))),
        ]
    # Reached only if the fast checks refused a record the checks above accept: still a dead
    # letter, never a silent pass.
    reason = F.lit("value does not match the expected fields and types")
    for failed, message in reversed(checks):
        reason = F.when(F.coalesce(failed, F.lit(False)), message).otherwise(reason)
    return reason


# A dead letter is sized to the sink's request limit (the catalog's producer.max.request.size;
# the catalog refuses a dead-letter topic that accepts less). Everything but the original bytes
# fits in this reserve: app, version, the reason (capped), times, source coordinates, sizes,
# digests and the preview (512 characters, at most 6 bytes each once JSON-escaped).
DEAD_LETTER_RESERVE_BYTES = 16 * 1024
REASON_MAX_CHARS = 1000
PREVIEW_CHARS = 512


def _base64_bytes(size: Column) -> Column:
    return F.floor((size + 2) / 3) * 4


def _stored(data: Column, inline: Column) -> Column:
    return F.when(data.isNull(), F.lit("null")).when(inline, F.lit("inline")).otherwise(F.lit("reference"))


def dead_letter_record(spec: AppSpec, version: str) -> Column:
    """The dead letter of a parsed row with an error, as struct(key, value, topic) for the sink.

    The envelope (JSON) names the reason, the app and the source record (topic, partition,
    offset, timestamp) and keeps the original key and value: byte for byte in base64 when they
    fit the sink's request limit, else by reference (source coordinates, size and sha256, which
    recover_replay_dead_letters reads back from the source topic), the reason saying so. So a
    dead letter always fits, and one large record never fails the sink. The dead letter's Kafka
    key is the original key when that is kept inline (else null).
    """
    budget = spec.producer.max_request_size - DEAD_LETTER_RESERVE_BYTES
    key, value = F.col("key"), F.col("value")
    key_size, value_size = F.length(key), F.length(value)
    # A key (at most an eighth of the budget) is kept twice: as the Kafka key and in base64.
    key_inline = key.isNull() | (key_size <= budget // 8)
    key_cost = F.when(key.isNotNull() & key_inline, key_size + _base64_bytes(key_size)).otherwise(F.lit(0))
    value_inline = value.isNull() | (_base64_bytes(value_size) + key_cost <= budget)
    by_reference = [
        F.when(~key_inline, F.format_string("key (%d bytes)", key_size)),
        F.when(~value_inline, F.format_string("value (%d bytes)", value_size)),
    ]
    note = F.format_string(
        f"; the original %s is stored by reference, not inline: over the {budget}-byte dead-letter limit "
        "(read it from the source topic/partition/offset; sizes and sha256 are in this envelope)",
        F.concat_ws(" and ", *by_reference),
    )
    reason = _capped(F.col("error"), REASON_MAX_CHARS)
    envelope = F.struct(
        F.lit(spec.name).alias("app"),
        F.lit(version).alias("app_version"),
        F.when(key_inline & value_inline, reason).otherwise(F.concat(reason, note)).alias("reason"),
        F.date_format(F.current_timestamp(), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("failed_at"),
        F.struct(
            F.col("topic").alias("topic"),
            F.col("partition").alias("partition"),
            F.col("offset").alias("offset"),
            F.date_format(F.col("timestamp"), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("timestamp"),
        ).alias("source"),
        F.when(key_inline, F.base64(key)).alias("original_key_base64"),
        F.when(value_inline, F.base64(value)).alias("original_value_base64"),
        _stored(key, key_inline).alias("original_key_stored"),
        _stored(value, value_inline).alias("original_value_stored"),
        key_size.alias("original_key_bytes"),
        value_size.alias("original_value_bytes"),
        F.sha2(key, 256).alias("original_key_sha256"),
        F.sha2(value, 256).alias("original_value_sha256"),
        F.substring(value.cast("string"), 1, PREVIEW_CHARS).alias("original_value_preview"),
    )
    return F.struct(
        F.when(key_inline, key).alias("key"), F.to_json(envelope).alias("value"), F.lit(spec.dead_letter_topic).alias("topic")
    )


def dead_letters(parsed: DataFrame, spec: AppSpec, version: str) -> DataFrame:
    """Rows with an error as dead-letter records (key, value, topic) for the Kafka sink."""
    return parsed.where(F.col("error").isNotNull()).select(dead_letter_record(spec, version).alias("dead")).select("dead.*")


def original_json() -> Column:
    """A valid record's value as JSON text without the whitespace around it, to embed as is."""
    return F.btrim(_text(), F.lit(_JSON_WHITESPACE))


def good(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("error").isNull())


def iso_ms(epoch_ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC text with milliseconds (Python side, same format)."""
    moment = _EPOCH + timedelta(milliseconds=int(epoch_ms))  # exact (no float), any year 0001-9999
    return f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z"


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
