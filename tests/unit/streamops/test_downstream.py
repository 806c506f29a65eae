"""What a plan does to the readers of an app's outputs, in words, and in the approval's text (the
counting on a real broker: tests/test_recovery.py, tests/test_supervision.py)."""

from __future__ import annotations

from streamops.dag_tasks.approval import plan_body
from streamops.dag_tasks.recovery import _rebuild_effect, _reset_effect, _restore_effect, _skip_effect
from streamops.downstream import DownstreamImpact, GroupImpact, InputRange, PlanEffect, is_suite_group


def test_each_group_is_told_what_it_receives_again_and_never():
    impact = DownstreamImpact(groups=[
        GroupImpact("billing", "out.a", 120, 30, 0), GroupImpact("audit", "out.a", 0, 0, 5),
        GroupImpact("bi", "out.counts", None, None, 0, ""), GroupImpact("idle", "out.a", 0, 0, 0)],
        unread_outputs=["out.b"])
    assert impact.lines() == [
        "group billing on out.a: receives again 120 record(s) it has read, and 30 it has not read yet twice",
        "group audit on out.a: never receives the outputs of 5 input record(s)",
        "group bi on out.counts: receives again the outputs recomputed from the records processed again (how many is "
        "known only once the app has run: this output names no source record)",
        "group idle on out.a: sees no difference",
        "no consumer group outside the suite reads out.b"]
    assert impact.summary() == "downstream: 3 consumer group(s) affected"
    assert DownstreamImpact.from_json(impact.to_json()) == impact
    assert DownstreamImpact(unread_outputs=["out.a"]).summary() == "downstream: no consumer group outside the suite is affected"


def test_the_suite_and_spark_are_no_downstream_readers():
    assert [g for g in ("streamops-reader", "spark-kafka-source-1a2b-driver-0", "billing", "streamops")
            if not is_suite_group(g)] == ["billing", "streamops"]


def test_the_approval_shows_the_impact_first_and_a_group_name_stays_text():
    plan = {"summary": "250 replayed, 0 skipped; downstream: 1 consumer group(s) affected", "app": "r",
            "downstream": DownstreamImpact(groups=[GroupImpact("**evil** [x](http://e)", "out.a", 2, 0, 0)]).to_json()}
    body = plan_body(plan)
    assert ("**What the readers of the outputs see** (consumer groups outside the suite):\n\n- group \\*\\*evil\\*\\* "
            "\\[x\\]\\(http://e\\) on out.a: receives again 2 record\\(s\\) it has read\n") in body
    assert "downstream" not in body.split("Approve applies exactly this plan", 1)[1]  # not again as a raw field


def test_each_plan_names_what_it_does_to_the_input():
    from types import SimpleNamespace

    rows = [SimpleNamespace(topic="in", partition=0, current=100, new=40, selected=True),
            SimpleNamespace(topic="in", partition=1, current=100, new=130, selected=True),
            SimpleNamespace(topic="in", partition=2, current=None, new=0, selected=True),  # never read: nothing written
            SimpleNamespace(topic="in", partition=3, current=100, new=0, selected=False)]
    assert _reset_effect(SimpleNamespace(rows=rows)) == PlanEffect(again=(InputRange("in", 0, 40, 100),),
                                                                   never=(InputRange("in", 1, 100, 130),))
    assert _skip_effect(SimpleNamespace(entries=[{"topic": "in", "partition": 3, "first": 7, "last": 9}])) == PlanEffect(
        never=(InputRange("in", 3, 7, 10),))
    moves = [{"topic": "in", "partition": 0, "now": 90, "restored": 60}, {"topic": "in", "partition": 1, "now": None,
                                                                          "restored": 5}]
    assert _restore_effect(SimpleNamespace(moves=moves)) == PlanEffect(again=(InputRange("in", 0, 60, 90),))
    inputs = [{"topic": "in", "partition": 0, "earliest": 5, "latest": 50}]
    assert _rebuild_effect(SimpleNamespace(target="live", inputs=inputs)) == PlanEffect(again=(InputRange("in", 0, 5, 50),))
    assert _rebuild_effect(SimpleNamespace(target="v2", inputs=inputs)) == PlanEffect(moved_to="the versioned topics (v2)")


def test_a_cutover_tells_each_group_its_topic_goes_quiet():
    moved = GroupImpact("billing", "out.a", 0, 0, 0, "after the cutover r writes to the versioned topics (v2): this group "
                                                   "receives nothing more on out.a until it reads those")
    assert moved.words() == ("group billing on out.a: after the cutover r writes to the versioned topics (v2): this group "
                             "receives nothing more on out.a until it reads those")
    assert DownstreamImpact(groups=[moved]).summary() == "downstream: 1 consumer group(s) affected"


def test_a_hold_keeps_the_longer_of_its_retention_and_the_catalogs_and_a_bad_holds_file_is_named(tmp_path, monkeypatch):
    import pytest

    from streamops.retention import HoldsUnreadable, RetentionHold, held_configs, holds_changed, holds_file, read_holds

    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path))
    with holds_changed() as holds:
        holds["in"] = RetentionHold("in", 620_000, 20_000, "2026-12-03T10:00:00.000Z", "r1", "ops")
    kept = read_holds()
    assert held_configs("in", {"retention.ms": 20_000, "cleanup.policy": "delete"}, kept) == {
        "retention.ms": 620_000, "cleanup.policy": "delete"}  # ended or not: until the supervisor reverts it
    assert held_configs("in", {"retention.ms": 900_000}, kept) == {"retention.ms": 900_000}  # the catalog raised it
    assert held_configs("other", {"retention.ms": 1}, kept) == {"retention.ms": 1}
    with holds_changed() as holds:  # a size limit held too, and a hold written before sizes were held still reads
        holds["sized"] = RetentionHold("sized", None, None, "2026-12-03T10:00:00.000Z", "r2", "ops", 9_000_000, 1_000_000)
    kept = read_holds()
    assert held_configs("sized", {"retention.ms": -1, "retention.bytes": 1_000_000}, kept) == {
        "retention.ms": -1, "retention.bytes": 9_000_000}
    assert kept["in"].held() == {"retention.ms": 620_000} and kept["sized"].held() == {"retention.bytes": 9_000_000}
    holds_file().write_text("{not json")
    with pytest.raises(HoldsUnreadable, match=r"holds.json is not JSON .*: fix or remove it"):
        read_holds()


def test_a_replay_tells_each_group_it_receives_outputs_new_to_it():
    assert GroupImpact("billing", "out.a", 0, 0, 0, replayed=12).words() == (
        "group billing on out.a: receives the outputs of 12 replayed dead letter(s), new to it")


def test_an_output_too_large_to_count_says_so_and_not_that_it_has_no_lineage():
    line = GroupImpact("bi", "out.a", None, None, 0, "not counted: 900,000 records of out.a would have to be read").words()
    assert line == ("group bi on out.a: receives again the outputs of the records processed again (not counted: 900,000 "
                    "records of out.a would have to be read)")
