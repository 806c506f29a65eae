"""What every plan of the suite is: a value an operator reviews before anything changes.

A plan (a topic plan, a reprocessing plan, each recovery's plan, the reconcile plan) is made by a
plan task, shown as a table in its log and on the approval page, summarised in a line for the
audit log, and handed to the apply task as JSON (XCom): the apply reads that JSON back, so what
runs is what was shown.

`Plan` is that protocol. `JsonPlan` gives a dataclass plan its JSON both ways: its fields, plus the
derived figures it names (`DERIVED`, e.g. how many records it replays) for whoever reads the XCom.

Every plan, and every other value a task hands the next as JSON (a validation range), is read
back through one reader, `from_plan_json`: pydantic validates the JSON against the class's own
annotations, strictly, as JSON (a string is not an int, a list is not an object, an entry has no
keys its type does not declare; JSON's own forms are taken: string object keys for int keys, an
array for a tuple, an enum by its value, an int for a float), and rebuilds nested dataclasses and
models on the way. Only the class's own fields are read (what a task added beside them, such as
the summary or the derived figures, is left out: those are computed again). Anything else is a
`PlanMismatch` naming the plan, the field and the problem, never a half-built plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields, is_dataclass
from typing import Any, ClassVar, Protocol, Self, TypeVar, runtime_checkable

import pydantic_core
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from streamops.refusals import OneLineRefused

T = TypeVar("T")

# How long a wrong value is quoted in a PlanMismatch (a plan's lists can be long).
QUOTED_CHARS = 80


@runtime_checkable
class Plan(Protocol):
    """A reviewed plan: shown (table), told in a line (summary), handed on as JSON and read back."""

    def table(self) -> str: ...

    def summary(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self: ...


@runtime_checkable
class AppPlan(Plan, Protocol):
    """A plan for one app (every recovery's, a reprocessing run's)."""

    app: str


class PlanMismatch(OneLineRefused):
    """The JSON a task received is not a plan its plan task makes (fields missing or mistyped, or
    values the plan task never writes)."""

    def render(self, problems: list[str]) -> str:
        return "the plan this task received is not one the plan task makes: " + "; ".join(problems)


class JsonPlan:
    """A dataclass plan's JSON: `to_json()` is its fields and its `DERIVED` properties;
    `from_json()` reads its fields back through `from_plan_json`."""

    DERIVED: ClassVar[tuple[str, ...]] = ()
    # Read by pydantic (from_plan_json) for the plan and the dataclasses nested in it: no key a
    # type does not declare, no value of another type.
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(strict=True, extra="forbid")

    def to_json(self) -> dict[str, Any]:
        assert is_dataclass(self), f"{type(self).__name__} is not a dataclass"
        return {**asdict(self), **{name: getattr(self, name) for name in self.DERIVED}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return from_plan_json(cls, data)


def from_plan_json(kind: type[T], data: object) -> T:
    """A `kind` (a dataclass or a pydantic model) from the JSON a task handed on, validated as the
    module docstring says; a PlanMismatch naming every problem if it is not one."""
    if not isinstance(data, Mapping):
        raise PlanMismatch([f"a {kind.__name__} is a JSON object, got {type(data).__name__}"])
    own = {name: value for name, value in data.items() if name in _field_names(kind)}
    try:
        # Validated as the JSON text XCom carries: JSON's forms, and strict types, are JSON mode's.
        text = pydantic_core.to_json(own, inf_nan_mode="constants")
    except pydantic_core.PydanticSerializationError as exc:
        raise PlanMismatch([f"{kind.__name__} is not JSON: {exc}"]) from None
    try:
        plan: T = _adapter(kind).validate_json(text, strict=True)
    except ValidationError as exc:
        raise PlanMismatch(_problems(kind.__name__, exc)) from None
    return plan


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(kind: type) -> TypeAdapter[Any]:
    """One validator per class, built from its annotations the first time it is read."""
    if kind not in _ADAPTERS:
        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


def _field_names(kind: type) -> set[str]:
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return set(kind.model_fields)
    assert is_dataclass(kind), f"{kind.__name__} is neither a dataclass nor a pydantic model"
    return {f.name for f in fields(kind)}


def _problems(plan: str, exc: ValidationError) -> list[str]:
    """One problem per error; the plan's own missing fields in one ("RestartPlan without lag, version")."""
    errors = exc.errors(include_url=False)
    missing = [str(e["loc"][0]) for e in errors if e["type"] == "missing" and len(e["loc"]) == 1]
    problems = [f"{plan} without {', '.join(missing)}"] if missing else []
    for error in errors:
        if error["type"] == "missing" and len(error["loc"]) == 1:
            continue
        where = ".".join([plan, *(str(part) for part in error["loc"])])
        problem = f"{where}: {error['msg']}"
        if error["type"] not in ("missing", "unexpected_keyword_argument", "extra_forbidden"):
            quoted = repr(error["input"])
            problem += f", got {quoted if len(quoted) <= QUOTED_CHARS else quoted[:QUOTED_CHARS - 3] + '...'}"
        problems.append(problem)
    return problems
