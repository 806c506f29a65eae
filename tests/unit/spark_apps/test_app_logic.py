"""The presence notifier's per-key state logic, as plain functions (no Spark needed). (Browser
activity's challenge is Spark's own aggregation: tests/test_browser_activity.py.)"""

from __future__ import annotations

import json

from spark_apps.presence_notifier import notify_user

MIN = 60_000
PRESENCE = dict(message="M", horizon_ms=MIN, notifications_topic="n", latest_state_topic="s")


def row(kind, time_ms, action=None, offset=0):
    return {"kind": kind, "time_ms": time_ms, "action": action, "event_id": f"t/0/{offset}", "partition": 0, "offset": offset}


def test_tick_before_any_presence_gives_nothing_and_no_state():
    outputs, history = notify_user("u", [row(1, 5 * MIN)], [], **PRESENCE)
    assert outputs == [] and history == []


def test_tick_uses_the_presence_at_or_before_its_time_even_if_a_later_event_arrived_first():
    rows = [row(0, 10 * MIN, "Open", offset=2), row(1, 5 * MIN, offset=3)]
    history = [(1 * MIN, "Close", "t/0/1")]
    outputs, _ = notify_user("u", rows, history, **PRESENCE)
    notifications = [json.loads(v) for _, v, topic in outputs if topic == "n"]
    assert [(n["cause"], n["presence_event_id"]) for n in notifications] == [("tick", "t/0/1")]


def test_latest_state_is_written_only_when_the_newest_event_changes():
    outputs, _ = notify_user("u", [row(0, 1 * MIN, "Open", offset=1)], [(2 * MIN, "Close", "t/0/0")], **PRESENCE)
    assert [topic for _, _, topic in outputs] == []  # a late Open older than the known Close


def test_history_keeps_the_horizon_plus_the_last_event_before_it():
    history = [(0, "Open", "a"), (1 * MIN, "Close", "b"), (2 * MIN, "Open", "c")]
    _, kept = notify_user("u", [row(0, 5 * MIN, "Close", offset=9)], history, **PRESENCE)
    assert kept == [(2 * MIN, "Open", "c"), (5 * MIN, "Close", "t/0/9")]
