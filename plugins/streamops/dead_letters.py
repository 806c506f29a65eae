"""A dead letter as its readers see it: the envelope decoded (why, where from, the original key and
value), and the originals kept by reference read back from their source record.

The writer is the driver (streamops.records.dead_letter_record builds the envelope from
streamops.runtime_records.DeadLetterEnvelope); the readers are the replay
(streamops.recovery.replay) and the message browser (streamops.message_browser). A record of a
dead-letter topic that is not an envelope is "not an envelope", never an error.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import OffsetSpan, end_offsets
from streamops.kafka_records import Record, held_offsets, read_spans
from streamops.runtime_records import DeadLetterEnvelope

NOT_AN_ENVELOPE = "(not a dead-letter envelope)"


@dataclass
class DeadLetter:
    at: str  # dead-letter topic/partition/offset
    reason: str
    source: str | None  # original topic/partition/offset (None: not an envelope)
    source_topic: str | None = None
    source_partition: int | None = None
    key: bytes | None = None
    value: bytes | None = None
    verdict: str = ""  # replay | still fails: <reason> | filtered out | already replayed | ...
    source_offset: int | None = None
    # An original too large for the dead letter is kept by reference: read back from the source.
    by_reference: dict[str, str] = field(default_factory=dict)  # "key"/"value" -> sha256 of the original
    envelope: DeadLetterEnvelope | None = field(default=None, compare=False, repr=False)


def decode_dead_letter(record: Record) -> DeadLetter:
    """The dead letter a dead-letter topic's record holds (verdict "not an envelope" when it holds none)."""
    at = f"{record.topic}/{record.partition}/{record.offset}"
    try:
        # A null value is not an envelope either; nor is one whose base64 does not decode.
        envelope = DeadLetterEnvelope.model_validate_json(record.value or b"")
        source = envelope.source
        stored = {"key": (envelope.original_key_stored, envelope.original_key_sha256),
                  "value": (envelope.original_value_stored, envelope.original_value_sha256)}
        return DeadLetter(
            at=at, reason=envelope.reason, source=f"{source.topic}/{source.partition}/{source.offset}",
            source_topic=source.topic, source_partition=source.partition, source_offset=source.offset,
            key=_b64(envelope.original_key_base64), value=_b64(envelope.original_value_base64),
            by_reference={part: str(digest) for part, (how, digest) in stored.items() if how == "reference"},
            envelope=envelope,
        )
    except ValueError:  # pydantic's ValidationError and base64's binascii.Error too
        return DeadLetter(at=at, reason=NOT_AN_ENVELOPE, source=None, verdict="not an envelope")


def read_dead_letters(kafka: KafkaClientConfig, topic: str, spans: Mapping[int, OffsetSpan]) -> list[DeadLetter]:
    return [decode_dead_letter(record) for record in read_spans(kafka, topic, spans)]


def _b64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def fetch_originals(kafka: KafkaClientConfig, letters: Iterable[DeadLetter]) -> None:
    """Read originals kept by reference from their source records, checking each against its
    sha256; a record retention deleted (or a digest that differs) cannot be replayed, and its
    verdict says why."""
    by_partition: dict[tuple[str, int], list[tuple[DeadLetter, int]]] = {}
    for letter in letters:
        # Only an envelope keeps an original by reference, and an envelope names its source.
        if letter.by_reference and letter.source_topic is not None and letter.source_partition is not None \
                and letter.source_offset is not None:
            by_partition.setdefault((letter.source_topic, letter.source_partition), []).append((letter, letter.source_offset))
    for (topic, partition), group in by_partition.items():
        low, high = end_offsets(kafka, topic).get(partition, (0, 0))
        found = {}
        for _letter, offset in group:
            if low <= offset < high:
                records = read_spans(kafka, topic, {partition: OffsetSpan(offset, offset + 1)})
                found.update({r.offset: r for r in records})
        for letter, offset in group:
            record = found.get(offset)
            if record is None:
                letter.verdict = (f"not replayable: its original is kept by reference and {letter.source} is no longer on the "
                                  f"broker (retention; {topic} partition {partition}: {held_offsets(low, high)})")
                continue
            for part, digest in letter.by_reference.items():
                data = record.key if part == "key" else record.value
                if data is None or hashlib.sha256(data).hexdigest() != digest:
                    letter.verdict = (f"not replayable: {letter.source} no longer holds the original {part} the dead letter "
                                      "references (its sha256 differs)")
                    break
                setattr(letter, part, data)
