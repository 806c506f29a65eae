"""The state page without Spark: the child process's argv (values never become options or code),
what is refused and to whom, and that nothing a state row holds becomes markup."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streamops.state_page import render_state, state_command
from streamops.state_query import MAX_ROWS, SHOWN_ITEMS, StateRefused, StateRequest, _json_row

HOSTILE = "</pre><script>alert(1)</script>"


def test_the_read_runs_this_interpreter_with_each_value_one_argument_glued_to_its_option():
    argv = state_command("presence-notifier", StateRequest(key="--checkpoint=/etc; rm -rf /", query="notify", limit=5),
                         Path("/tmp/a.json"))
    assert argv == [sys.executable, "-m", "streamops.cli", "app", "state", "presence-notifier", "--json-out=/tmp/a.json",
                    "--limit=5", "--key=--checkpoint=/etc; rm -rf /", "--query=notify"]
    assert "--key" not in state_command("browser-activity", StateRequest(), Path("/tmp/b.json"))[6:][-1]


def test_a_request_names_each_bad_field():
    with pytest.raises(StateRefused) as refused:
        StateRequest.from_form({"limit": str(MAX_ROWS + 1), "query": "../etc", "key": ""})
    text = str(refused.value)
    assert text.startswith("the state was not read:")
    assert f"limit: Input should be less than or equal to {MAX_ROWS}" in text and "query: String should match pattern" in text
    assert StateRequest.from_form({"key": "", "query": "", "limit": "7"}) == StateRequest(limit=7)  # empty fields absent
    with pytest.raises(StateRefused, match="key: String should match pattern"):
        StateRequest.from_form({"key": "u1\x00--checkpoint=/"})  # a NUL would not even reach the child's argv


def test_rows_never_become_markup():
    answer = {"stores": [{"query": "notify", "operator_id": 0, "operator": "flatMapGroupsWithState", "store": "default",
                          "partitions": 2, "batch_id": 7, "batch_time": "2026-12-04T01:00:00.000Z", "watermark": None,
                          "rows": [{"key": {"value": HOSTILE}, "value": {"history": [HOSTILE]}}], "more": True}],
              "notes": [HOSTILE]}
    page = render_state(HOSTILE, {"key": HOSTILE}, answer, HOSTILE)
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "as of batch 7 (2026-12-04T01:00:00.000Z); 1 row(s) (more match: filter by key or raise the limit)" in page


def test_state_values_become_json_with_times_bytes_and_long_values_readable():
    from datetime import UTC, datetime

    row = {"key": {"window": {"start": datetime(2026, 1, 1, 14, 11, 50, tzinfo=UTC)}}, "blob": b"\x00\xff",
           "long": "x" * 2500, "n": float("nan")}
    shown = _json_row(row)
    assert shown["key"]["window"]["start"] == "2026-01-01T14:11:50.000Z" and shown["blob"] == "00ff"
    assert shown["long"].endswith("… (2,500 characters)") and shown["n"] == "nan"
    # A long history is cut with its count; a map keyed by times stays JSON.
    history = _json_row({"history": list(range(SHOWN_ITEMS + 5)), "by_time": {datetime(2026, 1, 1, tzinfo=UTC): 1}})
    assert history["history"][-1] == f"… 5 more ({SHOWN_ITEMS + 5:,} in all)" and len(history["history"]) == SHOWN_ITEMS + 1
    assert history["by_time"] == {'"2026-01-01T00:00:00.000Z"': 1}
