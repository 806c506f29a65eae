"""The plan as a pure function of catalog specs and a broker snapshot (no broker needed)."""

from __future__ import annotations

from streamops.catalog import TopicSpec
from streamops.provisioning import Action, BrokerSnapshot, BrokerTopic, ConfigChange, plan_topics


def spec(name="a.b", partitions=3, rf=1, **configs) -> TopicSpec:
    return TopicSpec(
        name=name, partitions=partitions, replication_factor=rf, owner="o", description="d",
        configs={k.replace("_", "."): v for k, v in configs.items()},
    )


def broker(*topics: BrokerTopic, brokers=1, extra_names=()) -> BrokerSnapshot:
    return BrokerSnapshot(
        broker_count=brokers,
        topics={t.name: t for t in topics},
        all_topic_names=frozenset([t.name for t in topics] + list(extra_names)),
    )


def on_broker(name="a.b", partitions=3, rf=1, configs=None, overridden=()) -> BrokerTopic:
    base = {"cleanup.policy": "delete", "retention.ms": "604800000"}
    base.update(configs or {})
    return BrokerTopic(name=name, partitions=partitions, replication_factor=rf, configs=base, overridden=frozenset(overridden))


def test_missing_topic_is_created_with_its_configs():
    plan = plan_topics([spec(retention_ms=1000)], broker(), report_unmanaged=True)
    (topic,) = plan.topics
    assert topic.actions == [Action.CREATE]
    assert topic.configs_desired == {"retention.ms": "1000"}
    assert topic.details() == "3 partitions, replication factor 1, retention.ms=1000"


def test_matching_topic_is_no_change():
    current = on_broker(configs={"retention.ms": "1000"}, overridden={"retention.ms"})
    plan = plan_topics([spec(retention_ms=1000)], broker(current), report_unmanaged=True)
    assert plan.topics[0].actions == [Action.NO_CHANGE]
    assert plan.to_change == []
    assert plan.summary() == "1 no change"


def test_config_drift_is_planned_as_alter_with_both_values():
    current = on_broker(configs={"retention.ms": "5"}, overridden={"retention.ms"})
    (topic,) = plan_topics([spec(retention_ms=1000)], broker(current), report_unmanaged=False).topics
    assert topic.actions == [Action.ALTER_CONFIGS]
    assert topic.config_changes == [ConfigChange(key="retention.ms", current="5", desired="1000")]
    assert topic.details() == "retention.ms: '5' -> '1000'"


def test_override_not_in_catalog_is_reset_to_the_default():
    current = on_broker(configs={"segment.ms": "100"}, overridden={"segment.ms"})
    (topic,) = plan_topics([spec()], broker(current), report_unmanaged=False).topics
    assert topic.config_changes == [ConfigChange(key="segment.ms", current="100", desired=None)]


def test_cleanup_policy_order_does_not_count_as_drift():
    current = on_broker(configs={"cleanup.policy": "delete,compact"}, overridden={"cleanup.policy"})
    (topic,) = plan_topics([spec(cleanup_policy="compact,delete")], broker(current), report_unmanaged=False).topics
    assert topic.actions == [Action.NO_CHANGE]


def test_partition_increase_and_config_change_together():
    current = on_broker(partitions=2, configs={"retention.ms": "5"}, overridden={"retention.ms"})
    (topic,) = plan_topics([spec(partitions=4, retention_ms=1000)], broker(current), report_unmanaged=False).topics
    assert topic.actions == [Action.ADD_PARTITIONS, Action.ALTER_CONFIGS]
    assert topic.details() == "partitions 2 -> 4; retention.ms: '5' -> '1000'"


def test_partition_decrease_is_refused_and_nothing_else_is_planned_for_that_topic():
    current = on_broker(partitions=6, configs={"retention.ms": "5"}, overridden={"retention.ms"})
    (topic,) = plan_topics([spec(partitions=3, retention_ms=1000)], broker(current), report_unmanaged=False).topics
    assert topic.actions == [Action.REFUSED]
    assert not topic.changes_broker
    assert topic.refusals == [
        "partitions 6 -> 3 refused: Kafka cannot remove partitions (it would drop their data and move "
        "keys to other partitions); set the catalog back to 6, or create a new topic and migrate"
    ]


def test_replication_factor_change_is_refused():
    (topic,) = plan_topics([spec(rf=1)], broker(on_broker(rf=3), brokers=3), report_unmanaged=False).topics
    assert topic.refusals == [
        "replication factor 3 -> 1 refused: that needs a partition reassignment "
        "(kafka-reassign-partitions), which this DAG does not do"
    ]


def test_creating_with_more_replicas_than_brokers_is_refused():
    (topic,) = plan_topics([spec(rf=3)], broker(brokers=1), report_unmanaged=False).topics
    assert topic.actions == [Action.REFUSED]
    assert topic.refusals == ["replication factor 3 needs at least 3 brokers; the cluster has 1"]


def test_topics_not_in_catalog_are_reported_only_on_full_runs():
    snapshot = broker(on_broker(), extra_names=["legacy.orders"])
    assert plan_topics([spec()], snapshot, report_unmanaged=True).unmanaged_topics == ["legacy.orders"]
    assert plan_topics([spec()], snapshot, report_unmanaged=False).unmanaged_topics == []
    table = plan_topics([spec()], snapshot, report_unmanaged=True).table()
    assert "legacy.orders  not in catalog  left alone (never deleted)" in table


def test_only_changes_that_delete_records_sooner_are_data_loss_risks():
    topics = [
        on_broker("t.shorter", configs={"retention.ms": "604800000"}, overridden={"retention.ms"}),
        on_broker("t.longer", configs={"retention.ms": "1000"}, overridden={"retention.ms"}),
        on_broker("t.forever", configs={"retention.bytes": "-1"}, overridden={"retention.bytes"}),
        on_broker("t.removed", configs={"retention.ms": "604800000"}, overridden={"retention.ms"}),
        on_broker("t.compacted"),
        on_broker("t.segment", configs={"segment.ms": "100"}, overridden={"segment.ms"}),
        on_broker("t.unlimited", configs={"retention.ms": "1000"}, overridden={"retention.ms"}),
    ]
    specs = [spec("t.shorter", retention_ms=3600000), spec("t.longer", retention_ms=604800000),
             spec("t.forever", retention_bytes=1000000), spec("t.removed"), spec("t.compacted", cleanup_policy="compact,delete"),
             spec("t.segment", segment_ms=200), spec("t.unlimited", retention_ms=-1)]
    plan = plan_topics(specs, broker(*topics), report_unmanaged=False)
    assert plan.data_loss_risks() == [
        "t.shorter: retention.ms '604800000' -> '3600000'",
        "t.forever: retention.bytes '-1' -> '1000000'",
        "t.removed: retention.ms override '604800000' removed (the broker default may be shorter)",
        "t.compacted: cleanup.policy 'delete' -> 'compact,delete' deletes records the topic keeps now",
    ]
    # Compaction's records under retention, a removed policy (the broker's default is delete),
    # tombstones kept for less time: each deletes what the topic keeps now.
    compacted = [on_broker("t.c1", configs={"cleanup.policy": "compact"}, overridden={"cleanup.policy"}),
                 on_broker("t.c2", configs={"cleanup.policy": "compact", "delete.retention.ms": "86400000"},
                           overridden={"cleanup.policy", "delete.retention.ms"})]
    plan = plan_topics([spec("t.c1", cleanup_policy="delete"), spec("t.c2", cleanup_policy="compact", delete_retention_ms=1000)],
                       broker(*compacted), report_unmanaged=False)
    assert plan.data_loss_risks() == ["t.c1: cleanup.policy 'compact' -> 'delete' deletes records the topic keeps now",
                                      "t.c2: delete.retention.ms '86400000' -> '1000'"]
    removed = plan_topics([spec("t.c1")], broker(compacted[0]), report_unmanaged=False)
    assert removed.data_loss_risks() == [
        "t.c1: cleanup.policy override 'compact' removed (the broker default, delete, may apply)"]
    assert plan_topics([spec("t.new", retention_ms=1)], broker(), report_unmanaged=False).data_loss_risks() == []
