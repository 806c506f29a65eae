"""streamops.recovery.skip without a broker: the records an operator names, the note, the reason
written into each dead letter, and the entries handed over between tasks. On a broker and a
driver: tests/test_skip_records.py."""

from __future__ import annotations

import pytest

from streamops.catalog import load_catalog
from streamops.kafka_offsets import MAX_OFFSET, MAX_PARTITION
from streamops.recovery.skip import MAX_RECORDS, MAX_SPECS, SkipSpec, entry_problems, note_problem, parse_specs, skip_reason

ROUTER = load_catalog(check_programs=False).app("oplog-router")


def parsed(items):
    problems: list[str] = []
    return parse_specs(items, problems), problems


def test_a_record_or_a_range_of_records_is_named_whole():
    specs, problems = parsed(["oplog.operations:3:1207", "oplog.operations:1:5-7"])
    assert problems == []
    assert specs == [SkipSpec("oplog.operations:3:1207", "oplog.operations", 3, 1207, 1207),
                     SkipSpec("oplog.operations:1:5-7", "oplog.operations", 1, 5, 7)]
    assert [s.count for s in specs] == [1, 3]


def test_every_bad_item_is_named_with_what_it_should_be():
    specs, problems = parsed(["ops:1", "ops:1:9-3", f"ops:{MAX_PARTITION + 1}:0", f"ops:0:{MAX_OFFSET + 1}", 7,
                              "ops:0:1-5", "ops:0:5"])
    assert [s.text for s in specs] == ["ops:0:1-5", "ops:0:5"]
    assert problems == [
        "record 'ops:1' is not 'topic:partition:offset' or 'topic:partition:first-last' "
        "(e.g. 'oplog.operations:3:1200' or 'oplog.operations:3:1200-1210')",
        "record 'ops:1:9-3': the range ends before it starts (9-3)",
        f"record 'ops:{MAX_PARTITION + 1}:0': partition {MAX_PARTITION + 1} is out of range (at most {MAX_PARTITION})",
        f"record 'ops:0:{MAX_OFFSET + 1}': offset {MAX_OFFSET + 1} is out of range (Kafka offsets are at most {MAX_OFFSET})",
        "record 7 is not 'topic:partition:offset' or 'topic:partition:first-last' "
        "(e.g. 'oplog.operations:3:1200' or 'oplog.operations:3:1200-1210')",
        "records 'ops:0:1-5' and 'ops:0:5' overlap: name each record once",
    ]


def test_a_skip_is_bounded_more_is_a_reset():
    assert parsed([]) == ([], ["records must be a non-empty list of 'topic:partition:offset' or 'topic:partition:first-last' "
                               "items, got []"])
    assert parsed(["ops:0:1"] * (MAX_SPECS + 1))[1] == [f"records names {MAX_SPECS + 1} items; at most {MAX_SPECS} per run"]
    assert parsed([f"ops:0:0-{MAX_RECORDS}"])[1] == [
        f"records name {MAX_RECORDS + 1} offsets; a skip takes at most {MAX_RECORDS}: "
        "to move past more, use recover_reset_offsets"]


@pytest.mark.parametrize("note, problem", [
    (None, None), ("INC-42: poison record from the v3 producer", None),
    (7, "note must be text, got 7"),
    ("x" * 501, "note is 501 characters; at most 500"),
    ("ok\nFAKE LOG LINE", "note contains a line break, control or formatting character: keep it to one line of plain text"),
    ("abc\u202edcba", "note contains a line break, control or formatting character: keep it to one line of plain text"),
])
def test_a_note_is_one_line_of_plain_text(note, problem):
    assert note_problem(note) == problem


def test_the_reason_names_who_skipped_in_which_run_and_why():
    assert skip_reason("erin", "manual__1", None) == "skipped by operator erin (run manual__1)"
    assert skip_reason("erin", "manual__1", "INC-42") == "skipped by operator erin (run manual__1): INC-42"


def test_entries_handed_between_tasks_are_checked_before_they_reach_the_driver():
    good = {"topic": "oplog.operations", "partition": 1, "first": 5, "last": 7, "reason": skip_reason("erin", "r", None)}
    assert entry_problems(ROUTER, [good]) == []
    bad = [{**good, "topic": "oplog.category.contacts"}, {**good, "first": 9}, {**good, "partition": True},
           {**good, "reason": "because"}, "ops:1:5"]
    assert len(entry_problems(ROUTER, bad)) == 5
    assert entry_problems(ROUTER, [{**good, "reason": "because"}]) == [
        f"entry {str({**good, 'reason': 'because'})[:200]} "
        "is not an input record range of oplog-router with an operator's reason"]
    assert entry_problems(ROUTER, []) == ["entries must be a non-empty list, got []"]
