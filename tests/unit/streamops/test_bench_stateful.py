"""The stateful bench's oracles: Spark's sliding windows recomputed, the last update per window,
and each record's batch commit found from a checkpoint's offset and commit logs."""

from __future__ import annotations

import json
import os
from collections import Counter

from streamops.bench_report import highest_sustained
from streamops.bench_stateful import commit_times, emitted_counts, lag_growth, window_counts_of, wrong_windows
from streamops.kafka_records import Record


def test_an_event_counts_in_every_sliding_window_that_holds_it():
    # 5-second windows every 2 seconds: t = 12.5 s is in [8, 13), [10, 15), [12, 17); t = 10 s in [6, 11), [8, 13), [10, 15).
    counts = window_counts_of([("b1", 12_500), ("b1", 10_000), ("b2", 0)], window_ms=5_000, slide_ms=2_000)
    assert counts == Counter({("b1", 8_000): 2, ("b1", 10_000): 2, ("b1", 12_000): 1, ("b1", 6_000): 1,
                              ("b2", 0): 1, ("b2", -2_000): 1, ("b2", -4_000): 1})
    # Tumbling (window = slide): one window each.
    assert window_counts_of([("u", 59_999), ("u", 60_000)], 60_000, 60_000) == Counter({("u", 0): 1, ("u", 60_000): 1})


def _count(partition: int, offset: int, key: str, start: str, count: int) -> Record:
    value = {"fingerprint": key, "window_start": start, "window_end": "-", "count": count}
    return Record("counts", partition, offset, key.encode(), json.dumps(value).encode(), 0)


def test_the_last_update_of_a_window_is_its_count_and_every_difference_is_named():
    got = emitted_counts([_count(0, 0, "b1", "1970-01-01T00:00:08.000Z", 1), _count(0, 1, "b1", "1970-01-01T00:00:08.000Z", 2),
                          _count(1, 0, "b2", "1970-01-01T00:00:00.000Z", 1)], "fingerprint")
    assert got == Counter({("b1", 8_000): 2, ("b2", 0): 1})
    expected = Counter({("b1", 8_000): 2, ("b2", 0): 3, ("b3", 2_000): 1})
    compared, wrong, examples = wrong_windows(expected, got)
    assert (compared, wrong) == (3, 2)
    assert examples == ["b2 @ 0: expected 3, got 1", "b3 @ 2000: expected 1, got 0"]


def _batch(query, batch: int, ends: dict, committed_at: float) -> None:
    (query / "offsets").mkdir(parents=True, exist_ok=True)
    (query / "commits").mkdir(exist_ok=True)
    (query / "offsets" / str(batch)).write_text("v1\n{}\n" + json.dumps({"in": {str(p): o for p, o in ends.items()}}) + "\n")
    commit = query / "commits" / str(batch)
    commit.write_text("v1\n{}\n")
    os.utime(commit, (committed_at, committed_at))


def test_each_record_waits_until_the_commit_of_the_batch_that_read_it(tmp_path):
    query = tmp_path / "notify"
    _batch(query, 0, {0: 2, 1: 0}, committed_at=100.0)  # offsets 0-1 of partition 0
    _batch(query, 1, {0: 5, 1: 3}, committed_at=102.5)  # 2-4 of partition 0, 0-2 of partition 1
    records = [Record("in", 0, 1, None, b"{}", 99_000), Record("in", 0, 2, None, b"{}", 101_000),
               Record("in", 1, 2, None, b"{}", 102_000),
               Record("in", 1, 3, None, b"{}", 102_400)]  # read by no committed batch yet: left out
    assert commit_times(query, records) == [(99_000.0, 100_000.0), (101_000.0, 102_500.0), (102_000.0, 102_500.0)]


def test_a_lag_that_grows_is_told_from_one_that_comes_round():
    # One record a second. Keeping pace: each committed 2 s after it was written.
    steady = [(t * 1000.0, t * 1000.0 + 2000) for t in range(20)]
    assert lag_growth(steady) == (2, 2)
    # Falling behind: the n-th record committed n/2 s late, more each second.
    behind = [(t * 1000.0, t * 1000.0 + 500.0 * t) for t in range(20)]
    first, second = lag_growth(behind)
    assert second > first + 1


def test_the_highest_rate_counts_only_sustained_runs_with_every_window_exact():
    rows = [{"app": "a", "target_rate": 1_000, "sustained": True, "windows_wrong": 0},
            {"app": "a", "target_rate": 2_500, "sustained": True, "windows_wrong": 1},
            {"app": "b", "target_rate": 1_000, "sustained": False, "windows_wrong": 0}]
    assert highest_sustained(rows) == {"a": 1_000, "b": None}


def test_the_report_refuses_a_stateful_app_it_does_not_measure_and_names_those_it_does():
    from typer.testing import CliRunner

    from streamops.cli import app

    result = CliRunner().invoke(app, ["bench", "report", "--parts", "stateful", "--stateful-apps", "browser-activity,acme"])
    assert result.exit_code == 2
    assert "--stateful-apps 'browser-activity,acme': acme; choose from presence-notifier, browser-activity" in " ".join(
        result.output.replace("│", " ").split())
