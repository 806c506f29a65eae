"""The program contract: what a streaming program gives the suite, and all the suite may assume.

A program is a Python object (usually a module-level `program = MyProgram()`) whose class
subclasses `StreamingProgram`. The catalog names it by an importable reference,
`package.module` (its `program` attribute) or `package.module:attribute`, optionally packaged as
a versioned artifact (`streamops artifact build`, docs/bring-your-own-app.md). The suite never
imports a program by name: `streamops.programs` resolves the catalog's reference and reads
only what this class declares.

Declarations (class attributes), checked when the catalog loads:

- `input_roles`: the roles an app of this program reads (`inputs:` in the catalog maps each
  to a topic). Exactly these roles must be mapped.
- `output_roles`: the roles it writes (`outputs:`), or None when its settings name them:
  `output_roles_setting` then names the mapping setting whose keys are the output roles (the
  router's `categories`), checked without importing the program.
- `Settings`: a pydantic model of the app's `settings:`. The catalog validates an app's settings
  with it (a wrong field is named with its file, entry and line); the program receives the
  validated model as `app.settings` (see `bind`).
- `input_fields`: per input role, the fields (`streamops.records.Field`) every record must
  carry; records without them become dead letters, and dead-letter replay re-checks with them.
- `reads_outputs`: output roles the program reads back (its ACLs grant Read on them); the catalog
  entry repeats them under `reads_outputs` so Terraform, which cannot import Python, sees them.
- `query_names`: its streaming queries in start order; each has a checkpoint folder of its name.
- `stateful_operators`: per query, the stateful operators it keeps in its checkpoint, in words
  ("groupBy(user_id).flatMapGroupsWithState: presence history"). A rolling restart refuses a
  version whose declared operators (or whose stateful plan) differ: Spark could not restore them.
- `state_settings`: per query, the settings that shape what its state holds where Spark cannot
  see it (a window's length and slide: the state's schema is the same for every length). A roll or
  reconcile refuses a change of one: Spark's own check on a copy of the checkpoint judges the rest
  (streamops.driver.state_check).
- `window_counts`: output roles holding windowed counts (`records.windowed_counts`), so the
  quality reconciliation and the nightly reconciliation can recompute them.
- `lineage_outputs`: output roles (or "*": every output role) whose records carry `event_id`
  (topic/partition/offset of the input record they come from), so the quality reconciliation
  can check that every input record arrived.

Behaviour (methods):

- `queries(app, version, source)`: the app's streaming queries, each an `OutputQuery` (its
  name, a DataFrame of (key, value, topic) rows, its output mode), built from `source(topics)`,
  which returns the records of those topics (a stream in a live run, a bounded batch in a
  backfill or a reconciliation: the same code runs in all). `version` is written into dead letters.
- `check(app)`: problems the declarations cannot express (default: none).

A program must not import Airflow, must not start queries itself, and must keep its state in
the operators Spark checkpoints (never in a side store the suite cannot back up).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

if TYPE_CHECKING:  # the suite's control plane reads the contract without Spark
    from pyspark.sql import DataFrame

    from streamops.catalog import AppSpec


@dataclass(frozen=True)
class OutputQuery:
    """One streaming query of an app: rows of (key, value, topic) for the Kafka sink."""

    name: str
    frame: DataFrame
    output_mode: str = "append"


@dataclass(frozen=True)
class WindowCountOutput:
    """An output role of windowed counts: the query writing it, the column the windows are per,
    and the settings field holding the watermark (how long a window stays open)."""

    query: str
    key_column: str
    watermark_setting: str = "watermark"


@dataclass(frozen=True)
class LineageOutput:
    """An output role whose records name their input record in `event_id`."""

    query: str
    input_role: str


class NoSettings(BaseModel):
    """The settings of a program that has none: an empty mapping."""

    model_config = {"extra": "forbid", "frozen": True}


class StreamingProgram:
    """Base class of every streaming program; the module docstring is the reference."""

    name: ClassVar[str]
    input_roles: ClassVar[tuple[str, ...]]
    output_roles: ClassVar[tuple[str, ...] | None]
    output_roles_setting: ClassVar[str | None] = None
    Settings: ClassVar[type[BaseModel]] = NoSettings
    input_fields: ClassVar[Mapping[str, list[Any]]]
    reads_outputs: ClassVar[tuple[str, ...]] = ()
    query_names: ClassVar[tuple[str, ...]]
    stateful_operators: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    state_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    window_counts: ClassVar[Mapping[str, WindowCountOutput]] = {}
    lineage_outputs: ClassVar[Mapping[str, LineageOutput]] = {}

    def queries(self, app: AppSpec, version: str, source: Callable[[list[str]], DataFrame]) -> list[OutputQuery]:
        raise NotImplementedError(f"{type(self).__name__} does not build its queries (StreamingProgram.queries)")

    def check(self, app: AppSpec) -> list[str]:
        """Problems of an app of this program that the declarations cannot express."""
        return []

    def bind(self, app: AppSpec) -> AppSpec:
        """The app with its settings as this program's validated model (what `queries` reads)."""
        if isinstance(app.settings, self.Settings):
            return app
        return app.model_copy(update={"settings": self.Settings.model_validate(app.settings)})


def contract_problems(program: object, reference: str) -> list[str]:
    """What makes `program` not a streaming program, for a message naming the reference."""
    if not isinstance(program, StreamingProgram):
        return [f"{reference} is a {type(program).__name__}, not a streaming program "
                "(an instance of streamops.program_contract.StreamingProgram)"]
    problems = []
    for attribute in ("name", "input_roles", "output_roles", "input_fields", "query_names"):
        if not hasattr(program, attribute):
            problems.append(f"{reference} does not declare {attribute!r}")
    if problems:
        return problems
    if not program.query_names:
        problems.append(f"{reference} declares no query (query_names)")
    for role in set(program.input_fields) - set(program.input_roles):
        problems.append(f"{reference}: input_fields names {role!r}, which is not one of its input_roles")
    outputs = set(program.output_roles) if program.output_roles is not None else None
    for label, roles in (("reads_outputs", set(program.reads_outputs)), ("window_counts", set(program.window_counts)),
                         ("lineage_outputs", set(program.lineage_outputs))):
        if outputs is not None and roles - outputs:
            problems.append(f"{reference}: {label} names {sorted(roles - outputs)}, not among its output_roles")
    fields = set(program.Settings.model_fields) if hasattr(program, "Settings") else set()
    for query, names in program.state_settings.items():
        for name in set(names) - fields:
            problems.append(f"{reference}: state_settings of query {query!r} names {name!r}, which is not one of its settings")
    for label, queries in (("stateful_operators", set(program.stateful_operators)),
                           ("state_settings", set(program.state_settings)),
                           ("window_counts", {w.query for w in program.window_counts.values()}),
                           ("lineage_outputs", {w.query for w in program.lineage_outputs.values()})):
        if queries - set(program.query_names):
            problems.append(f"{reference}: {label} names the queries {sorted(queries - set(program.query_names))}, "
                            f"not among its query_names {list(program.query_names)}")
    return problems


def describe(program: StreamingProgram) -> dict[str, Any]:
    """The program's declarations as JSON data: what an artifact's manifest records, so the
    catalog can check an app against a version without importing its code."""
    return {
        "name": program.name,
        "input_roles": list(program.input_roles),
        "output_roles": None if program.output_roles is None else list(program.output_roles),
        "settings_schema": program.Settings.model_json_schema(),
        "input_fields": {
            role: [f.as_data() for f in fields]
            for role, fields in program.input_fields.items()
        },
        "reads_outputs": list(program.reads_outputs),
        "query_names": list(program.query_names),
        "output_roles_setting": program.output_roles_setting,
        "stateful_operators": {query: list(ops) for query, ops in program.stateful_operators.items()},
        "state_settings": {query: list(names) for query, names in program.state_settings.items()},
        "window_counts": {role: vars(w) for role, w in program.window_counts.items()},
        "lineage_outputs": {role: vars(w) for role, w in program.lineage_outputs.items()},
    }
