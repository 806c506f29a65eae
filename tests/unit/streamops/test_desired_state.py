"""streamops.desired_state without a broker: what the reconcile plan does with each kind of drift
(in sync, stopped, only approved changes, other inputs, another cluster, a stateful plan the new
values change, a roll that keeps the approved changes), the policies, and a failed roll that is
not tried again until the catalog entry changes."""

from __future__ import annotations

import pytest

from streamops.app_runtime import AppRuntime
from streamops.catalog import load_catalog
from streamops.desired_state import SyncPlan, plan_sync, record_roll_outcome
from streamops.effective_spec import approve_topics, bind_app, declared_spec

ROUTER, NOTIFIER = "oplog-router", "presence-notifier"
CLUSTER = "cluster-A"


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    return load_catalog()


def running(catalog, name: str, *, version: str | None = None, spark_conf: dict | None = None,
            stateful: dict | None = None) -> AppRuntime:
    """The app running here (this process holds its lease) with the spec a launch of the catalog
    entry (with its approved changes) records."""
    from streamops.app_runtime import LaunchRecord

    app = catalog.app(name)
    bound = bind_app(catalog, name)
    spec = bound.spec(version=version or app.version, spark_conf=spark_conf or {},
                      code=declared_spec(catalog, name, principal=None, kafka_cluster=CLUSTER).code,
                      principal=None, kafka_cluster=CLUSTER)
    runtime = AppRuntime(app.checkpoint_location())
    runtime.acquire({"app": name, "version": spec.version, "stateful_operators": stateful or {},
                     "launch": LaunchRecord(version=spec.version, spark_conf=spark_conf or {}, spec=spec.to_record()).to_json()})
    return runtime


def edited(catalog, name: str, **changes):
    return catalog.model_copy(update={"apps": [a.model_copy(update=changes) if a.name == name else a for a in catalog.apps]})


def plan(catalog, names, *, state_check=None, on_demand=False) -> dict:
    the_plan = plan_sync(catalog, names, principal_of=lambda _app: None, kafka_cluster=CLUSTER,
                         state_check_of=state_check or (lambda *_: pytest.fail("no stateless app is checked by Spark")),
                         on_demand=on_demand)
    assert SyncPlan.from_json(the_plan.to_json()).items == the_plan.items  # what the apply reads back
    return {i.app: i for i in the_plan.items}


def test_in_sync_stopped_and_never_started_apps_need_nothing(catalog):
    router = running(catalog, ROUTER)
    items = plan(catalog, [ROUTER, NOTIFIER])
    assert (items[ROUTER].action, items[ROUTER].reason) == ("none", "in sync")
    assert (items[NOTIFIER].action, items[NOTIFIER].reason) == ("none", "not running: never started here")
    router.release("stopped", "asked")
    changed = edited(catalog, ROUTER, spark_conf={"spark.sql.shuffle.partitions": 3})
    stopped = plan(changed, [ROUTER])[ROUTER]
    assert stopped.action == "none" and stopped.reason.startswith("stopped: its next start")


def test_a_catalog_change_rolls_per_policy_keeping_what_was_approved(catalog):
    approve_topics(AppRuntime(catalog.app(ROUTER).checkpoint_location()), {catalog.app(ROUTER).outputs["contacts"]: "x.v2"},
                   run_id="cutover_1", by="alice")
    running(catalog, ROUTER, version="1.0.0+v2", spark_conf={"spark.driver.memory": "2g"})
    # Only approved changes differ: a decision, never a roll.
    (decide,) = plan(catalog, [ROUTER]).values()
    assert decide.action == "decide" and "reconcile never undoes them" in decide.reason
    assert "+    contacts: x.v2" in decide.catalog_edit
    # A Spark conf edit: a roll that keeps the running version and the launch's conf.
    changed = edited(catalog, ROUTER, spark_conf={**catalog.app(ROUTER).spark_conf, "spark.sql.shuffle.partitions": 3})
    (roll,) = plan(changed, [ROUTER]).values()
    assert (roll.action, roll.policy, roll.version, roll.spark_conf) == (
        "roll", "report", "1.0.0+v2", {"spark.driver.memory": "2g"})
    assert "keeping the approved" in roll.reason and "policy report: shown only" in roll.reason and not roll.applied
    the_plan = plan_sync(changed, [ROUTER], principal_of=lambda _: None, kafka_cluster=CLUSTER, state_check_of=lambda *_: None,
                         on_demand=False)
    assert the_plan.approval_not_needed == "Nothing in this plan needs an approval: no roll is planned."
    # By hand, report counts as approve; under policy auto, no approval is needed.
    assert plan(changed, [ROUTER], on_demand=True)[ROUTER].policy == "approve"
    auto = edited(changed, ROUTER, reconcile="auto")
    auto_plan = plan_sync(auto, [ROUTER], principal_of=lambda _: None, kafka_cluster=CLUSTER, state_check_of=lambda *_: None,
                          on_demand=True)
    assert auto_plan.rolls("auto")[0].app == ROUTER
    assert auto_plan.approval_not_needed.endswith("oplog-router roll(s) without one (policy auto).")


def test_what_a_roll_cannot_carry_is_refused_with_the_way_forward(catalog):
    router = running(catalog, ROUTER)
    other_inputs = edited(catalog, ROUTER, inputs={"operations": "somewhere.else"})
    (inputs,) = plan(other_inputs, [ROUTER]).values()
    assert inputs.action == "refuse" and "changes the topics it reads" in inputs.reason
    assert "recover_rebuild_state" in inputs.reason
    elsewhere = plan_sync(catalog, [ROUTER], principal_of=lambda _: None, kafka_cluster="cluster-B",
                          state_check_of=lambda *_: None, on_demand=False).items[0]
    assert elsewhere.action == "refuse" and "another Kafka cluster" in elsewhere.reason
    router.release("stopped", "asked")

    running(catalog, NOTIFIER, stateful={"notify": ["groupBy(user_id).flatMapGroupsWithState"]})
    wider = edited(catalog, NOTIFIER, settings={**catalog.app(NOTIFIER).settings, "count_window": "11 minutes"})
    asked = []
    refusal = "query 'count': setting count_window changes from 10 minutes to 11 minutes"
    (stateful,) = plan(wider, [NOTIFIER], state_check=lambda *args: asked.append(args) or [refusal]).values()
    assert asked == [(NOTIFIER, catalog.app(NOTIFIER).version, {})]
    assert stateful.action == "refuse"
    assert stateful.reason.startswith(f"a state-incompatible change ({refusal}): its state cannot carry over")
    assert "reprocess it" in stateful.reason and "rebuild its state (recover_rebuild_state)" in stateful.reason
    (unjudged,) = plan(wider, [NOTIFIER], state_check=lambda *_: None).values()
    assert unjudged.action == "refuse" and "Spark's check of the new values against the checkpoint could not run" in \
        unjudged.reason
    (compatible,) = plan(wider, [NOTIFIER], state_check=lambda *_: []).values()
    assert compatible.action == "roll"


def test_a_failed_roll_is_not_tried_again_until_the_entry_changes(catalog):
    runtime = running(catalog, ROUTER)
    changed = edited(catalog, ROUTER, spark_conf={**catalog.app(ROUTER).spark_conf, "spark.sql.shuffle.partitions": 3})
    (roll,) = plan(changed, [ROUTER]).values()
    record_roll_outcome(runtime, roll, "reconcile_1", "rolling restart failed: version 1.0.0 failed its health gate")
    (again,) = plan(changed, [ROUTER]).values()
    assert again.action == "refuse" and "the last reconcile roll onto this catalog entry failed (run reconcile_1" in again.reason
    other = edited(catalog, ROUTER, spark_conf={**catalog.app(ROUTER).spark_conf, "spark.sql.shuffle.partitions": 2})
    assert plan(other, [ROUTER])[ROUTER].action == "roll"  # the entry changed: tried again
    record_roll_outcome(runtime, roll, "reconcile_2", None)
    assert plan(changed, [ROUTER])[ROUTER].action == "roll"
