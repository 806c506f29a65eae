"""Provision Kafka topics from the catalog: plan, apply, verify.

The plan is computed by a pure function from the catalog and a snapshot of the broker, so it
is unit-testable and what the dry run shows is exactly what apply does. Apply touches only the
topics the plan says to change; refused topics are left exactly as they are. Nothing here ever
deletes a topic or lowers a partition count.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from pydantic import BaseModel, ConfigDict
from tabulate import tabulate

from streamops.catalog import Catalog, TopicSpec
from streamops.plans import from_plan_json
from streamops.retention import held_configs, read_holds
from streamops.waiting import DeadlineExceeded, poll_until

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 30.0


class ProvisioningError(RuntimeError):
    """The broker could not be brought to the catalog's state; the message lists each topic."""


# ---------------------------------------------------------------------------------------------
# What the broker has


class BrokerTopic(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str]  # effective value of every topic config
    overridden: frozenset[str]  # configs set on the topic itself (not inherited defaults)


class BrokerSnapshot(BaseModel):
    model_config = ConfigDict(frozen=True)

    broker_count: int
    topics: dict[str, BrokerTopic]  # the described topics
    all_topic_names: frozenset[str]  # every non-internal topic on the cluster


def describe_broker(admin: AdminClient, names: Iterable[str]) -> BrokerSnapshot:
    """Partitions, replication factor and configs of `names` that exist, plus every topic name."""
    metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    all_names = frozenset(name for name in metadata.topics if not name.startswith("__"))
    wanted = [name for name in names if name in metadata.topics]

    configs_by_topic: dict[str, dict[str, ConfigEntry]] = {}
    if wanted:
        futures = admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, name) for name in wanted],
            request_timeout=ADMIN_TIMEOUT_S,
        )
        for resource, future in futures.items():
            configs_by_topic[resource.name] = future.result()

    topics = {}
    for name in wanted:
        partitions = metadata.topics[name].partitions
        entries = configs_by_topic[name]
        topics[name] = BrokerTopic(
            name=name,
            partitions=len(partitions),
            replication_factor=min((len(p.replicas) for p in partitions.values()), default=0),
            configs={key: entry.value for key, entry in entries.items() if entry.value is not None},
            overridden=frozenset(
                key
                for key, entry in entries.items()
                if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
            ),
        )
    return BrokerSnapshot(broker_count=len(metadata.brokers), topics=topics, all_topic_names=all_names)


# ---------------------------------------------------------------------------------------------
# The plan


# The plan's models: values, and no key they do not declare (read back from XCom: from_plan_json).
PLAN_MODEL = ConfigDict(frozen=True, extra="forbid")


class Action(str, Enum):
    CREATE = "create"
    ADD_PARTITIONS = "add partitions"
    ALTER_CONFIGS = "alter configs"
    NO_CHANGE = "no change"
    REFUSED = "refused"


class ConfigChange(BaseModel):
    model_config = PLAN_MODEL

    key: str
    current: str | None  # None: not set on the topic
    desired: str | None  # None: remove the topic override (back to the broker default)

    def describe(self) -> str:
        if self.desired is None:
            return f"{self.key}: remove override {self.current!r} (not in catalog; broker default applies)"
        return f"{self.key}: {self.current!r} -> {self.desired!r}"


class TopicPlan(BaseModel):
    model_config = PLAN_MODEL

    topic: str
    actions: list[Action]
    partitions_current: int | None = None
    partitions_desired: int
    replication_factor: int
    configs_desired: dict[str, str] = {}
    config_changes: list[ConfigChange] = []
    refusals: list[str] = []

    @property
    def changes_broker(self) -> bool:
        return not self.refusals and self.actions != [Action.NO_CHANGE]

    def details(self) -> str:
        if self.refusals:
            return "; ".join(self.refusals)
        parts = []
        if Action.CREATE in self.actions:
            configs = ", ".join(f"{k}={v}" for k, v in sorted(self.configs_desired.items()))
            parts.append(
                f"{self.partitions_desired} partitions, replication factor {self.replication_factor}"
                + (f", {configs}" if configs else "")
            )
        if Action.ADD_PARTITIONS in self.actions:
            parts.append(f"partitions {self.partitions_current} -> {self.partitions_desired}")
        parts.extend(change.describe() for change in self.config_changes)
        return "; ".join(parts)


class ProvisioningPlan(BaseModel):
    model_config = PLAN_MODEL

    topics: list[TopicPlan]
    unmanaged_topics: list[str]  # on the broker, not in the catalog: reported, never deleted

    @property
    def refused(self) -> list[TopicPlan]:
        return [plan for plan in self.topics if plan.refusals]

    @property
    def to_change(self) -> list[TopicPlan]:
        return [plan for plan in self.topics if plan.changes_broker]

    def counts(self) -> dict[str, int]:
        counts = {action.value: 0 for action in Action}
        for plan in self.topics:
            for action in plan.actions:
                counts[action.value] += 1
        return counts

    def table(self) -> str:
        rows = [[plan.topic, ", ".join(a.value for a in plan.actions), plan.details()] for plan in self.topics]
        rows += [[name, "not in catalog", "left alone (never deleted)"] for name in self.unmanaged_topics]
        return tabulate(rows, headers=["topic", "action", "details"], tablefmt="simple", maxcolwidths=[None, None, 90])

    def summary(self) -> str:
        counts = self.counts()
        parts = [f"{n} {action}" for action, n in counts.items() if n]
        if self.unmanaged_topics:
            parts.append(f"{len(self.unmanaged_topics)} not in catalog")
        return ", ".join(parts) or "nothing to do"

    def data_loss_risks(self) -> list[str]:
        """Each change of this plan that can make the broker delete records sooner (a shorter or
        removed retention, compaction turned on): such a plan needs a second person's approval
        (streamops.access.four_eyes_reason)."""
        return [f"{plan.topic}: {risk}" for plan in self.to_change for change in plan.config_changes
                if (risk := _deletes_sooner(change))]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProvisioningPlan:
        """The plan from its JSON, as every plan is read back (streamops.plans.from_plan_json)."""
        return from_plan_json(cls, data)


def select_topics(catalog: Catalog, names: Sequence[str] | None) -> list[TopicSpec]:
    """The catalog topics to provision: all of them, or the named subset (each must exist). A
    topic whose retention is held (streamops.retention: recover_extend_retention, for a stated time)
    keeps the held retention.ms until the hold ends."""
    if names:
        known = set(catalog.topic_names())
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(
                f"topics not in the catalog: {', '.join(sorted(unknown))}; "
                f"choose from: {', '.join(catalog.topic_names())}"
            )
    chosen = [spec for spec in catalog.topics if not names or spec.name in set(names)]
    holds = read_holds()
    return [spec.model_copy(update={"configs": held_configs(spec.name, spec.configs, holds)}) if spec.name in holds
            else spec for spec in chosen]


def plan_topics(specs: Sequence[TopicSpec], broker: BrokerSnapshot, *, report_unmanaged: bool) -> ProvisioningPlan:
    """Compare catalog specs with the broker and say, per topic, what apply would do."""
    plans = [_plan_one(spec, broker) for spec in specs]
    catalog_names = {spec.name for spec in specs}
    unmanaged = sorted(broker.all_topic_names - catalog_names) if report_unmanaged else []
    return ProvisioningPlan(topics=plans, unmanaged_topics=unmanaged)


def _plan_one(spec: TopicSpec, broker: BrokerSnapshot) -> TopicPlan:
    desired_configs = spec.kafka_configs()
    current = broker.topics.get(spec.name)
    common: dict[str, Any] = dict(
        topic=spec.name,
        partitions_desired=spec.partitions,
        replication_factor=spec.replication_factor,
        configs_desired=desired_configs,
    )
    if current is None:
        refusals = []
        if spec.replication_factor > broker.broker_count:
            refusals.append(
                f"replication factor {spec.replication_factor} needs at least {spec.replication_factor} "
                f"brokers; the cluster has {broker.broker_count}"
            )
        return TopicPlan(
            actions=[Action.REFUSED] if refusals else [Action.CREATE], refusals=refusals, **common
        )

    refusals = []
    if spec.partitions < current.partitions:
        refusals.append(
            f"partitions {current.partitions} -> {spec.partitions} refused: Kafka cannot remove partitions "
            f"(it would drop their data and move keys to other partitions); set the catalog back to "
            f"{current.partitions}, or create a new topic and migrate"
        )
    if spec.replication_factor != current.replication_factor:
        refusals.append(
            f"replication factor {current.replication_factor} -> {spec.replication_factor} refused: "
            "that needs a partition reassignment (kafka-reassign-partitions), which this DAG does not do"
        )

    changes = [
        ConfigChange(key=key, current=current.configs.get(key), desired=value)
        for key, value in sorted(desired_configs.items())
        if not _same_config(key, current.configs.get(key), value)
    ]
    changes += [
        ConfigChange(key=key, current=current.configs.get(key), desired=None)
        for key in sorted(current.overridden - desired_configs.keys())
    ]

    actions = []
    if refusals:
        actions.append(Action.REFUSED)
    else:
        if spec.partitions > current.partitions:
            actions.append(Action.ADD_PARTITIONS)
        if changes:
            actions.append(Action.ALTER_CONFIGS)
    return TopicPlan(
        actions=actions or [Action.NO_CHANGE],
        partitions_current=current.partitions,
        config_changes=changes,
        refusals=refusals,
        **common,
    )


# Limits after which the broker deletes records (-1: never): a partition's oldest records, a
# compacted topic's tombstones, the youngest records compaction may remove.
_RETENTION_LIMITS = ("retention.ms", "retention.bytes", "local.retention.ms", "local.retention.bytes",
                     "delete.retention.ms", "min.compaction.lag.ms")


def _deletes_sooner(change: ConfigChange) -> str | None:
    """Why `change` can delete records sooner than the topic does now, else None."""
    if change.key == "cleanup.policy":
        # Either way records go: compaction removes a key's older values, retention deletes what
        # compaction kept (a removed override is the broker's default, delete).
        if change.desired is None:
            return f"cleanup.policy override {change.current!r} removed (the broker default, delete, may apply)"
        kept, wanted = (set((v or "").replace(" ", "").split(",")) - {""} for v in (change.current, change.desired))
        return f"cleanup.policy {change.current!r} -> {change.desired!r} deletes records the topic keeps now" \
            if wanted - kept else None
    if change.key not in _RETENTION_LIMITS:
        return None
    if change.desired is None:
        return f"{change.key} override {change.current!r} removed (the broker default may be shorter)"

    def limit(value: str | None) -> float | None:
        try:
            number = int(value) if value is not None else None
        except ValueError:
            return None
        return None if number is None else float("inf") if number < 0 else float(number)

    now, then = limit(change.current), limit(change.desired)
    if now is None or then is None or then < now:
        return f"{change.key} {change.current!r} -> {change.desired!r}"
    return None


def _same_config(key: str, current: str | None, desired: str) -> bool:
    if current is None:
        return False
    if key == "cleanup.policy":
        return sorted(current.replace(" ", "").split(",")) == sorted(desired.split(","))
    return current == desired


# ---------------------------------------------------------------------------------------------
# Apply and verify


class TopicResult(BaseModel):
    topic: str
    applied: list[str]
    error: str | None = None


def apply_plan(admin: AdminClient, plan: ProvisioningPlan) -> list[TopicResult]:
    """Carry out the plan's creates, partition increases and config changes.

    Every topic is attempted even if another fails, so one bad topic does not hold back the
    rest; the caller fails the run when any result has an error. Refused topics are skipped.
    """
    results = {p.topic: TopicResult(topic=p.topic, applied=[]) for p in plan.to_change}

    creates = [p for p in plan.to_change if Action.CREATE in p.actions]
    if creates:
        # The provider's KafkaAdminClientHook.create_topic takes no topic configs and treats
        # "already exists" as success; the catalog needs both, so create with its AdminClient.
        futures = admin.create_topics(
            [
                NewTopic(
                    p.topic,
                    num_partitions=p.partitions_desired,
                    replication_factor=p.replication_factor,
                    config=p.configs_desired,
                )
                for p in creates
            ],
            request_timeout=ADMIN_TIMEOUT_S,
        )
        _collect(futures, results, "created", key=lambda topic: topic)

    grows = [p for p in plan.to_change if Action.ADD_PARTITIONS in p.actions]
    if grows:
        futures = admin.create_partitions(
            [NewPartitions(p.topic, p.partitions_desired) for p in grows], request_timeout=ADMIN_TIMEOUT_S
        )
        _collect(futures, results, "partitions added", key=lambda topic: topic)

    alters = [p for p in plan.to_change if Action.ALTER_CONFIGS in p.actions]
    if alters:
        resources = [
            ConfigResource(
                ResourceType.TOPIC,
                p.topic,
                incremental_configs=[
                    ConfigEntry(c.key, c.desired, incremental_operation=AlterConfigOpType.SET)
                    if c.desired is not None
                    else ConfigEntry(c.key, None, incremental_operation=AlterConfigOpType.DELETE)
                    for c in p.config_changes
                ],
            )
            for p in alters
        ]
        altered = admin.incremental_alter_configs(resources, request_timeout=ADMIN_TIMEOUT_S)
        _collect(altered, results, "configs altered", key=lambda resource: resource.name)

    return list(results.values())


def _collect(futures: dict, results: dict[str, TopicResult], what: str, key) -> None:
    for item, future in futures.items():
        topic = key(item)
        try:
            future.result()
        except KafkaException as exc:
            error = exc.args[0]
            message = f"{what} failed: {error.str() if hasattr(error, 'str') else error}"
            previous = results[topic].error
            results[topic].error = f"{previous}; {message}" if previous else message
            log.error("%s: %s", topic, message)
        else:
            results[topic].applied.append(what)
            log.info("%s: %s", topic, what)


def _differences(plan: ProvisioningPlan) -> dict[str, str]:
    """Per topic, how the broker still differs from the catalog (empty when it matches)."""
    out = {}
    for topic in plan.topics:
        if topic.actions == [Action.NO_CHANGE]:
            continue
        if Action.CREATE in topic.actions:
            out[topic.topic] = "does not exist"
        else:
            out[topic.topic] = topic.details()
    return out


def verify(admin: AdminClient, specs: Sequence[TopicSpec], timeout: float = 30.0) -> BrokerSnapshot:
    """Describe the topics again until they match the catalog; raise naming what still differs.

    Polls because a new topic's metadata can reach the broker we ask a moment after creation. A
    difference the plan refuses (fewer partitions, another replication factor) never goes away
    by itself: it is reported as soon as nothing else is still settling, not after the timeout.
    """
    names = [spec.name for spec in specs]
    latest: dict[str, ProvisioningPlan] = {}
    snapshots: dict[str, BrokerSnapshot] = {}

    def settled() -> bool:
        snapshots["latest"] = describe_broker(admin, names)
        latest["plan"] = plan_topics(specs, snapshots["latest"], report_unmanaged=False)
        return all(topic.actions == [Action.NO_CHANGE] or topic.refusals for topic in latest["plan"].topics)

    try:
        poll_until(settled, timeout=timeout, what="the broker to match the catalog")
    except DeadlineExceeded:
        pass
    diff = _differences(latest["plan"])
    if diff:
        lines = "\n".join(f"  - {topic}: {why}" for topic, why in sorted(diff.items()))
        raise ProvisioningError(
            f"after apply, {len(diff)} topic(s) on the broker still differ from the catalog:\n{lines}"
        )
    return snapshots["latest"]


def ensure_topics(admin: AdminClient, specs: Sequence[TopicSpec]) -> ProvisioningPlan:
    """Plan, apply and verify in one call (scripts and tests); refuse if any change is refused."""
    plan = plan_topics(specs, describe_broker(admin, [s.name for s in specs]), report_unmanaged=False)
    if plan.refused:
        raise ProvisioningError(
            "refused: " + "; ".join(f"{p.topic}: {', '.join(p.refusals)}" for p in plan.refused)
        )
    failed = [r for r in apply_plan(admin, plan) if r.error]
    if failed:
        raise ProvisioningError("; ".join(f"{r.topic}: {r.error}" for r in failed))
    verify(admin, specs)
    return plan
