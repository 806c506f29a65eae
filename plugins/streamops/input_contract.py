"""What one app input may hold beyond the shared input contract: field constraints, the nesting
depth and how far an event time may lie from the record's own time (docs/architecture.md "Input contract").

Declared per input role in the catalog (`apps[].input_contract.<role>`), on top of what the
program declares for its fields (`records.Field`); the catalog's value wins where both say one.
No Spark here: the catalog, Terraform-facing checks and the control plane read it; the apps
(`streamops.records`) and the output suites (`streamops.quality.suites`) enforce it.
"""

from __future__ import annotations

import re
import warnings
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, model_validator

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

# A pattern runs on a field's every value: its length is bounded so that one hostile record cannot
# make it expensive (Java's regex engine recurses per repetition of a group).
PATTERN_MAX_LENGTH = 1000
# Escapes Java's and Python's regex engines read alike (\\uXXXX aside, checked on its own).
_SAME_ESCAPES = set("dDwWsSbB.\\-[](){}|*+?^$/tnr")


def check_pattern(pattern: str, max_length: int | None) -> None:
    """Refuse a pattern Spark (Java's regex engine) would read differently from how it is checked
    here (Python's), or not at all, and one whose field has no max_length (PATTERN_MAX_LENGTH at
    most). Raises ValueError naming what to change."""
    try:
        with warnings.catch_warnings():  # "possible nested set": refused below, in words
            warnings.simplefilter("ignore", FutureWarning)
            re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
    in_class, index = False, 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            escaped = pattern[index + 1:index + 2]
            if escaped == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", pattern[index + 2:index + 6]):
                index += 6
                continue
            if escaped not in _SAME_ESCAPES:
                raise ValueError(f"pattern {pattern!r}: the escape \\{escaped} means something else to Java (which runs it) "
                                 "than to Python, or nothing; write the characters as a class such as [0-9] or [A-Z]")
            index += 2
            continue
        if in_class:
            if char == "[" or pattern.startswith("&&", index):
                raise ValueError(f"pattern {pattern!r}: '[' or '&&' inside a character class is a nested class or an "
                                 "intersection to Java and a plain character to Python; escape it (\\[)")
            in_class = char != "]"
        elif char == "[":
            if pattern.startswith(("[]", "[^]"), index):
                raise ValueError(f"pattern {pattern!r}: a ']' first in a character class is a literal to Python and ends "
                                 "the class to Java; escape it (\\])")
            in_class = True
        elif (
            char == "("
            and pattern.startswith("(?", index)
            and not pattern.startswith(("(?:", "(?=", "(?!", "(?<=", "(?<!"), index)
        ):
            raise ValueError(f"pattern {pattern!r}: only the groups (...), (?:...) and lookarounds read alike in Java and "
                             "Python; no flags, comments, named or conditional groups")
        elif pattern.startswith("{,", index):
            raise ValueError(f"pattern {pattern!r}: '{{,n}}' is a repetition to Python and a literal to Java; write '{{0,n}}'")
        index += 1
    if max_length is None or max_length > PATTERN_MAX_LENGTH:
        raise ValueError(f"pattern {pattern!r} needs max_length on the same field, at most {PATTERN_MAX_LENGTH} characters "
                         f"(got {max_length}): it bounds the work the pattern does on one record")


# The nesting-depth check, as the apps (records._deeper_than) and the output suites
# (suites._deeper_than_sql) run it: JSON strings blanked first (unrolled and possessive: linear, no
# regex recursion on a long string), then innermost containers removed, one level per pass.
JSON_STRING_REGEX = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
INNERMOST_CONTAINER_REGEX = r"[\[{][^\[\]{}]*+[\]}]"


def whole_match(pattern: str) -> str:
    """A field's pattern as Spark runs it: the whole value (\\z, not $: Java's $ also matches
    before a final line break)."""
    return f"^(?:{pattern})\\z"


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

    @model_validator(mode="after")
    def _pattern_reads_alike(self) -> FieldRules:
        if self.pattern is not None:
            check_pattern(self.pattern, self.max_length)
        return self

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
    # null turns a bound off (docs/architecture.md "Input contract" says what that risks).
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
        for rule, value in rules.set_rules().items():
            if RULE_KINDS[rule] != types[name]:
                kind = "strings" if RULE_KINDS[rule] == "string" else "integers"
                problems.append((f"{name}.{rule}", f"applies to {kind}, and {name!r} is a {types[name]} field"))
            program_allows = next((f.get("allowed") for f in declared if f["path"] == name), None)
            if rule == "allowed" and program_allows and not set(value) & set(program_allows):
                problems.append(
                    (f"{name}.allowed", f"none of {value} is a value the program allows ({', '.join(program_allows)})")
                )
    return problems


def merged_rules(declared: dict, contract: InputContract) -> dict[str, Any]:
    """One field's rules: the program's (`declared`, a field as data) and the catalog's together,
    the stricter where both set one (the catalog can narrow what a program needs, never widen it):
    the larger minimum, the smaller maximum, the values both allow, both patterns."""
    rules: dict[str, Any] = {name: declared.get(name) for name in RULE_KINDS if declared.get(name) not in (None, [], ())}
    overrides = contract.fields.get(declared["path"])
    for name, value in (overrides.set_rules() if overrides is not None else {}).items():
        if name not in rules:
            rules[name] = value
        elif name in ("min_length", "minimum"):
            rules[name] = max(rules[name], value)
        elif name in ("max_length", "maximum"):
            rules[name] = min(rules[name], value)
        elif name == "allowed":
            rules[name] = [v for v in rules[name] if v in value]
        elif name == "pattern" and value != rules[name]:
            # Both must match the whole value (Java's \z: Spark runs it).
            rules[name] = f"(?=(?:{rules[name]})\\z)(?:{value})"
    return rules
