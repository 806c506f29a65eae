"""Extend an app's input retention for a stated time, then revert it (recover_extend_retention).

When a stopped or slow app's retention runway (streamops.retention) is shorter than it needs to
catch up, its inputs' retention.ms is raised by a stated amount for a stated time (and, where a
size limit deletes too, retention.bytes by what the partition writes in that time at the rate its
unread records were written), through the
provisioning path (the same plan, apply and verify as provision_topics): a hold is written first
(`<checkpoint root>/_retention/holds.json`), so provision_topics keeps the held value instead of
reverting it, then the broker is changed. When the hold ends, the supervisor (the app_status run)
puts the catalog's retention back, unless that would delete records the app has not read yet:
then it keeps the hold and says so (the run pages; extend again or let the app catch up).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tabulate import tabulate

from streamops.app_status import app_status
from streamops.catalog import KNOWN_TOPIC_CONFIGS, Catalog, TopicSpec
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import DURATION_PATTERN, duration_ms, end_offsets
from streamops.plans import JsonPlan
from streamops.provisioning import apply_plan, describe_broker, plan_topics, verify
from streamops.recovery.common import RecoveryRefused, resolve_app
from streamops.retention import (
    RUNWAY_FLOOR_S,
    RetentionHold,
    Runway,
    TopicRetention,
    holds_changed,
    read_holds,
    topic_retentions,
)
from streamops.timestamps import iso_ms

MAX_EXTENSION = timedelta(days=30)
MAX_HOLD = timedelta(days=30)


@dataclass
class ExtendRequest:
    app: str
    extend_by: str = "1 day"  # added to each input's retention.ms
    hold_for: str = "1 day"  # then the catalog's retention comes back


@dataclass
class TopicExtension:
    topic: str
    retention_ms_now: int | None  # the broker's (None: no time limit)
    declared_ms: int | None  # the catalog's (None: the broker's default)
    retention_ms_new: int | None  # None: left as it is
    shortest_runway_s: float | None  # now, over the app's partitions of it (None: nothing waits)
    retention_bytes_now: int | None = None  # per partition (None: no size limit)
    declared_bytes: int | None = None
    retention_bytes_new: int | None = None
    bytes_per_s: float | None = None  # the fastest partition's write rate, the size extension's basis
    runway_after_s: float | None = None  # the shortest runway once held

    def held(self) -> dict[str, int]:
        """The configs this extension sets: name -> value."""
        return {name: value for name, value in (("retention.ms", self.retention_ms_new),
                                                ("retention.bytes", self.retention_bytes_new)) if value is not None}


@dataclass
class ExtendPlan(JsonPlan):
    app: str
    request: dict
    topics: list[TopicExtension]
    until: str  # when the hold ends and the catalog's retention comes back
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        def change(now: int | None, new: int | None) -> str:
            return "-" if new is None else f"{now:,} -> {new:,}" if now is not None else f"{new:,}"

        rows = [[t.topic, change(t.retention_ms_now, t.retention_ms_new),
                 change(t.retention_bytes_now, t.retention_bytes_new),
                 "-" if t.shortest_runway_s is None else f"{t.shortest_runway_s:,.0f} s -> "
                 + ("-" if t.runway_after_s is None else f"{t.runway_after_s:,.0f} s")] for t in self.topics]
        head = tabulate(rows, headers=["input topic", "retention.ms", "retention.bytes", "shortest runway"])
        return "\n".join([head, f"held until {self.until}; then the catalog's retention comes back (the supervisor "
                                "reverts it, unless that would delete records the app has not read)", *self.notes])

    def summary(self) -> str:
        return (f"extend the retention of {len(self.topics)} input topic(s) of {self.app} by {self.request['extend_by']} "
                f"until {self.until}")


def _duration(text: str, what: str, most: timedelta, problems: list[str]) -> int | None:
    if not isinstance(text, str) or not re.fullmatch(DURATION_PATTERN, text):
        problems.append(f"{what} {text!r} must look like '6 hours' or '2 days'")
        return None
    ms = duration_ms(text)
    if ms > most // timedelta(milliseconds=1):
        problems.append(f"{what} {text!r} is more than {most.days} days")
        return None
    return ms


def plan_extend(admin: Any, kafka: KafkaClientConfig, catalog: Catalog, request: ExtendRequest,
                now: datetime | None = None) -> ExtendPlan:
    now = now or datetime.now(UTC)
    problems: list[str] = []
    app = resolve_app(catalog, request.app, problems)
    extra = _duration(request.extend_by, "extend_by", MAX_EXTENSION, problems)
    hold = _duration(request.hold_for, "hold_for", MAX_HOLD, problems)
    if app is None or extra is None or hold is None:
        raise RecoveryRefused(problems)
    inputs = sorted(set(app.inputs.values()))
    kept = topic_retentions(admin, inputs)
    notes = []
    try:
        runways = app_status(app, kafka).runways
    except Exception as exc:  # noqa: BLE001 - the runway is shown, not needed: the extension still helps
        runways = []
        notes.append(f"the app's runway could not be read ({type(exc).__name__}: {exc}); shown as unknown")
    topics = []
    for topic in inputs:
        extension = _topic_extension(topic, kept.get(topic), catalog.topic(topic).configs, extra,
                                     [r for r in runways if r.topic == topic], notes)
        if extension is not None:
            topics.append(extension)
    if not topics:
        raise RecoveryRefused([*notes, f"no input topic of {app.name} has a retention to extend"])
    return ExtendPlan(app.name, asdict(request), topics, iso_ms(now + timedelta(milliseconds=hold)), notes)


def _topic_extension(topic: str, broker: TopicRetention | None, declared: dict[str, Any], extra_ms: int,
                     runways: list[Runway], notes: list[str]) -> TopicExtension | None:
    """What the extension holds on one input: retention.ms plus `extra_ms`; retention.bytes plus
    what its fastest partition writes in `extra_ms` at the rate its unread records were written."""
    if broker is None or (broker.retention_ms is None and broker.retention_bytes is None):
        notes.append(f"{topic} keeps its records without a limit (retention.ms and retention.bytes -1, or compaction "
                     "only): left as it is")
        return None
    new_ms = broker.retention_ms + extra_ms if broker.retention_ms is not None else None
    new_bytes, rate = None, None
    if broker.retention_bytes is not None:
        rates = [r.unread_bytes / max(r.oldest_age_s, 1.0) for r in runways
                 if r.unread_bytes is not None and r.oldest_age_s is not None]
        rate = round(max(rates, default=0.0), 1) or None  # as the plan shows it: the extension is what it says
        if rate is None:
            notes.append(f"{topic}: retention.bytes {broker.retention_bytes:,} left as it is: no unread records to "
                         "measure the rate it fills at (nothing a size limit could delete yet)")
        else:
            new_bytes = broker.retention_bytes + math.ceil(rate * extra_ms / 1000)
    if new_ms is None and new_bytes is None:
        return None
    short = [r.runway_s for r in runways if r.runway_s is not None]
    after = [replace(r, retention_ms=new_ms or r.retention_ms, retention_bytes=new_bytes or r.retention_bytes).runway_s
             for r in runways]
    declared_ms, declared_bytes = declared.get("retention.ms"), declared.get("retention.bytes")
    return TopicExtension(topic, broker.retention_ms, declared_ms if isinstance(declared_ms, int) else None, new_ms,
                          min(short) if short else None, broker.retention_bytes,
                          declared_bytes if isinstance(declared_bytes, int) else None, new_bytes,
                          rate,
                          min((a for a in after if a is not None), default=None) if short else None)


def _set_retention(admin: Any, topics: dict[str, dict[str, int | None]]) -> list[str]:
    """Set the given retention configs of each topic (None: remove the topic's own value) and nothing
    else, through provisioning's plan and apply: the topic as the broker has it, those configs changed."""
    snapshot = describe_broker(admin, list(topics))
    specs = []
    for name, changes in topics.items():
        broker = snapshot.topics[name]
        configs: dict[str, Any] = {k: _config_value(broker.configs[k]) for k in broker.overridden
                                   if k not in changes and k in KNOWN_TOPIC_CONFIGS}
        configs.update({k: v for k, v in changes.items() if v is not None})
        specs.append(TopicSpec(name=name, partitions=broker.partitions, replication_factor=broker.replication_factor,
                               owner="-", description="-", configs=configs))
    plan = plan_topics(specs, snapshot, report_unmanaged=False)
    errors = [f"{r.topic}: {r.error}" for r in apply_plan(admin, plan) if r.error]
    if not errors:
        verify(admin, specs)  # until the broker reports the new value (its metadata catches up after a while)
    return errors


def _config_value(text: str) -> Any:
    """A broker's config value as the catalog writes it (numbers as numbers)."""
    return int(text) if re.fullmatch(r"-?[0-9]+", text) else text


def apply_extend(admin: Any, plan: ExtendPlan, *, run_id: str, by: str, now: datetime | None = None) -> dict[str, Any]:
    """The hold first (provision_topics keeps it from then on), then the broker's retention.ms (and
    retention.bytes where held), and only them. The hold's time counts from now (the approval may
    have taken a while)."""
    now = now or datetime.now(UTC)
    until = iso_ms(now + timedelta(milliseconds=duration_ms(plan.request["hold_for"])))
    with holds_changed() as holds:
        for t in plan.topics:
            holds[t.topic] = RetentionHold(t.topic, t.retention_ms_new, t.declared_ms, until, run_id, by,
                                           t.retention_bytes_new, t.declared_bytes)
    held = {t.topic: dict(t.held()) for t in plan.topics}
    failed = _set_retention(admin, {topic: dict(configs) for topic, configs in held.items()})
    if failed:
        raise RecoveryRefused([f"the broker refused the change: {', '.join(failed)} (the hold is recorded; "
                               "provision_topics applies it once the broker takes it)"])
    return {"summary": "; ".join(f"{topic}: {_configs_words(configs)}" for topic, configs in held.items())
                       + f", held until {until}",
            "held": held, "until": until}


def _configs_words(configs: dict[str, int]) -> str:
    return " and ".join(f"{name} {value:,}" for name, value in configs.items())


def verify_extend(admin: Any, plan: ExtendPlan) -> dict[str, Any]:
    kept = topic_retentions(admin, [t.topic for t in plan.topics])
    wrong = []
    for t in plan.topics:
        now = {"retention.ms": kept[t.topic].retention_ms, "retention.bytes": kept[t.topic].retention_bytes}
        wrong += [f"{t.topic}: {name} {now[name]} (wanted {value})" for name, value in t.held().items() if now[name] != value]
    if wrong:
        raise RecoveryRefused([f"the broker does not keep the held retention: {'; '.join(wrong)}"])
    return {"summary": "the broker keeps " + "; ".join(f"{t.topic}: {_configs_words(t.held())}" for t in plan.topics)}


def end_holds(admin: Any, kafka: KafkaClientConfig, catalog: Catalog, now: datetime | None = None) -> list[str]:
    """The supervisor's part: put the catalog's retention back (retention.ms, and retention.bytes
    where held; only them) on every topic whose hold ended, unless an app reading it could lose an
    unread record by that: its runway under the catalog's retention would be below the runway
    floor (or half the catalog's time limit, if shorter), or its oldest unread record cannot be
    read, or the catalog declares no value to go back to. Then the hold stays and the line says
    why. What it did, a line per topic."""
    now = now or datetime.now(UTC)
    ended = {topic: hold for topic, hold in read_holds().items() if not hold.active(now)}
    lines = []
    for topic, hold in sorted(ended.items()):
        configs = catalog.topic(topic).configs if topic in catalog.topic_names() else {}
        declared = {name: configs.get(name) for name in hold.held()}
        why_kept = _revert_risk(kafka, catalog, topic, declared)
        if why_kept:
            lines.append(f"{topic}: the retention hold of run {hold.run_id} ended at {hold.until}, but {why_kept}: kept "
                         "held; extend again with recover_extend_retention, let the app catch up, or revert by hand")
            continue
        with holds_changed() as holds:
            holds.pop(topic, None)
        back = {name: value for name, value in declared.items() if isinstance(value, int)}
        errors = _set_retention(admin, {topic: dict(back)})
        lines.append(f"{topic}: the retention hold of run {hold.run_id} ended at {hold.until}: "
                     + (f"reverting failed: {errors[0]}" if errors else
                        f"the catalog's {' and '.join(f'{name} {value}' for name, value in back.items())} is back"))
    return lines


def _revert_risk(kafka: KafkaClientConfig, catalog: Catalog, topic: str, declared: Mapping[str, object]) -> str | None:
    missing = [name for name, value in declared.items() if not isinstance(value, int)]
    if missing:  # the broker's default would come back, which this suite does not read: a person decides
        return (f"the catalog declares no {' or '.join(missing)} for it to go back to (the broker's default would "
                "apply)")
    declared = {name: value for name, value in declared.items() if isinstance(value, int) and value >= 0}
    if not declared:  # unlimited (-1) deletes nothing: nothing unread is at risk
        return None
    declared_ms, declared_bytes = declared.get("retention.ms"), declared.get("retention.bytes")
    for app in (a for a in catalog.apps if topic in a.inputs.values()):
        for runway in app_status(app, kafka).runways:
            if runway.topic != topic or runway.position >= _end_of(kafka, topic, runway.partition):
                continue
            if runway.oldest_age_s is None:
                return f"{app.name}'s oldest unread record on partition {runway.partition} cannot be read"
            reverted = replace(runway, retention_ms=declared_ms if isinstance(declared_ms, int) else runway.retention_ms,
                               retention_bytes=declared_bytes if isinstance(declared_bytes, int) else runway.retention_bytes)
            time_left, size_left = reverted.time_runway_s, reverted.size_runway_s
            time_margin = min(RUNWAY_FLOOR_S, (reverted.retention_ms or 0) / 2000)
            if time_left is not None and time_left <= time_margin:
                kept_s = (reverted.retention_ms or 0) / 1000
                return (f"{app.name}'s oldest unread record (partition {runway.partition}, offset {runway.position}) is "
                        f"{runway.oldest_age_s:,.0f} s old: the catalog's retention ({kept_s:,.0f} s) would delete it, or "
                        "nearly")
            if size_left is not None and size_left <= RUNWAY_FLOOR_S:
                return (f"{app.name}'s unread records on partition {runway.partition} (from offset {runway.position}, about "
                        f"{runway.unread_bytes:,} bytes) would reach the catalog's retention.bytes ({declared_bytes:,}) "
                        f"in {size_left:,.0f} s")
    return None


def _end_of(kafka: KafkaClientConfig, topic: str, partition: int) -> int:
    return end_offsets(kafka, topic).get(partition, (0, 0))[1]
