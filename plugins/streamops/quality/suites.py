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
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

from streamops.programs import settings_dict
from streamops.catalog import AppSpec, Catalog, TopicSpec
from streamops.kafka_offsets import DURATION_PATTERN, duration_ms


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


def value_contract_expectation(spec: TopicSpec) -> dict:
    """One expectation, generated from the topic's value_schema, that every value keeps the
    input contract's rules downstream: exactly one JSON value, an object, no member name twice,
    each schema field (when present) of its JSON type, times in the outputs' form. The offending
    rows name the first rule they break (column `problem`). Suites do not repeat it."""
    doc = "try_parse_json(value)"
    problems = [
        # (A ']' after the value would close the brackets: the second count rules that out.)
        ("NOT coalesce(json_array_length(concat('[', value, ']')) = 1 AND (instr(value, ']') = 0 "
         "OR json_array_length(concat('[', value, ',0]')) = 2), false)", "'not exactly one JSON value'"),
        (f"{doc} IS NULL", "'not I-JSON: invalid JSON or a member name twice'"),
        (f"NOT schema_of_variant({doc}) LIKE 'OBJECT%'", "'not a JSON object'"),
    ]
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
                        f"name twice, fields of their types ({fields}), times as YYYY-MM-DDTHH:MM:SS.sssZ in years 0001-9999"),
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
    records, reconciling, kinds = [value_contract_expectation(spec)], [], set()
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
