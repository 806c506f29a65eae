"""Expectation suites: JSON files in catalog/expectations/, named by the topic's catalog entry.

A suite is a GX 1.x ExpectationSuite document. Values that the catalog already states (a
category's op types, a window size, the notification text) are not repeated in the suite: it
names them as parameters, filled in from the catalog entry of the app that writes the topic:

- in an expectation's kwargs, GX's own form: `"value_set": {"$PARAMETER": "categories"}`;
- inside an `unexpected_rows_query` (SQL, where GX has no parameters): `${window_ms}`.

Which parameters exist follows from the writing app's settings alone (`suite_parameters`), so a
suite for a program the suite has never seen needs no code here.

Expectations with `"meta": {"reconciliation": ...}` are cross-record checks: they run on a
reconciliation batch built from the app's input (see reconcile.py), not on the topic's records.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

from streamops.catalog import AppSpec, Catalog, TopicSpec
from streamops.input_contract import INNERMOST_CONTAINER_REGEX, JSON_STRING_REGEX, merged_rules, whole_match
from streamops.kafka_offsets import DURATION_PATTERN, duration_ms
from streamops.programs import program_info, running_version, settings_dict


class SuiteError(ValueError):
    """A suite file that cannot be used, with the file and the expectation named."""


@dataclass(frozen=True)
class TopicSuite:
    """One topic's suite, split by the batch each part runs on, with its parameters."""

    topic: str
    path: Path
    name: str
    record_expectations: list[dict]
    reconciliation: str | None  # kind of reconciliation batch needed, or None
    reconciliation_expectations: list[dict]
    parameters: dict
    meta: dict


def suite_parameters(catalog: Catalog, topic: str) -> dict:
    """The parameters a topic's suite may use, from the catalog entry of the app that writes it
    (no program code: the same rule for every program):

    - `app` (a one-value set), `role` (the output role of the topic, a one-value set);
    - every setting by its name: a mapping keyed by the app's output roles gives this topic's
      entry (the router's `categories` -> this category's op types), any other value itself;
    - a Spark interval setting also as milliseconds, `<name>_ms`; a single value also as a
      one-value set, `<name>_values` (for `value_set`);
    - for the dead-letter topic: `app` and `source_topics` (the app's inputs)."""
    writer = catalog.writer(topic)
    if writer is None:
        return {}
    app, role = writer
    if role == "dead_letters":
        return {"app": [app.name], "source_topics": sorted(app.inputs.values())}
    parameters: dict = {"app": [app.name], "role": [role]}
    for name, value in settings_dict(app).items():
        if isinstance(value, dict):
            if set(value) == set(app.outputs):
                parameters[name] = value[role]
            continue
        parameters[name] = value
        if not isinstance(value, list):
            parameters[f"{name}_values"] = [value]
        if isinstance(value, str) and re.fullmatch(DURATION_PATTERN, value):
            parameters[f"{name}_ms"] = duration_ms(value)
    return parameters


# How each value_schema type looks in JSON (Spark's schema_of_variant names), and in words.
_JSON_TYPES = {
    "string": ("= 'STRING'", "a string"),
    "bigint": ("IN ('TINYINT', 'SMALLINT', 'INT', 'BIGINT')", "an integer"),
    "double": ("RLIKE '^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL.*)$'", "a number"),
    "boolean": ("= 'BOOLEAN'", "true or false"),
    "timestamp": ("= 'STRING'", "a time string"),
    "json": ("RLIKE '^(OBJECT|ARRAY)'", "an object or array"),
}
# Every output writes times as UTC with milliseconds (records.iso_time), years 0001-9999.
# (No braces: the query is formatted with {batch}.)
_D2 = "[0-9][0-9]"
OUTPUT_TIME = rf"^(?!0000){_D2}{_D2}-{_D2}-{_D2}T{_D2}:{_D2}:{_D2}[.][0-9]{_D2}Z$"
_FIELD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
VALUE_CONTRACT = "value contract"


@dataclass(frozen=True)
class OutputRules:
    """What the writing app's input contract says about the fields it copies to an output: per
    output field (an input field's column name), its rules; the nesting depth an output may have
    (the inputs' deepest, plus the one level the app's envelope adds); per timestamp field, how far
    it may lie after the record's Kafka timestamp (the inputs' max_future, written no earlier)."""

    fields: dict[str, dict]
    max_depth: int | None = None
    max_future: dict[str, str] = dataclasses.field(default_factory=dict)


def output_rules(catalog: Catalog, topic: str) -> OutputRules:
    """The input contract's rules as they hold on `topic`, from the app that writes it. A field
    several inputs carry keeps a rule only if every one of them has it (the loosest value)."""
    writer = catalog.writer(topic)
    if writer is None or writer[1] == "dead_letters":
        return OutputRules({})
    app = writer[0]
    declared = program_info(app, running_version(app)).input_fields
    per_column: dict[str, list[dict]] = {}
    futures: dict[str, list[str | None]] = {}
    depths = []
    for role in app.inputs:
        contract = app.contract(role)
        depths.append(contract.max_depth)
        for field in declared.get(role, []):
            per_column.setdefault(field["column"], []).append(merged_rules(field, contract))
            if field["type"] == "timestamp":
                futures.setdefault(field["column"], []).append(contract.max_future)
    fields = {column: rules for column, seen in per_column.items() if (rules := _loosest(seen))}
    max_future = {column: max(bounds, key=duration_ms) for column, bounds in futures.items()  # type: ignore[arg-type]
                  if None not in bounds}
    return OutputRules(fields, max(depths) + 1 if depths else None, max_future)  # type: ignore[arg-type]


def _loosest(seen: list[dict]) -> dict:
    rules: dict = {}
    for name, pick in (("min_length", min), ("max_length", max), ("minimum", min), ("maximum", max)):
        if all(name in r for r in seen):
            rules[name] = pick(r[name] for r in seen)
    if all("pattern" in r for r in seen) and len({r["pattern"] for r in seen}) == 1:
        rules["pattern"] = seen[0]["pattern"]
    if all("allowed" in r for r in seen):
        rules["allowed"] = sorted({value for r in seen for value in r["allowed"]})
    return rules


def _sql_text(text: str) -> str:
    """A Spark SQL string literal of `text`, inside a query GX formats ({batch}): braces doubled."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("{", "{{").replace("}", "}}") + "'"


# The apps' depth check in SQL (records._deeper_than): strings blanked, innermost containers
# removed once per level; a pair left over is a level too deep. Only for values with more brackets.
_TWO_QUOTES = '""'


def _deeper_than_sql(value: str, limit: int) -> str:
    brackets = f"length({value}) - length(translate({value}, {_sql_text('{[')}, ''))"
    innermost = _sql_text(INNERMOST_CONTAINER_REGEX)
    blanked = f"regexp_replace({value}, {_sql_text(JSON_STRING_REGEX)}, {_sql_text(_TWO_QUOTES)})"
    reduced = f"aggregate(sequence(1, {limit}), {blanked}, (rest, level) -> regexp_replace(rest, {innermost}, '0'))"
    return f"({brackets} > {limit} AND {reduced} RLIKE {innermost})"


def _rule_problems(path: str, kind: str, rules: dict, max_future: str | None, doc: str) -> list[tuple[str, str]]:
    """(condition, message) per input-contract rule of one output field (present and of its type)."""
    json_path = f"$.{path}"
    present = f"try_variant_get({doc}, '{json_path}', 'variant') IS NOT NULL"
    text = f"try_variant_get({doc}, '{json_path}', 'string')"
    number = f"try_variant_get({doc}, '{json_path}', 'bigint')"
    shown = f"substring({text}, 1, 100)"
    problems = []
    if kind == "string":
        if "min_length" in rules:
            need = "empty" if int(rules["min_length"]) == 1 else f"shorter than {int(rules['min_length'])} characters"
            problems.append((f"{present} AND char_length({text}) < {int(rules['min_length'])}",
                             f"concat('field {path} is \"', {shown}, '\", {need} (input contract length)')"))
        if "max_length" in rules:
            problems.append((f"{present} AND char_length({text}) > {int(rules['max_length'])}",
                             f"concat('field {path} has ', char_length({text}), "
                             f"' characters, more than {int(rules['max_length'])} (input contract length)')"))
        if "pattern" in rules:
            problems.append((f"{present} AND NOT {text} RLIKE {_sql_text(whole_match(rules['pattern']))}",
                             f"concat('field {path} is \"', {shown}, '\", not matching the input contract pattern ', "
                             f"{_sql_text(rules['pattern'])})"))
        if "allowed" in rules:
            values = ", ".join(_sql_text(v) for v in rules["allowed"])
            problems.append((f"{present} AND NOT {text} IN ({values})",
                             f"concat('field {path} is \"', {shown}, '\", not one of the input contract\\'s allowed values')"))
    if kind == "bigint":
        if "minimum" in rules:
            problems.append((f"{present} AND {number} < {int(rules['minimum'])}",
                             f"concat('field {path} is ', {number}, "
                             f"', below the minimum {int(rules['minimum'])} (input contract range)')"))
        if "maximum" in rules:
            problems.append((f"{present} AND {number} > {int(rules['maximum'])}",
                             f"concat('field {path} is ', {number}, "
                             f"', above the maximum {int(rules['maximum'])} (input contract range)')"))
    if kind == "timestamp" and max_future is not None:
        future_us = duration_ms(max_future) * 1000
        problems.append((f"{present} AND unix_micros(try_to_timestamp({text})) > unix_micros(timestamp) + {future_us}",
                         f"concat('field {path} is \"', {shown}, '\", more than {max_future} after the record\\'s Kafka "
                         f"timestamp (input contract event-time: max_future {max_future})')"))
    return problems


def value_contract_expectation(spec: TopicSpec, rules: OutputRules | None = None) -> dict:
    """One expectation, generated from the topic's value_schema, that every value keeps the
    input contract's rules downstream: exactly one JSON value, an object, no member name twice,
    each schema field (when present) of its JSON type, times in the outputs' form; and with
    `rules` (output_rules), the writing app's field rules, nesting depth and event-time bound.
    The offending rows name the first rule they break (column `problem`). Suites do not repeat it."""
    doc = "try_parse_json(value)"
    rules = rules or OutputRules({})
    problems = [
        # (A ']' after the value would close the brackets: the second count rules that out.)
        ("NOT coalesce(json_array_length(concat('[', value, ']')) = 1 AND (instr(value, ']') = 0 "
         "OR json_array_length(concat('[', value, ',0]')) = 2), false)", "'not exactly one JSON value'"),
        (f"{doc} IS NULL", "'not I-JSON: invalid JSON or a member name twice'"),
        (f"NOT schema_of_variant({doc}) LIKE 'OBJECT%'", "'not a JSON object'"),
    ]
    if rules.max_depth is not None:
        problems.append((_deeper_than_sql("value", rules.max_depth),
                         f"'nested more than {rules.max_depth} levels deep (input contract depth)'"))
    for path, kind in (spec.value_schema or {}).items():
        if not _FIELD_PATH.fullmatch(path):
            raise SuiteError(f"topic {spec.name!r}: value_schema field {path!r} cannot be checked (letters, digits, '_' and '.')")
        json_path = f"$.{path}"
        value = f"variant_get({doc}, '{json_path}', 'variant')"
        condition, words = _JSON_TYPES[kind]
        present = f"{value} IS NOT NULL AND NOT is_variant_null({value})"
        problems.append((f"{present} AND NOT schema_of_variant({value}) {condition}",
                         f"concat('field {path} is ', schema_of_variant({value}), ', not {words}')"))
        if kind == "timestamp":
            text = f"variant_get({doc}, '{json_path}', 'string')"
            # (The length too: the regex's $ would also pass a final line break.)
            problems.append((
                f"{present} AND NOT coalesce(length({text}) = 24 AND {text} RLIKE '{OUTPUT_TIME}' "
                f"AND try_to_timestamp({text}) IS NOT NULL, false)",
                f"concat('field {path} is \"', {text}, '\", not YYYY-MM-DDTHH:MM:SS.sssZ in years 0001-9999')",
            ))
        problems += _rule_problems(path, kind, rules.fields.get(path, {}), rules.max_future.get(path), doc)
    cases = " ".join(f"WHEN {condition} THEN {message}" for condition, message in problems)
    fields = ", ".join(f"{path} {kind}" for path, kind in (spec.value_schema or {}).items())
    return {
        "type": "unexpected_rows_expectation",
        "kwargs": {
            # Every field path in `cases` matched _FIELD_PATH above; {batch} is GX's own placeholder.
            "unexpected_rows_query": (
                f"SELECT partition, offset, key, problem FROM (SELECT partition, offset, key, CASE {cases} END AS problem "  # noqa: S608
                "FROM {batch} WHERE value IS NOT NULL) WHERE problem IS NOT NULL ORDER BY partition, offset"
            ),
        },
        "description": (f"{VALUE_CONTRACT} (generated from the catalog's value_schema): one JSON object per record, no member "
                        f"name twice, fields of their types ({fields}), times as YYYY-MM-DDTHH:MM:SS.sssZ in years 0001-9999"
                        + (", and the writing app's input contract (field rules, depth, event-time bound)"
                           if rules.max_depth is not None else "")),
        "meta": {"generated": "streamops.quality.suites.value_contract_expectation"},
    }


def writer_of(catalog: Catalog, topic: str) -> tuple[AppSpec, str]:
    writer = catalog.writer(topic)
    if writer is None:
        raise SuiteError(f"topic {topic!r} is written by no app in the catalog, so its suite has no parameters")
    return writer


def load_suite(catalog: Catalog, topic: str) -> TopicSuite:
    """Read and check the topic's suite file; substitute the catalog's values into SQL."""
    spec = catalog.topic(topic)
    if not spec.expectation_suite:
        raise SuiteError(f"topic {topic!r} has no expectation_suite in the catalog")
    path = Path(spec.expectation_suite)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuiteError(f"suite file {path} (topic {topic!r}) not found") from None
    except json.JSONDecodeError as exc:
        raise SuiteError(f"suite file {path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    expectations = document.get("expectations")
    if not isinstance(expectations, list) or not expectations:
        raise SuiteError(f"suite file {path}: 'expectations' must be a non-empty list")

    parameters = suite_parameters(catalog, topic)
    records, reconciling, kinds = [value_contract_expectation(spec, output_rules(catalog, topic))], [], set()
    for index, item in enumerate(expectations):
        where = f"suite file {path}, expectations[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("type"), str) or not isinstance(item.get("kwargs"), dict):
            raise SuiteError(f"{where}: each expectation needs 'type' (text) and 'kwargs' (a mapping)")
        item = copy.deepcopy(item)
        _check_parameters(item["kwargs"], parameters, where)
        query = item["kwargs"].get("unexpected_rows_query")
        if isinstance(query, str):
            try:
                item["kwargs"]["unexpected_rows_query"] = string.Template(query).substitute(parameters)
            except KeyError as exc:
                raise SuiteError(
                    f"{where}: the query uses ${{{exc.args[0]}}}, which the catalog does not provide for {topic!r} "
                    f"(available: {', '.join(sorted(parameters)) or 'none'})"
                ) from None
        kind = (item.get("meta") or {}).get("reconciliation")
        if kind:
            kinds.add(kind)
            reconciling.append(item)
        else:
            records.append(item)
    if len(kinds) > 1:
        raise SuiteError(f"suite file {path}: one reconciliation kind per suite (found {sorted(kinds)})")
    return TopicSuite(
        topic=topic,
        path=path,
        name=document.get("name") or topic,
        record_expectations=records,
        reconciliation=next(iter(kinds), None),
        reconciliation_expectations=reconciling,
        parameters=parameters,
        meta=document.get("meta") or {},
    )


def _check_parameters(kwargs: dict, parameters: dict, where: str) -> None:
    for key, value in kwargs.items():
        if isinstance(value, dict) and "$PARAMETER" in value and value["$PARAMETER"] not in parameters:
            raise SuiteError(
                f"{where}, kwargs.{key}: parameter {value['$PARAMETER']!r} is not provided by the catalog "
                f"(available: {', '.join(sorted(parameters)) or 'none'})"
            )
