"""What one app input may hold beyond the shared input contract: field constraints, the nesting
depth and how far an event time may lie from the record's own time (README "Input contract").

Declared per input role in the catalog (`apps[].input_contract.<role>`), on top of what the
program declares for its fields (`records.Field`); the catalog's value wins where both say one.
No Spark here: the catalog, Terraform-facing checks and the control plane read it; the apps
(`spark_apps.common.records`) and the output suites (`streamops.quality.suites`) enforce it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, field_validator, model_validator

from streamops.kafka_offsets import DURATION_PATTERN, duration_ms

Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN)]

# Spark's JSON (VARIANT) parser stops at 1000 levels and the apps parse a value inside brackets.
PARSER_MAX_DEPTH = 998
# Common decoders refuse far less than the parser: Rust's serde_json at 128 levels, Ruby's JSON at
# 100, Python's json.loads near its recursion limit. A record the apps route must be readable by
# their consumers, so the default stays well inside all of them.
DEFAULT_MAX_DEPTH = 64
# A record's event time may lie at most this far after its own time: the earlier of its Kafka
# timestamp and the time it is processed (a producer can set any Kafka timestamp; processing time
# alone would judge a backfill differently from the live run). One record beyond it would move a
# windowed app's watermark and drop every later record as late.
DEFAULT_MAX_FUTURE = "5 minutes"
# ...and at most this far before its Kafka timestamp (deterministic: a backfill judges a record as
# the live run did). Ten years keeps replays of archived history and refuses the zero dates
# (1970-01-01, year 1) of a broken producer.
DEFAULT_MAX_PAST = "3650 days"

RULE_KINDS = {
    "min_length": "string", "max_length": "string", "pattern": "string", "allowed": "string",
    "minimum": "bigint", "maximum": "bigint",
}


class FieldRules(BaseModel):
    """Constraints on one field's value, beyond its JSON type (each names its rule when broken)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Strings, in characters (code points): min_length 1 means not empty.
    min_length: StrictInt | None = Field(default=None, ge=0)
    max_length: StrictInt | None = Field(default=None, ge=1)
    # Strings: the whole value matches (Java regex syntax, as Spark runs it; checked here with
    # Python's, so only the syntax both share is accepted).
    pattern: str | None = Field(default=None, min_length=1, max_length=1000)
    # Strings: the only values accepted.
    allowed: list[str] | None = Field(default=None, min_length=1)
    # Integers, inclusive.
    minimum: StrictInt | None = None
    maximum: StrictInt | None = None

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, pattern: str | None) -> str | None:
        if pattern is None:
            return None
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
        if re.search(r"\\[0-9]|\(\?P|\(\?<[A-Za-z]", pattern):
            raise ValueError(f"pattern {pattern!r}: back references and named groups differ between Python and Java; "
                             "write the pattern without them")
        return pattern

    @model_validator(mode="after")
    def _bounds_in_order(self) -> FieldRules:
        for low, high in (("min_length", "max_length"), ("minimum", "maximum")):
            low_value, high_value = getattr(self, low), getattr(self, high)
            if low_value is not None and high_value is not None and low_value > high_value:
                raise ValueError(f"{low} {low_value} is more than {high} {high_value}")
        return self

    def set_rules(self) -> dict[str, Any]:
        return {name: value for name, value in self.model_dump().items() if value is not None}


class InputContract(BaseModel):
    """One input role's rules: nesting depth, event-time bounds, field constraints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_depth: StrictInt = Field(default=DEFAULT_MAX_DEPTH, ge=1, le=PARSER_MAX_DEPTH)
    # null turns a bound off (README "Input contract" says what that risks).
    max_future: Duration | None = DEFAULT_MAX_FUTURE
    max_past: Duration | None = DEFAULT_MAX_PAST
    fields: dict[str, FieldRules] = Field(default_factory=dict)

    def max_future_ms(self) -> int | None:
        return None if self.max_future is None else duration_ms(self.max_future)

    def max_past_ms(self) -> int | None:
        return None if self.max_past is None else duration_ms(self.max_past)


DEFAULT_CONTRACT = InputContract()


def field_problems(contract: InputContract, declared: list[dict]) -> list[tuple[str, str]]:
    """How the catalog's field rules do not fit the program's fields for this role:
    (field path in `fields`, message). `declared`: the program's fields as data (path, type)."""
    types = {f["path"]: f["type"] for f in declared}
    problems = []
    for name, rules in contract.fields.items():
        if name not in types:
            problems.append((name, f"the program's fields for this input are {', '.join(types)}; there is no {name!r}"))
            continue
        for rule in rules.set_rules():
            if RULE_KINDS[rule] != types[name]:
                kind = "strings" if RULE_KINDS[rule] == "string" else "integers"
                problems.append((f"{name}.{rule}", f"applies to {kind}, and {name!r} is a {types[name]} field"))
    return problems


def merged_rules(declared: dict, contract: InputContract) -> dict[str, Any]:
    """One field's rules: the program's (`declared`, a field as data) with the catalog's on top."""
    rules = {name: declared.get(name) for name in RULE_KINDS if declared.get(name) not in (None, [], ())}
    overrides = contract.fields.get(declared["path"])
    if overrides is not None:
        rules.update(overrides.set_rules())
    return rules
