"""The message browser: the records of a catalog topic, read for on-call without a console consumer.

One partition per request, from an offset, a time, or the newest records; filters by key, by a
header, and for a dead-letter topic by the reason (which names the rule the record broke). Each
record is shown with its key, headers, timestamp and value (JSON pretty-printed, text as text,
anything else as hex; long values cut, with their size); a dead letter is decoded (reason, rule,
the app and version that refused it, the source topic, partition and offset, and the original,
read back from the source when the dead letter keeps it by reference). What the catalog marks
sensitive (`topics[].sensitive_fields`, `sensitive_key`) is masked unless the caller's role may see
sensitive data (streamops.access.SENSITIVE_DATA); a filter on a masked part is refused, so it
cannot be probed either.

Reads are bounded (records shown, records and bytes scanned, time) and never join a consumer group
or commit anything: partitions are assigned, auto-commit is off and nothing calls commit.
From what it shows the page offers the recovery DAGs' forms filled in (streamops.messages_page):
a run plans and waits for its approval as always.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from streamops.catalog import AppSpec, Catalog, TopicSpec
from streamops.dead_letters import DeadLetter, decode_dead_letter, fetch_originals
from streamops.kafka_client import KafkaClientConfig, transient
from streamops.kafka_offsets import BACK, TIME, end_offsets, offsets_for_time, parse_moment
from streamops.kafka_records import Record, held_offsets
from streamops.timestamps import epoch_ms, iso_ms

MAX_RECORDS = 100  # records shown per request
DEFAULT_RECORDS = 20
SCAN_RECORDS = 20_000  # records read per request while looking for matches
SCAN_BYTES = 64 * 1024 * 1024
SCAN_SECONDS = 10.0
SHOWN_CHARS = 4_000  # of one key, header or value
MASK = "•••"
# The consumer's group id is never joined (assign, no subscribe) and never committed to.
READER_GROUP = "streamops-message-browser"


class BrowseError(ValueError):
    """A request the browser cannot answer: says which field is wrong and what it takes."""


class BrowseQuery(BaseModel):
    """One request: the query string of /streamops/messages."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    topic: str = Field(min_length=1, max_length=249)
    partition: int = Field(0, ge=0, le=2**31 - 1)
    offset: int | None = Field(None, ge=0, le=2**63 - 1)  # the first offset read
    time: str | None = Field(None, max_length=64)  # or the first record at or after this time
    key: str | None = Field(None, max_length=200)  # key contains (case-sensitive)
    header: str | None = Field(None, max_length=300)  # a header's name, or name=value
    reason: str | None = Field(None, max_length=200)  # dead letters: reason contains (case-insensitive)
    limit: int = Field(DEFAULT_RECORDS, ge=1, le=MAX_RECORDS)

    @model_validator(mode="after")
    def _one_start(self) -> BrowseQuery:
        if self.offset is not None and self.time:
            raise ValueError("give an offset or a time to start from, not both")
        return self

    @property
    def filtered(self) -> bool:
        return bool(self.key or self.header or self.reason)

    @classmethod
    def from_form(cls, form: dict[str, Any]) -> BrowseQuery:
        """From a query string: empty fields are absent; a refusal names each wrong field."""
        given = {name: value for name, value in form.items() if value not in (None, "")}
        try:
            return cls.model_validate(given)
        except ValidationError as exc:
            problems = [f"{'.'.join(str(p) for p in e['loc']) or 'query'}: {e['msg']}" for e in exc.errors()]
            raise BrowseError("; ".join(problems)) from None


@dataclass
class Shown:
    """A key, header or value as the page shows it."""

    kind: str  # null | json | text | hex | masked
    text: str
    size: int  # bytes
    cut: bool = False
    masked: list[str] = field(default_factory=list)  # the fields masked in it


@dataclass
class ShownDeadLetter:
    reason: str
    app: str | None
    app_version: str | None
    failed_at: str | None
    source: str | None  # topic/partition/offset
    source_topic: str | None
    source_partition: int | None
    source_offset: int | None
    source_time: str | None
    original_key: Shown | None
    original_value: Shown | None
    stored: str  # inline | by reference: read from the source | by reference: <why not>
    note: str = ""


@dataclass
class ShownRecord:
    partition: int
    offset: int
    timestamp: str
    key: Shown
    headers: list[tuple[str, Shown]]
    value: Shown
    dead_letter: ShownDeadLetter | None = None


@dataclass
class BrowseResult:
    topic: str
    partition: int
    partitions: int
    low: int
    high: int
    start: int
    next_offset: int  # where the next page starts
    scanned: int
    records: list[ShownRecord]
    notes: list[str]  # what the reader should know: clamped start, why it stopped
    sensitive_masked: bool
    dead_letter_of: str | None  # the app whose dead-letter topic this is
    readers: list[str]  # the apps that read this topic (skip forms)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Showing bytes


def show_bytes(data: bytes | None, masked_fields: list[str] | None = None, *, mask_all: bool = False,
               max_chars: int = SHOWN_CHARS) -> Shown:
    """`data` as the page shows it: JSON pretty-printed, UTF-8 text as text, else hex; cut at
    `max_chars`. `masked_fields` (dotted paths, through arrays and JSON held in strings) are masked
    in a JSON value; a value that must be masked but whose fields cannot be found (text, hex, a bare
    JSON value) is masked whole, as is everything with `mask_all`."""
    if data is None:
        return Shown("null", "null", 0)
    size = len(data)
    if mask_all:
        return Shown("masked", f"{MASK} (sensitive; {size:,} bytes)", size, masked=["(all)"])
    try:
        decoded: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        decoded = None
    kind, masked, text, parsed = "hex", [], "", None
    if decoded is not None:
        kind, text = "text", decoded
        try:
            parsed = json.loads(decoded)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than Python's parser goes
            parsed = None
        else:
            kind = "json"
            if masked_fields and _maskable(parsed):
                masked = _mask_paths(parsed, masked_fields)
            text = json.dumps(parsed, indent=2, ensure_ascii=False)
    if masked_fields and not (kind == "json" and _maskable(parsed)):
        return Shown("masked", f"{MASK} (sensitive: not JSON whose fields can be masked; {size:,} bytes)",
                     size, masked=["(all)"])
    if kind == "hex":
        shown_bytes = max_chars // 3
        text, cut = data[:shown_bytes].hex(" "), size > shown_bytes
    else:
        text, cut = text[:max_chars], len(text) > max_chars
    if cut:
        text += f"… (cut: {size:,} bytes in all)"
    return Shown(kind, text, size, cut, masked)


def _maskable(parsed: Any) -> bool:
    """A JSON value whose sensitive fields can be found: an object, or an array of objects and
    arrays (a bare value, or an array holding one, cannot say which field it is: masked whole)."""
    if isinstance(parsed, dict):
        return True
    return isinstance(parsed, list) and all(isinstance(item, dict) or (isinstance(item, list) and _maskable(item))
                                            for item in parsed)


def _mask_paths(parsed: Any, paths: list[str]) -> list[str]:
    """Masks each dotted path in the JSON value `parsed` (in place); the paths masked. A path goes
    through arrays (`items.user_id` masks every item's), and through a string that holds JSON (a
    payload carried as text): what the record means counts, not how it was encoded. Where a path
    reaches a value it cannot go on through (text, a number, an array's bare item), that value is
    masked whole: it may be the sensitive one in another shape."""
    return [path for path in paths if _mask_path(parsed, path.split("."))]


def _mask_path(node: Any, parts: list[str]) -> bool:
    """`node`: an object or an array; `parts`: what is left of the path (not empty)."""
    if isinstance(node, list):
        # Each item, not any(): every match is masked.
        return bool(sum(_mask_slot(node, index, parts) for index in range(len(node))))
    if not isinstance(node, dict) or parts[0] not in node:
        return False
    if len(parts) == 1:
        node[parts[0]] = MASK
        return True
    return _mask_slot(node, parts[0], parts[1:])


def _mask_slot(container: Any, key: Any, parts: list[str]) -> bool:
    """Search `container[key]` for `parts`."""
    value = container[key]
    if isinstance(value, dict | list):
        return _mask_path(value, parts)
    inner = _json_container(value) if isinstance(value, str) else None
    if inner is not None:
        masked = _mask_path(inner, parts)
        # Written back from what was parsed, masked or not: a duplicate key's other copy, which the
        # parser dropped, is not shown from the original text.
        container[key] = json.dumps(inner, ensure_ascii=False)
        return masked
    container[key] = MASK
    return True


def _json_container(text: str) -> Any:
    """`text` parsed when it holds a JSON object or array, else None."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict | list) else None


_QUOTED = re.compile(r"'([^'\s]*)'")
_RULE = re.compile(r"\s*\((input contract[^()]*)\)")
_VALUE_LIKE = re.compile(r"['\"0-9]")


def mask_reason(reason: str, field_names: set[str]) -> str:
    """A dead letter's reason quotes values of the record ('u3', a number, a key); for a reader who
    may not see a sensitive source, anything that may be a value goes: the field names it quotes and
    the rule it names stay, the rest of a sentence that still quotes or counts anything is masked."""
    rules = _RULE.findall(reason)
    sentence = _RULE.sub("", reason)
    kept = _QUOTED.sub(lambda m: f"\0{m.group(1)}\0" if m.group(1) in field_names else MASK, sentence)
    if _VALUE_LIKE.search(kept):  # a quote or a number left over: a value the pattern did not take
        kept = f"{MASK} (the reason quotes the record)"
    return kept.replace("\0", "'") + "".join(f" ({rule})" for rule in rules)


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass
class _Visibility:
    """What the caller may see of a topic."""

    may_see_sensitive: bool

    def key_masked(self, spec: TopicSpec | None) -> bool:
        return bool(spec and spec.sensitive_key and not self.may_see_sensitive)

    def fields_masked(self, spec: TopicSpec | None) -> list[str]:
        return list(spec.sensitive_fields) if spec and not self.may_see_sensitive else []

    def any_masked(self, spec: TopicSpec | None) -> bool:
        return bool(spec and spec.has_sensitive_data and not self.may_see_sensitive)


def browse(catalog: Catalog, kafka: KafkaClientConfig, query: BrowseQuery, *, may_see_sensitive: bool,
           now: datetime | None = None) -> BrowseResult:
    """One page of `query.topic`'s partition. BrowseError names what is wrong with the request."""
    now = now or datetime.now(UTC)
    try:
        spec = catalog.topic(query.topic)
    except KeyError:
        raise BrowseError(f"topic: {query.topic!r} is not a catalog topic (the browser reads the catalog's topics: "
                          f"{', '.join(catalog.topic_names())})") from None
    seeing = _Visibility(may_see_sensitive)
    dead_letter_app = next((a for a in catalog.apps if a.dead_letter_topic == spec.name), None)
    if query.reason and dead_letter_app is None:
        raise BrowseError(f"reason: {spec.name} is not a dead-letter topic; the reason filter reads dead letters")
    if query.key and seeing.key_masked(spec):
        raise BrowseError(f"key: the keys of {spec.name} are sensitive (catalog: sensitive_key) and your role may not "
                          "see them, so it may not filter by them either")
    if query.key and dead_letter_app is not None and seeing.any_masked(_source_spec(catalog, dead_letter_app)):
        raise BrowseError(f"key: the dead letters of {spec.name} carry keys of a sensitive input, which your role may not "
                          "see or filter by")
    try:
        ends = end_offsets(kafka, spec.name)
    except KafkaException as exc:
        raise BrowseError(f"topic: {spec.name} cannot be read on the broker ({exc.args[0]})") from None
    if query.partition not in ends:
        raise BrowseError(f"partition: {spec.name} has partitions 0-{len(ends) - 1}; there is no partition {query.partition}")
    low, high = ends[query.partition]
    notes: list[str] = []
    start = _start_offset(kafka, spec.name, query, low, high, now, notes)
    # The reason a reader matches is the one it is shown (masked values cannot be probed).
    reason_seen = (lambda record: _seen_reason(catalog, decode_dead_letter(record), seeing)) if query.reason else None
    records, scanned, next_offset = _scan(kafka, spec.name, query, start, high, reason_seen, notes)
    # A dead letter is keyed by its original's key: masked as the source's keys are.
    key_spec = _source_spec(catalog, dead_letter_app) if dead_letter_app is not None else spec
    shown = [_show(record, spec, seeing, key_spec) for record in records]
    if dead_letter_app is not None:
        _show_dead_letters(catalog, kafka, records, shown, seeing)
    return BrowseResult(
        topic=spec.name, partition=query.partition, partitions=len(ends), low=low, high=high, start=start,
        next_offset=next_offset, scanned=scanned, records=shown, notes=notes,
        sensitive_masked=seeing.any_masked(spec) or (dead_letter_app is not None
                                                      and seeing.any_masked(_source_spec(catalog, dead_letter_app))),
        dead_letter_of=dead_letter_app.name if dead_letter_app else None,
        readers=[a.name for a in catalog.apps if spec.name in a.inputs.values()])


def _source_spec(catalog: Catalog, app: AppSpec) -> TopicSpec | None:
    """What a dead letter of `app` may carry: its inputs' sensitive parts together (the strictest),
    for its key and for any dead letter whose source topic the catalog does not name."""
    specs = [catalog.topic(t) for t in sorted(set(app.inputs.values())) if t in catalog.topic_names()]
    if not specs:
        return None
    fields = sorted({f for s in specs for f in s.sensitive_fields})
    return specs[0].model_copy(update={"sensitive_fields": fields, "sensitive_key": any(s.sensitive_key for s in specs)})


def _start_offset(kafka: KafkaClientConfig, topic: str, query: BrowseQuery, low: int, high: int, now: datetime,
                  notes: list[str]) -> int:
    where = f"{topic} partition {query.partition} ({held_offsets(low, high)})"
    if query.offset is not None:
        if query.offset < low:
            notes.append(f"offset {query.offset} is no longer on the broker (retention deleted it); {where}: "
                         f"reading from {low}")
            return low
        if query.offset >= high:
            notes.append(f"offset {query.offset} is past the end of {where}: nothing to show yet")
            return high
        return query.offset
    if query.time:
        try:
            moment = parse_moment(query.time, "time", now, {TIME, BACK})
        except ValueError as exc:
            raise BrowseError(f"{exc} (or a time back such as '30 minutes')") from None
        assert moment.at is not None
        admin = kafka.admin(**{"allow.auto.create.topics": False})
        found = offsets_for_time(admin, topic, [query.partition], epoch_ms(moment.at))[query.partition]
        if found >= high:
            notes.append(f"no record of {where} is at or after {iso_ms(moment.at)}")
        return max(low, found)
    # The newest records: a page of them, or while filtering as many as one request scans.
    return max(low, high - (SCAN_RECORDS if query.filtered else query.limit))


def _scan(kafka: KafkaClientConfig, topic: str, query: BrowseQuery, start: int, end: int,
          reason_seen: Callable[[Record], str] | None, notes: list[str]) -> tuple[list[Record], int, int]:
    """Records from `start` up to `end` (the end when the request came) that pass the filters,
    at most query.limit, reading at most SCAN_RECORDS / SCAN_BYTES / SCAN_SECONDS. Returns the
    records, how many were read, and where a next page starts."""
    if start >= end:
        return [], 0, start
    matched: list[Record] = []
    scanned = scanned_bytes = 0
    position = start
    header_name, _, header_value = (query.header or "").partition("=")
    consumer = kafka.consumer(READER_GROUP, **{
        "isolation.level": "read_committed", "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
        "fetch.max.bytes": 8 * 1024 * 1024, "max.partition.fetch.bytes": 4 * 1024 * 1024})
    deadline = time.monotonic() + SCAN_SECONDS
    try:
        consumer.assign([TopicPartition(topic, query.partition, start)])
        while position < end and len(matched) < query.limit:
            if scanned >= SCAN_RECORDS or scanned_bytes >= SCAN_BYTES or time.monotonic() > deadline:
                notes.append(f"stopped after reading {scanned:,} records ({scanned_bytes:,} bytes), a request's bound: "
                             f"{len(matched)} matched; the next page continues at offset {position}")
                break
            for message in consumer.consume(num_messages=min(500, SCAN_RECORDS - scanned), timeout=0.2):
                if message.error():
                    if transient(KafkaException(message.error())):
                        continue
                    raise BrowseError(f"topic: {topic} partition {query.partition} cannot be read ({message.error()})")
                offset = message.offset()
                if offset >= end:
                    position = end
                    break
                position = offset + 1
                scanned += 1
                scanned_bytes += len(message.value() or b"") + len(message.key() or b"")
                record = Record(topic, message.partition(), offset, message.key(), message.value(),
                                message.timestamp()[1], message.headers() or [])
                if _matches(record, query, header_name, header_value, reason_seen):
                    matched.append(record)
                    if len(matched) >= query.limit:
                        break
            else:
                # Compacted or transactional topics have offset gaps: the position tells the truth.
                for tp in consumer.position([TopicPartition(topic, query.partition)]):
                    if tp.offset >= 0:
                        position = max(position, tp.offset)
    finally:
        consumer.close()
    return matched, scanned, position


def _matches(record: Record, query: BrowseQuery, header_name: str, header_value: str,
             reason_seen: Callable[[Record], str] | None) -> bool:
    if query.key and (record.key is None or query.key not in record.key.decode("utf-8", errors="replace")):
        return False
    if query.header:
        values = [v for n, v in record.headers if n == header_name]
        if not values or ("=" in query.header and header_value.encode() not in values):
            return False
    if query.reason and reason_seen is not None and query.reason.lower() not in reason_seen(record).lower():
        return False
    return True


def _show(record: Record, spec: TopicSpec, seeing: _Visibility, key_spec: TopicSpec | None) -> ShownRecord:
    return ShownRecord(
        partition=record.partition, offset=record.offset,
        timestamp=iso_ms(record.timestamp_ms) if record.timestamp_ms >= 0 else "",
        key=show_bytes(record.key, mask_all=seeing.key_masked(key_spec)),
        # Headers may carry what the value does (a user id for routing): masked as the key is.
        headers=[(name, show_bytes(value, max_chars=500, mask_all=seeing.any_masked(key_spec) or seeing.any_masked(spec)))
                 for name, value in record.headers],
        value=show_bytes(record.value, seeing.fields_masked(spec)))


def _show_dead_letters(catalog: Catalog, kafka: KafkaClientConfig, records: list[Record], shown: list[ShownRecord],
                       seeing: _Visibility) -> None:
    letters = [decode_dead_letter(record) for record in records]
    referenced = [letter for letter in letters if letter.by_reference]
    try:
        fetch_originals(kafka, referenced)
    except Exception as exc:  # noqa: BLE001 - the dead letters still show; their originals say why not
        for letter in referenced:
            letter.verdict = f"the original could not be read from {letter.source} ({type(exc).__name__}: {exc})"
    for letter, row in zip(letters, shown, strict=True):
        row.dead_letter = _shown_letter(catalog, letter, seeing)
        if letter.envelope is not None:
            # The envelope itself quotes the original (base64, a preview): shown decoded above.
            row.value = Shown("json", "(the dead-letter envelope, decoded below)", row.value.size)


def _topic_or_none(catalog: Catalog, name: str | None) -> TopicSpec | None:
    return catalog.topic(name) if name in catalog.topic_names() else None


def _letter_source(catalog: Catalog, letter: DeadLetter) -> TopicSpec | None:
    """The topic a dead letter's original came from, or (unknown to the catalog) what its app's
    inputs may carry: never less masking than the app's inputs ask for."""
    known = _topic_or_none(catalog, letter.source_topic)
    if known is not None:
        return known
    app = next((a for a in catalog.apps if letter.envelope is not None and a.name == letter.envelope.app), None)
    app = app or next((a for a in catalog.apps if a.dead_letter_topic == letter.at.rsplit("/", 2)[0]), None)
    return _source_spec(catalog, app) if app is not None else None


def _seen_reason(catalog: Catalog, letter: DeadLetter, seeing: _Visibility) -> str:
    """The dead letter's reason as this reader sees it: with the record's quoted values masked
    when its source has sensitive data the reader may not see (the field names it quotes kept)."""
    source = _letter_source(catalog, letter)
    if letter.envelope is None or not seeing.any_masked(source):
        return letter.reason
    assert source is not None
    names = set(source.value_schema or {}) | {part for p in source.sensitive_fields for part in p.split(".")}
    app = next((a for a in catalog.apps if a.name == letter.envelope.app), None)
    if app is not None:
        names |= set(app.input_keys.values())
        names |= {f for contract in app.input_contract.values() for f in contract.fields}
    return mask_reason(letter.reason, names)


def _shown_letter(catalog: Catalog, letter: DeadLetter, seeing: _Visibility) -> ShownDeadLetter:
    envelope = letter.envelope
    if envelope is None:
        return ShownDeadLetter(reason=letter.reason, app=None, app_version=None, failed_at=None, source=None,
                               source_topic=None, source_partition=None, source_offset=None, source_time=None,
                               original_key=None, original_value=None, stored="", note="not a dead-letter envelope")
    source = _letter_source(catalog, letter)
    reason = _seen_reason(catalog, letter, seeing)
    referenced = sorted(letter.by_reference)
    stored = "inline" if not referenced else (
        f"{' and '.join(referenced)} by reference: " + ("read from the source record" if not letter.verdict
                                                        else letter.verdict))
    missing = bool(letter.verdict)
    key = None if missing and "key" in referenced else show_bytes(letter.key, mask_all=seeing.key_masked(source))
    value = None if missing and "value" in referenced else show_bytes(letter.value, seeing.fields_masked(source))
    return ShownDeadLetter(
        reason=reason, app=envelope.app, app_version=envelope.app_version, failed_at=envelope.failed_at,
        source=letter.source, source_topic=letter.source_topic, source_partition=letter.source_partition,
        source_offset=letter.source_offset, source_time=envelope.source.timestamp, original_key=key,
        original_value=value, stored=stored)
