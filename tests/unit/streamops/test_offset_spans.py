"""streamops.kafka_offsets' one span type for "the offsets of a time range": OffsetSpan, its JSON,
time_range_spans over a stand-in broker, and the plans and ranges that carry spans in their JSON
(the replay plan, a reprocessing plan's inputs, a validation's TopicRange) written as before."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from streamops import kafka_offsets
from streamops.kafka_offsets import MAX_OFFSET, OffsetSpan, spans_from_json, spans_to_json, time_range_spans
from streamops.plans import PlanMismatch
from streamops.quality.ranges import TopicRange
from streamops.recovery.replay import ReplayPlan
from streamops.reprocess import PartitionRange, ReprocessPlan
from streamops.timestamps import epoch_ms

T1 = datetime(2026, 11, 24, 1, tzinfo=UTC)
T2 = datetime(2026, 11, 24, 2, tzinfo=UTC)


def test_a_span_counts_its_offsets_and_knows_when_it_is_empty():
    assert OffsetSpan(10, 70).records == 60 and not OffsetSpan(10, 70).empty
    assert OffsetSpan(5, 5).records == 0 and OffsetSpan(5, 5).empty
    assert OffsetSpan(0, 1) == OffsetSpan(0, 1) and len({OffsetSpan(0, 1), OffsetSpan(0, 1)}) == 1  # a value


@pytest.mark.parametrize(("start", "end", "error", "words"), [
    (7, 3, ValueError, f"offset span [7, 3) must have 0 <= start <= end <= {MAX_OFFSET}"),
    (-1, 3, ValueError, f"offset span [-1, 3) must have 0 <= start <= end <= {MAX_OFFSET}"),
    (0, MAX_OFFSET + 1, ValueError, f"offset span [0, {MAX_OFFSET + 1}) must have 0 <= start <= end <= {MAX_OFFSET}"),
    ("0", 3, TypeError, "an offset span's start is a whole number, not str: '0'"),
    (0, True, TypeError, "an offset span's end is a whole number, not bool: True"),
])
def test_a_span_that_is_not_one_is_refused_in_words(start, end, error, words):
    with pytest.raises(error) as refused:
        OffsetSpan(start, end)
    assert str(refused.value) == words


def test_spans_are_written_as_the_plans_always_wrote_them_and_read_back_the_same():
    spans = {2: OffsetSpan(0, 0), 0: OffsetSpan(3, 9), 10: OffsetSpan(1, 2)}
    written = spans_to_json(spans)
    assert json.dumps(written) == '{"0": [3, 9], "2": [0, 0], "10": [1, 2]}'
    assert spans_from_json(json.loads(json.dumps(written)), "spans") == spans
    assert OffsetSpan(3, 9).to_json() == [3, 9] and OffsetSpan.from_json([3, 9], "x") == OffsetSpan(3, 9)


@pytest.mark.parametrize(("data", "words"), [
    ([[0, 1]], "spans must map partitions to [start, end], got [[0, 1]]"),
    ({"p0": [0, 1]}, "spans: partition 'p0' is not a whole number from 0 to 2147483647"),
    ({"0": [0, 1, 2]}, "spans['0'] must be [start, end] (two whole numbers, end exclusive), got [0, 1, 2]"),
    ({"0": ["0", 1]}, "spans['0'] must be [start, end] (two whole numbers, end exclusive), got ['0', 1]"),
    ({"1": [9, 4]}, f"spans['1']: offset span [9, 4) must have 0 <= start <= end <= {MAX_OFFSET}"),
])
def test_spans_json_that_is_not_spans_is_refused_naming_where(data, words):
    with pytest.raises(ValueError) as refused:
        spans_from_json(data, "spans")
    assert str(refused.value) == words


@pytest.fixture
def listed(monkeypatch):
    """Partitions 0 and 1 holding offsets [100, 500) and [0, 40); by time: T1 at 200 and 10, T2 at
    300 and (records written out of time order) 5; the calls made, in order."""
    calls: list[str] = []
    marks = {0: (100, 500), 1: (0, 40)}
    at = {epoch_ms(T1): {0: 200, 1: 10}, epoch_ms(T2): {0: 300, 1: 5}}

    def watermarks(admin, topic, partitions, *, committed=False):
        calls.append(f"watermarks {topic} {list(partitions)}")
        return {p: marks[p] for p in partitions}

    def offsets_for_time(admin, topic, partitions, ms):
        calls.append(f"offsets_for_time {topic} {ms}")
        return {p: at[ms][p] for p in partitions}

    monkeypatch.setattr(kafka_offsets, "watermarks", watermarks)
    monkeypatch.setattr(kafka_offsets, "offsets_for_time", offsets_for_time)
    return calls


def test_a_time_range_is_the_spans_of_the_records_written_in_it(listed):
    assert time_range_spans(None, "ops", [0, 1], T1, T2) == {0: OffsetSpan(200, 300), 1: OffsetSpan(10, 10)}
    assert listed == [f"offsets_for_time ops {epoch_ms(T1)}", f"offsets_for_time ops {epoch_ms(T2)}"]  # no watermarks needed


def test_none_means_the_partitions_earliest_and_latest_offsets(listed):
    assert time_range_spans(None, "ops", [0, 1], None, None) == {0: OffsetSpan(100, 500), 1: OffsetSpan(0, 40)}
    assert time_range_spans(None, "ops", [0, 1], T1, None) == {0: OffsetSpan(200, 500), 1: OffsetSpan(10, 40)}
    assert time_range_spans(None, "ops", [0], None, T2) == {0: OffsetSpan(100, 300)}
    assert time_range_spans(None, "ops", [], None, None) == {}


def test_the_replay_plan_writes_its_spans_as_before_and_reads_them_back():
    plan = ReplayPlan(app="a", request={}, dead_letter_topic="dlq",
                      spans=spans_to_json({1: OffsetSpan(4, 9), 0: OffsetSpan(0, 5)}),
                      by_reason=[], totals={"replay": 0, "still fails": 0, "already replayed": 0})
    handed = json.loads(json.dumps(plan.to_json()))
    assert handed["spans"] == {"0": [0, 5], "1": [4, 9]}
    assert ReplayPlan.from_json(handed).offset_spans() == {0: OffsetSpan(0, 5), 1: OffsetSpan(4, 9)}
    assert plan.table().splitlines()[0] == "dead letters of a in dlq [p0 0..5, p1 4..9]:"


def test_a_reprocessing_plans_inputs_stay_flat_in_its_json_and_give_their_span():
    plan = ReprocessPlan(app="a", request={}, inputs=[PartitionRange("ops", 0, 10, 70, None)], targets={}, estimate_s=1.0,
                         rate=1.0, rate_measured=False)
    handed = json.loads(json.dumps(plan.to_json()))
    assert handed["inputs"] == [{"topic": "ops", "partition": 0, "start": 10, "end": 70, "first_timestamp_ms": None}]
    assert ReprocessPlan.from_json(handed).inputs[0].span == OffsetSpan(10, 70)
    assert handed["records"] == 60


def test_a_validation_range_writes_its_spans_as_before_and_reads_them_back():
    topic_range = TopicRange("ops", {1: OffsetSpan(7, 7), 0: OffsetSpan(10, 20)}, "explicit offsets")
    handed = json.loads(json.dumps(topic_range.to_json()))
    assert handed == {
        "topic": "ops", "partitions": {"0": [10, 20], "1": [7, 7]}, "description": "explicit offsets", "records": 10
    }
    assert TopicRange.from_json(handed) == topic_range
    assert topic_range.spans() == "p0 10-20, p1 empty"
    handed["partitions"]["1"] = [7]
    with pytest.raises(PlanMismatch) as refused:  # read back as every plan is (streamops.plans)
        TopicRange.from_json(handed)
    assert refused.value.problems == ["TopicRange.partitions.1.1: Field required"]
    handed["partitions"]["1"] = [9, 7]
    with pytest.raises(PlanMismatch) as refused:
        TopicRange.from_json(handed)
    assert refused.value.problems == [f"TopicRange.partitions.1: Value error, offset span [9, 7) must have 0 <= start <= end "
                                      f"<= {MAX_OFFSET}, got [9, 7]"]


def test_a_partition_that_answers_without_an_offset_during_a_leader_election_is_asked_again():
    """A broker killed, its partitions' earliest offset may come back as -1001 with no error for a
    moment: the watermarks wait for a real offset instead of handing a reader an invalid start."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    class ElectingAdmin:
        def __init__(self) -> None:
            self.asked = 0

        def list_offsets(self, request, isolation_level, request_timeout):
            self.asked += 1
            answers = {}
            for tp in request:
                future: Future = Future()
                electing = self.asked == 1 and tp.partition == 1  # the first earliest answer of p1
                future.set_result(SimpleNamespace(offset=-1001 if electing else 10 * (tp.partition + 1)))
                answers[tp] = future
            return answers

    admin = ElectingAdmin()
    assert kafka_offsets.watermarks(admin, "ops", [0, 1]) == {0: (10, 10), 1: (20, 20)}
    assert admin.asked == 4  # earliest and latest, asked twice


def test_offsets_for_a_time_wait_for_a_partition_that_answers_without_one_and_keep_minus_one_as_the_end():
    from concurrent.futures import Future
    from types import SimpleNamespace

    answers = iter([{0: -1, 1: -1001}, {0: 40, 1: 50}, {0: -1, 1: 7}, {0: 40, 1: 50}])  # by time, latest; again

    class ElectingAdmin:
        def list_offsets(self, request, isolation_level, request_timeout):
            offsets = next(answers)
            futures = {}
            for tp in request:
                future: Future = Future()
                future.set_result(SimpleNamespace(offset=offsets[tp.partition]))
                futures[tp] = future
            return futures

    # p1 had no answer at first (a leader being elected); p0's -1 means no record since: its end.
    assert kafka_offsets.offsets_for_time(ElectingAdmin(), "ops", [0, 1], 1_000) == {0: 40, 1: 7}
