"""Kafka offsets and the moments that name them: the one place the suite asks a broker where a
topic's partitions begin and end, and reads what an operator wrote for "from when" and "until when".

The floor (the broker):

    topic_partitions(admin, topics)        topic -> its partitions (None: no such topic)
    watermarks(admin, topic, partitions)   partition -> (earliest, latest) offsets now
    offsets_for_time(admin, ..., epoch_ms) partition -> first offset written at or after a time
    end_offsets(kafka, topic)              every partition's (earliest, latest), as a committed reader sees it

No other module asks the broker for offsets (AdminClient.list_offsets, a consumer's watermarks
or offsets_for_times): they call these.

The offsets of a range (what a backfill, a validation, a replay or a reset reads):

    OffsetSpan(start, end)                  one partition's offsets [start, end); .records, .empty
    time_range_spans(admin, topic, partitions, start, end)
                                            partition -> the span of the records written from
                                            `start` up to `end` (None: earliest / latest)
    spans_to_json(spans) / spans_from_json  {"0": [start, end], ...}: a plan's or a result's JSON

A span never ends before it starts: a time range whose end finds an earlier offset than its
start (records written out of time order) is the empty span at its start.

The moments (what an operator types into a form, a CLI or an API trigger):

    earliest                    the first retained record
    2026-11-22T10:00:00Z        an ISO-8601 time, with its timezone, from 1970 to before 3000
    6 hours                     a duration back from now, at most 3650 days
    now                         the partitions' current ends

`parse_moment` reads any subset of the four (each caller says which it takes) and refuses the
rest in words; `moment_pattern` is the trigger forms' JSON-schema pattern for the same subset. The
duration grammar ("10 minutes", "1 day") is also the catalog's Spark interval grammar
(`DURATION_PATTERN`, `duration_ms`): it is written here once.

This module imports no other streamops module at import time but `kafka_client`'s retry helper
and the leaf `timestamps` (the catalog imports the duration grammar from here), and confluent-kafka
only when it talks to a broker.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from streamops.kafka_client import while_transient
from streamops.timestamps import epoch_ms

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from streamops.kafka_client import KafkaClientConfig

# ---------------------------------------------------------------------------------------------
# Bounds of every offset, partition, time and duration an operator may name: the forms' schemas
# use them and the parsing code checks them again (an API trigger or a direct call bypasses a form).

MAX_OFFSET = 2**63 - 1  # Kafka offsets are signed 64-bit
MAX_PARTITION = 2**31 - 1  # Kafka partitions are signed 32-bit
# Kafka timestamps count milliseconds from 1970; a time past year 2999 is a typo, not a plan.
EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(3000, 1, 1, tzinfo=UTC)
MAX_LOOKBACK = timedelta(days=3650)

# ---------------------------------------------------------------------------------------------
# The duration grammar: Spark interval strings ("10 minutes", "2 seconds"), used by the catalog for
# triggers, windows and watermarks, and by the forms for a time back from now.

DURATION_UNITS_MS = {"millisecond": 1, "second": 1_000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
_UNITS = "|".join(DURATION_UNITS_MS)
# Any amount: the catalog's durations and the code's check of a time back (which bounds it in words).
DURATION_PATTERN = rf"^[1-9][0-9]* ({_UNITS})s?$"
# The forms' pattern: at most 12 digits, so the schema never lets a number through that the code
# could only refuse as absurd.
DURATION_FORM_PATTERN = rf"^[1-9][0-9]{{0,11}} ({_UNITS})s?$"
_DURATION = re.compile(DURATION_PATTERN)
# The forms' time: a year from 1970 to 2999. (The timezone is optional here so the code can say it
# is missing in plain words.)
TIME_PATTERN = r"^(19[7-9][0-9]|2[0-9]{3})-[0-9]{2}-[0-9]{2}([T ][0-9:.]+)?(Z|[+-][0-9]{2}:?[0-9]{2})?$"


def duration_ms(value: str) -> int:
    """'10 minutes' -> 600000 (a text DURATION_PATTERN matches)."""
    amount, unit = value.split()
    return int(amount) * DURATION_UNITS_MS[unit.rstrip("s")]


# ---------------------------------------------------------------------------------------------
# Moments

# The four forms a moment takes; "earliest" and "now" are also the words an operator types.
EARLIEST, NOW, TIME, BACK = "earliest", "now", "time", "back"
MOMENT_FORMS = frozenset({EARLIEST, NOW, TIME, BACK})
_WORDS = (EARLIEST, NOW)


@dataclass(frozen=True)
class Moment:
    """Where a range starts or ends. `form` is one of MOMENT_FORMS; `at` is the instant of a time
    or a duration back, None for earliest and now (the partitions' ends, not an instant)."""

    form: str
    at: datetime | None = None


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
    if not isinstance(text, str) or not _DURATION.fullmatch(text):
        raise ValueError(f"{what} {text!r} must look like '30 minutes' or '6 hours' (a time back from now)")
    back_ms = duration_ms(text)
    if back_ms > MAX_LOOKBACK // timedelta(milliseconds=1):
        raise ValueError(f"{what} {text!r} is more than {MAX_LOOKBACK.days} days back; for everything retained use 'earliest'")
    moment = now - timedelta(milliseconds=back_ms)
    if moment < EARLIEST_TIME:
        raise ValueError(f"{what} {text!r} reaches back before 1970-01-01T00:00:00Z, where Kafka timestamps start")
    return moment


def parse_moment(text: str, what: str, now: datetime | None = None, allowed: Collection[str] = MOMENT_FORMS,
                 hint: str = "") -> Moment:
    """The moment `text` names, taking only the forms in `allowed` (see MOMENT_FORMS), or
    ValueError saying what is wrong with it, `what` naming the field ("start", "to_datetime").

    A text that looks like a duration is read as one when `allowed` has both a time and a duration
    back; with only one of them, every text is read as that one (and refused in its words). `hint`
    is added to a refused time: what else the field takes, in the caller's words
    ("; or use 'now'"). `now` is needed for a duration back."""
    allowed = frozenset(allowed)
    if not allowed <= MOMENT_FORMS or not allowed & {TIME, BACK}:
        raise TypeError(f"allowed forms {sorted(allowed)} must be among {sorted(MOMENT_FORMS)}, with 'time' or 'back'")
    if isinstance(text, str) and text in _WORDS and text in allowed:
        return Moment(text)
    # `match`, not `fullmatch`: as the code always dispatched ("6 hours\n" is a duration, refused
    # as malformed, not a time).
    if BACK in allowed and (TIME not in allowed or (isinstance(text, str) and _DURATION.match(text))):
        if now is None:
            raise TypeError("a duration back needs `now`")
        return Moment(BACK, time_back(text, what, now))
    try:
        return Moment(TIME, parse_time(text, what))
    except ValueError as exc:
        raise ValueError(f"{exc}{hint}") from None


def moment_pattern(allowed: Collection[str]) -> str:
    """The trigger form's JSON-schema pattern for a field that takes the forms in `allowed`: the
    words, then the bounded duration, then the time (one form: its own pattern, unchanged)."""
    allowed = frozenset(allowed)
    if not allowed or not allowed <= MOMENT_FORMS:
        raise TypeError(f"allowed forms {sorted(allowed)} must be among {sorted(MOMENT_FORMS)}")
    patterns = [f"^{word}$" for word in _WORDS if word in allowed]
    patterns += [p for form, p in ((BACK, DURATION_FORM_PATTERN), (TIME, TIME_PATTERN)) if form in allowed]
    if len(patterns) == 1:
        return patterns[0]
    return "^(" + "|".join(p.removeprefix("^").removesuffix("$") for p in patterns) + ")$"


# ---------------------------------------------------------------------------------------------
# Spans: the offsets of a range


class _Span(NamedTuple):
    start: int
    end: int


class OffsetSpan(_Span):
    """One partition's offsets [start, end): from `start` up to, not including, `end`, as Kafka's
    offsets count (on a compacted or transactional topic some offsets hold no record). A pair, so
    it unpacks and compares as `(start, end)` does; made only from whole numbers in order."""

    __slots__ = ()

    def __new__(cls, start: int, end: int) -> OffsetSpan:
        for name, value in (("start", start), ("end", end)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"an offset span's {name} is a whole number, not {type(value).__name__}: {value!r}")
        if not 0 <= start <= end <= MAX_OFFSET:
            raise ValueError(f"offset span [{start}, {end}) must have 0 <= start <= end <= {MAX_OFFSET}")
        return super().__new__(cls, start, end)

    @property
    def records(self) -> int:
        """Offsets in the span (the records, but for those compaction removed)."""
        return self.end - self.start

    @property
    def empty(self) -> bool:
        return self.end == self.start

    def to_json(self) -> list[int]:
        return [self.start, self.end]

    @classmethod
    def __get_pydantic_core_schema__(cls, _source: Any, _handler: Any) -> Any:
        """Its JSON form, [start, end], for a plan read back by streamops.plans (pydantic)."""
        from pydantic_core import core_schema

        pair = core_schema.tuple_schema([core_schema.int_schema(strict=True), core_schema.int_schema(strict=True)])
        return core_schema.no_info_after_validator_function(
            lambda both: cls(*both), pair,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda span: span.to_json()))

    @classmethod
    def from_json(cls, value: Any, where: str) -> OffsetSpan:
        """[start, end] as `to_json` writes it; ValueError naming `where` for anything else."""
        if (not isinstance(value, list | tuple) or len(value) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in value)):
            raise ValueError(f"{where} must be [start, end] (two whole numbers, end exclusive), got {value!r}")
        try:
            return cls(value[0], value[1])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def spans_to_json(spans: Mapping[int, OffsetSpan]) -> dict[str, list[int]]:
    """{"0": [start, end], ...} in partition order (JSON keys are text)."""
    return {str(p): span.to_json() for p, span in sorted(spans.items())}


def spans_from_json(data: Any, where: str) -> dict[int, OffsetSpan]:
    """The spans `spans_to_json` wrote; ValueError naming `where` and the partition for anything else."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must map partitions to [start, end], got {data!r}")
    spans: dict[int, OffsetSpan] = {}
    for key, value in data.items():
        if not re.fullmatch(r"[0-9]{1,10}", str(key)) or int(key) > MAX_PARTITION:
            raise ValueError(f"{where}: partition {key!r} is not a whole number from 0 to {MAX_PARTITION}")
        spans[int(key)] = OffsetSpan.from_json(value, f"{where}[{str(key)!r}]")
    return spans


def time_range_spans(admin: AdminClient, topic: str, partitions: Sequence[int], start: datetime | None,
                     end: datetime | None) -> dict[int, OffsetSpan]:
    """partition -> the span of the records written from `start` up to `end` (their Kafka
    timestamps; None: the partition's earliest offset, its latest). The end is never before the
    start (records written out of time order make an empty span there)."""
    marks = watermarks(admin, topic, partitions) if start is None or end is None else {}
    firsts = offsets_for_time(admin, topic, partitions, epoch_ms(start)) if start else {p: marks[p][0] for p in partitions}
    lasts = offsets_for_time(admin, topic, partitions, epoch_ms(end)) if end else {p: marks[p][1] for p in partitions}
    return {p: OffsetSpan(firsts[p], max(firsts[p], lasts[p])) for p in partitions}


# ---------------------------------------------------------------------------------------------
# The broker

_TIMEOUT_S = 15


def topic_partitions(admin: AdminClient, topics: Sequence[str]) -> dict[str, list[int] | None]:
    """topic -> its partitions on the broker (None: the topic does not exist)."""
    metadata = admin.list_topics(timeout=_TIMEOUT_S)
    return {
        t: sorted(metadata.topics[t].partitions) if t in metadata.topics and metadata.topics[t].error is None else None
        for t in topics
    }


def watermarks(
    admin: AdminClient, topic: str, partitions: Sequence[int], *, committed: bool = False
) -> dict[int, tuple[int, int]]:
    """partition -> (earliest, latest) offsets now. `committed`: the latest as a read_committed
    reader sees it (the last stable offset, before any open transaction), else the high watermark."""
    from confluent_kafka.admin import OffsetSpec

    def ask() -> dict[int, tuple[int, int]]:
        low = _list_offsets(admin, topic, {p: OffsetSpec.earliest() for p in partitions}, committed)
        high = _list_offsets(admin, topic, {p: OffsetSpec.latest() for p in partitions}, committed)
        _answered_or_again(topic, [p for p in partitions if low[p] < 0 or high[p] < 0])
        return {p: (low[p], high[p]) for p in partitions}

    marks: dict[int, tuple[int, int]] = while_transient(ask, timeout=2 * _TIMEOUT_S)
    return marks


def offsets_for_time(admin: AdminClient, topic: str, partitions: Sequence[int], epoch_ms: int) -> dict[int, int]:
    """partition -> the first offset whose timestamp is at or after `epoch_ms` (the end if none)."""
    from confluent_kafka.admin import OffsetSpec

    def ask() -> dict[int, int]:
        found = _list_offsets(admin, topic, {p: OffsetSpec.for_timestamp(epoch_ms) for p in partitions})
        latest = _list_offsets(admin, topic, {p: OffsetSpec.latest() for p in partitions})
        # -1: no record at or after the time (the end, then); below it, or a negative end: no answer.
        _answered_or_again(topic, [p for p in partitions if found[p] < -1 or latest[p] < 0])
        return {p: latest[p] if found[p] < 0 else found[p] for p in partitions}

    offsets: dict[int, int] = while_transient(ask, timeout=2 * _TIMEOUT_S)
    return offsets


def _answered_or_again(topic: str, unanswered: list[int]) -> None:
    """While a leader is elected (a broker just died) a partition may answer with no offset (-1001)
    and no error: that is raised as a transient error, so `while_transient` asks again until its
    deadline."""
    from confluent_kafka import KafkaError, KafkaException

    if unanswered:
        raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE,
                                        f"{topic}: no offsets yet for partition(s) {sorted(unanswered)}"))


def end_offsets(kafka: KafkaClientConfig, topic: str) -> dict[int, tuple[int, int]]:
    """Every partition of `topic` -> its (earliest, latest) offsets, latest as a read_committed
    reader sees it (`read_spans` reads up to it). A topic the broker does not have (or does not
    let this connection see) raises its KafkaException."""
    from confluent_kafka import KafkaException

    # A client of its own (callers hold a connection, not a client). Asking for one topic's
    # metadata may create it where the broker allows auto-creation: this client never asks to.
    admin = kafka.admin(**{"allow.auto.create.topics": False})

    def ask() -> dict[int, tuple[int, int]]:
        metadata = admin.list_topics(topic, timeout=_TIMEOUT_S)
        if metadata.topics[topic].error is not None:
            raise KafkaException(metadata.topics[topic].error)
        return watermarks(admin, topic, sorted(metadata.topics[topic].partitions), committed=True)

    # A broker restarting or a leader being elected answers for a moment with an error.
    ends: dict[int, tuple[int, int]] = while_transient(ask)
    return ends


def _list_offsets(admin: AdminClient, topic: str, specs: dict[int, OffsetSpec], committed: bool = False) -> dict[int, int]:
    """Offsets per partition. A partition without a leader for a moment (a topic just created, a
    leader election after a broker restart) answers with a retriable error: asked again until
    the deadline, then the error is raised."""
    from confluent_kafka import IsolationLevel, TopicPartition

    isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED

    def ask() -> dict[int, int]:
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p, spec in specs.items()},
                                     isolation_level=isolation, request_timeout=_TIMEOUT_S)
        return {tp.partition: future.result().offset for tp, future in futures.items()}

    offsets: dict[int, int] = while_transient(ask, timeout=_TIMEOUT_S)
    return offsets
