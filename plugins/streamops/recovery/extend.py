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
from streamops.catalog import Catalog
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import DURATION_PATTERN, duration_ms
from streamops.plans import JsonPlan
from streamops.provisioning import apply_plan, describe_broker, plan_topics, select_topics
from streamops.recovery.common import RecoveryRefused, resolve_app
from streamops.retention import RetentionHold, read_holds, topic_retentions, write_holds
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
    runways = app_status(app, kafka).runways
    topics = []
    for topic in inputs:
        now_ms = kept.get(topic)
        if now_ms is None or now_ms.retention_ms is None:
            problems.append(f"{topic} keeps its records without a time limit (retention.ms -1, or compaction only): "
                            "nothing to extend")
            continue
        declared = catalog.topic(topic).configs.get("retention.ms")
        short = [r.runway_s for r in runways if r.topic == topic and r.runway_s is not None]
        topics.append(TopicExtension(topic, now_ms.retention_ms, declared if isinstance(declared, int) else None,
                                     now_ms.retention_ms + extra, min(short) if short else None))
    if problems:
        raise RecoveryRefused(problems)
    return ExtendPlan(app.name, asdict(request), topics, iso_ms(now + timedelta(milliseconds=hold)))


def apply_extend(admin: Any, catalog: Catalog, plan: ExtendPlan, *, run_id: str, by: str) -> dict[str, Any]:
    """The hold first (provision_topics keeps it from then on), then the broker, through provisioning."""
    holds = read_holds()
    for t in plan.topics:
        holds[t.topic] = RetentionHold(t.topic, t.retention_ms_new, t.declared_ms, plan.until, run_id, by)
    write_holds(holds)
    names = [t.topic for t in plan.topics]
    specs = select_topics(catalog, names)
    provisioning = plan_topics(specs, describe_broker(admin, names), report_unmanaged=False)
    failed = [f"{r.topic}: {r.error}" for r in apply_plan(admin, provisioning) if r.error]
    if failed:
        raise RecoveryRefused([f"the broker refused the change: {', '.join(failed)} (the hold is recorded; "
                               "provision_topics applies it once the broker takes it)"])
    return {"summary": f"retention.ms of {', '.join(names)} held at "
                       f"{', '.join(f'{t.retention_ms_new:,}' for t in plan.topics)} until {plan.until}",
            "held": {t.topic: t.retention_ms_new for t in plan.topics}}


def verify_extend(admin: Any, plan: ExtendPlan) -> dict[str, Any]:
    kept = topic_retentions(admin, [t.topic for t in plan.topics])
    wrong = [f"{t.topic}: {kept[t.topic].retention_ms} (wanted {t.retention_ms_new})" for t in plan.topics
             if kept[t.topic].retention_ms != t.retention_ms_new]
    if wrong:
        raise RecoveryRefused([f"the broker does not keep the held retention: {'; '.join(wrong)}"])
    return {"summary": f"the broker keeps {', '.join(f'{t.topic} for {t.retention_ms_new:,} ms' for t in plan.topics)}"}


def end_holds(admin: Any, kafka: KafkaClientConfig, catalog: Catalog, now: datetime | None = None) -> list[str]:
    """The supervisor's part: put the catalog's retention back on every topic whose hold ended,
    unless an app reading it has an unread record older than that retention (it would be deleted):
    then the hold stays, and the line says so. What it did, a line per topic."""
    now = now or datetime.now(UTC)
    holds = read_holds()
    ended = {topic: hold for topic, hold in holds.items() if not hold.active(now)}
    if not ended:
        return []
    lines = []
    for topic, hold in sorted(ended.items()):
        declared = catalog.topic(topic).configs.get("retention.ms") if topic in catalog.topic_names() else None
        limit_s = declared / 1000 if isinstance(declared, int) and declared >= 0 else None
        readers = [a for a in catalog.apps if topic in a.inputs.values()]
        oldest = max((r.oldest_age_s or 0.0 for a in readers for r in app_status(a, kafka).runways if r.topic == topic),
                     default=0.0)
        if limit_s is not None and oldest >= limit_s:
            lines.append(f"{topic}: the retention hold of run {hold.run_id} ended at {hold.until}, but its oldest unread "
                         f"record is {oldest:,.0f} s old, past the catalog's retention ({limit_s:,.0f} s): kept held "
                         "(reverting would delete it); extend again with recover_extend_retention or let the app catch up")
            continue
        del holds[topic]
        write_holds(holds)
        specs = select_topics(catalog, [topic], now)
        results = apply_plan(admin, plan_topics(specs, describe_broker(admin, [topic]), report_unmanaged=False))
        errors = [r.error for r in results if r.error]
        lines.append(f"{topic}: the retention hold of run {hold.run_id} ended at {hold.until}: "
                     + (f"reverting failed: {errors[0]}" if errors else f"the catalog's retention.ms {declared} is back"))
    return lines
