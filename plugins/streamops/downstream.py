"""What a recovery does to the teams that read an app's outputs: per output topic and per consumer
group reading it, how many records that group receives again and how many it never receives.

A plan says which of the app's input records it processes again (a reset back, a restore, a
rebuild) and which it never processes (a reset forward, a skip), as InputRanges. The readers are
the consumer groups with committed offsets on the app's output topics, found on the cluster; the
suite's own groups and Spark's never count (SUITE_GROUP_PREFIXES: they commit nothing anyway).

- Again: an output that names its source record (a value field `event_id` =
  "topic/partition/offset", the suite's lineage convention: streamops.records, the quality
  reconciliation) is read (bounded) and the output records of the ranges are counted exactly, per
  partition, against the group's committed offset: those below it the group has read and receives
  again, those at or above it it will read twice. An output without lineage (a stateful app's
  aggregates) is recomputed from those input records: the count of its records is not known before
  the app runs, and the impact says so.
- Never: the outputs of input records the app never processes are never written: every group
  reading the app's outputs never receives them (counted as input records; their dead letters, for
  a skip, go to the dead-letter topic and its readers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions

from streamops.catalog import AppSpec, Catalog
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import OffsetSpan, end_offsets, offsets_for_time
from streamops.kafka_records import read_spans

# Groups that are the suite itself or Spark: never a downstream reader.
SUITE_GROUP_PREFIXES = ("streamops-", "spark-kafka-source-", "spark-kafka-relation-")
LINEAGE_FIELD = "event_id"
SCAN_RECORDS = 100_000  # output records read per plan to count what it re-emits (held in memory while read)
SCAN_SECONDS = 60.0
# An output record is written after its input record: read outputs from the input's timestamp on,
# less this much for clocks that differ between hosts.
CLOCK_SLACK_MS = 5 * 60 * 1000
ADMIN_TIMEOUT_S = 30

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputRange:
    """Input records [start, end) of one partition a plan processes again, or never."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def records(self) -> int:
        return max(0, self.end - self.start)

    def contains(self, topic: str, partition: int, offset: int) -> bool:
        return topic == self.topic and partition == self.partition and self.start <= offset < self.end


@dataclass(frozen=True)
class PlanEffect:
    """What a plan does to an app's input, as its readers downstream feel it."""

    again: tuple[InputRange, ...] = ()  # processed once more: their outputs are written again
    never: tuple[InputRange, ...] = ()  # never processed: their outputs are never written
    moved_to: str | None = None  # a cutover: the outputs leave for these topics, in words
    replayed: int = 0  # dead letters put back on the input: outputs new to every reader


@dataclass
class GroupImpact:
    group: str
    topic: str  # the output topic the group reads
    again_read: int | None  # output records it has read and receives again (None: not known before the run)
    again_unread: int | None  # output records it has not read yet and will receive twice
    never: int  # input records whose outputs it never receives
    note: str = ""
    replayed: int = 0  # replayed dead letters whose outputs it receives for the first time

    def words(self) -> str:
        parts = []
        note = self.note
        if self.again_read is None and note:  # a lineage output too large to count: the note says why
            parts.append(f"receives again the outputs of the records processed again ({note})")
            note = ""
        elif self.again_read is None:
            parts.append("receives again the outputs recomputed from the records processed again (how many is known "
                         "only once the app has run: this output names no source record)")
        elif self.again_read or self.again_unread:
            parts.append(f"receives again {self.again_read:,} record(s) it has read"
                         + (f", and {self.again_unread:,} it has not read yet twice" if self.again_unread else ""))
        if self.never:
            parts.append(f"never receives the outputs of {self.never:,} input record(s)")
        if self.replayed:
            parts.append(f"receives the outputs of {self.replayed:,} replayed dead letter(s), new to it")
        if not parts and note:
            return f"group {self.group} on {self.topic}: {note}"
        said = "; ".join(parts) or "sees no difference"
        return f"group {self.group} on {self.topic}: {said}" + (f" ({note})" if note else "")


@dataclass
class DownstreamImpact:
    groups: list[GroupImpact] = field(default_factory=list)
    unread_outputs: list[str] = field(default_factory=list)  # output topics no outside group reads
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        lines = [g.words() for g in self.groups]
        if self.unread_outputs:
            lines.append(f"no consumer group outside the suite reads {', '.join(self.unread_outputs)}")
        return lines + self.notes

    def summary(self) -> str:
        touched = [g for g in self.groups
                   if g.again_read is None or g.again_read or g.again_unread or g.never or g.note or g.replayed]
        return (f"downstream: {len(touched)} consumer group(s) affected" if touched
                else "downstream: no consumer group outside the suite is affected")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "lines": self.lines()}

    @classmethod
    def from_json(cls, data: Any) -> DownstreamImpact:
        if not isinstance(data, dict):
            return cls()
        return cls(groups=[GroupImpact(**g) for g in data.get("groups") or []],
                   unread_outputs=list(data.get("unread_outputs") or []), notes=list(data.get("notes") or []))


def is_suite_group(group: str) -> bool:
    return group.startswith(SUITE_GROUP_PREFIXES)


def reading_groups(admin: Any, topics: Iterable[str]) -> dict[str, dict[tuple[str, int], int]]:
    """The consumer groups outside the suite with committed offsets on `topics`:
    group -> {(topic, partition): committed offset}."""
    wanted = set(topics)
    listed = admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result(ADMIN_TIMEOUT_S)
    found: dict[str, dict[tuple[str, int], int]] = {}
    for listing in sorted(listed.valid, key=lambda g: g.group_id):
        if is_suite_group(listing.group_id):
            continue
        request = [ConsumerGroupTopicPartitions(listing.group_id)]
        answer = admin.list_consumer_group_offsets(request, request_timeout=ADMIN_TIMEOUT_S)[listing.group_id]
        committed = answer.result(ADMIN_TIMEOUT_S)
        offsets = {(tp.topic, tp.partition): tp.offset for tp in committed.topic_partitions or []
                   if tp.topic in wanted and tp.offset >= 0}
        if offsets:
            found[listing.group_id] = offsets
    return found


def has_lineage(catalog: Catalog, topic: str) -> bool:
    """Does each record of `topic` name its source record (`event_id`)?"""
    spec = next((t for t in catalog.topics if t.name == topic), None)
    return bool(spec and spec.value_schema and LINEAGE_FIELD in spec.value_schema)


def downstream_impact(kafka: KafkaClientConfig, admin: Any, catalog: Catalog, app: AppSpec,
                      effect: PlanEffect) -> DownstreamImpact:
    """The impact on the readers of `app`'s outputs of a plan's `effect`: input processed again or
    never, dead letters replayed, or (a cutover) the outputs moved to new topics."""
    again = [r for r in effect.again if r.records]
    never = [r for r in effect.never if r.records]
    moved_to = effect.moved_to
    outputs = sorted(set(app.outputs.values()))
    impact = DownstreamImpact()
    groups = reading_groups(admin, outputs)
    if moved_to is not None:
        for topic in outputs:
            moved = sorted(g for g, offsets in groups.items() if any(t == topic for t, _p in offsets))
            impact.groups += [GroupImpact(group, topic, 0, 0, 0, f"after the cutover {app.name} writes to {moved_to}: "
                                          f"this group receives nothing more on {topic} until it reads those")
                              for group in moved]
            if not moved:
                impact.unread_outputs.append(topic)
        return impact
    never_records = sum(r.records for r in never)
    for topic in outputs:
        readers = {g: {p: o for (t, p), o in offsets.items() if t == topic} for g, offsets in groups.items()
                   if any(t == topic for t, _p in offsets)}
        if not readers:
            impact.unread_outputs.append(topic)
            continue
        counted: dict[int, list[int]] | None = None
        note = ""
        if again:
            if has_lineage(catalog, topic):
                counted, note = _re_emitted(kafka, topic, again)
            else:
                counted = None
        for group, committed in sorted(readers.items()):
            if again and counted is None:
                impact.groups.append(GroupImpact(group, topic, None, None, never_records, note, effect.replayed))
                continue
            read = unread = 0
            for partition, offsets in (counted or {}).items():
                mark = committed.get(partition, 0)
                read += sum(1 for o in offsets if o < mark)
                unread += sum(1 for o in offsets if o >= mark)
            impact.groups.append(GroupImpact(group, topic, read, unread, never_records, note, effect.replayed))
    return impact


def impact_or_note(kafka: KafkaClientConfig, admin: Any, catalog: Catalog, app: AppSpec,
                   effect: PlanEffect) -> DownstreamImpact:
    """downstream_impact, or an impact that says it could not be worked out (a group listing
    refused, a broker away, a slow read): a plan is never failed by it."""
    try:
        return downstream_impact(kafka, admin, catalog, app, effect)
    except Exception as exc:  # noqa: BLE001 - said in the plan; the recovery still has to happen
        log.warning("The downstream impact of the plan could not be worked out: %s: %s", type(exc).__name__, exc)
        return DownstreamImpact(notes=[f"the readers of the outputs could not be found on the cluster "
                                       f"({type(exc).__name__}: {exc}): check the consumer groups by hand before approving"])


def _re_emitted(kafka: KafkaClientConfig, topic: str, again: list[InputRange]) -> tuple[dict[int, list[int]] | None, str]:
    """The offsets, per partition of the output `topic`, of the records whose source is in `again`
    (None when the bounded read could not see them all), and a note."""
    first_ms = _first_timestamp(kafka, again)
    ends = end_offsets(kafka, topic)
    if first_ms is None:
        return {p: [] for p in ends}, "the records to process again are no longer on the broker"
    admin = kafka.admin(**{"allow.auto.create.topics": False})
    starts = offsets_for_time(admin, topic, sorted(ends), max(0, first_ms - CLOCK_SLACK_MS))
    spans = {p: OffsetSpan(max(low, starts[p]), high) for p, (low, high) in ends.items()}
    total = sum(s.records for s in spans.values())
    if total > SCAN_RECORDS:
        return None, (f"not counted: {total:,} records of {topic} would have to be read, more than a plan reads "
                      f"({SCAN_RECORDS:,})")
    found: dict[int, list[int]] = {p: [] for p in ends}
    # A read over SCAN_SECONDS raises; impact_or_note turns that into the plan's note.
    for record in read_spans(kafka, topic, spans, timeout=SCAN_SECONDS):
        source = _source_of(record.value)
        if source is not None and any(r.contains(*source) for r in again):
            found[record.partition].append(record.offset)
    return found, ""


def _first_timestamp(kafka: KafkaClientConfig, ranges: list[InputRange]) -> int | None:
    """The earliest Kafka timestamp of the ranges' first records still on the broker."""
    stamps = []
    for r in ranges:
        low, high = end_offsets(kafka, r.topic).get(r.partition, (0, 0))
        start = max(r.start, low)
        if start < min(r.end, high):
            stamps += [rec.timestamp_ms for rec in read_spans(kafka, r.topic, {r.partition: OffsetSpan(start, start + 1)})
                       if rec.timestamp_ms >= 0]
    return min(stamps) if stamps else None


def _source_of(value: bytes | None) -> tuple[str, int, int] | None:
    try:
        event_id = json.loads(value or b"").get(LINEAGE_FIELD)
        topic, partition, offset = str(event_id).rsplit("/", 2)
        return topic, int(partition), int(offset)
    except (ValueError, AttributeError, TypeError):
        return None
