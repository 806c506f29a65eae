"""provision_topics end to end: a real broker and real Airflow task runs (`dag.test`)."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from streamops.audit import read_audit
from streamops.provisioning import describe_broker
from tests.support.catalogs import topic_entry, write_catalog


def broker_state(admin, names):
    snapshot = describe_broker(admin, names)
    return {
        name: (topic.partitions, topic.replication_factor, {k: topic.configs[k] for k in sorted(topic.overridden)})
        for name, topic in snapshot.topics.items()
    }


def actions(result) -> dict[str, list[str]]:
    return {topic["topic"]: topic["actions"] for topic in result.xcoms["plan"]["topics"]}


def test_creates_every_topic_then_a_rerun_is_all_no_change(run_dag, admin, prefix, tmp_path):
    names = [f"{prefix}.orders", f"{prefix}.payments", f"{prefix}.audit"]
    catalog = write_catalog(
        tmp_path,
        [
            topic_entry(names[0], 3, configs={"cleanup.policy": "delete", "retention.ms": 3600000}),
            topic_entry(names[1], 2, configs={"cleanup.policy": "compact", "min.insync.replicas": 1}),
            topic_entry(names[2], 1),
        ],
    )

    first = run_dag("provision_topics", catalog, dry_run=False)

    assert first.state == "success"
    assert first.task_states == {"plan": "success", "approve": "skipped", "apply": "success", "verify": "success"}
    assert actions(first) == {name: ["create"] for name in names}
    assert first.xcoms["apply"]["applied"] == {name: ["created"] for name in names}
    audited = read_audit(run_id=first.run_id)
    assert [(e["step"], e["outcome"], e["user"]) for e in audited] == [
        ("plan", "planned", "dag_test"), ("apply", "done", "dag_test"), ("verify", "done", "dag_test")]
    assert audited[1]["result"]["applied"] == {name: ["created"] for name in names} and audited[1]["params"]["dry_run"] is False
    assert broker_state(admin, names) == {
        names[0]: (3, 1, {"cleanup.policy": "delete", "retention.ms": "3600000"}),
        names[1]: (2, 1, {"cleanup.policy": "compact", "min.insync.replicas": "1"}),
        names[2]: (1, 1, {}),
    }

    second = run_dag("provision_topics", catalog, dry_run=False)

    assert second.state == "success"
    assert actions(second) == {name: ["no change"] for name in names}
    assert second.xcoms["apply"]["applied"] == {}
    assert second.xcoms["plan"]["summary"].startswith("3 no change")


def test_dry_run_plans_but_changes_nothing(run_dag, admin, prefix, tmp_path):
    name = f"{prefix}.orders"
    catalog = write_catalog(tmp_path, [topic_entry(name, 2)])

    result = run_dag("provision_topics", catalog, dry_run=True)

    assert result.state == "success"
    assert result.task_states == {"plan": "success", "approve": "skipped", "apply": "skipped", "verify": "skipped"}
    assert actions(result) == {name: ["create"]}
    assert name not in admin.list_topics(timeout=10).topics


def test_a_dry_run_plans_only_with_nothing_to_approve(run_dag, admin, prefix, tmp_path):
    name = f"{prefix}.orders"
    result = run_dag("provision_topics", write_catalog(tmp_path, [topic_entry(name)]), dry_run=True, approve_in_ui=True)
    assert (result.task_states["approve"], result.task_states["apply"]) == ("skipped", "skipped")
    assert name not in admin.list_topics(timeout=10).topics


def test_config_changed_by_hand_is_reported_as_drift_and_fixed(run_dag, admin, prefix, tmp_path):
    name = f"{prefix}.orders"
    catalog = write_catalog(tmp_path, [topic_entry(name, 2, configs={"retention.ms": 3600000})])
    assert run_dag("provision_topics", catalog, dry_run=False).state == "success"
    # Someone changes the topic by hand, outside the catalog.
    futures = admin.incremental_alter_configs(
        [
            ConfigResource(
                ResourceType.TOPIC,
                name,
                incremental_configs=[
                    ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET),
                    ConfigEntry("segment.ms", "600000", incremental_operation=AlterConfigOpType.SET),
                ],
            )
        ]
    )
    for future in futures.values():
        future.result()

    plan = run_dag("provision_topics", catalog, dry_run=True)

    (topic,) = plan.xcoms["plan"]["topics"]
    assert topic["actions"] == ["alter configs"]
    assert topic["config_changes"] == [
        {"key": "retention.ms", "current": "60000", "desired": "3600000"},
        {"key": "segment.ms", "current": "600000", "desired": None},
    ]
    assert broker_state(admin, [name])[name][2] == {"retention.ms": "60000", "segment.ms": "600000"}

    fixed = run_dag("provision_topics", catalog, dry_run=False)

    assert fixed.state == "success"
    assert fixed.xcoms["apply"]["applied"] == {name: ["configs altered"]}
    assert broker_state(admin, [name]) == {name: (2, 1, {"retention.ms": "3600000"})}


def test_partition_increase_is_applied(run_dag, admin, prefix, tmp_path):
    name = f"{prefix}.orders"
    assert run_dag("provision_topics", write_catalog(tmp_path, [topic_entry(name, 2)]), dry_run=False).state == "success"

    grown = run_dag("provision_topics", write_catalog(tmp_path, [topic_entry(name, 5)], "grown.yaml"), dry_run=False)

    assert grown.state == "success"
    assert actions(grown) == {name: ["add partitions"]}
    assert grown.xcoms["apply"]["applied"] == {name: ["partitions added"]}
    assert broker_state(admin, [name])[name][0] == 5


def test_partition_decrease_is_refused_and_the_topic_untouched(run_dag, admin, prefix, tmp_path):
    name, other = f"{prefix}.orders", f"{prefix}.payments"
    original = write_catalog(tmp_path, [topic_entry(name, 4, configs={"retention.ms": 3600000}), topic_entry(other, 1)])
    assert run_dag("provision_topics", original, dry_run=False).state == "success"
    # The lower partition count comes with a config change that must not be applied either,
    # while the other topic's change still goes through.
    lowered = write_catalog(
        tmp_path,
        [topic_entry(name, 2, configs={"retention.ms": 60000}), topic_entry(other, 2)],
        "lowered.yaml",
    )

    result = run_dag("provision_topics", lowered, dry_run=False)

    assert result.state == "failed"
    assert result.task_states == {"plan": "success", "approve": "skipped", "apply": "success", "verify": "failed"}
    (refused,) = [t for t in result.xcoms["plan"]["topics"] if t["topic"] == name]
    assert refused["actions"] == ["refused"]
    assert refused["refusals"] == [
        "partitions 4 -> 2 refused: Kafka cannot remove partitions (it would drop their data and move keys "
        "to other partitions); set the catalog back to 4, or create a new topic and migrate"
    ]
    assert result.xcoms["apply"]["refused"] == {name: refused["refusals"]}
    # verify names the refused difference at once: it never settles, so there is nothing to wait for.
    assert result.task_states.errors["verify"] == (
        "ProvisioningError: after apply, 1 topic(s) on the broker still differ from the catalog:\n"
        f"  - {name}: {refused['refusals'][0]}")
    assert broker_state(admin, [name, other]) == {
        name: (4, 1, {"retention.ms": "3600000"}),
        other: (2, 1, {}),
    }


def test_topic_subset_touches_only_the_chosen_topics(run_dag, admin, prefix, tmp_path):
    chosen, left = f"{prefix}.orders", f"{prefix}.payments"
    catalog = write_catalog(tmp_path, [topic_entry(chosen), topic_entry(left)])

    result = run_dag("provision_topics", catalog, dry_run=False, topics=[chosen])

    assert result.state == "success"
    assert actions(result) == {chosen: ["create"]}
    assert result.xcoms["plan"]["unmanaged_topics"] == []
    topics = admin.list_topics(timeout=10).topics
    assert chosen in topics and left not in topics


def test_topics_not_in_the_catalog_are_reported_and_never_deleted(run_dag, admin, prefix, tmp_path):
    stray, managed = f"{prefix}.stray", f"{prefix}.orders"
    run_dag("provision_topics", write_catalog(tmp_path, [topic_entry(stray)], "first.yaml"), dry_run=False)

    result = run_dag("provision_topics", write_catalog(tmp_path, [topic_entry(managed)]), dry_run=False)

    assert result.state == "success"
    assert stray in result.xcoms["plan"]["unmanaged_topics"]
    assert stray in admin.list_topics(timeout=10).topics


def test_unknown_topic_in_the_form_is_refused_before_any_work(run_dag, admin, prefix, tmp_path):
    from airflow.sdk.exceptions import ParamValidationError

    catalog = write_catalog(tmp_path, [topic_entry(f"{prefix}.orders")])
    with pytest.raises(ParamValidationError, match=f"'{prefix}.typo' is not one of \\['{prefix}.orders'\\]"):
        run_dag("provision_topics", catalog, dry_run=False, topics=[f"{prefix}.typo"])
    assert f"{prefix}.orders" not in admin.list_topics(timeout=10).topics


def test_a_retention_cut_needs_an_approver_other_than_its_requester(run_dag, admin, prefix, tmp_path):
    """Four eyes (streamops.access): a plan that makes the broker delete records sooner is applied
    only after an Approve by someone who did not trigger the run, checked by the apply itself."""
    name = f"{prefix}.orders"
    assert run_dag("provision_topics", write_catalog(tmp_path, [topic_entry(name, 1, configs={"retention.ms": 3600000})]),
                   dry_run=False).state == "success"
    cut = write_catalog(tmp_path, [topic_entry(name, 1, configs={"retention.ms": 60000})])

    # In-process runs are requested by "dag_test": approved by that same user, the apply refuses.
    own = run_dag("provision_topics", cut, dry_run=False, approved_by="dag_test")
    assert own.task_states == {"plan": "success", "approve": "success", "apply": "failed", "verify": "upstream_failed"}
    assert own.xcoms["plan"]["data_loss_risks"] == [f"{name}: retention.ms '3600000' -> '60000'"]
    assert [(e["step"], e["outcome"]) for e in read_audit(run_id=own.run_id)][1:] == [
        ("approve", "approved by its own requester (the apply refuses it: this plan needs a second person)"),
        ("apply", "refused")]
    assert ("Apply refused: dag_test approved a plan they triggered themselves, and this one needs a second person (it "
            f"can delete records sooner: {name}: retention.ms '3600000' -> '60000')") in read_audit(run_id=own.run_id)[2]["error"]
    assert broker_state(admin, [name])[name][2] == {"retention.ms": "3600000"}

    applied = run_dag("provision_topics", cut, dry_run=False, approved_by="approver")
    assert applied.state == "success", applied.task_states
    assert broker_state(admin, [name])[name][2] == {"retention.ms": "60000"}
    approve = next(e for e in read_audit(run_id=applied.run_id) if e["step"] == "approve")
    assert (approve["user"], approve["approved_by"], approve["outcome"]) == ("dag_test", "approver", "approved")
