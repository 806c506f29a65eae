"""A dead letter always fits (issue 13, point 2), on a real broker and real Spark.

A record the broker accepted but the app refuses, however large its value or key, becomes one
dead letter no larger than the sink's request limit: the original inline (base64) when it fits,
else by reference (source coordinates, size, sha256) with the reason saying so. The app runs on.
A replay reads a by-reference original back from its source topic (digest checked) and refuses
it, naming why, once retention has deleted it.
"""

from __future__ import annotations

import base64
import hashlib
import json

from confluent_kafka import TopicPartition

from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import produce, read_all
from tests.support.apps import run_available_now

LIMIT = 65536  # the catalog's max_record_bytes of oplog-router
BUDGET = 1_048_576 - 16 * 1024  # producer max.request.size - the envelope's reserve
KEY_RULE = "(input contract key: the catalog keys this input by field 'user_id')"


def op(seq: int, user: str, note: str = "") -> bytes:
    return json.dumps({"seq": seq, "user_id": user, "op_type": "SEND_MESSAGE", "event_time": "2026-11-23T03:00:00Z",
                       "note": note}).encode()


def reference_note(what: str) -> str:
    return (f"; the original {what} is stored by reference, not inline: over the {BUDGET}-byte dead-letter limit "
            "(read it from the source topic/partition/offset; sizes and sha256 are in this envelope)")


def test_oversized_records_become_dead_letters_that_fit_and_replay_reads_them_back(spark, broker, admin, app_catalog, tmp_path):
    from streamops.recovery.replay import ReplayRequest, apply_replay, plan_replay

    spec = app_catalog.app("oplog-router")
    source, kafka = spec.inputs["operations"], broker.client_config
    huge = op(2, "u1", "h" * 900_000)  # base64 would be 1.2 MB: kept by reference
    big = op(3, "u1", "b" * 700_000)  # base64 933 KB: still fits inline
    long_key = b"k" * 200_000  # over an eighth of the budget: kept by reference
    produce(kafka, source, [
        (b"u1", op(1, "u1")), (b"u1", huge), (b"u1", big), (long_key, op(4, "u4")), (b"u5", op(5, "u5")),
    ], partition=0)
    gone = op(6, "u6", "g" * 900_000)
    produce(kafka, source, [(b"u6", gone)], partition=1)

    run_available_now(spark, app_catalog, "oplog-router", broker, tmp_path / "ckpt")  # no RecordTooLargeException

    letters = read_all(kafka, spec.dead_letter_topic)
    for letter in letters:
        assert len(letter.key or b"") + len(letter.value) <= BUDGET, "a dead letter over the sink's request limit"
    by_offset = {(e["source"]["partition"], e["source"]["offset"]): (letter, e)
                 for letter, e in ((r, r.json()) for r in letters)}
    assert sorted(by_offset) == [(0, 1), (0, 2), (0, 3), (1, 0)]

    letter, envelope = by_offset[(0, 1)]
    assert envelope["reason"] == (f"record is {len(huge)} bytes, over the {LIMIT}-byte limit (input contract size)"
                                  + reference_note(f"value ({len(huge)} bytes)"))
    assert "original_value_base64" not in envelope and envelope["original_value_stored"] == "reference"
    assert envelope["original_value_bytes"] == len(huge)
    assert envelope["original_value_sha256"] == hashlib.sha256(huge).hexdigest()
    assert envelope["original_value_preview"] == huge.decode()[:512]
    assert letter.key == b"u1" and base64.b64decode(envelope["original_key_base64"], validate=True) == b"u1"

    letter, envelope = by_offset[(0, 2)]
    assert envelope["reason"] == f"record is {len(big)} bytes, over the {LIMIT}-byte limit (input contract size)"
    assert envelope["original_value_stored"] == "inline"
    assert base64.b64decode(envelope["original_value_base64"], validate=True) == big

    letter, envelope = by_offset[(0, 3)]
    shown_key = "k" * 97 + "..."
    assert envelope["reason"] == (f"key '{shown_key}' does not equal field 'user_id' 'u4' {KEY_RULE}"
                                  + reference_note(f"key ({len(long_key)} bytes)"))
    assert letter.key is None and "original_key_base64" not in envelope
    assert (envelope["original_key_stored"], envelope["original_key_bytes"]) == ("reference", len(long_key))
    assert envelope["original_key_sha256"] == hashlib.sha256(long_key).hexdigest()
    assert base64.b64decode(envelope["original_value_base64"], validate=True) == op(4, "u4")

    routed = {r.json()["seq"] for t in spec.outputs.values() for r in read_all(kafka, t)}
    assert routed == {1, 5}, "the records around the oversized ones are routed"

    # Retention deletes the source of one by-reference dead letter: that one cannot come back.
    (deleted,) = admin.delete_records([TopicPartition(source, 1, 1)]).values()
    deleted.result(timeout=30)
    assert end_offsets(kafka, source)[1] == (1, 1)

    # The limit is raised: the oversized records pass now and are replayed, the by-reference one
    # read back from its source record (digest checked), byte for byte.
    raised = app_catalog.model_copy(update={"apps": [
        a.model_copy(update={"max_record_bytes": 1_000_000}) if a.name == "oplog-router" else a for a in app_catalog.apps]})
    request = ReplayRequest(app="oplog-router", reason_contains="byte limit")
    plan = plan_replay(spark, admin, kafka, raised, request)
    assert plan.totals["replay"] == 2 and plan.totals["other"] == 1, plan.table()
    verdicts = {r["reason"][:40]: r for r in plan.by_reason}
    assert len(verdicts) == 3
    before = {p: hi for p, (_, hi) in end_offsets(kafka, source).items()}
    applied = apply_replay(spark, kafka, raised, plan, "manual__test")
    assert applied["count"] == 2
    replayed = [r for p, hi in before.items() for r in read_all(kafka, source) if r.partition == p and r.offset >= hi]
    assert sorted(r.value for r in replayed) == sorted([huge, big])

    from streamops.recovery.replay import evaluate

    (refused,) = [d for d in evaluate(spark, kafka, raised.app("oplog-router"), plan.spans, "byte limit")
                  if d.source == f"{source}/1/0"]
    assert refused.verdict == (f"not replayable: its original is kept by reference and {source}/1/0 is no longer on the "
                               f"broker (retention; {source} partition 1: it is empty (next offset 1))")


def test_outputs_and_dead_letters_come_from_one_read_of_each_record(spark):
    """records.with_dead_letters: a good record writes its outputs (none, one or several), a bad
    one its dead letter, from one read of the source; the union of two branches reads it twice,
    which the driver's check names."""
    import pytest
    from pyspark.sql import functions as F

    from spark_apps.oplog_router import FIELDS
    from streamops import records
    from streamops.catalog import load_catalog
    from streamops.driver.outputs import sources_read_more_than_once
    from streamops.program_contract import OutputQuery

    spec = load_catalog(check_programs=False).app("oplog-router")
    source = spec.inputs["operations"]
    rows = [(b"u1", op(1, "u1")), (b"u2", op(2, "u2")), (b"u3", b"not json"), (b"u4", op(4, "u5"))]
    raw = spark.createDataFrame(
        [(key, value, source, 0, offset, None) for offset, (key, value) in enumerate(rows)],
        "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp",
    ).withColumn("timestamp", F.current_timestamp())
    parsed = records.parse_input(raw, spec, "operations", FIELDS)

    def one(topic: str):
        return F.struct(F.col("key").alias("key"), F.format_string("%s:%d", F.lit(topic), F.col("seq")).alias("value"),
                        F.lit(topic).alias("topic"))

    # An even seq writes two records, an odd seq none.
    outputs = F.when(F.col("seq") % 2 == 0, F.array(one("even.a"), one("even.b"))).otherwise(F.array().cast(
        "array<struct<key:binary,value:string,topic:string>>"))
    frame = records.with_dead_letters(parsed, spec, "1.0.0", outputs)
    written = sorted((r.topic, (r.key or b"").decode(), r.value) for r in frame.collect())
    good = [(t, k, v.decode()) for t, k, v in written if t != spec.dead_letter_topic]
    assert good == [("even.a", "u2", "even.a:2"), ("even.b", "u2", "even.b:2")]
    dead = {json.loads(v)["source"]["offset"]: json.loads(v)["reason"] for t, _, v in written if t == spec.dead_letter_topic}
    assert sorted(dead) == [2, 3]
    assert dead[2] == "value is not valid JSON (input contract json: RFC 8259)"
    assert dead[3] == f"key 'u4' does not equal field 'user_id' 'u5' {KEY_RULE}"
    assert sources_read_more_than_once(OutputQuery("tag", frame)) == {}

    # One output struct per good record works too; the union form reads the source twice.
    single = records.with_dead_letters(parsed, spec, "1.0.0", one("all"))
    assert sorted(r.value.decode() for r in single.collect() if r.topic == "all") == ["all:1", "all:2"]
    union = records.good(parsed).select(one("all").alias("o")).select("o.*").unionByName(
        records.dead_letters(parsed, spec, "1.0.0"), allowMissingColumns=True)
    assert list(sources_read_more_than_once(OutputQuery("tag", union)).values()) == [2]
    # The same union over a shared parse (what the driver builds for such a query, e.g. a stateful
    # operator's outputs with their dead letters): the same records, Spark reads the source once.
    with records.shared_parses():
        shared = records.parse_input(raw, spec, "operations", FIELDS)
    shared_union = records.good(shared).select(one("all").alias("o")).select("o.*").unionByName(
        records.dead_letters(shared, spec, "1.0.0"), allowMissingColumns=True)
    assert sources_read_more_than_once(OutputQuery("tag", shared_union)) == {}
    # The same columns in the same order; event_json (made above the exchange, read only by a
    # program that wants it) the same VARIANT.
    assert shared.columns == parsed.columns
    assert [r.event_json.toJson() for r in shared.where("offset = 1").collect()] == [
        r.event_json.toJson() for r in parsed.where("offset = 1").collect()]

    def timeless(rows):  # the dead letters' failed_at and the source's Kafka time are the collect's clock
        def value(row):
            if row.topic != spec.dead_letter_topic:
                return row.value
            letter = json.loads(row.value)
            del letter["failed_at"], letter["source"]["timestamp"]
            return json.dumps(letter)
        return sorted((r.topic, r.key, value(r)) for r in rows)

    assert timeless(shared_union.collect()) == timeless(union.collect())
    assert "ReusedExchange" in shared_union._jdf.queryExecution().executedPlan().toString()
    # Two parses of one source are two reads even when shared: the check (and the driver's warning) still names them.
    with records.shared_parses():
        parsed_twice = records.good(records.parse_input(raw, spec, "operations", FIELDS)).select(
            one("all").alias("o")).select("o.*").unionByName(
            records.dead_letters(records.parse_input(raw, spec, "operations", FIELDS), spec, "1.0.0"),
            allowMissingColumns=True)
    assert list(sources_read_more_than_once(OutputQuery("tag", parsed_twice)).values()) == [2]

    with pytest.raises(TypeError, match=r"oplog-router: records.with_dead_letters takes a struct \(key, value, topic\) or an "
                                        r"array of them as the outputs of a good record, not string"):
        records.with_dead_letters(parsed, spec, "1.0.0", F.col("op_type"))
    with pytest.raises(TypeError, match="have no topic field"):
        records.with_dead_letters(parsed, spec, "1.0.0", F.struct(F.col("key"), F.col("value")))
