"""What every plan of the suite is: a value an operator reviews before anything changes.

A plan (a topic plan, a reprocessing plan, each recovery's plan) is made by a plan task, shown as a
table in its log and on the approval page, summarised in a line for the audit log, and handed to
the apply task as JSON (XCom): the apply reads that JSON back, so what runs is what was shown.

`Plan` is that protocol. `JsonPlan` gives a dataclass plan its JSON both ways: its fields, plus the
derived figures it names (`DERIVED`, e.g. how many records it replays) for whoever reads the XCom;
read back, only its own fields count (what a task added, such as the summary, is left out), and a
field that is missing is a refusal naming it, never a half-built plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, asdict, fields, is_dataclass
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

from streamops.refusals import OneLineRefused


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
    `from_json()` takes its fields back, lists of `NESTED` dataclasses rebuilt item by item."""

    DERIVED: ClassVar[tuple[str, ...]] = ()
    NESTED: ClassVar[Mapping[str, type]] = {}

    def to_json(self) -> dict[str, Any]:
        assert is_dataclass(self), f"{type(self).__name__} is not a dataclass"
        return {**asdict(self), **{name: getattr(self, name) for name in self.DERIVED}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        assert is_dataclass(cls), f"{cls.__name__} is not a dataclass"
        if not isinstance(data, Mapping):
            raise PlanMismatch([f"a {cls.__name__} is a JSON object, got {type(data).__name__}"])
        own = fields(cls)
        missing = [f.name for f in own if f.name not in data and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise PlanMismatch([f"{cls.__name__} without {', '.join(missing)}"])
        values = {f.name: data[f.name] for f in own if f.name in data}
        problems = []
        for name, item in cls.NESTED.items():
            try:
                values[name] = [item(**entry) for entry in values.get(name) or []]
            except TypeError as exc:  # an entry with fields its type does not have, or without one it needs
                problems.append(f"{cls.__name__}.{name}: {exc}")
        if problems:
            raise PlanMismatch(problems)
        return cls(**values)
