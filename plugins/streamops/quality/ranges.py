"""Bounded Kafka ranges: what a validation run reads as its batch.

An operator asks for a range in one of four ways (the validate DAG's form): the last N records
of each partition, a time range, explicit offsets per partition, or "auto" (a scheduled run's
data interval; after a deploy or backfill, the last N records). Every request is checked against
the catalog and the broker before any record is read; all problems are reported at once.

Times are the records' Kafka timestamps: for an output topic, when the app wrote the record.
Ranges are half-open: [start, end) per partition, as Kafka's offsets count (`OffsetSpan`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from confluent_kafka.admin import AdminClient

from streamops.catalog import Catalog
from streamops.kafka_offsets import (
    MAX_OFFSET,
    MAX_PARTITION,
    TIME,
    OffsetSpan,
    parse_moment,
    spans_to_json,
    time_range_spans,
    topic_partitions,
    watermarks,
)
from streamops.plans import from_plan_json
from streamops.refusals import Refused
from streamops.timestamps import iso_as_given

RangeMode = Literal["auto", "last_records", "time_range", "offsets"]
MODES: tuple[str, ...] = ("auto", "last_records", "time_range", "offsets")

# Bounds of a count a DAG param names (offsets, partitions, times: kafka_offsets): the form's
# schema uses it and the parsing code below checks it again (an API trigger or a direct call
# bypasses the form).
MAX_LAST_RECORDS = 1_000_000  # per partition, for a validation batch


class RangeError(Refused):
    """A range request that cannot be served. The message lists every problem, one per line."""

    heading = "the validation range was refused before reading anything:"


@dataclass(frozen=True)
class TopicRange:
    """The offsets to read per partition of one topic."""

    topic: str
    partitions: dict[int, OffsetSpan]
    description: str  # how the operator asked for it, in words

    @property
    def records(self) -> int:
        """Offsets in the range (on a compacted topic, some may have been compacted away)."""
        return sum(span.records for span in self.partitions.values())

    def spans(self) -> str:
        """'p0 10-20, p1 empty' for logs."""
        return ", ".join(
            f"p{p} empty" if span.empty else f"p{p} {span.start}-{span.end}" for p, span in sorted(self.partitions.items())
        )

    def to_json(self) -> dict:
        return {
            "topic": self.topic,
            "partitions": spans_to_json(self.partitions),
            "description": self.description,
            "records": self.records,
        }

    @classmethod
    def from_json(cls, data: dict) -> TopicRange:
        """A range the plan task handed on, read back as every plan is (streamops.plans)."""
        return from_plan_json(cls, data)


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
            last_records=1000 if (last := params.get("last_records")) is None else last,
            start_time=params.get("start_time") or None,
            end_time=params.get("end_time") or None,
            offsets=params.get("offsets") or None,
        )


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
    window: tuple[datetime | None, datetime | None] = (None, None)
    if mode not in MODES:
        problems.append(f"range {mode!r} is not one of {', '.join(MODES)}")
    if mode == "auto":
        if interval and interval[1] > interval[0]:
            mode, window = "time_range", interval
        else:
            mode = "last_records"
    elif mode == "time_range":
        window = _check_times(request, problems)
    if mode == "last_records" and (
        isinstance(request.last_records, bool) or not isinstance(request.last_records, int) or request.last_records < 1
    ):
        problems.append(f"last_records must be a positive whole number (got {request.last_records!r})")
    elif mode == "last_records" and request.last_records > MAX_LAST_RECORDS:
        problems.append(f"last_records {request.last_records} is more than {MAX_LAST_RECORDS} records per partition; "
                        "validate a longer stretch as several ranges")
    if mode == "offsets":
        _check_offsets_shape(request.offsets, selected, problems)
    start, end = window
    if mode == "time_range" and (start is None or end is None) and not problems:  # (each was named above)
        problems.append("range time_range needs start_time and end_time")
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
        partitions = layout[topic] or []
        if mode == "time_range" and start is not None and end is not None:
            spans = time_range_spans(admin, topic, partitions, start, end)
            described = f"records written from {iso_as_given(start)} up to {iso_as_given(end)}"
        elif mode == "last_records":
            n = request.last_records
            spans = {p: OffsetSpan(max(low, high - n), high) for p, (low, high) in watermarks(admin, topic, partitions).items()}
            described = f"last {n} records of each partition"
        else:
            spans = _explicit_spans(topic, (request.offsets or {})[topic], watermarks(admin, topic, partitions), problems)
            described = "explicit offsets"
        ranges.append(TopicRange(topic, spans, described))
    if problems:
        raise RangeError(problems)
    return ranges


def whole_topics(admin: AdminClient, topics: Sequence[str]) -> list[TopicRange]:
    """Each topic from its first to its last retained record (e.g. a backfill's fresh targets)."""
    layout = topic_partitions(admin, topics)
    return [TopicRange(t, time_range_spans(admin, t, layout[t] or [], None, None), "the whole topic") for t in topics]


def _check_topics(catalog: Catalog, topics: Sequence[str], problems: list[str]) -> list[str]:
    validated = catalog.validated_topics()
    if not topics:
        problems.append("choose at least one topic")
    selected = []
    for topic in topics:
        if topic not in catalog.topic_names():
            problems.append(f"topic {topic!r} is not in the catalog (topics with suites: {', '.join(validated)})")
        elif topic not in validated:
            problems.append(f"topic {topic!r} has no expectation suite in the catalog "
                            f"(topics with suites: {', '.join(validated)})")
        elif topic not in selected:
            selected.append(topic)
    return selected


def _check_times(request: RangeRequest, problems: list[str]) -> tuple[datetime | None, datetime | None]:
    times: list[datetime | None] = []
    for what, text in (("start_time", request.start_time), ("end_time", request.end_time)):
        if not text:
            problems.append(f"range time_range needs {what}")
            times.append(None)
            continue
        try:
            times.append(parse_moment(text, what, allowed={TIME}).at)
        except ValueError as exc:
            problems.append(str(exc))
            times.append(None)
    start, end = times
    if start and end and end <= start:
        problems.append(f"end_time {request.end_time} is not after start_time {request.start_time}: "
                        "the time range is empty or inverted")
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


def _explicit_spans(
    topic: str, wanted: dict[str, list[int]], marks: dict[int, tuple[int, int]], problems: list[str]
) -> dict[int, OffsetSpan]:
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
            spans[partition] = OffsetSpan(start, end)
    return spans
