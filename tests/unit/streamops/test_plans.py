"""streamops.plans: every plan of the suite keeps one protocol, its JSON comes back as the same plan,
and JSON that is not one it makes (a field missing, of another type, or not its own) is refused
naming the plan, the field and the problem."""

from __future__ import annotations

import json

import pytest

from streamops.desired_state import SyncItem, SyncPlan
from streamops.kafka_offsets import OffsetSpan
from streamops.plans import AppPlan, Plan, PlanMismatch
from streamops.provisioning import Action, ConfigChange, ProvisioningPlan, TopicPlan
from streamops.quality.ranges import TopicRange
from streamops.recovery.rebuild import RebuildPlan
from streamops.recovery.replay import ReplayPlan
from streamops.recovery.reset import PartitionReset, ResetPlan
from streamops.recovery.restart import RestartPlan
from streamops.recovery.restore import RestorePlan
from streamops.recovery.skip import SkipPlan
from streamops.reprocess import PartitionRange, ReprocessPlan

APP = "oplog-router"


def restart() -> RestartPlan:
    return RestartPlan(app=APP, state="crashed", last_driver={"pid": 4242, "host": "host-a", "version": "1.0.3",
                                                              "started_at": "2026-11-25T01:00:00Z"},
                       leftovers=[], lag=120, batches={"route": 7}, version="1.0.3", spark_conf={})


def reset() -> ResetPlan:
    rows = [PartitionReset("ops", 0, 100, 40, 0, 150, True), PartitionReset("ops", 1, 90, 95, 0, 150, True),
            PartitionReset("ops", 2, None, 0, 0, 10, False)]
    return ResetPlan(app=APP, request={"mode": "shift"}, rows=rows, kept={}, marks={"route": 7}, stateful=False)


def replay() -> ReplayPlan:
    return ReplayPlan(app=APP, request={"start": "earliest"}, dead_letter_topic="dlq", spans={"0": [0, 5]},
                      by_reason=[{"reason": "bad json", "records": 5, "replay": 3, "still fails": 1, "already replayed": 1,
                                  "filtered out": 0, "other": 0}],
                      totals={"replay": 3, "still fails": 1, "already replayed": 1})


def rebuild() -> RebuildPlan:
    return RebuildPlan(app=APP, target="live", running=False, stateful=True, batches={"route": 3},
                       inputs=[{"topic": "ops", "partition": 0, "earliest": 10, "latest": 60}], outputs=["out"])


def restore() -> RestorePlan:
    return RestorePlan(app=APP, snapshot="20261125T010000-before-reset", history=[], current={"route": 9},
                       restored={"route": 4},
                       moves=[{"query": "route", "topic": "ops", "partition": 0, "now": 90, "restored": 60}],
                       running=False, version="1.0.0", spark_conf={})


def skip() -> SkipPlan:
    entries = [{"topic": "ops", "partition": 3, "first": 1207, "last": 1207, "offsets": [1207]},
               {"topic": "ops", "partition": 1, "first": 5, "last": 7, "offsets": [5, 6, 7]}]
    return SkipPlan(app=APP, state="failed", entries=entries, shown=[], marks={"route": 2}, version="1.0.0", spark_conf={},
                    dead_letter_topic="dlq", reason="skipped by operator ops (run r1)")


def reprocess() -> ReprocessPlan:
    return ReprocessPlan(app=APP, request={"tag": "t1"}, inputs=[PartitionRange("ops", 0, 10, 70, None)],
                         targets={"out": "out.v2"}, estimate_s=12.0, rate=5.0, rate_measured=False)


def sync() -> SyncPlan:
    rolled = SyncItem(app=APP, policy="approve", action="roll", reason="the catalog says version 1.0.4",
                      fields=[{"field": "version", "declared": "1.0.4", "running": "1.0.3", "cause": "catalog"}],
                      version="1.0.4", spark_conf={"spark.sql.shuffle.partitions": "4"}, running_digest="sha256:aa",
                      declared_digest="sha256:bb")
    return SyncPlan(items=[rolled, SyncItem(app="presence-notifier", policy="report", action="none", reason="in sync")],
                    planned_at="2026-11-25T01:00:00Z", on_demand=True)


def provisioning() -> ProvisioningPlan:
    altered = TopicPlan(topic="ops", actions=[Action.ADD_PARTITIONS, Action.ALTER_CONFIGS], partitions_current=3,
                        partitions_desired=6, replication_factor=1, configs_desired={"retention.ms": "3600000"},
                        config_changes=[ConfigChange(key="retention.ms", current=None, desired="3600000")])
    created = TopicPlan(topic="orders", actions=[Action.CREATE], partitions_desired=3, replication_factor=1)
    return ProvisioningPlan(topics=[altered, created], unmanaged_topics=["legacy"])


EVERY_PLAN = [restart, reset, replay, rebuild, restore, skip, reprocess]


def handed_on(plan) -> dict:
    """The plan's JSON as the plan task hands it on and XCom carries it (the summary beside it)."""
    return json.loads(json.dumps({"summary": "the plan in a line", **plan.to_json()}))


@pytest.mark.parametrize("make", EVERY_PLAN, ids=lambda make: make.__name__)
def test_every_plan_keeps_the_protocol_and_comes_back_from_its_json_unchanged(make):
    plan = make()
    assert isinstance(plan, AppPlan)
    handed = json.loads(json.dumps({**plan.to_json(), "summary": plan.summary()}))  # as XCom carries it
    assert type(plan).from_json(handed) == plan
    assert plan.table() and "\n" not in plan.summary()


def test_the_json_carries_what_a_reader_wants_and_the_summary_says_it_in_a_line():
    assert (reset().to_json()["replayed"], reset().to_json()["skipped"]) == (60, 5)
    assert reset().summary() == "60 replayed, 5 skipped"
    assert rebuild().to_json()["records"] == 50 and rebuild().summary() == "live: 50 record(s) from earliest"
    assert restore().to_json()["replayed"] == 30
    assert restore().summary() == "restore 20261125T010000-before-reset: batches {'route': 9} -> {'route': 4}"
    assert skip().to_json()["records"] == 4 and skip().summary() == "skip 4 record(s) of oplog-router (ops:3:1207, ops:1:5-7)"
    assert replay().summary() == "3 to replay, 1 still fail, 1 replayed before"
    assert restart().summary() == "oplog-router is crashed; lag 120; 0 leftover process(es)"
    assert reprocess().summary() == "60 record(s) of oplog-router into out.v2 (about 12 s)"


def test_a_plan_without_a_field_is_refused_naming_it():
    handed = restart().to_json()
    del handed["lag"], handed["version"]
    with pytest.raises(PlanMismatch) as refused:
        RestartPlan.from_json(handed)
    assert refused.value.operator_text() == (
        "refused: the plan this task received is not one the plan task makes: RestartPlan without lag, version")


def test_nested_entries_that_do_not_fit_their_type_are_refused():
    handed = reset().to_json()
    handed["rows"][1]["command"] = "touch /tmp/x"
    with pytest.raises(PlanMismatch) as refused:
        ResetPlan.from_json(handed)
    assert refused.value.problems == ["ResetPlan.rows.1.command: Unexpected keyword argument"]
    with pytest.raises(PlanMismatch, match="a ReprocessPlan is a JSON object, got list"):
        ReprocessPlan.from_json([])  # type: ignore[arg-type]


def test_fields_a_task_added_are_left_out_when_read_back():
    handed = {**rebuild().to_json(), "summary": "x", "reprocess_plan": {"app": APP}, "records": 10**9}
    assert RebuildPlan.from_json(handed) == rebuild()  # derived figures are computed again, never trusted


def test_the_topic_plan_keeps_the_same_protocol():
    plan = ProvisioningPlan(topics=[TopicPlan(topic="orders", actions=[Action.CREATE], partitions_desired=3,
                                              replication_factor=1)],
                            unmanaged_topics=["legacy"])
    assert isinstance(plan, Plan) and not isinstance(plan, AppPlan)
    handed = json.loads(json.dumps({**plan.to_json(), "summary": plan.summary(), "table": plan.table()}))
    assert ProvisioningPlan.from_json(handed) == plan
    assert plan.summary() == "1 create, 1 not in catalog"
    del handed["topics"][0]["actions"]
    with pytest.raises(PlanMismatch, match=r"^the plan this task received is not one the plan task makes: "
                                           r"ProvisioningPlan\.topics\.0\.actions: Field required$"):
        ProvisioningPlan.from_json(handed)


@pytest.mark.parametrize("make", [*EVERY_PLAN, sync, provisioning], ids=lambda make: make.__name__)
def test_every_plan_comes_back_from_the_json_xcom_carries_through_the_one_reader(make):
    plan = make()
    assert type(plan).from_json(handed_on(plan)) == plan
    assert type(plan).from_json(plan.to_json()) == plan  # handed on in the same process, before any JSON


def test_the_reconcile_plan_comes_back_with_its_items_rebuilt():
    back = SyncPlan.from_json(handed_on(sync()))
    assert [type(item) for item in back.items] == [SyncItem, SyncItem]
    assert back.rolls("approve") == [sync().items[0]] and back.approval_not_needed is None


def test_a_validation_range_comes_back_with_int_partitions_and_offset_spans():
    topic_range = TopicRange("ops", {1: OffsetSpan(5, 5), 0: OffsetSpan(10, 20)}, "the last 10 records of each partition")
    handed = json.loads(json.dumps(topic_range.to_json()))
    assert handed["partitions"] == {"0": [10, 20], "1": [5, 5]} and handed["records"] == 10
    assert TopicRange.from_json(handed) == topic_range
    handed["partitions"]["0"] = [10, "20"]
    with pytest.raises(PlanMismatch) as refused:
        TopicRange.from_json(handed)
    assert refused.value.problems == ["TopicRange.partitions.0.1: Input should be a valid integer, got '20'"]


def test_a_field_of_another_type_is_refused_naming_the_plan_the_field_and_the_value():
    def problems(plan, **changes) -> list[str]:
        handed = {**handed_on(plan), **changes}
        with pytest.raises(PlanMismatch) as refused:
            type(plan).from_json(handed)
        return refused.value.problems

    assert problems(restart(), lag="120") == ["RestartPlan.lag: Input should be a valid integer, got '120'"]
    assert problems(restart(), lag=120.5) == ["RestartPlan.lag: Input should be a valid integer, got 120.5"]
    assert problems(replay(), spans=[[0, 5]]) == ["ReplayPlan.spans: Input should be an object, got [[0, 5]]"]
    assert problems(reprocess(), rate_measured=1, targets={"out": 2}) == [
        "ReprocessPlan.targets.out: Input should be a valid string, got 2",
        "ReprocessPlan.rate_measured: Input should be a valid boolean, got 1"]
    assert problems(rebuild(), outputs="out") == ["RebuildPlan.outputs: Input should be a valid array, got 'out'"]
    rows = handed_on(reset())["rows"]
    rows[0]["partition"] = "0"
    assert problems(reset(), rows=rows) == ["ResetPlan.rows.0.partition: Input should be a valid integer, got '0'"]
    items = handed_on(sync())["items"]
    items[1]["fields"] = {"field": "version"}
    assert problems(sync(), items=items) == [
        "SyncPlan.items.1.fields: Input should be a valid array, got {'field': 'version'}"]
    topics = handed_on(provisioning())["topics"]
    topics[1]["actions"] = ["delete"]
    assert problems(provisioning(), topics=topics) == [
        "ProvisioningPlan.topics.1.actions.0: Input should be 'create', 'add partitions', 'alter configs', 'no change' or "
        "'refused', got 'delete'"]
    long = "x" * 200
    assert problems(skip(), marks={"route": long}) == [
        f"SkipPlan.marks.route: Input should be a valid integer, got '{long[:76]}..."]


def test_missing_and_mistyped_fields_are_refused_together():
    handed = handed_on(restore())
    del handed["snapshot"]
    handed["running"] = "no"
    with pytest.raises(PlanMismatch) as refused:
        RestorePlan.from_json(handed)
    assert str(refused.value) == ("the plan this task received is not one the plan task makes: RestorePlan without snapshot; "
                                  "RestorePlan.running: Input should be a valid boolean, got 'no'")


def test_a_plan_that_is_not_json_is_refused():
    with pytest.raises(PlanMismatch, match=r"^the plan this task received is not one the plan task makes: "
                                           r"RestartPlan is not JSON: Unable to serialize unknown type: <class .object.>$"):
        RestartPlan.from_json({**restart().to_json(), "leftovers": [object()]})
