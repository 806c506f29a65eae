"""streamops.recovery.reset without a broker: which partitions a request moves, the explicit
offsets it may name, and the plan's figures and words. On a broker: tests/test_recovery.py."""

from __future__ import annotations

from streamops.catalog import load_catalog
from streamops.kafka_offsets import MAX_OFFSET
from streamops.recovery.reset import PartitionReset, ResetPlan, ResetRequest, _check_offsets, _selection

ROUTER = load_catalog(check_programs=False).app("oplog-router")
LAYOUT = {"oplog.operations": [0, 1, 2]}


def selection(**request):
    problems: list[str] = []
    chosen = _selection(ROUTER, LAYOUT, ResetRequest(app=ROUTER.name, **request), problems)
    return chosen, problems


def test_a_request_moves_every_input_partition_or_exactly_those_it_names():
    assert selection() == ({("oplog.operations", 0), ("oplog.operations", 1), ("oplog.operations", 2)}, [])
    assert selection(partitions=["oplog.operations:1"]) == ({("oplog.operations", 1)}, [])
    assert selection(partitions=["oplog.operations"])[0] == selection()[0]
    assert selection(mode="offsets", offsets={"oplog.operations": {"2": 5}}) == ({("oplog.operations", 2)}, [])


def test_every_bad_partition_selector_is_named():
    chosen, problems = selection(partitions=["presence.events", "oplog.operations:x", "oplog.operations:7", "../x:1"])
    assert chosen == set()
    assert problems == [
        "partition selector 'presence.events': 'presence.events' is not an input of oplog-router (inputs: oplog.operations)",
        "partition selector 'oplog.operations:x': the partition must be a number, as in oplog.operations:0",
        "partition 7 of 'oplog.operations' does not exist (it has partitions 0-2)",
        "partition selector '../x:1': topic '../x' looks like a path; give the name only (no '/', '\\\\' or '..')",
    ]
    assert selection(mode="offsets", offsets={"oplog.operations": {"0": 1}}, partitions=["oplog.operations"])[1] == [
        "with mode 'offsets' the offsets name the partitions: leave 'partitions' empty"]


def test_explicit_offsets_are_checked_topic_by_topic_and_partition_by_partition():
    problems: list[str] = []
    _check_offsets(ROUTER, LAYOUT, {"oplog.operations": {"0": 5, "9": 1, "a": 2, "1": -1, "2": True}, "presence.events": {"0": 1},
                                    "oplog.category.contacts": 3}, problems)
    assert problems == [
        "offsets: partition 9 of 'oplog.operations' does not exist (it has partitions 0-2)",
        "offsets: 'oplog.operations' partition 'a' must be a number",
        f"offsets: 'oplog.operations' partition 1: offset -1 must be a whole number from 0 to {MAX_OFFSET} "
        "(Kafka offsets are 64-bit)",
        f"offsets: 'oplog.operations' partition 2: offset True must be a whole number from 0 to {MAX_OFFSET} "
        "(Kafka offsets are 64-bit)",
        "offsets: 'presence.events' is not an input of oplog-router (inputs: oplog.operations)",
        "offsets: 'oplog.category.contacts' is not an input of oplog-router (inputs: oplog.operations)",
    ]
    problems.clear()
    _check_offsets(ROUTER, LAYOUT, {}, problems)
    assert problems == ['mode \'offsets\' needs offsets such as {"<input topic>": {"0": 42, "1": 17}}']


def test_the_plan_counts_what_is_replayed_and_skipped_and_starts_the_kept_topics_where_they_were():
    rows = [PartitionReset("oplog.operations", 0, 100, 40, 0, 150, True),
            PartitionReset("oplog.operations", 1, 90, 95, 0, 150, True),
            PartitionReset("oplog.operations", 2, None, 0, 0, 10, True)]
    plan = ResetPlan(app="oplog-router", request={}, rows=rows, kept={"side": {"0": 7}}, marks={}, stateful=True, running=True,
                     warnings=["partition 2 was never read"])
    assert [r.change() for r in rows] == ["replays 60", "skips 5", "starts at 0 (no position before)"]
    assert (plan.replayed, plan.skipped) == (60, 5)
    assert plan.starting_offsets() == {"side": {"0": 7}, "oplog.operations": {"0": 40, "1": 95, "2": 0}}
    table = plan.table()
    assert "in total: 60 record(s) replayed, 5 skipped" in table
    assert "STATE: oplog-router keeps state in its checkpoint; on the new checkpoint it starts EMPTY" in table
    assert "NOTE: oplog-router is running: stop it with stop_apps first; applying now is refused" in table
    assert table.endswith("WARNING: partition 2 was never read")
