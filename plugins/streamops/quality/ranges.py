"""Bounded Kafka ranges: what a validation run reads as its batch.

An operator asks for a range in one of four ways (the validate DAG's form): the last N records
of each partition, a time range, explicit offsets per partition, or "auto" (a scheduled run's
data interval; after a deploy or backfill, the last N records). Every request is checked against
the catalog and the broker before any record is read; all problems are reported at once.

Times are the records' Kafka timestamps: for an output topic, when the app wrote the record.
Ranges are half-open: [start, end) per partition, as Kafka's offsets count.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

from confluent_kafka.admin import AdminClient

from streamops.catalog import Catalog
from streamops.kafka_offsets import (
    DURATION_PATTERN,
    MAX_OFFSET,
    MAX_PARTITION,
    duration_ms,
    offsets_for_time,
    topic_partitions,
    watermarks,
)

RangeMode = Literal["auto", "last_records", "time_range", "offsets"]
MODES: tuple[str, ...] = ("auto", "last_records", "time_range", "offsets")

# Bounds of every time and count a DAG param names (offsets and partitions: kafka_offsets): the
# form's schema uses them and the parsing code below checks them again (an API trigger or a
# direct call bypasses the form).
MAX_LAST_RECORDS = 1_000_000  # per partition, for a validation batch
# Kafka timestamps count milliseconds from 1970; a time past year 2999 is a typo, not a plan.
EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST_TIME = datetime(3000, 1, 1, tzinfo=timezone.utc)
MAX_LOOKBACK = timedelta(days=3650)
# The forms' pattern: a time starts with a year from 1970 to 2999 (a duration: kafka_offsets).
# (The timezone is optional here so the code can say it is missing in plain words.)
TIME_PATTERN = r"^(19[7-9][0-9]|2[0-9]{3})-[0-9]{2}-[0-9]{2}([T ][0-9:.]+)?(Z|[+-][0-9]{2}:?[0-9]{2})?$"
DURATION_BACK = re.compile(DURATION_PATTERN)


class RangeError(ValueError):
    """A range request that cannot be served. The message lists every problem, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        head = "the validation range was refused before reading anything:"
        super().__init__("\n".join([head, *(f"  - {p}" for p in problems)]))


@dataclass(frozen=True)
class TopicRange:
    """[start, end) offsets per partition of one topic."""

    topic: str
    partitions: dict[int, tuple[int, int]]
    description: str  # how the operator asked for it, in words

    @property
    def records(self) -> int:
        """Offsets in the range (on a compacted topic, some may have been compacted away)."""
        return sum(end - start for start, end in self.partitions.values())

    def spans(self) -> str:
        """'p0 10-20, p1 empty' for logs."""
        return ", ".join(
            f"p{p} {start}-{end}" if end > start else f"p{p} empty" for p, (start, end) in sorted(self.partitions.items())
        )

    def to_json(self) -> dict:
        return {
            "topic": self.topic,
            "partitions": {str(p): [s, e] for p, (s, e) in sorted(self.partitions.items())},
            "description": self.description,
            "records": self.records,
        }

    @classmethod
    def from_json(cls, data: dict) -> TopicRange:
        return cls(data["topic"], {int(p): (int(s), int(e)) for p, (s, e) in data["partitions"].items()}, data["description"])


@dataclass
class RangeRequest:
    """The range part of the validate DAG's form."""

    mode: str = "auto"
    last_records: int = 1000
    start_time: str | None = None
    end_time: str | None = None
    # topic -> partition (as text, JSON keys are strings) -> [start, end)
    offsets: dict[str, dict[str, list[int]]] | None = None

    @classmethod
    def from_params(cls, params: dict) -> RangeRequest:
        return cls(
            mode=params.get("range") or "auto",
            last_records=params.get("last_records") if params.get("last_records") is not None else 1000,
            start_time=params.get("start_time") or None,
            end_time=params.get("end_time") or None,
            offsets=params.get("offsets") or None,
        )


def parse_time(text: str, what: str) -> datetime:
    """An ISO-8601 time that says its timezone; a naive one means different instants on
    different hosts, so it is refused."""
    try:
        value = datetime.fromisoformat(text.strip())
    except (ValueError, AttributeError):
        raise ValueError(f"{what} {text!r} is not an ISO-8601 time (e.g. 2026-11-22T10:00:00Z)") from None
    if value.tzinfo is None:
        raise ValueError(f"{what} {text!r} has no timezone: add Z or an offset such as +01:00")
    if not EARLIEST_TIME <= value < LATEST_TIME:
        raise ValueError(f"{what} {text!r} is out of range: a time must be from 1970-01-01T00:00:00Z (where Kafka "
                         "timestamps start) to before 3000-01-01T00:00:00Z")
    return value


def time_back(text: str, what: str, now: datetime) -> datetime:
    """The moment a duration such as '6 hours' back from `now` names, at most MAX_LOOKBACK back."""
    if not isinstance(text, str) or not DURATION_BACK.fullmatch(text):
        raise ValueError(f"{what} {text!r} must look like '30 minutes' or '6 hours' (a time back from now)")
    back_ms = duration_ms(text)
    if back_ms > MAX_LOOKBACK // timedelta(milliseconds=1):
        raise ValueError(f"{what} {text!r} is more than {MAX_LOOKBACK.days} days back; for everything retained use 'earliest'")
    moment = now - timedelta(milliseconds=back_ms)
    if moment < EARLIEST_TIME:
        raise ValueError(f"{what} {text!r} reaches back before 1970-01-01T00:00:00Z, where Kafka timestamps start")
    return moment


def resolve(
    admin: AdminClient,
    catalog: Catalog,
    topics: Sequence[str],
    request: RangeRequest,
    interval: tuple[datetime, datetime] | None = None,
) -> list[TopicRange]:
    """The offsets to read per topic, or `RangeError` naming every problem.

    `interval` is the DAG run's data interval: "auto" uses it when it has a length (a
    scheduled run), else falls back to the last `last_records` records (after a deploy).
    """
    problems: list[str] = []
    selected = _check_topics(catalog, topics, problems)
    mode = request.mode
    if mode not in MODES:
        problems.append(f"range {mode!r} is not one of {', '.join(MODES)}")
    if mode == "auto":
        if interval and interval[1] > interval[0]:
            mode, start, end = "time_range", interval[0], interval[1]
        else:
            mode = "last_records"
    elif mode == "time_range":
        start, end = _check_times(request, problems)
    if mode == "last_records" and (isinstance(request.last_records, bool) or not isinstance(request.last_records, int) or request.last_records < 1):
        problems.append(f"last_records must be a positive whole number (got {request.last_records!r})")
    elif mode == "last_records" and request.last_records > MAX_LAST_RECORDS:
        problems.append(f"last_records {request.last_records} is more than {MAX_LAST_RECORDS} records per partition; "
                        "validate a longer stretch as several ranges")
    if mode == "offsets":
        _check_offsets_shape(request.offsets, selected, problems)
    if problems:
        raise RangeError(problems)

    layout = topic_partitions(admin, selected)
    for topic, partitions in layout.items():
        if partitions is None:
            problems.append(f"topic {topic!r} does not exist on the broker (run provision_topics first)")
    if problems:
        raise RangeError(problems)

    ranges = []
    for topic in selected:
        partitions = layout[topic]
        marks = watermarks(admin, topic, partitions)
        if mode == "last_records":
            n = request.last_records
            spans = {p: (max(low, high - n), high) for p, (low, high) in marks.items()}
            described = f"last {n} records of each partition"
        elif mode == "time_range":
            starts = offsets_for_time(admin, topic, partitions, int(start.timestamp() * 1000))
            ends = offsets_for_time(admin, topic, partitions, int(end.timestamp() * 1000))
            spans = {p: (starts[p], max(starts[p], ends[p])) for p in partitions}
            described = f"records written from {start.isoformat()} up to {end.isoformat()}"
        else:
            spans = _explicit_spans(topic, request.offsets[topic], marks, problems)
            described = "explicit offsets"
        ranges.append(TopicRange(topic, spans, described))
    if problems:
        raise RangeError(problems)
    return ranges


def whole_topics(admin: AdminClient, topics: Sequence[str]) -> list[TopicRange]:
    """Each topic from its first to its last retained record (e.g. a backfill's fresh targets)."""
    layout = topic_partitions(admin, topics)
    return [TopicRange(t, watermarks(admin, t, layout[t] or []), "the whole topic") for t in topics]


def _check_topics(catalog: Catalog, topics: Sequence[str], problems: list[str]) -> list[str]:
    validated = catalog.validated_topics()
    if not topics:
        problems.append("choose at least one topic")
    selected = []
    for topic in topics:
        if topic not in catalog.topic_names():
            problems.append(f"topic {topic!r} is not in the catalog (topics with suites: {', '.join(validated)})")
        elif topic not in validated:
            problems.append(f"topic {topic!r} has no expectation suite in the catalog (topics with suites: {', '.join(validated)})")
        elif topic not in selected:
            selected.append(topic)
    return selected


def _check_times(request: RangeRequest, problems: list[str]) -> tuple[datetime | None, datetime | None]:
    times = []
    for what, text in (("start_time", request.start_time), ("end_time", request.end_time)):
        if not text:
            problems.append(f"range time_range needs {what}")
            times.append(None)
            continue
        try:
            times.append(parse_time(text, what))
        except ValueError as exc:
            problems.append(str(exc))
            times.append(None)
    start, end = times
    if start and end and end <= start:
        problems.append(f"end_time {request.end_time} is not after start_time {request.start_time}: the time range is empty or inverted")
    return start, end


def _check_offsets_shape(offsets, selected: list[str], problems: list[str]) -> None:
    example = '{"%s": {"0": [100, 200]}}' % (selected[0] if selected else "topic")
    if not isinstance(offsets, dict) or not offsets:
        problems.append(f"range offsets needs offsets per topic and partition, e.g. {example}")
        return
    for topic in offsets:
        if topic not in selected:
            problems.append(f"offsets name topic {topic!r}, which is not among the chosen topics")
    for topic in selected:
        if topic not in offsets:
            problems.append(f"offsets has no entry for chosen topic {topic!r} (e.g. {example})")
            continue
        partitions = offsets[topic]
        if not isinstance(partitions, dict) or not partitions:
            problems.append(f"offsets[{topic!r}] must map partitions to [start, end], e.g. {example}")
            continue
        for partition, span in partitions.items():
            where = f"offsets[{topic!r}][{partition!r}]"
            if not re.fullmatch(r"[0-9]{1,10}", str(partition)) or int(partition) > MAX_PARTITION:
                problems.append(f"{where}: the partition must be a whole number from 0 to {MAX_PARTITION}")
            if (
                not isinstance(span, list)
                or len(span) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            ):
                problems.append(f"{where} must be [start, end] (two whole numbers, end exclusive), got {span!r}")
            elif span[0] < 0 or span[1] < span[0]:
                problems.append(f"{where} = {span}: start must be >= 0 and end >= start")
            elif span[1] > MAX_OFFSET:
                problems.append(f"{where} = {span}: end is beyond Kafka's offsets (at most {MAX_OFFSET})")


def _explicit_spans(topic: str, wanted: dict[str, list[int]], marks: dict[int, tuple[int, int]], problems: list[str]) -> dict[int, tuple[int, int]]:
    spans = {}
    for key, (start, end) in wanted.items():
        partition = int(key)
        where = f"offsets[{topic!r}][{key!r}]"
        if partition not in marks:
            problems.append(f"{where}: topic {topic!r} has no partition {partition} (it has {len(marks)}: 0-{len(marks) - 1})")
            continue
        low, high = marks[partition]
        if end > high:
            problems.append(f"{where} = [{start}, {end}]: end is beyond the end of the partition ({high})")
        elif start < low:
            problems.append(
                f"{where} = [{start}, {end}]: records before offset {low} are gone (retention or compaction deleted them)"
            )
        else:
            spans[partition] = (start, end)
    return spans
