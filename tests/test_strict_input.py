"""The input contract (plugins/streamops/records.py, docs/architecture.md "Input contract") on a real broker
and real Spark: every record is routed exactly or dead-lettered once with the rule it breaks,
the original bytes kept and base64-encoded without line breaks."""

from __future__ import annotations

import base64
import itertools
import json
from datetime import UTC

import pytest
import yaml

from spark_apps.presence_notifier import EVENT_FIELDS
from streamops import records
from streamops.catalog import CatalogError, load_catalog
from streamops.driver.queries import observed_totals
from streamops.kafka_records import produce, read_all
from streamops.paths import PROJECT_ROOT
from tests.support.apps import run_available_now

TIME = "2026-01-01T00:00:01Z"
KEY_RULE = "(input contract key: the catalog keys this input by field 'user_id')"


def op(seq=1, user="u1", op_type="ADD_CONTACT", event_time=TIME, **extra) -> str:
    return json.dumps({"seq": seq, "user_id": user, "op_type": op_type, "event_time": event_time, **extra})


def raw_op(seq="1", user='"u1"', op_type='"ADD_CONTACT"', event_time=f'"{TIME}"', extra="") -> bytes:
    """An operation built from JSON text pieces, for values json.dumps cannot write."""
    return f'{{"seq":{seq},"user_id":{user},"op_type":{op_type},"event_time":{event_time}{extra}}}'.encode()


def not_rfc3339(text: str) -> str:
    return (f"field 'event_time' is not an RFC 3339 date-time YYYY-MM-DDTHH:MM:SS[.ffffff](Z|±HH:MM): '{text}' "
            "(input contract timestamp)")


def depth_rule(limit: int = 64) -> str:
    return (f"value is nested more than {limit} levels deep (input contract depth: at most {limit}, so that common JSON "
            "decoders can read what the app writes)")


# In an event-time reason, the record's Kafka timestamp (from its dead letter's source.timestamp).
KAFKA_TIME = "{kafka_time}"


def too_far_ahead(text: str, bound: str = "5 minutes") -> str:
    return (f"field 'event_time' '{text}' is more than {bound} after the record's Kafka timestamp {KAFKA_TIME} "
            f"(input contract event-time: max_future {bound})")


def too_far_back(text: str, bound: str = "3650 days") -> str:
    return (f"field 'event_time' '{text}' is more than {bound} before the record's Kafka timestamp {KAFKA_TIME} "
            f"(input contract event-time: max_past {bound})")


def not_a_time(text: str) -> str:
    return (f"field 'event_time' is not a valid date and time: '{text}' (a day the month has, seconds 00-59, an offset within "
            "±18:00; input contract timestamp)")


# (key, value, the exact dead-letter reason): one per class of invalid input.
INVALID: list[tuple[bytes | None, bytes | None, str]] = [
    (b"u1", raw_op(op_type='"ADD_CONTACT","op_type":"LOGIN"'),
     "duplicate member name 'op_type' (input contract unique-names: I-JSON, RFC 7493 §2.3: member names must be unique)"),
    (b"u1", raw_op(extra=',"meta":{"a":1,"a":2}'),
     "duplicate member name in a nested object (input contract unique-names: I-JSON, RFC 7493 §2.3)"),
    (b"u1", op().encode() + b' {"seq":2}',
     "value has content after the JSON value (input contract one-value: exactly one JSON value per record)"),
    (b"u1", op().encode() + b"xyz",
     "value has content after the JSON value (input contract one-value: exactly one JSON value per record)"),
    (b"u1", op().encode() + b"\x00",
     "value has content after the JSON value (input contract one-value: exactly one JSON value per record)"),
    (b"u1", raw_op(seq='"1"'), "field 'seq' must be an integer, got STRING (input contract field-type)"),
    (b"u1", raw_op(seq="1.5"), "field 'seq' must be an integer, got DECIMAL(2,1) (input contract field-type)"),
    (b"u1", raw_op(seq="1e3"), "field 'seq' must be an integer, got DOUBLE (input contract field-type)"),
    (b"u1", raw_op(seq="9223372036854775808"),
     "field 'seq' is an integer outside the int64 range: 9223372036854775808 (input contract field-type)"),
    (b"u1", raw_op(seq="NaN"), "value has NaN or Infinity, which are not JSON numbers (input contract json: RFC 8259 §6)"),
    (b"7", raw_op(user="7"), "field 'user_id' must be a string, got BIGINT (input contract field-type)"),
    (b"u1", raw_op(op_type='{"name":"ADD_CONTACT"}'),
     "field 'op_type' must be a string, got OBJECT<name: STRING> (input contract field-type)"),
    (b"u1", raw_op(event_time="1767225601"),
     "field 'event_time' must be an ISO-8601 timestamp string, got BIGINT (input contract field-type)"),
    # A field present as null is not a missing one.
    (b"u1", raw_op(seq="null"), "field 'seq' is null, not an integer (input contract field-present)"),
    (b"u1", b'{"user_id":"u1","op_type":"ADD_CONTACT","event_time":"2026-01-01T00:00:01Z"}',
     "missing field 'seq' (input contract field-present)"),
    # Field rules: the router's (user_id, op_type not empty) and the catalog's (seq >= 0, user_id at
    # most 256 characters, op_type a pattern).
    (b"u1", raw_op(seq="-5"), "field 'seq' is -5, below the minimum 0 (input contract range)"),
    (b"", raw_op(user='""'), "field 'user_id' must not be empty, got '' (0 characters) (input contract length)"),
    (b"u" * 257, raw_op(user='"' + "u" * 257 + '"'),
     "field 'user_id' must have at most 256 characters, got 257: '" + "u" * 97 + "...' (input contract length)"),
    (b"u1", raw_op(op_type='"add_contact"'),
     "field 'op_type' does not match the pattern [A-Z][A-Z_]*: 'add_contact' (input contract pattern)"),
    # Event time within bounds of the record's own time: far ahead would hijack a watermark.
    (b"u1", op(event_time="9999-12-31T23:59:59.999Z").encode(), too_far_ahead("9999-12-31T23:59:59.999Z")),
    (b"u1", op(event_time="0001-01-01T00:00:00Z").encode(), too_far_back("0001-01-01T00:00:00Z")),
    (b"u1", op(event_time="1970-01-01T00:00:00Z").encode(), too_far_back("1970-01-01T00:00:00Z")),
    (b"u1", raw_op(extra=',"note":"BAD"').replace(b"BAD", b"\xff\xfe"),
     "value is not UTF-8 (input contract utf-8: RFC 8259 §8.1)"),
    (b"u1", b"\xef\xbb\xbf" + op().encode(),
     "value starts with a byte order mark (input contract utf-8: RFC 8259 §8.1 forbids it)"),
    (b"u1", raw_op(extra=',"note":"a\x01b"'),
     "value has an unescaped control character (input contract json: RFC 8259 §7 requires \\u escapes)"),
    (b"u1", raw_op(extra=r',"note":"\ud800x"'),
     "value has a lone surrogate escape '\\ud800' (input contract unicode: I-JSON, RFC 7493 §2.1)"),
    (b"u1", raw_op(extra=',"deep":' + "[" * 1500 + "]" * 1500), depth_rule()),
    # Deeper than common decoders read (64, the default), within what the parser takes.
    (b"u1", raw_op(extra=',"deep":' + "[" * 64 + "]" * 64), depth_rule()),
    (b"u1", raw_op(extra=',"deep":' + '{"a":' * 995 + "1" + "}" * 995), depth_rule()),
    # Brackets inside strings are text, not levels: this one is 2 deep, and a wrong type.
    (b"u1", raw_op(seq='"' + "[{" * 600 + '"'), "field 'seq' must be an integer, got STRING (input contract field-type)"),
    (b"u1", raw_op(extra=',"n":' + "1" * 1001),
     "value has a number of more than 1000 digits (input contract json: the parser's limit)"),
    # Shapes that must not overflow a regex's stack (one such record would fail the query).
    # Objects past the parser's own limit are named by depth too, not as invalid JSON.
    (b"u1", raw_op(extra=',"deep":' + '{"a":' * 1100 + "1" + "}" * 1100), depth_rule()),
    (b"u1", b'{"items":[' + b'{"a":1},' * 999, "value is not valid JSON (input contract json: RFC 8259)"),
    (b"u1", raw_op(extra=',"long":"' + "a" * 60000 + r'\ud800"'),
     "value has a lone surrogate escape '\\ud800' (input contract unicode: I-JSON, RFC 7493 §2.1)"),
    (b"u1", b"{'seq': 1}", "value is not valid JSON (input contract json: RFC 8259)"),
    (b"u1", b"[1, 2]", "value is not a JSON object (input contract object)"),
    (b"u1", None, "empty value (null): a tombstone is not an event (input contract value-present)"),
    (b"u1", op(event_time="9999-12-31T23:59:59-01:00").encode(),
     "field 'event_time' is outside years 0001-9999 in UTC: '9999-12-31T23:59:59-01:00' (input contract timestamp)"),
    (b"u1", op(event_time="+10000-01-01T00:00:00Z").encode(), not_rfc3339("+10000-01-01T00:00:00Z")),
    (b"u1", op(event_time="2026-01-01 00:00:01Z").encode(), not_rfc3339("2026-01-01 00:00:01Z")),
    (b"u1", op(event_time="2026-01-01T00:00:01z").encode(), not_rfc3339("2026-01-01T00:00:01z")),
    # Java's $ would let a final line break through; Spark's parser would drop it.
    (b"u1", op(event_time="2026-01-01T00:00:01Z\n").encode(), not_rfc3339("2026-01-01T00:00:01Z\n")),
    # Spark keeps microseconds: a seventh digit would be cut silently.
    (b"u1", op(event_time="2026-01-01T00:00:01.1234567Z").encode(), not_rfc3339("2026-01-01T00:00:01.1234567Z")),
    (b"u1", op(event_time="2026-02-29T00:00:00Z").encode(), not_a_time("2026-02-29T00:00:00Z")),
    (b"u1", op(event_time="2016-12-31T23:59:60Z").encode(), not_a_time("2016-12-31T23:59:60Z")),
    (b"u1", op(event_time="2026-01-01T00:00:00+19:00").encode(), not_a_time("2026-01-01T00:00:00+19:00")),
    # A ']' after the value would close brackets put around it: still content after the value.
    (b"u1", op().encode() + b']{"seq":2,"user_id":"evil"}',
     "value has content after the JSON value (input contract one-value: exactly one JSON value per record)"),
    # A lone low surrogate after literal hex digits, and after an escaped backslash.
    (b"u1", raw_op(extra=r',"note":"d800\udc00"'),
     "value has a lone surrogate escape '\\udc00' (input contract unicode: I-JSON, RFC 7493 §2.1)"),
    (b"u1", raw_op(extra=r',"note":"\\ud800\udc00"'),
     "value has a lone surrogate escape '\\udc00' (input contract unicode: I-JSON, RFC 7493 §2.1)"),
    (b"u1", raw_op(extra=',\n"zz":1,\n"zz":2'),
     "duplicate member name 'zz' (input contract unique-names: I-JSON, RFC 7493 §2.3: member names must be unique)"),
    (b"u9", op(user="u1").encode(), f"key 'u9' does not equal field 'user_id' 'u1' {KEY_RULE}"),
    (b"", op(user="u1").encode(), f"key '' does not equal field 'user_id' 'u1' {KEY_RULE}"),
    (None, op(user="u1").encode(), f"record has no key; it must equal field 'user_id' {KEY_RULE}"),
    (b"u1", op(op_type="LOGIN").encode(),
     "op type 'LOGIN' is in no category (contacts, groups, messages) of the catalog's settings.categories "
     "(router contract: every op type is routed or refused)"),
]

UNICODE_USER = "ü-用户-😀"
# Valid edge cases: (key, value text) - every one must be routed, exactly as sent.
VALID: list[tuple[str, str]] = [
    (UNICODE_USER, op(user=UNICODE_USER, seq=9223372036854775807, note='"quoted" \\ \n é 😀 \t')),
    ("u2", json.dumps({"seq": 0, "user_id": "u2", "op_type": "SEND_MESSAGE",
                       "event_time": "2026-01-01T05:30:01.123456+05:30", "nested": {"a": [1, {"b": None}]}})),
    # Escaped backslash then 'ud800' is text, not an escape; a surrogate pair is one character.
    ("u3", '  {"seq":3,"user_id":"u3","op_type":"CREATE_GROUP","event_time":"2026-01-01T00:00:01Z",'
           '"path":"C:\\\\ud800","smile":"\\ud83d\\ude00"}\n\t '),
    # At the bounds: 255 levels of brackets inside a string, 64 levels of nesting, 256 characters.
    ("u4", op(seq=9223372036854775807, user="u4", op_type="READ_MESSAGE", note="[{" * 255,
              deep=json.loads("[" * 63 + "]" * 63))),
    ("u" * 256, op(seq=5, user="u" * 256, op_type="DELETE_MESSAGE", event_time="2020-06-30T23:59:59.999Z")),
    # 15,000 escaped quotes, each before a bracket: the depth check reads strings in linear time.
    ("u7", op(seq=7, user="u7", op_type="SEND_MESSAGE", long='"[' * 15000)),
    # Numbers beyond a double and exponents: the router copies the event's text, it re-encodes nothing.
    ("u6", '{"seq":6,"user_id":"u6","op_type":"SEND_MESSAGE","event_time":"2026-01-01T00:00:01.123456+14:00",'
           '"big":1e400,"exp":1E2,"long":1.000000000000000000000000000000000000001}'),
]


def test_every_invalid_class_is_one_dead_letter_with_its_rule_and_valid_edge_cases_are_routed(
    spark, broker, app_catalog, tmp_path
):
    spec = app_catalog.app("oplog-router")
    source = spec.inputs["operations"]
    inputs = [(k.encode(), v.encode()) for k, v in VALID[:2]] + [(k, v) for k, v, _ in INVALID] + [
        (k.encode(), v.encode()) for k, v in VALID[2:]
    ]
    produce(broker.client_config, source, inputs, partition=0)

    queries = run_available_now(spark, app_catalog, "oplog-router", broker, tmp_path / "ckpt")

    dead = read_all(broker.client_config, spec.dead_letter_topic)
    envelopes = [r.json() for r in dead]
    first_invalid = 2
    assert [(e["source"]["offset"], e["reason"]) for e in envelopes] == [
        (first_invalid + i, reason.replace(KAFKA_TIME, envelopes[i]["source"]["timestamp"]))
        for i, (_, _, reason) in enumerate(INVALID)
    ]
    for envelope, (key, value, _) in zip(envelopes, INVALID, strict=True):
        # Strict decoding (validate=True refuses line breaks): the exact original bytes come back.
        for field, original in (("original_value_base64", value), ("original_key_base64", key)):
            encoded = envelope.get(field)  # to_json leaves out null fields
            assert (encoded is None) == (original is None), (field, envelope["reason"])
            if original is not None:
                assert "\n" not in encoded and "\r" not in encoded
                assert base64.b64decode(encoded, validate=True) == original

    routed: dict[tuple[str, str], dict] = {}
    raw_events: dict[str, bytes] = {}
    for topic in spec.outputs.values():
        for record in read_all(broker.client_config, topic):
            routed[(record.json()["event_id"], record.json()["category"])] = {"key": record.key_text, **record.json()}
            raw_events[record.json()["event_id"]] = record.value
    offsets = {0: VALID[0], 1: VALID[1]} | {first_invalid + len(INVALID) + i: kv for i, kv in enumerate(VALID[2:])}
    categories = {"ADD_CONTACT": ["contacts", "groups"], "SEND_MESSAGE": ["messages"], "CREATE_GROUP": ["groups"],
                  "READ_MESSAGE": ["messages"], "DELETE_MESSAGE": ["messages"]}
    utc_times = {0: "2026-01-01T00:00:01.000Z", 1: "2026-01-01T00:00:01.123Z",
                 first_invalid + len(INVALID): "2026-01-01T00:00:01.000Z",
                 first_invalid + len(INVALID) + 1: "2026-01-01T00:00:01.000Z",
                 first_invalid + len(INVALID) + 2: "2020-06-30T23:59:59.999Z",
                 first_invalid + len(INVALID) + 3: "2026-01-01T00:00:01.000Z",
                 first_invalid + len(INVALID) + 4: "2025-12-31T10:00:01.123Z"}
    expected = {}
    for offset, (key, text) in offsets.items():
        event = json.loads(text)
        for category in categories[event["op_type"]]:
            expected[(f"{source}/0/{offset}", category)] = {
                "key": key, "event_id": f"{source}/0/{offset}", "category": category, "seq": event["seq"],
                "user_id": event["user_id"], "op_type": event["op_type"], "event_time": utc_times[offset], "event": event,
            }
    assert routed == expected
    for offset, (_, text) in offsets.items():  # the event is the original text, byte for byte
        assert raw_events[f"{source}/0/{offset}"].endswith(b',"event":' + text.strip(" \t\n\r").encode() + b"}")
    assert observed_totals(queries) == {
        "records_in": len(VALID) + len(INVALID), "dead_letters": len(INVALID), "unknown_op_type": 1,
    }


def test_presence_events_obey_the_same_contract_and_their_key_rule(spark):
    """The presence notifier's inputs go through the same parse (batch, real Spark)."""
    rows = [
        (b"u1", b'{"seq":1,"user_id":"u1","action":"Close","event_time":"2026-01-01T00:00:01+01:00"}', "events", 0, 0),
        (b"u2", b'{"seq":2,"user_id":"u1","action":"Close","event_time":"2026-01-01T00:00:01Z"}', "events", 0, 1),
        (b"u1", b'{"seq":3,"user_id":"u1","action":"Close","action":"Open","event_time":"2026-01-01T00:00:01Z"}', "events", 0, 2),
        (b"u1", b'{"seq":4,"user_id":"u1","action":"Shut","event_time":"2026-01-01T00:00:01Z"}', "events", 0, 3),
    ]
    frame = spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, offset bigint")
    parsed = records.parse(frame, EVENT_FIELDS, 65536, key_field="user_id").orderBy("offset")
    assert [(r["offset"], r["error"]) for r in parsed.collect()] == [
        (0, None),
        (1, f"key 'u2' does not equal field 'user_id' 'u1' {KEY_RULE}"),
        (2, "duplicate member name 'action' (input contract unique-names: I-JSON, RFC 7493 §2.3: member names must be unique)"),
        (3, "field 'action' must be one of Open, Close, got 'Shut' (input contract allowed-value)"),
    ]


def test_event_time_bounds_name_the_time_they_compared_with_and_a_zero_kafka_timestamp_gives_no_pass(spark):
    """Batch parse with Kafka timestamps (real Spark): a producer's clock ahead is judged against the
    time of processing; a record whose Kafka timestamp is itself a zero date is judged against it
    too; a value set with a '%' in it names the rule rather than failing the query."""
    import re
    from datetime import datetime, timedelta

    from streamops.input_contract import InputContract

    now = datetime.now(UTC).replace(microsecond=0)
    ahead = now + timedelta(hours=1)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)

    def event(seq, when: datetime, action="Open") -> bytes:
        return json.dumps({"seq": seq, "user_id": "u1", "action": action,
                           "event_time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()

    rows = [
        (b"u1", event(0, now), "events", 0, 0, now),  # good
        (b"u1", event(1, ahead), "events", 0, 1, now),  # an hour ahead of its Kafka timestamp
        (b"u1", event(2, ahead), "events", 0, 2, ahead),  # the producer's clock (and Kafka timestamp) an hour ahead
        (b"u1", event(3, epoch), "events", 0, 3, epoch),  # a zero date, in the Kafka timestamp too
        (b"u1", event(4, now, action="Shut"), "events", 0, 4, now),
    ]
    frame = spark.createDataFrame(rows,
                                  "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp")
    fields = [f if f.path != "action" else records.Field("action", "string", "action", allowed=("Open", "50%"))
              for f in EVENT_FIELDS]
    parsed = records.parse(frame, fields, 65536, key_field="user_id", contract=InputContract()).orderBy("offset")
    errors = [r["error"] for r in parsed.collect()]
    stamp = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z"
    kafka_now = now.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert errors[0] is None
    assert errors[1] == (f"field 'event_time' '{ahead:%Y-%m-%dT%H:%M:%SZ}' is more than 5 minutes after the record's Kafka "
                         f"timestamp {kafka_now} (input contract event-time: max_future 5 minutes)")
    assert re.fullmatch(f"field 'event_time' '{ahead:%Y-%m-%dT%H:%M:%SZ}' is more than 5 minutes after the time it was processed "
                        rf"{stamp} \(input contract event-time: max_future 5 minutes\)", errors[2]), errors[2]
    assert re.fullmatch(r"field 'event_time' '1970-01-01T00:00:00Z' is more than 7300 days before the time it was processed "
                        rf"{stamp}, and its Kafka timestamp is too old to go by \(input contract event-time: max_past 3650 days, "
                        r"at most twice that before processing\)", errors[3]), errors[3]
    assert errors[4] == "field 'action' must be one of Open, 50%, got 'Shut' (input contract allowed-value)"


def test_a_key_rule_for_a_field_the_input_does_not_have_is_refused_when_the_app_starts(spark):
    frame = spark.createDataFrame([], "key binary, value binary, topic string, partition int, offset bigint")
    with pytest.raises(ValueError, match="key rule: the key must equal field 'account', but the input's fields have no "
                                         "string field of that name \\(fields: seq, user_id, action, event_time\\)"):
        records.parse(frame, EVENT_FIELDS, 65536, key_field="account")


def test_catalog_key_rules_name_an_input_role(tmp_path):
    catalog = yaml.safe_load((PROJECT_ROOT / "catalog" / "pipelines.yaml").read_text())
    router = next(app for app in catalog["apps"] if app["name"] == "oplog-router")
    assert router["input_keys"] == {"operations": "user_id"}
    router["input_keys"] = {"operation": "user_id"}
    broken = tmp_path / "catalog.yaml"
    broken.write_text(yaml.safe_dump(catalog, sort_keys=False))
    for suite in (PROJECT_ROOT / "catalog" / "expectations").glob("*.json"):  # suites resolve relative to the file
        (tmp_path / "expectations").mkdir(exist_ok=True)
        (tmp_path / "expectations" / suite.name).write_text(suite.read_text())
    with pytest.raises(CatalogError) as refused:
        load_catalog(broken)
    message = str(refused.value)
    assert "oplog-router" in message and "line" in message
    assert "input_keys: ['operation'] are not input roles of this app (inputs: ['operations'])" in message


def test_base64_of_dead_letters_has_no_line_breaks_in_every_app_session(spark):
    """spark.sql.chunkBase64String.enabled=false in BASE_CONF: base64() of >57 bytes is one line."""
    from streamops.driver.session import BASE_CONF

    assert BASE_CONF["spark.sql.chunkBase64String.enabled"] == "false"
    value = bytes(range(256)) * 2
    encoded = spark.createDataFrame([(value,)], "value binary").selectExpr("base64(value) AS b").first()["b"]
    assert "\n" not in encoded and base64.b64decode(encoded, validate=True) == value


def test_the_category_suite_catches_the_same_classes_downstream(spark, broker, admin, app_catalog, tmp_path):
    """Records a broken or foreign writer put on a category topic fail the suite's contract checks,
    the router's input contract (field rules, depth, event-time bound) included."""
    from streamops.quality.ranges import whole_topics
    from streamops.quality.validate import validate_topics

    contacts, groups = (app_catalog.app("oplog-router").outputs[role] for role in ("contacts", "groups"))

    def routed(**over) -> str:
        value = {"event_id": "x/0/1", "category": "contacts", "seq": 1, "user_id": "u1", "op_type": "ADD_CONTACT",
                 "event_time": "2026-01-01T00:00:01.000Z", "event": {"seq": 1}, **over}
        return json.dumps(value)

    produce(broker.client_config, contacts, [
        ("u1", routed()),  # offset 0: good
        ("u1", routed(event_time="+10000-01-01T00:00:00.000Z")),  # 1: year beyond 9999
        ("u1", routed(seq="1")),  # 2: quoted number
        ("u1", routed(user_id=7)),  # 3: number where a string belongs
        ("u1", routed()[:-1] + ', "seq": 2}'),  # 4: duplicate member name
        ("u1", routed() + " {}"),  # 5: a second JSON value
    ], partition=0)
    produce(broker.client_config, groups, [
        ("u1", routed(seq=-1)),  # offset 0
        ("", routed(user_id="")),  # 1
        ("u1", routed(op_type="add_contact")),  # 2
        ("u1", routed(event_time="9999-12-31T23:59:59.999Z")),  # 3
        ("u1", routed(event=json.loads("[" * 65 + "]" * 65))),  # 4: 66 levels with the envelope
        ("u1", routed(event={"note": "[{" * 100})),  # 5: brackets in a string are no levels: good
    ], partition=0)

    outcomes = validate_topics(spark, broker.client_config, admin, app_catalog, whole_topics(admin, [contacts, groups]),
                               "strict", tmp_path)

    def contract_failure(topic):
        (outcome,) = [o for o in outcomes if o.topic == topic]
        (failure,) = [f for f in outcome.failures
                      if f.description.startswith("value contract (generated from the catalog's value_schema)")]
        return failure

    contract = contract_failure(contacts)
    time_rule = "not YYYY-MM-DDTHH:MM:SS.sssZ in years 0001-9999"
    assert contract.unexpected == 5, contract.headline()  # every record but the good one
    assert contract.samples == [  # each naming the rule it breaks
        f'partition 0, offset 1, key "u1", problem "field event_time is \\"+10000-01-01T00:00:00.000Z\\", {time_rule}"',
        'partition 0, offset 2, key "u1", problem "field seq is STRING, not an integer"',
        'partition 0, offset 3, key "u1", problem "field user_id is BIGINT, not a string"',
        'partition 0, offset 4, key "u1", problem "not I-JSON: invalid JSON or a member name twice"',
        'partition 0, offset 5, key "u1", problem "not exactly one JSON value"',
    ], contract.samples
    rules = contract_failure(groups)
    assert rules.unexpected == 5, rules.headline()
    assert rules.samples == [
        'partition 0, offset 0, key "u1", problem "field seq is -1, below the minimum 0 (input contract range)"',
        'partition 0, offset 1, key "", problem "field user_id is \\"\\", empty (input contract length)"',
        'partition 0, offset 2, key "u1", problem "field op_type is \\"add_contact\\", not matching the input contract pattern '
        '[A-Z][A-Z_]*"',
        'partition 0, offset 3, key "u1", problem "field event_time is \\"9999-12-31T23:59:59.999Z\\", more than 5 minutes after '
        "the record's Kafka timestamp (input contract event-time: max_future 5 minutes)\"",
        'partition 0, offset 4, key "u1", problem "nested more than 65 levels deep (input contract depth)"',
    ], rules.samples


def _mutations(seed: int, count: int) -> list[bytes]:
    """Valid records broken in small ways, one byte or token at a time (inserted, removed,
    repeated), with the pieces JSON parsers disagree on: the corpus that compares the JVM pass
    with Spark's checks beyond the hand-written classes above."""
    import random

    rng = random.Random(seed)
    bases = [raw_op(), raw_op(extra=r',"n":{"a":[1,2.5e3,-0,true,null],"s":"\u00e9\ud83d\ude00"}'),
             op(note="[{ \\ \" é").encode(), raw_op(seq="9223372036854775807", extra=',"x":1E400')]
    pieces = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"\\u", b"\\ud800", b"\\udc00", b"0", b"-", b".", b"e",
              b"1.0", b"null", b"\x00", b"\x01", b"\x7f", b"\xff", b"\xed\xa0\x80", b"\xef\xbb\xbf", b" ", b"\n", b"\t",
              b"\xc2\xa0", b"'", b"NaN", b'"seq":2,', b'"user_id":"u1",', b"/*x*/", b"\xf0\x9f\x98\x80"]
    result = []
    for _ in range(count):
        value = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(value) + 1)
            action = rng.random()
            if action < 0.6:
                value[at:at] = rng.choice(pieces)
            elif action < 0.85:
                del value[at:at + rng.randint(1, 4)]
            else:
                value[at:at] = value[at:at + rng.randint(1, 8)]
        result.append(bytes(value))
    return result


def test_the_jvm_pass_decides_every_record_as_sparks_own_checks_do(spark, monkeypatch):
    """The input contract's JVM pass (streamops.contract.StrictJsonFields) is only a faster way to
    the same outcome: over every hostile record above and 3,000 generated ones, the parse with it
    and with Spark's checks alone (STREAMOPS_CONTRACT_JVM=off) give the same error, reason and
    typed fields for every record; and the pass does take the valid records (it is not bypassed)."""
    from datetime import datetime

    from pyspark.sql import functions as F

    from spark_apps.oplog_router import FIELDS
    from streamops.input_contract import InputContract

    now = datetime.now(UTC)
    values = [(k, v) for k, v, _ in INVALID] + [(k.encode(), v.encode()) for k, v in VALID]
    values += [(b"u1", v) for v in _mutations(seed=38, count=3000)]
    # Member names crafted to share one hash in the String parser's name table (Spark's parser
    # refuses more than 150 of them), and a record with many distinct names: the JVM pass, which
    # reads bytes, leaves documents of many names to Spark's checks.
    colliding = ["".join(p) for p in itertools.product(["Ab", "BA"], repeat=9)]
    values += [(b"u1", raw_op(extra=',"x":{' + ",".join(f'"{n}":0' for n in colliding) + "}")),
               (b"u1", raw_op(extra="".join(f',"f{i}":{i}' for i in range(120))))]
    rows = [(key, value, "t", 0, offset, now) for offset, (key, value) in enumerate(values)]
    frame = spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, offset bigint, "
                                        "timestamp timestamp").cache()
    fields = records.with_contract(FIELDS, InputContract())

    def outcome() -> list[tuple]:
        parsed = records.parse(frame, fields, 65536, key_field="user_id", contract=InputContract())
        assert parsed.columns == [*frame.columns, "event_id", "event_json", "seq", "user_id", "op_type", "event_time",
                                  "error"]
        # Times as microseconds: some fields hold years Python's datetime cannot.
        return [tuple(r) for r in parsed.select("offset", "error", "seq", "user_id", "op_type",
                                                F.unix_micros("event_time")).orderBy("offset").collect()]

    with_jvm = outcome()
    monkeypatch.setenv("STREAMOPS_CONTRACT_JVM", "off")
    by_spark = outcome()
    assert len(with_jvm) == len(values)
    assert [a for a, b in zip(with_jvm, by_spark, strict=True) if a != b] == []
    # A program that reads no field: the same outcome on both paths (the JVM pass is not used).
    no_fields = [(r["offset"], r["error"]) for r in records.parse(frame, [], 65536, contract=InputContract()).collect()]
    monkeypatch.delenv("STREAMOPS_CONTRACT_JVM")
    assert [(r["offset"], r["error"]) for r in records.parse(frame, [], 65536, contract=InputContract()).collect()] == no_fields
    assert by_spark[-2][1] is not None and by_spark[-1][1] is None  # Spark refuses the collisions, takes 120 names
    good = sum(1 for r in with_jvm if r[1] is None)
    assert len(VALID) <= good < len(values) - len(INVALID)  # mutations broke most records, not all
    taken = records._strict_json_fields(frame, fields, 64)
    assert taken is not None
    took = frame.select("offset", taken.isNotNull().alias("took")).orderBy("offset").collect()
    first_valid = len(INVALID)
    assert [r["took"] for r in took[first_valid:first_valid + len(VALID)]] == [True] * len(VALID)
    frame.unpersist()
