"""Parsing input records, and the dead-letter envelope for the ones that do not parse.

Values are parsed with Spark's VARIANT functions (`try_parse_json`, `try_variant_get`), so a bad
record never fails the query: each row gets an `error` column with the first reason it is bad
(null when it is good). Good rows go on; bad rows become dead letters with their provenance.
What "good" means is the input contract below, one for every app.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Literal, SupportsInt

from pydantic import BaseModel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from streamops import settings, timestamps
from streamops.catalog import AppSpec
from streamops.input_contract import (
    DEFAULT_CONTRACT,
    INNERMOST_CONTAINER_REGEX,
    JSON_STRING_REGEX,
    InputContract,
    check_pattern,
    merged_rules,
    whole_match,
)
from streamops.runtime_records import DeadLetterEnvelope, DeadLetterSource
from streamops.timestamps import SPARK_ISO_MS, SPARK_ISO_MS_OFFSET

log = logging.getLogger("streamops.records")

# The column of a source record's skip reason (null for every record not skipped): the driver adds
# it (streamops.driver.outputs.operator_skip), `parse` makes it the record's error.
OPERATOR_SKIP = "_operator_skip"

FieldType = Literal["string", "bigint", "timestamp"]

# ---------------------------------------------------------------------------------------------
# The input contract, the same for every app and input topic (docs/architecture.md "Input contract").
# A record is valid input only if every rule holds; otherwise it is a dead letter whose reason
# names the first rule it breaks:
#   value-present   the value is not null (a tombstone is not an event)
#   size            the value is at most the app's max_record_bytes
#   utf-8           the value is UTF-8 (RFC 8259 §8.1), without a byte order mark
#   json            the value is JSON text (RFC 8259): no NaN/Infinity, no single quotes, no raw
#                   control characters in strings, no trailing commas; numbers of at most 1000
#                   digits (the JSON parser's limit)
#   depth           at most the input's max_depth levels of nesting (default 64, what common
#                   decoders of the outputs accept; at most 998, the parser's limit)
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
#   event-time      a timestamp field lies at most max_future after the record's own time (the
#                   earlier of its Kafka timestamp and the time it is processed) and at most
#                   max_past before its Kafka timestamp (defaults 5 minutes and 3650 days): one
#                   record beyond them would move a windowed app's watermark
#   allowed-value   a field with a value set (e.g. action: Open/Close) holds one of them
#   length          a string field has at least min_length and at most max_length characters
#   pattern         a string field matches the field's pattern as a whole
#   range           an integer field lies within minimum..maximum (inclusive)
#   key             where the catalog declares a key field for the input (apps[].input_keys),
#                   the Kafka key is UTF-8 and equals that field: the key picks the partition,
#                   so a wrong key breaks per-user order and is refused, never silently re-keyed
# The field rules (allowed-value, length, pattern, range), max_depth and the event-time bounds
# come from the program's fields and the catalog's apps[].input_contract (streamops.input_contract).
# Extra fields are allowed and kept. Whitespace around the value is allowed (RFC 8259 §2).
# ---------------------------------------------------------------------------------------------

_TYPE_NAMES = {"string": "a string", "bigint": "an integer", "timestamp": "an ISO-8601 timestamp string"}
_INTEGER_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")
# An instant must say its offset: a naive time means different instants on different hosts.
# (\z, not $: Java's $ also matches before a final line break, which would pass '...Z\n'.)
_NO_OFFSET = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?\z"
_RFC3339 = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})\z"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIRST_MICROS = (datetime(1, 1, 1, tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
_LAST_MICROS = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
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
    min_length: int | None = None  # strings, in characters (1: not empty)
    max_length: int | None = None
    pattern: str | None = None  # strings: the whole value matches (Java regex)
    minimum: int | None = None  # integers, inclusive
    maximum: int | None = None

    def __post_init__(self) -> None:
        kind = "string" if self.type == "string" else "bigint" if self.type == "bigint" else None
        for rule, applies_to in (("min_length", "string"), ("max_length", "string"), ("pattern", "string"),
                                 ("allowed", "string"), ("minimum", "bigint"), ("maximum", "bigint")):
            if getattr(self, rule) not in (None, ()) and kind != applies_to:
                raise ValueError(f"field {self.path!r} ({self.type}): {rule} applies to "
                                 f"{'strings' if applies_to == 'string' else 'integers'} only")
        if self.pattern is not None:
            check_pattern(self.pattern, self.max_length)

    def as_data(self) -> dict:
        """The field as JSON data (an artifact's manifest, dead-letter replay)."""
        return {"path": self.path, "type": self.type, "column": self.column, "allowed": list(self.allowed),
                "min_length": self.min_length, "max_length": self.max_length, "pattern": self.pattern,
                "minimum": self.minimum, "maximum": self.maximum}

    @classmethod
    def from_data(cls, data: dict) -> Field:
        return cls(data["path"], data["type"], data["column"], tuple(data.get("allowed") or ()),
                   data.get("min_length"), data.get("max_length"), data.get("pattern"), data.get("minimum"),
                   data.get("maximum"))


def with_contract(fields: list[Field], contract: InputContract) -> list[Field]:
    """The program's fields with the catalog's rules for this input on top."""
    result = []
    for field in fields:
        rules = merged_rules(field.as_data(), contract)
        rules["allowed"] = tuple(rules.get("allowed") or ())
        result.append(replace(field, **rules))
    return result


def parse_input(raw: DataFrame, app: AppSpec, role: str, fields: list[Field]) -> DataFrame:
    """`parse` with everything the catalog says about this input of the app: its size limit, key
    rule and input contract (field rules, depth, event-time bounds). What every program calls.
    Inside `shared_parses()` (the driver's, for a query that uses the result in several branches)
    the parsed rows are read and parsed once per batch whatever the program builds on them."""
    contract = app.contract(role)
    parsed = parse(raw, with_contract(fields, contract), app.max_record_bytes, key_field=app.input_keys.get(role),
                   contract=contract)
    return _shared(parsed, role) if _SHARING.get() else parsed


# The driver's switch for `parse_input`, and the names of the barriers it puts in plans.
_SHARING: ContextVar[bool] = ContextVar("streamops_shared_parses", default=False)
SHARED_PARSE_PREFIX = "streamops.shared_parse."
_shared_ids = itertools.count(1)
_PACKED = "_streamops_parsed"


@contextlib.contextmanager
def shared_parses() -> Iterator[None]:
    """While open, `parse_input` returns parsed rows that Spark reads and parses once per batch
    however many branches use them (the dead letters and a stateful operator's outputs, unioned).
    A union of two branches of one parsed frame is, in Spark's plan, two scans of the source and
    two parses: Spark shares work between branches only at an exchange that both branches hold
    whole (ReuseExchange), so the parsed rows go through one, packed as one struct column, with an
    observation above it (Spark's optimizer moves neither filters nor column pruning through an
    observation, which would make the two branches' exchanges differ). The cost is a shuffle of
    the parsed rows; the driver uses it only for a query that reads a source more than once."""
    token = _SHARING.set(True)
    try:
        yield
    finally:
        _SHARING.reset(token)


def _event_json() -> Column:
    """The whole value as VARIANT (parse's `event_json`): computed only where a program reads it."""
    return F.variant_get(_in_brackets(_text()), "$[0]", "variant").alias("event_json")


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _shared(parsed: DataFrame, role: str) -> DataFrame:
    # event_json stays out of the exchange and is made again above it: packed, it would be computed
    # (a second parse of every value) whether or not a branch reads it, since Spark prunes no field
    # of a struct through the barrier.
    columns = parsed.columns
    packed = parsed.select(F.struct(*[F.col(_quoted(c)) for c in columns if c != "event_json"]).alias(_PACKED))
    # Hashed on the source partition: its records stay in one task and in their order (a dead
    # letter topic's readers see them as the source had them), deterministic on a retry.
    spread = packed.repartition(F.col(f"{_PACKED}.topic"), F.col(f"{_PACKED}.partition"))
    barrier = spread.observe(f"{SHARED_PARSE_PREFIX}{role}.{next(_shared_ids)}", F.count(F.lit(1)).alias("records"))
    unpacked = barrier.select(f"{_PACKED}.*")
    return unpacked.select(*[_event_json() if c == "event_json" else F.col(_quoted(c)) for c in columns])


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
    # contains() searches bytes; instr() counts characters up to the match (0.8 s of 2.9 s over 200,000 records).
    return ~text.contains("]") | (F.json_array_length(F.concat(F.lit("["), text, F.lit(",0]"))) == 2)


def _starts_an_object(text: Column) -> Column:
    # Valid JSON text whose first non-whitespace character is '{' is an object.
    return F.substring(F.ltrim(text, F.lit(_JSON_WHITESPACE)), 1, 1) == "{"


def _no_lone_surrogate(text: Column) -> Column:
    # The regex runs only on values with a \u escape (rare), so the common case stays cheap.
    return ~text.contains("\\u") | ~text.rlike(_LONE_SURROGATE)


def _timestamp_in_range(ts: Column) -> Column:
    micros = F.unix_micros(ts)
    return (micros >= F.lit(_FIRST_MICROS)) & (micros <= F.lit(_LAST_MICROS))


def _deeper_than(text: Column, limit: int) -> Column:
    """The text nests containers more than `limit` levels deep. Cheap for almost every record:
    only a text with more than `limit` brackets at all is measured (strings blanked, then the
    innermost containers removed `limit` times: a pair left means a deeper level). Works on text
    that does not parse too (an unclosed bracket is no level), so its reason can be right."""
    # Counted in bytes ('{' and '[' are one byte in UTF-8, never part of another character) with
    # replace(), which searches bytes: translate() looked every character up in a map (1 s in 200,000 records).
    brackets = F.octet_length(text) - F.octet_length(F.replace(F.replace(text, F.lit("{"), F.lit("")), F.lit("["), F.lit("")))
    blanked = F.regexp_replace(text, JSON_STRING_REGEX, '""')
    reduced = F.aggregate(F.sequence(F.lit(1), F.lit(limit)), blanked,
                          lambda rest, _: F.regexp_replace(rest, INNERMOST_CONTAINER_REGEX, "0"))
    return (brackets > limit) & reduced.rlike(INNERMOST_CONTAINER_REGEX)


def _processing_time() -> Column:
    """The time a record is processed, read per record from the JVM's clock. Not
    current_timestamp(): Spark folds that into a literal per micro-batch, the literal is compiled
    into the generated code, so every batch (and every backfill pass) compiled the parse anew and
    ran it cold (streamops bench parse: 82,000 against 114,000 records/s)."""
    return F.timestamp_millis(F.expr("java_method('java.lang.System', 'currentTimeMillis')").cast("bigint"))


def _record_time(raw_columns: list[str]) -> tuple[Column, Column]:
    """(The record's Kafka timestamp, the earlier of it and the time of processing.) A frame
    without Kafka timestamps (dead-letter replay, which writes the record anew) counts as written
    now."""
    now = _processing_time()
    kafka = F.coalesce(F.col("timestamp"), now) if "timestamp" in raw_columns else now
    return kafka, F.least(kafka, now)


def _past_limit_micros(kafka_time: Column, past_ms: int) -> Column:
    """The earliest event time max_past allows: max_past before the Kafka timestamp, and never
    more than twice that before the time of processing (a producer that sets its Kafka timestamps
    to a zero date, 1970 or year 1, gets no pass from them). A re-run within max_past of the live
    run judges the same."""
    past_us = past_ms * 1000
    return F.greatest(F.unix_micros(kafka_time) - F.lit(past_us), F.unix_micros(_processing_time()) - F.lit(2 * past_us))


def within_future_bound(frame: DataFrame, event_time: str, contract: InputContract) -> DataFrame:
    """Rows whose `event_time` keeps the contract's max_future against their Kafka `timestamp`:
    for a query that reads back an app's own output (records the input bounds already passed),
    so a record another writer put there cannot move its watermark."""
    if contract.max_future is None:
        return frame
    return frame.where(
        _in_bounds(F.col(event_time), contract.model_copy(update={"max_past": None}), *_record_time(frame.columns))
    )


def _field_ok(field: Field, value: Column) -> Column:
    """The field rules (length, pattern, allowed-value, range) hold for a value of the right type."""
    ok = F.lit(True)
    if field.min_length is not None:
        ok = ok & (F.length(value) >= field.min_length)
    if field.max_length is not None:
        ok = ok & (F.length(value) <= field.max_length)
    if field.pattern is not None:
        ok = ok & value.rlike(whole_match(field.pattern))
    if field.allowed:
        ok = ok & value.isin(*field.allowed)
    if field.minimum is not None:
        ok = ok & (value >= F.lit(field.minimum))
    if field.maximum is not None:
        ok = ok & (value <= F.lit(field.maximum))
    return ok


def _in_bounds(ts: Column, contract: InputContract, kafka_time: Column, reference: Column) -> Column:
    ok = F.lit(True)
    future_ms, past_ms = contract.max_future_ms(), contract.max_past_ms()
    if future_ms is not None:
        ok = ok & (F.unix_micros(ts) <= F.unix_micros(reference) + F.lit(future_ms * 1000))
    if past_ms is not None:
        ok = ok & (F.unix_micros(ts) >= _past_limit_micros(kafka_time, past_ms))
    return ok


def parse(
    raw: DataFrame, fields: list[Field], max_record_bytes: int, key_field: str | None = None,
    contract: InputContract | None = None,
) -> DataFrame:
    """Add a column per field, `event_json` (the whole value as VARIANT) and `error`.

    `key_field`: the catalog's key rule for this input (apps[].input_keys): the Kafka key must
    equal this string field. `contract`: the input's depth and event-time bounds (the field
    rules are on `fields`: see `parse_input`). Three paths, each for fewer records: the JVM-side
    pass (streamops.contract.StrictJsonFields: the JSON-level rules and the typed fields in one
    pass of Jackson) decides most records good; the records it does not take get Spark's own
    checks (VARIANT), which decide good or bad; only the bad ones get the checks that name the
    exact rule. (CASE WHEN evaluates a branch for the rows that reach it only.) The JVM pass never
    refuses a record: a record it does not take costs the Spark checks, nothing else.
    """
    if contract is None:
        # A program written before the catalog's input_contract: the defaults protect it, but what
        # the catalog says for this input does not reach it.
        log.warning("records.parse without the input's contract: the catalog's apps[].input_contract does not apply "
                    "(defaults: max_depth 64, max_future 5 minutes, max_past 3650 days); call "
                    "records.parse_input(frame, app, role, fields) instead")
        contract = DEFAULT_CONTRACT
    if key_field is not None and not any(f.path == key_field and f.type == "string" for f in fields):
        raise ValueError(
            f"key rule: the key must equal field {key_field!r}, but the input's fields have no string field of that name "
            f"(fields: {', '.join(f.path for f in fields)})"
        )
    text = _text()
    staged = with_source_columns(raw)
    # The columns parse returns first, in their order (a field may replace one in place, e.g. event_id).
    source = [c for c in staged.columns if c != OPERATOR_SKIP]
    kafka_time, reference = _record_time(raw.columns)
    size = F.length(F.col("value"))
    # The rules on the record's bytes and on its typed fields (not its JSON structure): the same
    # whichever path read the fields.
    bytes_ok = F.col("value").isNotNull() & (size <= max_record_bytes) & F.is_valid_utf8(text)

    def field_rules(values: dict[str, Column]) -> Column:
        ok = bytes_ok
        for field in fields:
            value = values[field.column]
            if field.type == "timestamp":
                ok = ok & _timestamp_in_range(value) & _in_bounds(value, contract, kafka_time, reference)
            else:
                ok = ok & _field_ok(field, value)
        if key_field is not None:
            ok = ok & (F.col("key").cast("string") == values[_column_of(fields, key_field)])
        return ok

    # 1. The JVM pass: the typed fields of a record it takes, every rule then checked on them.
    fast = _strict_json_fields(raw, fields, contract.max_depth)
    fast_values: dict[str, Column] = {}
    if fast is None:
        taken = F.lit(False)
    else:
        staged = staged.withColumn("_fast", fast)
        for i, field in enumerate(fields):
            value = F.col("_fast")[f"f{i}"]
            if field.type == "timestamp":
                # The JVM pass checks JSON types only: the text's form is checked here, as below.
                value = F.when(value.rlike(_RFC3339), F.try_to_timestamp(value))
            fast_values[field.column] = value
        staged = staged.withColumn("_taken", F.col("_fast").isNotNull() & F.coalesce(field_rules(fast_values), F.lit(False)))
        taken = F.col("_taken")
    # 2. Spark's checks, for the records the JVM pass did not take (all of them without it): the
    # value parsed as VARIANT (null for a record taken above, so it costs those nothing).
    staged = staged.withColumn("_in_brackets", F.when(taken, F.lit(None)).otherwise(_in_brackets(text)))
    doc = F.variant_get(F.col("_in_brackets"), "$[0]", "variant")
    json_ok = (
        # Null when not JSON, and for duplicate member names at any depth
        # (spark.sql.variant.allowDuplicateKeys is false, Spark's default).
        doc.isNotNull()
        # (An array or scalar has no fields, so the field checks below refuse it.)
        & F.variant_get(F.col("_in_brackets"), "$[1]", "variant").isNull()
        & _nothing_after_a_bracket(text)
        & _no_lone_surrogate(text)
        & ~_deeper_than(text, contract.max_depth)
    )
    # Each field's JSON value once (a small VARIANT), then its exact type and typed value from it.
    staged = staged.select("*", *[F.variant_get(doc, _json_path(f), "variant").alias(f"_json_{f.column}") for f in fields])
    spark_values: dict[str, Column] = {}
    for field in fields:
        present = F.col(f"_json_{field.column}")
        actual_type = F.schema_of_variant(present)
        if field.type == "bigint":
            spark_values[field.column] = F.try_variant_get(present, "$", "bigint")
            json_ok = json_ok & actual_type.isin(*_INTEGER_TYPES)
            continue
        as_text = F.try_variant_get(present, "$", "string")
        json_ok = json_ok & (actual_type == "STRING")
        if field.type == "timestamp":
            spark_values[field.column] = F.try_to_timestamp(as_text)
            json_ok = json_ok & as_text.rlike(_RFC3339)
        else:
            spark_values[field.column] = as_text
    for field in fields:
        value = spark_values[field.column]
        if fast is not None:
            value = F.when(taken, fast_values[field.column]).otherwise(value)
        staged = staged.withColumn(field.column, value)
    good_by_spark = F.coalesce(json_ok & field_rules({f.column: F.col(f.column) for f in fields}), F.lit(False))
    # 3. The reason, for the records neither took: built inside a lambda so that subexpression
    # elimination cannot hoist its checks out of the CASE and run them on every row (measured: 3x slower).
    reason = F.transform(
        F.array(F.col("_in_brackets")),
        lambda wrapped: _reason(wrapped, fields, max_record_bytes, key_field, contract, raw.columns),
    )[0]
    error = F.when(taken | good_by_spark, F.lit(None).cast("string")).otherwise(reason)
    # Named in the app's skip list by an operator (recover_skip_records; the driver's source adds
    # the column): the operator's reason is the error, before any check of the record itself.
    if OPERATOR_SKIP in raw.columns:
        error = F.coalesce(F.col(OPERATOR_SKIP), error)
    staged = staged.withColumn("error", error)
    # The whole value as VARIANT, for a program that reads it (computed only then). Columns in the
    # order parse has always given: the source's, event_json, the other fields, error.
    added = [c for c in dict.fromkeys([f.column for f in fields] + ["error"]) if c not in source]
    event_json = _event_json()
    if "event_json" in source:
        return staged.select(*[event_json if c == "event_json" else F.col(c) for c in source], *added)
    return staged.select(*source, event_json, *added)


# The JVM side of the input contract (build/maven/streamops-contract, on every driver's spark.jars).
_STRICT_JSON_FIELDS = "streamops.contract.StrictJsonFields"
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _strict_json_fields(raw: DataFrame, fields: list[Field], max_depth: int) -> Column | None:
    """The JVM pass over each value (streamops.contract.StrictJsonFields, registered on the frame's
    session): a struct of the fields' typed values (f0, f1, ... in the order of `fields`), null when
    it does not take the record. None when it cannot run here (its jar is not on this session's
    classpath, or a field name it does not read), and the parse goes by Spark's checks alone."""
    if settings.CONTRACT_JVM.get() == "off" or not fields or not all(_PLAIN_NAME.fullmatch(f.path) for f in fields):
        return None
    spec = ",".join(f"{'L' if f.type == 'bigint' else 'S'}:{f.path}" for f in fields)
    returns = StructType([StructField(f"f{i}", LongType() if f.type == "bigint" else StringType()) for i, f in enumerate(fields)])
    name = "streamops_strict_json_" + hashlib.sha256(spec.encode()).hexdigest()[:12]
    try:
        raw.sparkSession.udf.registerJavaFunction(name, _STRICT_JSON_FIELDS, returns)
    except Exception as error:  # noqa: BLE001 - py4j or Spark Connect: any failure means "not here"
        log.warning("records.parse: the input contract's JVM pass (%s) cannot run on this session, so Spark's checks "
                    "parse every record (slower, the same outcome): %s", _STRICT_JSON_FIELDS, str(error).splitlines()[0])
        return None
    return F.call_function(name, F.col("value"), F.lit(max_depth), F.lit(spec))


def _rule_checks(field: Field, value: Column) -> list[tuple[Column, Column]]:
    """(broken, reason) for each of the field's rules, in the order `_field_ok` checks them."""
    name = _pct(f"field '{field.path}'")
    checks: list[tuple[Column, Column]] = []
    if field.min_length is not None:
        need = "must not be empty" if field.min_length == 1 else f"must have at least {field.min_length} characters"
        checks.append((F.length(value) < field.min_length, F.format_string(
            f"{name} {need}, got '%s' (%d characters) (input contract length)", shown(value), F.length(value))))
    if field.max_length is not None:
        checks.append((F.length(value) > field.max_length, F.format_string(
            f"{name} must have at most {field.max_length} characters, got %d: '%s' (input contract length)",
            F.length(value), shown(value))))
    if field.pattern is not None:
        checks.append((~value.rlike(whole_match(field.pattern)), F.format_string(
            f"{name} does not match the pattern %s: '%s' (input contract pattern)",
            F.lit(_shown_pattern(field.pattern)), shown(value))))
    if field.allowed:
        allowed = _pct(", ".join(field.allowed))
        checks.append((~value.isin(*field.allowed), F.format_string(
            f"{name} must be one of {allowed}, got '%s' (input contract allowed-value)", shown(value))))
    if field.minimum is not None:
        checks.append((value < F.lit(field.minimum), F.format_string(
            f"{name} is %d, below the minimum {field.minimum} (input contract range)", value)))
    if field.maximum is not None:
        checks.append((value > F.lit(field.maximum), F.format_string(
            f"{name} is %d, above the maximum {field.maximum} (input contract range)", value)))
    return checks


def _shown_pattern(pattern: str) -> str:
    return pattern if len(pattern) <= 100 else pattern[:97] + "..."


def _bound_checks(
    field: Field, ts: Column, as_text: Column, contract: InputContract, kafka_time: Column, reference: Column,
    has_kafka_time: bool,
) -> list[tuple[Column, Column]]:
    """(broken, reason) for the event-time bounds, naming the time the field was compared with."""
    name = _pct(f"field '{field.path}'")
    checks: list[tuple[Column, Column]] = []
    future_ms, past_ms = contract.max_future_ms(), contract.max_past_ms()
    processed, kafka = F.lit("the time it was processed"), F.lit("the record's Kafka timestamp")
    if future_ms is not None:
        compared = F.when((reference < kafka_time) | F.lit(not has_kafka_time), processed).otherwise(kafka)
        checks.append((
            F.unix_micros(ts) > F.unix_micros(reference) + F.lit(future_ms * 1000),
            F.format_string(
                f"{name} '%s' is more than {contract.max_future} after %s %s (input contract event-time: "
                f"max_future {contract.max_future})", shown(as_text), compared, iso_time(reference),
            ),
        ))
    if past_ms is not None and contract.max_past is not None:
        by_kafka = F.unix_micros(ts) < F.unix_micros(kafka_time) - F.lit(past_ms * 1000)
        checks.append((
            by_kafka & F.lit(has_kafka_time),
            F.format_string(
                f"{name} '%s' is more than {contract.max_past} before the record's Kafka timestamp %s (input contract "
                f"event-time: max_past {contract.max_past})", shown(as_text), iso_time(kafka_time),
            ),
        ))
        twice = _twice(contract.max_past)
        checks.append((
            F.unix_micros(ts) < _past_limit_micros(kafka_time, past_ms),
            F.format_string(
                f"{name} '%s' is more than {twice} before the time it was processed %s, and its Kafka timestamp is too old "
                f"to go by (input contract event-time: max_past {contract.max_past}, at most twice that before processing)",
                shown(as_text), iso_time(_processing_time()),
            ),
        ))
    return checks


def _twice(duration: str) -> str:
    amount, unit = duration.split()
    return f"{int(amount) * 2} {unit.rstrip('s')}s"


def _pct(text: str) -> str:
    """Text put into a format_string template, its '%' escaped (a value set or a field name may hold one)."""
    return text.replace("%", "%%")


def _column_of(fields: list[Field], path: str) -> str:
    return next(f.column for f in fields if f.path == path)


def _reason(
    wrapped: Column, fields: list[Field], max_record_bytes: int, key_field: str | None, contract: InputContract,
    raw_columns: list[str],
) -> Column:
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
        (F.col("value").isNull(), F.lit("empty value (null): a tombstone is not an event (input contract value-present)")),
        (
            size > max_record_bytes,
            F.format_string(f"record is %d bytes, over the {max_record_bytes}-byte limit (input contract size)", size),
        ),
        (~F.is_valid_utf8(text), F.lit("value is not UTF-8 (input contract utf-8: RFC 8259 §8.1)")),
        (
            text.startswith("\ufeff"),
            F.lit("value starts with a byte order mark (input contract utf-8: RFC 8259 §8.1 forbids it)"),
        ),
        (
            # Before the JSON checks: past the parser's own limit a value does not parse at all.
            _deeper_than(text, contract.max_depth),
            F.lit(f"value is nested more than {contract.max_depth} levels deep (input contract depth: at most "
                  f"{contract.max_depth}, so that common JSON decoders can read what the app writes)"),
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
            text.contains("\\u") & (surrogate != ""),
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
        (doc.isNull(), F.lit("value is not valid JSON (input contract json: RFC 8259)")),
        (~_starts_an_object(text), F.lit("value is not a JSON object (input contract object)")),
    ]
    kafka_time, reference = _record_time(raw_columns)
    has_kafka_time = "timestamp" in raw_columns
    for field in fields:
        path = _json_path(field)
        present = F.variant_get(doc, path, "variant")
        actual_type = F.schema_of_variant(present)
        checks += [
            (present.isNull(), F.lit(f"missing field '{field.path}' (input contract field-present)")),
            (
                F.is_variant_null(present),
                F.lit(f"field '{field.path}' is null, not {_TYPE_NAMES[field.type]} (input contract field-present)"),
            ),
        ]
        if field.type == "bigint":
            literal = F.to_json(present)
            number = F.try_variant_get(present, "$", "bigint")
            checks += [
                (
                    # An integral literal of 19+ digits; shorter DECIMAL(p,0) values came from '1.0'.
                    actual_type.rlike(r"^DECIMAL\((19|[2-9][0-9]),0\)\z"),
                    F.format_string(
                        f"field '{_pct(field.path)}' is an integer outside the int64 range: %s (input contract field-type)",
                        shown(literal),
                    ),
                ),
                (
                    ~actual_type.isin(*_INTEGER_TYPES),
                    F.format_string(
                        f"field '{_pct(field.path)}' must be an integer, got %s (input contract field-type)",
                        shown(actual_type),
                    ),
                ),
                *_rule_checks(field, number),
            ]
            continue
        as_text = F.try_variant_get(doc, path, "string")
        checks.append(
            (
                actual_type != "STRING",
                F.format_string(
                    f"field '{_pct(field.path)}' must be {_TYPE_NAMES[field.type]}, got %s (input contract field-type)",
                    shown(actual_type),
                ),
            )
        )
        if field.type == "timestamp":
            ts = F.try_to_timestamp(as_text)
            checks += [
                (
                    as_text.rlike(_NO_OFFSET),
                    F.format_string(
                        f"field '{_pct(field.path)}' has no timezone offset: '%s' (input contract timestamp)",
                        shown(as_text),
                    ),
                ),
                (
                    ~as_text.rlike(_RFC3339),
                    F.format_string(
                        f"field '{_pct(field.path)}' is not an RFC 3339 date-time YYYY-MM-DDTHH:MM:SS[.ffffff](Z|±HH:MM): '%s' "
                        "(input contract timestamp)",
                        shown(as_text),
                    ),
                ),
                (
                    ts.isNull(),
                    F.format_string(
                        f"field '{_pct(field.path)}' is not a valid date and time: '%s' (a day the month has, seconds 00-59, an "
                        "offset within ±18:00; input contract timestamp)",
                        shown(as_text),
                    ),
                ),
                (
                    ~_timestamp_in_range(ts),
                    F.format_string(
                        f"field '{_pct(field.path)}' is outside years 0001-9999 in UTC: '%s' (input contract timestamp)",
                        shown(as_text),
                    ),
                ),
                *_bound_checks(field, ts, as_text, contract, kafka_time, reference, has_kafka_time),
            ]
        else:
            checks += _rule_checks(field, as_text)
    if key_field is not None:
        key = F.col("key").cast("string")
        expected = F.try_variant_get(doc, _json_path(Field(key_field, "string", key_field)), "string")
        rule = f"(input contract key: the catalog keys this input by field '{key_field}')"
        checks += [
            (F.col("key").isNull(), F.lit(f"record has no key; it must equal field '{key_field}' {rule}")),
            (~F.is_valid_utf8(key), F.lit(f"key is not UTF-8 {rule}")),
            (
                key != expected,
                F.format_string(f"key '%s' does not equal field '{key_field}' '%s' {rule}", shown(key), shown(expected)),
            ),
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


def struct_of(record: type[BaseModel], columns: dict[str, Column]) -> Column:
    """struct(...) of `columns`, named and ordered as the fields of `record`, the model its readers
    validate with (streamops.runtime_records): a field without a column, or a column the model
    lacks, is refused here, so the writer and its readers cannot drift apart."""
    fields = list(record.model_fields)
    missing, unknown = [f for f in fields if f not in columns], [c for c in columns if c not in record.model_fields]
    if missing or unknown:
        raise ValueError(f"the {record.__name__} struct does not match its model: "
                         + "; ".join(f"{what}: {', '.join(names)}" for what, names in
                                     (("no column for", missing), ("not in the model", unknown)) if names))
    return F.struct(*(columns[name].alias(name) for name in fields))


def dead_letter_record(spec: AppSpec, version: str) -> Column:
    """The dead letter of a parsed row with an error, as struct(key, value, topic) for the sink.

    The envelope (JSON, a streamops.runtime_records.DeadLetterEnvelope: its struct is built from
    that model's fields) names the reason, the app and the source record (topic, partition,
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
    envelope = struct_of(DeadLetterEnvelope, {
        "app": F.lit(spec.name),
        "app_version": F.lit(version),
        "reason": F.when(key_inline & value_inline, reason).otherwise(F.concat(reason, note)),
        "failed_at": F.date_format(_processing_time(), SPARK_ISO_MS_OFFSET),
        "source": struct_of(DeadLetterSource, {
            "topic": F.col("topic"),
            "partition": F.col("partition"),
            "offset": F.col("offset"),
            "timestamp": F.date_format(F.col("timestamp"), SPARK_ISO_MS_OFFSET),
        }),
        "original_key_base64": F.when(key_inline, F.base64(key)),
        "original_value_base64": F.when(value_inline, F.base64(value)),
        "original_key_stored": _stored(key, key_inline),
        "original_value_stored": _stored(value, value_inline),
        "original_key_bytes": key_size,
        "original_value_bytes": value_size,
        "original_key_sha256": F.sha2(key, 256),
        "original_value_sha256": F.sha2(value, 256),
        "original_value_preview": F.substring(value.cast("string"), 1, PREVIEW_CHARS),
    })
    return F.struct(
        F.when(key_inline, key).alias("key"), F.to_json(envelope).alias("value"), F.lit(spec.dead_letter_topic).alias("topic")
    )


def dead_letters(parsed: DataFrame, spec: AppSpec, version: str) -> DataFrame:
    """Rows with an error as dead-letter records (key, value, topic) for the Kafka sink. A query
    that unions these with its good records' outputs reads every source record twice: a stateless
    program builds both with `with_dead_letters` instead."""
    return parsed.where(F.col("error").isNotNull()).select(dead_letter_record(spec, version).alias("dead")).select("dead.*")


def with_dead_letters(parsed: DataFrame, spec: AppSpec, version: str, outputs: Column) -> DataFrame:
    """The output records of one parsed input, good records and dead letters together, from one
    read and one parse of each source record (the Kafka sink's (key, value, topic) rows).

    `outputs` says what a good record writes: a struct of key, value and topic (one output
    record), or an array of them (none, one or several: the router's categories); a null or empty
    array writes nothing. Every record with an `error` becomes its dead letter instead. Building
    both from one row (Spark's explode) instead of a union of two branches is what keeps the
    read single: a union of `records.good(parsed)` and `records.dead_letters(parsed, ...)` makes
    Spark read and parse every source record once per branch (the driver warns of such a query).
    Keys and values are written as bytes (text as its UTF-8 bytes, as the Kafka sink writes it)."""
    kind = parsed.select(outputs.alias("outputs")).schema["outputs"].dataType
    element = kind.elementType if isinstance(kind, ArrayType) else kind
    if not isinstance(element, StructType):
        raise TypeError(f"{spec.name}: records.with_dead_letters takes a struct (key, value, topic) or an array of them "
                        f"as the outputs of a good record, not {kind.simpleString()}")
    missing = [name for name in ("value", "topic") if name not in element.fieldNames()]
    if missing:
        raise TypeError(f"{spec.name}: the outputs given to records.with_dead_letters have no {' or '.join(missing)} "
                        f"field ({element.simpleString()}); each output record is a struct of key, value and topic")
    has_key = "key" in element.fieldNames()

    def sink_record(record: Column, keyed: bool = True) -> Column:
        return F.struct(
            (record["key"] if keyed else F.lit(None)).cast("binary").alias("key"),
            record["value"].cast("binary").alias("value"),
            record["topic"].cast("string").alias("topic"),
        )

    written = F.transform(outputs if isinstance(kind, ArrayType) else F.array(outputs), lambda o: sink_record(o, has_key))
    every = F.when(F.col("error").isNotNull(), F.array(sink_record(dead_letter_record(spec, version)))).otherwise(written)
    return parsed.select(F.explode(every).alias("output")).select("output.*")


def original_json() -> Column:
    """A valid record's value as JSON text without the whitespace around it, to embed as is."""
    return F.btrim(_text(), F.lit(_JSON_WHITESPACE))


def good(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("error").isNull())


def iso_ms(epoch_ms: SupportsInt) -> str:
    """Epoch milliseconds as ISO-8601 UTC text with milliseconds ('...T01:00:00.123Z'), the text
    `iso_time` writes in SQL: programs call it in Spark's Python workers, with whatever whole number
    their data holds (an int, a numpy integer, a float of a column with nulls). The format is
    streamops.timestamps'."""
    return timestamps.iso_ms(int(epoch_ms))


def iso_time(column: str | Column) -> Column:
    """A timestamp as ISO-8601 text in UTC with milliseconds, as every output writes times."""
    return F.date_format(column, SPARK_ISO_MS)


def windowed_counts(
    frame: DataFrame, key: str, event_time: str, window: str, slide: str, watermark: str, topic: str,
    distinct_by: str | None = None,
) -> DataFrame:
    """Rows per `key` in `window` windows every `slide` on event time, as update records
    (key `<key>|<window start>`, value {key, window_start, window_end, count}).

    `distinct_by`: a column that identifies a record (an id the writer gives it), so a record
    delivered twice counts once. Kafka sinks write at least once (a task retried after a lost
    executor writes its records again): a query counting a topic with such copies counts them
    unless it drops the copies first. A stream drops them within the watermark (a copy later than
    that would be dropped as late by the count anyway); a batch read of the same records (a
    backfill, a reconciliation's recount) drops every copy."""
    timed = frame.withWatermark(event_time, watermark)
    if distinct_by is not None:
        timed = timed.dropDuplicatesWithinWatermark([distinct_by]) if frame.isStreaming else timed.dropDuplicates([distinct_by])
    counted = timed.groupBy(F.window(event_time, window, slide), key).count()
    start, end = iso_time("window.start"), iso_time("window.end")
    value = F.struct(F.col(key), start.alias("window_start"), end.alias("window_end"), F.col("count"))
    return counted.select(
        F.concat_ws("|", F.col(key), start).alias("key"), F.to_json(value).alias("value"), F.lit(topic).alias("topic")
    )
