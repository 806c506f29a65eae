"""Golden tests of the presence notifier on a real broker and real Spark."""

from __future__ import annotations

import json
import random

from spark_apps.presence_notifier import notify_user
from streamops.driver.queries import observed_totals
from streamops.kafka_records import produce, read_all
from tests.support.apps import run_available_now

MESSAGE = "You are not currently viewing Facebook."
FAR_FUTURE, FAR_PAST = "9999-12-31T23:59:59.999Z", "0001-01-01T00:00:00Z"


def presence(seq, user, action, hms):
    return user, json.dumps({"seq": seq, "user_id": user, "action": action, "event_time": f"2026-01-01T{hms}Z"})


def tick(seq, user, hms):
    return user, json.dumps({"seq": seq, "user_id": user, "event_time": f"2026-01-01T{hms}Z"})


def notification(user, cause, hms, source, presence_id):
    return {
        "notification_id": source,
        "user_id": user,
        "message": MESSAGE,
        "cause": cause,
        "event_time": f"2026-01-01T{hms}.000Z",
        "source_event_id": source,
        "presence_event_id": presence_id,
    }


def values(broker, topic):
    return [r.json() for r in read_all(broker.client_config, topic)]


def test_close_events_ticks_while_closed_latest_state_and_hopping_counts(spark, broker, app_catalog, tmp_path):
    spec = app_catalog.app("presence-notifier")
    events_topic, ticks_topic = spec.inputs["events"], spec.inputs["ticks"]
    produce(
        broker.client_config,
        events_topic,
        [
            presence(1, "u1", "Open", "00:00:00"),  # offset 0
            presence(2, "u1", "Close", "00:01:00"),  # 1: notification (close)
            presence(3, "u2", "Close", "00:02:30"),  # 2: notification (close)
            presence(4, "u1", "Open", "00:03:00"),  # 3
            ("u1", json.dumps({"seq": 5, "user_id": "u1", "action": "Away", "event_time": "2026-01-01T00:03:30Z"})),
            # Outside the input contract: dead letters. Let through, the far-future Close would be
            # u1's latest state for ever and move the count windows' watermark to the year 9999.
            ("u1", json.dumps({"seq": 6, "user_id": "u1", "action": "Close", "event_time": FAR_FUTURE})),  # 5
            ("u2", json.dumps({"seq": 7, "user_id": "u2", "action": "Close", "event_time": FAR_PAST})),  # 6
            ("u1", json.dumps({"seq": -5, "user_id": "u1", "action": "Open", "event_time": "2026-01-01T00:03:40Z"})),  # 7
            ("", json.dumps({"seq": 9, "user_id": "", "action": "Close", "event_time": "2026-01-01T00:03:50Z"})),  # 8
        ],
        partition=0,
    )
    produce(
        broker.client_config,
        ticks_topic,
        [
            tick(1, "u3", "00:00:30"),  # offset 0: u3 has no presence state: nothing
            tick(2, "u1", "00:00:30"),  # 1: latest at or before is Open: nothing
            tick(3, "u1", "00:01:00"),  # 2: the Close at exactly this time counts: notification
            tick(4, "u1", "00:02:00"),  # 3: still closed: notification
            tick(5, "u1", "00:04:00"),  # 4: Open since 00:03: nothing
            tick(6, "u2", "00:02:00"),  # 5: u2's Close is later (00:02:30): nothing
            tick(7, "u2", "00:05:00"),  # 6: closed: notification
            ("u2", "garbage"),  # 7: dead letter
            ("u2", json.dumps({"seq": 8, "user_id": "u2", "event_time": FAR_FUTURE})),  # 8
        ],
        partition=0,
    )

    queries = run_available_now(spark, app_catalog, "presence-notifier", broker, tmp_path / "ckpt")

    e, t = f"{events_topic}/0", f"{ticks_topic}/0"
    got = sorted(values(broker, spec.outputs["notifications"]), key=lambda n: (n["user_id"], n["event_time"], n["cause"]))
    assert got == [
        notification("u1", "close", "00:01:00", f"{e}/1", f"{e}/1"),
        notification("u1", "tick", "00:01:00", f"{t}/2", f"{e}/1"),
        notification("u1", "tick", "00:02:00", f"{t}/3", f"{e}/1"),
        notification("u2", "close", "00:02:30", f"{e}/2", f"{e}/2"),
        notification("u2", "tick", "00:05:00", f"{t}/6", f"{e}/2"),
    ]

    latest = read_all(broker.client_config, spec.outputs["latest_state"])
    assert sorted((r.key_text, r.json()) for r in latest) == [
        ("u1", {"user_id": "u1", "action": "Open", "event_time": "2026-01-01T00:03:00.000Z", "event_id": f"{e}/3"}),
        ("u2", {"user_id": "u2", "action": "Close", "event_time": "2026-01-01T00:02:30.000Z", "event_id": f"{e}/2"}),
    ]

    def window(user, start, end, count):
        return {"user_id": user, "window_start": f"{start}.000Z", "window_end": f"{end}.000Z", "count": count}

    dec31, jan1 = "2025-12-31T23", "2026-01-01T00"
    counts = sorted(values(broker, spec.outputs["notification_counts"]), key=lambda c: (c["user_id"], c["window_start"]))
    assert counts == [
        # u1: two notifications at 00:01:00 and one at 00:02:00; 10-minute windows every minute.
        window("u1", f"{dec31}:52:00", f"{jan1}:02:00", 2),
        window("u1", f"{dec31}:53:00", f"{jan1}:03:00", 3),
        window("u1", f"{dec31}:54:00", f"{jan1}:04:00", 3),
        window("u1", f"{dec31}:55:00", f"{jan1}:05:00", 3),
        window("u1", f"{dec31}:56:00", f"{jan1}:06:00", 3),
        window("u1", f"{dec31}:57:00", f"{jan1}:07:00", 3),
        window("u1", f"{dec31}:58:00", f"{jan1}:08:00", 3),
        window("u1", f"{dec31}:59:00", f"{jan1}:09:00", 3),
        window("u1", f"{jan1}:00:00", f"{jan1}:10:00", 3),
        window("u1", f"{jan1}:01:00", f"{jan1}:11:00", 3),
        window("u1", f"{jan1}:02:00", f"{jan1}:12:00", 1),
        # u2: notifications at 00:02:30 and 00:05:00.
        window("u2", f"{dec31}:53:00", f"{jan1}:03:00", 1),
        window("u2", f"{dec31}:54:00", f"{jan1}:04:00", 1),
        window("u2", f"{dec31}:55:00", f"{jan1}:05:00", 1),
        window("u2", f"{dec31}:56:00", f"{jan1}:06:00", 2),
        window("u2", f"{dec31}:57:00", f"{jan1}:07:00", 2),
        window("u2", f"{dec31}:58:00", f"{jan1}:08:00", 2),
        window("u2", f"{dec31}:59:00", f"{jan1}:09:00", 2),
        window("u2", f"{jan1}:00:00", f"{jan1}:10:00", 2),
        window("u2", f"{jan1}:01:00", f"{jan1}:11:00", 2),
        window("u2", f"{jan1}:02:00", f"{jan1}:12:00", 2),
        window("u2", f"{jan1}:03:00", f"{jan1}:13:00", 1),
        window("u2", f"{jan1}:04:00", f"{jan1}:14:00", 1),
        window("u2", f"{jan1}:05:00", f"{jan1}:15:00", 1),
    ]

    # A notification delivered twice (a task retried after a lost executor writes its records
    # again) counts once: the count query drops the copy by its notification_id.
    (written,) = [r for r in read_all(broker.client_config, spec.outputs["notifications"])
                  if r.json()["source_event_id"] == f"{t}/6"]
    produce(broker.client_config, spec.outputs["notifications"], [(written.key, written.value)], partition=written.partition)
    emitted = len(read_all(broker.client_config, spec.outputs["notification_counts"]))
    again = run_available_now(spark, app_catalog, "presence-notifier", broker, tmp_path / "ckpt")
    assert {q.name: sum(p.numInputRows for p in q.recentProgress) for q in again}["presence-notifier.count"] == 1
    assert len(read_all(broker.client_config, spec.outputs["notification_counts"])) == emitted  # no window changed

    dead = [r.json() for r in read_all(broker.client_config, spec.dead_letter_topic)]
    kafka_time = {(d["source"]["topic"], d["source"]["offset"]): d["source"]["timestamp"] for d in dead}

    def too_far_ahead(topic, offset):
        return (f"field 'event_time' '{FAR_FUTURE}' is more than 30 seconds after the record's Kafka timestamp "
                f"{kafka_time[topic, offset]} (input contract event-time: max_future 30 seconds)")

    assert sorted((d["source"]["topic"], d["source"]["offset"], d["reason"]) for d in dead) == [
        (events_topic, 4, "field 'action' must be one of Open, Close, got 'Away' (input contract allowed-value)"),
        (events_topic, 5, too_far_ahead(events_topic, 5)),
        (events_topic, 6, f"field 'event_time' '{FAR_PAST}' is more than 3650 days before the record's Kafka timestamp "
                          f"{kafka_time[events_topic, 6]} (input contract event-time: max_past 3650 days)"),
        (events_topic, 7, "field 'seq' is -5, below the minimum 0 (input contract range)"),
        (events_topic, 8, "field 'user_id' must not be empty, got '' (0 characters) (input contract length)"),
        (ticks_topic, 7, "value is not valid JSON (input contract json: RFC 8259)"),
        (ticks_topic, 8, too_far_ahead(ticks_topic, 8)),
    ]
    assert observed_totals(queries) == {"records_in": 18, "dead_letters": 7}
    # The notify query unions the notices with both inputs' dead letters: each record read once.
    assert {q.name: sum(p.numInputRows for p in q.recentProgress) for q in queries}["presence-notifier.notify"] == 18


def test_presence_state_survives_a_restart_from_the_checkpoint(spark, broker, app_catalog, tmp_path):
    spec = app_catalog.app("presence-notifier")
    checkpoint = tmp_path / "ckpt"
    produce(broker.client_config, spec.inputs["events"], [presence(1, "u9", "Close", "00:10:00")], partition=0)
    run_available_now(spark, app_catalog, "presence-notifier", broker, checkpoint)
    assert [n["cause"] for n in values(broker, spec.outputs["notifications"])] == ["close"]

    # A new run from the same checkpoint: the tick only notifies if u9's Close came back from state.
    produce(broker.client_config, spec.inputs["ticks"], [tick(1, "u9", "00:11:00")], partition=0)
    run_available_now(spark, app_catalog, "presence-notifier", broker, checkpoint)

    got = sorted(values(broker, spec.outputs["notifications"]), key=lambda n: n["event_time"])
    events0 = f"{spec.inputs['events']}/0/0"
    # The state lives in RocksDB with changelog checkpointing, not in the default HDFS-backed store.
    assert list((checkpoint / "notify" / "state").rglob("*.changelog"))
    assert got == [
        notification("u9", "close", "00:10:00", events0, events0),
        notification("u9", "tick", "00:11:00", f"{spec.inputs['ticks']}/0/0", events0),
    ]


def test_the_jvm_step_follows_the_python_reference_on_generated_input(spark):
    """streamops.apps.PresenceNotify (what the notify query runs) against notify_user, its reference
    rule for rule: per generated user, several batches with the history carried over; equal event
    times, ticks before any presence, late presence events, pruning by the horizon, text to escape."""
    jvm_step = spark._jvm.streamops.apps.PresenceNotify.stepJson
    rng = random.Random(38)
    settings = dict(message="Ne regardez pas \"Facebook\"\n\u00e9\u2603 \U0001F600", notifications_topic="n",
                    latest_state_topic="s")
    steps = notifications = pruned = 0
    for user_number in range(80):
        user = rng.choice(["u", "\u00fc\u0161er", "a\"b\\c", "tab\tuser"]) + str(user_number)
        horizon_ms = rng.choice([0, 30_000, 60_000, 180_000])
        history: list[tuple[int, str, str]] = []
        offset = 0
        for _batch in range(rng.randint(1, 5)):
            rows = []
            for _ in range(rng.randint(0, 9)):
                kind = rng.randint(0, 1)
                partition = rng.randint(0, 1)
                offset += 1
                rows.append({"kind": kind, "time_ms": rng.randrange(0, 600_000, 15_000),
                             "action": rng.choice(["Open", "Close"]) if kind == 0 else None,
                             "event_id": f"{'events' if kind == 0 else 'ticks'}/{partition}/{offset}",
                             "partition": partition, "offset": offset})
            want_out, want_history = notify_user(user, rows, history, horizon_ms=horizon_ms, **settings)
            rows_json = json.dumps([[r["kind"], r["time_ms"], r["action"], r["event_id"], r["partition"], r["offset"]]
                                    for r in rows])
            got = json.loads(jvm_step(user, rows_json, json.dumps(history), settings["message"], horizon_ms,
                                      settings["notifications_topic"], settings["latest_state_topic"]))
            assert [(k, json.loads(v), t) for k, v, t in got["outputs"]] == [
                (k, json.loads(v), t) for k, v, t in want_out], (user, rows, history)
            assert [tuple(e) for e in got["history"]] == want_history, (user, rows, history)
            steps += 1
            notifications += sum(t == "n" for _, _, t in want_out)
            pruned += len(history) + sum(r["kind"] == 0 for r in rows) > len(want_history)
            history = want_history
    # The generated input reached every rule, not only the easy ones.
    assert steps > 150 and notifications > 100 and pruned > 20, (steps, notifications, pruned)
