"""The message browser on the session's real broker (streamops.message_browser): seek by offset and by
time, filters by key, header and dead-letter reason, JSON, text and binary values, long values cut
with their size, dead letters decoded with their original (inline, and by reference from the
source record), sensitive fields masked for a role without sensitive data, requests refused with
the field named, and nothing joined or committed on the broker."""

from __future__ import annotations

import base64
import hashlib
import json
import time

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions

from streamops.kafka_records import producer
from streamops.message_browser import MASK, READER_GROUP, SHOWN_CHARS, BrowseError, BrowseQuery, browse
from streamops.timestamps import iso_ms

# The records' timestamps: T0 + offset seconds (an hour ago: within any retention).
T0 = (int(time.time()) - 3600) * 1000


def op(seq: int, user: str, op_type: str = "SEND_MESSAGE", **extra) -> bytes:
    return json.dumps({"seq": seq, "user_id": user, "op_type": op_type, "event_time": "2026-11-29T03:00:00Z",
                       **extra}).encode()


def envelope(source_topic: str, offset: int, reason: str, *, value: bytes | None, by_reference: bytes | None = None) -> bytes:
    """A dead letter as the driver writes it (streamops.records.dead_letter_record's fields)."""
    original = by_reference if by_reference is not None else value
    return json.dumps({
        "app": "oplog-router", "app_version": "1.0.0", "reason": reason, "failed_at": "2026-11-29T03:00:01.000Z",
        "source": {"topic": source_topic, "partition": 0, "offset": offset, "timestamp": "2026-11-29T03:00:00.000Z"},
        "original_key_base64": base64.b64encode(b"u7").decode(), "original_key_stored": "inline",
        "original_value_base64": None if by_reference is not None else base64.b64encode(value or b"").decode(),
        "original_value_stored": "reference" if by_reference is not None else "inline",
        "original_key_bytes": 2, "original_value_bytes": len(original or b""),
        "original_key_sha256": hashlib.sha256(b"u7").hexdigest(),
        "original_value_sha256": hashlib.sha256(original or b"").hexdigest(),
        "original_value_preview": (original or b"")[:100].decode(errors="replace"),
    }).encode()


@pytest.fixture
def topics(broker, app_catalog):
    """oplog.operations partition 0: 6 records (JSON, text, binary, long, with headers), and the
    router's dead letters of two of them (one inline, one by reference)."""
    operations = app_catalog.app("oplog-router").inputs["operations"]
    dead_letters = app_catalog.app("oplog-router").dead_letter_topic
    out = producer(broker.client_config)
    values = [op(0, "u1"), op(1, "u2", note="x" * 10_000), b"not json at all", bytes(range(256)) * 2,
              op(4, "u7", op_type="NO_SUCH_OP"), op(5, "u1")]
    for offset, value in enumerate(values):
        out.produce(operations, key=f"u{offset + 1}".encode(), value=value, partition=0, timestamp=T0 + offset * 1000,
                    headers=[("trace", f"t{offset % 2}".encode()), ("bin", b"\xff\x00")])
    out.produce(dead_letters, key=b"u7", partition=0, value=envelope(
        operations, 4, "field 'op_type': 'NO_SUCH_OP' is not one of the allowed values", value=values[4]))
    out.produce(dead_letters, key=b"u7", partition=0, value=envelope(
        operations, 2, "value is not JSON", value=None, by_reference=values[2]))
    out.produce(dead_letters, partition=0, value=b"not an envelope")
    assert out.flush(30) == 0
    return app_catalog, operations, dead_letters


def read(broker, catalog, *, sensitive: bool = True, **form):
    return browse(catalog, broker.client_config, BrowseQuery.from_form(form), may_see_sensitive=sensitive)


def test_records_by_offset_and_by_time_shown_as_json_text_or_hex_and_cut_with_their_size(broker, topics):
    catalog, operations, _ = topics
    page = read(broker, catalog, topic=operations, partition="0", offset="0", limit="4")
    assert (page.low, page.high, page.start, page.next_offset, page.scanned) == (0, 6, 0, 4, 4)
    assert [r.offset for r in page.records] == [0, 1, 2, 3]
    first, long, text, binary = page.records
    assert (first.key.kind, first.key.text) == ("text", "u1")
    assert first.value.kind == "json" and json.loads(first.value.text) == json.loads(op(0, "u1"))
    assert first.value.text.startswith('{\n  "seq": 0,')  # pretty-printed
    assert first.timestamp == iso_ms(T0)
    assert [(n, v.kind, v.text) for n, v in first.headers] == [("trace", "text", "t0"), ("bin", "hex", "ff 00")]
    assert long.value.cut and long.value.size == len(op(1, "u2", note="x" * 10_000))
    assert long.value.text.endswith(f"… (cut: {long.value.size:,} bytes in all)") and len(long.value.text) < SHOWN_CHARS + 40
    assert (text.value.kind, text.value.text) == ("text", "not json at all")
    assert binary.value.kind == "hex" and binary.value.text.startswith("00 01 02 03") and binary.value.size == 512
    assert page.readers == ["oplog-router"]

    by_time = read(broker, catalog, topic=operations, time=iso_ms(T0 + 3500))  # the first at or after it: offset 4
    assert [r.offset for r in by_time.records] == [4, 5]
    newest = read(broker, catalog, topic=operations, limit="2")  # no start: the newest records
    assert [r.offset for r in newest.records] == [4, 5]
    past = read(broker, catalog, topic=operations, offset="99")
    assert past.records == [] and past.notes == [
        f"offset 99 is past the end of {operations} partition 0 (it holds offsets 0-5): nothing to show yet"]


def test_filters_by_key_header_and_dead_letter_reason_and_dead_letters_decoded(broker, topics):
    catalog, operations, dead_letters = topics
    assert [r.offset for r in read(broker, catalog, topic=operations, offset="0", key="u1").records] == [0]
    assert [r.offset for r in read(broker, catalog, topic=operations, offset="0", header="trace=t1").records] == [1, 3, 5]
    assert len(read(broker, catalog, topic=operations, offset="0", header="bin").records) == 6

    letters = read(broker, catalog, topic=dead_letters, offset="0")
    assert letters.dead_letter_of == "oplog-router" and len(letters.records) == 3
    inline, by_reference, other = (r.dead_letter for r in letters.records)
    assert (inline.reason, inline.source, inline.app, inline.app_version, inline.stored) == (
        "field 'op_type': 'NO_SUCH_OP' is not one of the allowed values", f"{operations}/0/4", "oplog-router", "1.0.0",
        "inline")
    assert json.loads(inline.original_value.text)["op_type"] == "NO_SUCH_OP" and inline.original_key.text == "u7"
    assert by_reference.stored == "value by reference: read from the source record"
    assert by_reference.original_value.text == "not json at all"
    assert other.note == "not a dead-letter envelope"
    by_reason = read(broker, catalog, topic=dead_letters, offset="0", reason="NOT JSON")
    assert [r.dead_letter.source for r in by_reason.records] == [f"{operations}/0/2"]


def test_a_role_without_sensitive_data_sees_it_masked_and_cannot_filter_by_it(broker, topics):
    catalog, operations, dead_letters = topics
    page = read(broker, catalog, sensitive=False, topic=operations, offset="0", limit="3")
    first, _long, text = page.records
    assert page.sensitive_masked and first.key.kind == "masked" and "u1" not in first.key.text
    shown = json.loads(first.value.text)
    assert shown["user_id"] == MASK and shown["op_type"] == "SEND_MESSAGE" and first.value.masked == ["user_id"]
    assert text.value.kind == "masked"  # not JSON: its fields cannot be told apart, so all of it
    with pytest.raises(BrowseError, match=f"key: the keys of {operations} are sensitive"):
        read(broker, catalog, sensitive=False, topic=operations, key="u1")
    letters = read(broker, catalog, sensitive=False, topic=dead_letters, offset="0", limit="1")
    letter = letters.records[0].dead_letter
    assert letters.records[0].key.kind == "masked"  # a dead letter is keyed by its original's key
    assert letter.reason == f"field 'op_type': {MASK} is not one of the allowed values"  # the value goes, the field stays
    assert [v.kind for _n, v in first.headers] == ["masked", "masked"]
    assert letter.original_key.kind == "masked" and json.loads(letter.original_value.text)["user_id"] == MASK
    # A reason filter matches what the reader is shown: a masked value cannot be probed.
    assert read(broker, catalog, sensitive=False, topic=dead_letters, offset="0", reason="NO_SUCH_OP").records == []


def test_bad_requests_name_the_field_and_reads_join_no_group(broker, admin, topics):
    catalog, operations, _ = topics
    with pytest.raises(BrowseError, match=r"^topic: 'nope' is not a catalog topic"):
        read(broker, catalog, topic="nope")
    with pytest.raises(BrowseError, match=rf"^partition: {operations} has partitions 0-5; there is no partition 9$"):
        read(broker, catalog, topic=operations, partition="9")
    with pytest.raises(BrowseError, match=r"^limit: Input should be less than or equal to 100$"):
        BrowseQuery.from_form({"topic": operations, "limit": "500"})
    with pytest.raises(BrowseError, match="give an offset or a time to start from, not both"):
        BrowseQuery.from_form({"topic": operations, "offset": "1", "time": "1 hour"})
    with pytest.raises(BrowseError, match=f"reason: {operations} is not a dead-letter topic"):
        read(broker, catalog, topic=operations, reason="x")
    with pytest.raises(BrowseError, match="time 'yesterday' is not an ISO-8601 time"):
        read(broker, catalog, topic=operations, time="yesterday")
    groups = admin.list_consumer_groups().result(30)
    assert READER_GROUP not in {g.group_id for g in groups.valid}
    committed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(READER_GROUP)])[READER_GROUP].result(30)
    assert committed.topic_partitions == []
