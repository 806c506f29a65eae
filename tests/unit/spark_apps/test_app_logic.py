"""The per-key state logic of the stateful apps, as plain functions (no Spark needed)."""

from __future__ import annotations

import json

from spark_apps.browser_activity import challenge_fingerprint
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


CHALLENGE = dict(captcha_logger="captcha", threshold=5, topic="c")


def action(time_ms, logger="web", offset=0):
    return {"logger_name": logger, "time_ms": time_ms, "event_id": f"t/0/{offset}", "partition": 0, "offset": offset}


def test_challenge_is_written_once_per_new_count_and_not_below_threshold():
    outputs, state = challenge_fingerprint("b", [action(i, offset=i) for i in range(4)], (0, False, 0), **CHALLENGE)
    assert outputs == [] and state == (4, False, 0)
    outputs, state = challenge_fingerprint("b", [action(10, offset=10)], state, **CHALLENGE)
    assert [json.loads(v)["actions"] for _, v, _ in outputs] == [5] and state == (5, False, 5)
    outputs, state = challenge_fingerprint("b", [action(11, logger="other.captcha", offset=11)], state, **CHALLENGE)
    assert [json.loads(v)["actions"] for _, v, _ in outputs] == [6]


def test_verification_retracts_a_challenge_with_a_tombstone_once():
    outputs, state = challenge_fingerprint("b", [action(1, "captcha")], (7, False, 7), **CHALLENGE)
    assert outputs == [("b", None, "c")] and state == (7, True, 0)
    outputs, state = challenge_fingerprint("b", [action(2)], state, **CHALLENGE)
    assert outputs == [] and state == (8, True, 0)
