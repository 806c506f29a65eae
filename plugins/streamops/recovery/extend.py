"""Extend an app's input retention for a stated time, then revert it (recover_extend_retention).

When a stopped or slow app's retention runway (streamops.retention) is shorter than it needs to
catch up, its inputs' retention.ms is raised by a stated amount for a stated time, through the
provisioning path (the same plan, apply and verify as provision_topics): a hold is written first
(`<checkpoint root>/_retention/holds.json`), so provision_topics keeps the held value instead of
reverting it, then the broker is changed. When the hold ends, the supervisor (the app_status run)
puts the catalog's retention back, unless that would delete records the app has not read yet:
then it keeps the hold and says so (the run pages; extend again or let the app catch up).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
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
from streamops.retention import RUNWAY_FLOOR_S, RetentionHold, holds_changed, read_holds, topic_retentions
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
    retention_ms_now: int  # the broker's
    declared_ms: int | None  # the catalog's (None: the broker's default)
    retention_ms_new: int
    shortest_runway_s: float | None  # now, over the app's partitions of it (None: nothing waits)


@dataclass
class ExtendPlan(JsonPlan):
    app: str
    request: dict
    topics: list[TopicExtension]
    until: str  # when the hold ends and the catalog's retention comes back
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [[t.topic, f"{t.retention_ms_now:,}", f"{t.retention_ms_new:,}",
                 "-" if t.shortest_runway_s is None else f"{t.shortest_runway_s:,.0f} s -> "
                 f"{t.shortest_runway_s + (t.retention_ms_new - t.retention_ms_now) / 1000:,.0f} s"] for t in self.topics]
        head = tabulate(rows, headers=["input topic", "retention.ms now", "retention.ms held", "shortest runway"])
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
        now_ms = kept.get(topic)
        if now_ms is None or now_ms.retention_ms is None:
            notes.append(f"{topic} keeps its records without a time limit (retention.ms -1, or compaction only): "
                         "left as it is")
            continue
        declared = catalog.topic(topic).configs.get("retention.ms")
        short = [r.runway_s for r in runways if r.topic == topic and r.runway_s is not None]
        topics.append(TopicExtension(topic, now_ms.retention_ms, declared if isinstance(declared, int) else None,
                                     now_ms.retention_ms + extra, min(short) if short else None))
    if not topics:
        raise RecoveryRefused([*notes, f"no input topic of {app.name} has a time retention to extend"])
    return ExtendPlan(app.name, asdict(request), topics, iso_ms(now + timedelta(milliseconds=hold)), notes)


def _only_retention(admin: Any, topics: dict[str, int | None]) -> list[str]:
    """Set retention.ms of each topic (None: remove the topic's own value) and nothing else, through
    provisioning's plan and apply: the topic as the broker has it, with that one config changed."""
    snapshot = describe_broker(admin, list(topics))
    specs = []
    for name, retention_ms in topics.items():
        broker = snapshot.topics[name]
        configs: dict[str, Any] = {k: _config_value(broker.configs[k]) for k in broker.overridden
                                   if k != "retention.ms" and k in KNOWN_TOPIC_CONFIGS}
        if retention_ms is not None:
            configs["retention.ms"] = retention_ms
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
    """The hold first (provision_topics keeps it from then on), then the broker's retention.ms, and
    only it. The hold's time counts from now (the approval may have taken a while)."""
    now = now or datetime.now(UTC)
    until = iso_ms(now + timedelta(milliseconds=duration_ms(plan.request["hold_for"])))
    with holds_changed() as holds:
        for t in plan.topics:
            holds[t.topic] = RetentionHold(t.topic, t.retention_ms_new, t.declared_ms, until, run_id, by)
    failed = _only_retention(admin, {t.topic: t.retention_ms_new for t in plan.topics})
    if failed:
        raise RecoveryRefused([f"the broker refused the change: {', '.join(failed)} (the hold is recorded; "
                               "provision_topics applies it once the broker takes it)"])
    return {"summary": f"retention.ms of {', '.join(t.topic for t in plan.topics)} held at "
                       f"{', '.join(f'{t.retention_ms_new:,}' for t in plan.topics)} until {until}",
            "held": {t.topic: t.retention_ms_new for t in plan.topics}, "until": until}


def verify_extend(admin: Any, plan: ExtendPlan) -> dict[str, Any]:
    kept = topic_retentions(admin, [t.topic for t in plan.topics])
    wrong = [f"{t.topic}: {kept[t.topic].retention_ms} (wanted {t.retention_ms_new})" for t in plan.topics
             if kept[t.topic].retention_ms != t.retention_ms_new]
    if wrong:
        raise RecoveryRefused([f"the broker does not keep the held retention: {'; '.join(wrong)}"])
    return {"summary": f"the broker keeps {', '.join(f'{t.topic} for {t.retention_ms_new:,} ms' for t in plan.topics)}"}


def end_holds(admin: Any, kafka: KafkaClientConfig, catalog: Catalog, now: datetime | None = None) -> list[str]:
    """The supervisor's part: put the catalog's retention.ms back (and only it) on every topic whose
    hold ended, unless an app reading it could lose an unread record by that: its oldest unread one
    is older than the catalog's retention less the runway floor, or its age cannot be read, or the
    catalog declares no retention.ms to go back to. Then the hold stays and the line says why.
    What it did, a line per topic."""
    now = now or datetime.now(UTC)
    ended = {topic: hold for topic, hold in read_holds().items() if not hold.active(now)}
    lines = []
    for topic, hold in sorted(ended.items()):
        declared = catalog.topic(topic).configs.get("retention.ms") if topic in catalog.topic_names() else None
        why_kept = _revert_risk(kafka, catalog, topic, declared)
        if why_kept:
            lines.append(f"{topic}: the retention hold of run {hold.run_id} ended at {hold.until}, but {why_kept}: kept "
                         "held; extend again with recover_extend_retention, let the app catch up, or revert by hand")
            continue
        assert isinstance(declared, int)
        with holds_changed() as holds:
            holds.pop(topic, None)
        errors = _only_retention(admin, {topic: declared})
        lines.append(f"{topic}: the retention hold of run {hold.run_id} ended at {hold.until}: "
                     + (f"reverting failed: {errors[0]}" if errors else f"the catalog's retention.ms {declared} is back"))
    return lines


def _revert_risk(kafka: KafkaClientConfig, catalog: Catalog, topic: str, declared: object) -> str | None:
    if not isinstance(declared, int) or declared < 0:
        return "the catalog declares no time retention.ms for it to go back to"
    for app in (a for a in catalog.apps if topic in a.inputs.values()):
        for runway in app_status(app, kafka).runways:
            if runway.topic != topic or runway.position >= _end_of(kafka, topic, runway.partition):
                continue
            if runway.oldest_age_s is None:
                return f"{app.name}'s oldest unread record on partition {runway.partition} cannot be read"
            if runway.oldest_age_s >= declared / 1000 - min(RUNWAY_FLOOR_S, declared / 2000):
                return (f"{app.name}'s oldest unread record (partition {runway.partition}, offset {runway.position}) is "
                        f"{runway.oldest_age_s:,.0f} s old: the catalog's retention ({declared / 1000:,.0f} s) would "
                        "delete it, or nearly")
    return None


def _end_of(kafka: KafkaClientConfig, topic: str, partition: int) -> int:
    return end_offsets(kafka, topic).get(partition, (0, 0))[1]
