"""The pipeline catalog: the one source of truth for topics (and, later, apps).

The catalog is plain YAML so that DAGs, tests and Terraform (`yamldecode`) read the same file.
It is loaded through pydantic models; every problem is reported as a `CatalogError` that names
the file, the entry (index and name) and the field, with the YAML line where it stands.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from streamops.paths import PROJECT_ROOT

DEFAULT_CATALOG_PATH = PROJECT_ROOT / "catalog" / "pipelines.yaml"
CATALOG_ENV_VAR = "STREAMOPS_CATALOG"

# Kafka's own rule for topic names (kafka.common.internals.Topic).
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

# Topic-level configs of Apache Kafka 4.x. A key outside this set is almost always a typo
# (`retention.msec`), which the broker would only reject at apply time, after other topics
# were already changed; refusing it at load time keeps the catalog honest.
KNOWN_TOPIC_CONFIGS = frozenset(
    {
        "cleanup.policy",
        "compression.type",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "follower.replication.throttled.replicas",
        "index.interval.bytes",
        "leader.replication.throttled.replicas",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.type",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
        "remote.storage.enable",
        "retention.bytes",
        "retention.ms",
        "segment.bytes",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
    }
)

_CLEANUP_POLICIES = {"delete", "compact", "compact,delete", "delete,compact"}


class CatalogError(ValueError):
    """A catalog file that cannot be used. The message lists every problem, one per line."""

    def __init__(self, path: Path, problems: list[str]):
        self.path = path
        self.problems = problems
        head = f"catalog {path} is invalid ({len(problems)} problem{'s' * (len(problems) != 1)}):"
        super().__init__("\n".join([head, *(f"  - {p}" for p in problems)]))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


ConfigValue = StrictInt | bool | str


class TopicSpec(_Strict):
    """One Kafka topic as the catalog declares it."""

    name: str
    partitions: StrictInt = Field(gt=0)
    replication_factor: StrictInt = Field(gt=0)
    owner: str = Field(min_length=1)
    description: str = Field(min_length=1)
    configs: dict[str, ConfigValue] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _legal_kafka_name(cls, name: str) -> str:
        if name in {".", ".."} or not _TOPIC_NAME.match(name):
            raise ValueError(
                "must be 1-249 characters of letters, digits, '.', '_' and '-' "
                "(and not '.' or '..'), as Kafka requires"
            )
        if name.startswith("__"):
            raise ValueError("names starting with '__' are reserved for Kafka's internal topics")
        if "." in name and "_" in name:
            raise ValueError(
                "mixes '.' and '_': Kafka maps both to the same metric name, so use one of them"
            )
        return name

    @field_validator("configs")
    @classmethod
    def _known_configs(cls, configs: dict[str, ConfigValue]) -> dict[str, ConfigValue]:
        unknown = sorted(set(configs) - KNOWN_TOPIC_CONFIGS)
        if unknown:
            raise ValueError(
                f"unknown topic config {', '.join(repr(k) for k in unknown)} "
                "(not a Kafka topic-level config; check the spelling)"
            )
        policy = configs.get("cleanup.policy")
        if policy is not None and str(policy).replace(" ", "") not in _CLEANUP_POLICIES:
            raise ValueError(
                f"cleanup.policy must be one of delete, compact or 'compact,delete' (got {policy!r})"
            )
        for key in ("retention.ms", "retention.bytes"):
            value = configs.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < -1):
                raise ValueError(f"{key} must be an integer >= -1, -1 meaning unlimited (got {value!r})")
        return configs

    @model_validator(mode="after")
    def _min_isr_fits_replicas(self) -> TopicSpec:
        min_isr = self.configs.get("min.insync.replicas")
        if min_isr is not None:
            if not isinstance(min_isr, int) or isinstance(min_isr, bool) or min_isr < 1:
                raise ValueError(f"configs.min.insync.replicas must be a positive integer (got {min_isr!r})")
            if min_isr > self.replication_factor:
                raise ValueError(
                    f"configs.min.insync.replicas ({min_isr}) is larger than replication_factor "
                    f"({self.replication_factor}): no write with acks=all could ever succeed"
                )
        return self

    def kafka_configs(self) -> dict[str, str]:
        """The configs as the broker reports them: every value a string."""
        return {key: _kafka_string(value) for key, value in self.configs.items()}


def _kafka_string(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace(" ", "") if isinstance(value, str) else str(value)


class Catalog(_Strict):
    """The whole catalog file."""

    version: Literal[1]
    topics: list[TopicSpec] = Field(min_length=1)

    def topic(self, name: str) -> TopicSpec:
        for spec in self.topics:
            if spec.name == name:
                return spec
        raise KeyError(f"topic {name!r} is not in the catalog (known: {', '.join(self.topic_names())})")

    def topic_names(self) -> list[str]:
        return [spec.name for spec in self.topics]


# ---------------------------------------------------------------------------------------------
# Loading


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first at line {seen[key]})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def catalog_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The catalog to use: the argument, else $STREAMOPS_CATALOG, else catalog/pipelines.yaml."""
    if path is not None:
        return Path(path)
    return Path(os.environ.get(CATALOG_ENV_VAR) or DEFAULT_CATALOG_PATH)


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """Read and validate a catalog file; raise `CatalogError` naming every problem."""
    path = catalog_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError(path, ["file not found"]) from None
    except OSError as exc:
        raise CatalogError(path, [f"cannot be read: {exc.strerror}"]) from None

    try:
        root_node = yaml.compose(text, Loader=_LineLoader)
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise CatalogError(path, [f"{where}not valid YAML: {problem}"]) from None

    if not isinstance(data, dict):
        raise CatalogError(path, ["the top level must be a mapping with 'version' and 'topics'"])

    try:
        catalog = Catalog.model_validate(data)
    except ValidationError as exc:
        problems = [_describe_error(err, data, root_node) for err in exc.errors()]
        raise CatalogError(path, problems) from None

    problems = list(_cross_topic_problems(catalog, data, root_node))
    if problems:
        raise CatalogError(path, problems)
    return catalog


def _cross_topic_problems(catalog: Catalog, data: dict, root_node: yaml.Node) -> Iterator[str]:
    first_by_name: dict[str, int] = {}
    separator_owner: tuple[str, int, str] | None = None  # (separator, index, name)
    for index, spec in enumerate(catalog.topics):
        where = _where(("topics", index), data, root_node, field_path=("topics", index, "name"))
        if spec.name in first_by_name:
            yield (
                f"{where}, field 'name': duplicate topic name {spec.name!r} "
                f"(already declared at topics[{first_by_name[spec.name]}])"
            )
        else:
            first_by_name[spec.name] = index
        separator = "." if "." in spec.name else "_" if "_" in spec.name else None
        if separator is None:
            continue
        if separator_owner is None:
            separator_owner = (separator, index, spec.name)
        elif separator != separator_owner[0]:
            yield (
                f"{where}, field 'name': {spec.name!r} uses {separator!r} but the catalog's names use "
                f"{separator_owner[0]!r} (from topics[{separator_owner[1]}] {separator_owner[2]!r}); "
                "Kafka maps '.' and '_' to the same metric name, so one cluster must use only one"
            )


def _describe_error(err: dict[str, Any], data: dict, root_node: yaml.Node) -> str:
    loc = tuple(err["loc"])
    # Pydantic appends the union member to the location ("int", "bool", "str"): drop it.
    loc = tuple(part for part in loc if part not in {"int", "bool", "str"}) or loc
    entry_loc = loc[:2] if len(loc) >= 2 and loc[0] == "topics" else loc[:1]
    field = ".".join(str(p) for p in loc[len(entry_loc):])
    where = _where(entry_loc, data, root_node, field_path=loc)
    message = _friendly_message(err)
    if field:
        return f"{where}, field '{field}': {message}"
    return f"{where}: {message}"


def _friendly_message(err: dict[str, Any]) -> str:
    kind, raw = err["type"], err.get("input")
    if kind == "extra_forbidden":
        return "unknown key (not part of the catalog format; check the spelling)"
    if kind == "missing":
        return "required but missing"
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return f"must be an integer (got {type(raw).__name__} {raw!r})"
    if kind in {"string_type"}:
        return f"must be a string (got {type(raw).__name__} {raw!r})"
    if kind == "greater_than":
        return f"must be a positive integer (got {raw!r})"
    if kind in {"list_type", "dict_type"}:
        wanted = "a list" if kind == "list_type" else "a mapping"
        return f"must be {wanted} (got {type(raw).__name__})"
    if kind == "value_error":
        return str(err["ctx"]["error"])
    return err["msg"]


def _where(entry_loc: tuple, data: Any, root_node: yaml.Node, field_path: tuple | None = None) -> str:
    """'topics[2] (name 'a.b', line 14)' for an entry, or the top-level key."""
    if entry_loc and entry_loc[0] == "topics" and len(entry_loc) == 2:
        index = entry_loc[1]
        label = f"topics[{index}]"
        topics = data.get("topics") if isinstance(data, dict) else None
        if isinstance(topics, list) and index < len(topics) and isinstance(topics[index], dict):
            name = topics[index].get("name")
            if isinstance(name, str):
                label += f" {name!r}"
    else:
        label = "top level" + (f" key '{entry_loc[0]}'" if entry_loc else "")
    line = _line_of(root_node, field_path or entry_loc)
    return f"{label} (line {line})" if line else label


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """The YAML line of the deepest node on `loc` that exists."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == part:
                    child = value_node
                    line = key_node.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line
