"""Golden tests of the operation-log router on a real broker and real Spark."""

from __future__ import annotations

import base64
import json

from streamops.driver.queries import observed_totals
from streamops.kafka_records import produce, read_all
from tests.support.apps import run_available_now


def op(seq, user, op_type, second, **extra):
    return json.dumps({"seq": seq, "user_id": user, "op_type": op_type, "event_time": f"2026-01-01T00:00:{second:02d}Z", **extra})


def routed(records):
    """(key, value) pairs of a category topic, in offset order per partition."""
    return [(r.key_text, r.json()) for r in records]


def test_router_routes_by_category_keeps_keys_counts_unknown_and_dead_letters(spark, broker, app_catalog, tmp_path):
    spec = app_catalog.app("oplog-router")
    source = spec.inputs["operations"]
    big = json.dumps({"seq": 8, "user_id": "u3", "op_type": "ADD_CONTACT", "event_time": "2026-01-01T00:00:08Z",
                      "pad": "x" * 70000})
    inputs = [
        ("u1", op(1, "u1", "ADD_CONTACT", 1)),  # offset 0: contacts AND groups
        ("u1", op(2, "u1", "SEND_MESSAGE", 2, to="u2")),  # 1: messages, extra field kept in "event"
        ("u2", op(3, "u2", "CREATE_GROUP", 3)),  # 2: groups
        ("u2", op(4, "u2", "LOGIN", 4)),  # 3: unknown op type: counted and dead-lettered (input contract)
        ("u3", "not json at all"),  # 4: dead letter
        ("u3", json.dumps({"seq": "six", "user_id": "u3", "op_type": "ADD_CONTACT", "event_time": "2026-01-01T00:00:06Z"})),
        ("u3", json.dumps({"user_id": "u3", "op_type": "ADD_CONTACT", "event_time": "2026-01-01T00:00:07Z"})),
        ("u3", big),  # 7: oversized
        ("u3", json.dumps({"seq": 9, "user_id": "u3", "op_type": "ADD_CONTACT", "event_time": "2026-01-01T00:00:09"})),
        ("u3", "[1, 2]"),  # 9: JSON but not an object
        ("u1", op(10, "u1", "BLOCK_CONTACT", 10)),  # 10: contacts, after offset 0 for the same key
    ]
    produce(broker.client_config, source, inputs, partition=0)

    queries = run_available_now(spark, app_catalog, "oplog-router", broker, tmp_path / "ckpt")

    def event(offset, seq, user, op_type, second, category, **extra):
        original = json.loads(op(seq, user, op_type, second, **extra))
        return (
            user,
            {
                "event_id": f"{source}/0/{offset}",
                "category": category,
                "seq": seq,
                "user_id": user,
                "op_type": op_type,
                "event_time": f"2026-01-01T00:00:{second:02d}.000Z",
                "event": original,
            },
        )

    out = spec.outputs
    assert routed(read_all(broker.client_config, out["contacts"])) == [
        event(0, 1, "u1", "ADD_CONTACT", 1, "contacts"),
        event(10, 10, "u1", "BLOCK_CONTACT", 10, "contacts"),
    ]
    assert routed(read_all(broker.client_config, out["messages"])) == [
        event(1, 2, "u1", "SEND_MESSAGE", 2, "messages", to="u2"),
    ]
    # Two users' events land on the partitions their keys choose; compare per key.
    groups = routed(read_all(broker.client_config, out["groups"]))
    assert sorted(groups, key=lambda kv: kv[1]["seq"]) == [
        event(0, 1, "u1", "ADD_CONTACT", 1, "groups"),
        event(2, 3, "u2", "CREATE_GROUP", 3, "groups"),
    ]

    dead = read_all(broker.client_config, spec.dead_letter_topic)
    envelopes = [r.json() for r in dead]
    assert [(r.key_text, e["reason"], e["source"]["offset"]) for r, e in zip(dead, envelopes, strict=True)] == [
        ("u2", "op type 'LOGIN' is in no category (contacts, groups, messages) of the catalog's settings.categories "
               "(router contract: every op type is routed or refused)", 3),
        ("u3", "value is not valid JSON (input contract json: RFC 8259)", 4),
        ("u3", "field 'seq' must be an integer, got STRING (input contract field-type)", 5),
        ("u3", "missing field 'seq' (input contract field-present)", 6),
        ("u3", f"record is {len(big)} bytes, over the 65536-byte limit (input contract size)", 7),
        ("u3", "field 'event_time' has no timezone offset: '2026-01-01T00:00:09' (input contract timestamp)", 8),
        ("u3", "value is not a JSON object (input contract object)", 9),
    ]
    first = envelopes[1]
    assert first["app"] == "oplog-router" and first["app_version"] == "1.0.0"
    assert first["source"]["topic"] == source and first["source"]["partition"] == 0
    assert base64.b64decode(first["original_value_base64"]) == b"not json at all"
    assert base64.b64decode(first["original_key_base64"]) == b"u3"
    assert first["original_value_preview"] == "not json at all"
    assert base64.b64decode(envelopes[4]["original_value_base64"]).decode() == big

    assert observed_totals(queries) == {"records_in": 11, "dead_letters": 7, "unknown_op_type": 1}
    # The topic is read once, not once per output branch.
    assert sum(p.numInputRows for q in queries for p in q.recentProgress) == 11
