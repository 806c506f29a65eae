"""streamops.effective_spec and the checkpoint's cluster (streamops.checkpoints) without a broker: the
approved topic bindings a cutover leaves (composed, refused when unreadable), the catalog as the app
runs it, drift field by field with its cause and the catalog edit that commits it, and a checkpoint
that refuses a launch against another Kafka cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamops.app_runtime import AppRuntime, LaunchRecord
from streamops.catalog import load_catalog
from streamops.checkpoints import (
    CLUSTER_FILE,
    CheckpointOfAnotherCluster,
    backup_checkpoint,
    bind_cluster,
    checkpoint_cluster,
    cluster_problem,
    restore_checkpoint,
)
from streamops.effective_spec import (
    SpecRefused,
    approve_topics,
    bind_app,
    declared_spec,
    drift,
    effective_catalog,
    read_approved,
    with_bindings,
)
from streamops.runtime_files import write_json_atomic

ROUTER = "oplog-router"


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    """The shipped catalog with its checkpoints under tmp_path."""
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    return load_catalog()


def cutover_targets(catalog) -> dict[str, str]:
    app = catalog.app(ROUTER)
    return {t: f"{t}.v2" for t in [*app.outputs.values(), app.dead_letter_topic]}


def runtime_of(catalog) -> AppRuntime:
    return AppRuntime(catalog.app(ROUTER).checkpoint_location())


def launched(runtime: AppRuntime, spec: dict) -> None:
    """driver.json as a driver writes it, with the launch record a launcher gave it."""
    runtime.dir.mkdir(parents=True, exist_ok=True)
    version = spec.get("version", "1.0.0")
    write_json_atomic(runtime.driver_file, {"app": ROUTER, "version": version, "pid": 1, "started_at": "2026-11-27T10:00:00Z",
                                            "launch": LaunchRecord(version=version, spark_conf={}, spec=spec or None).to_json()})


def test_a_cutover_is_approved_once_and_composed_with_the_next(catalog):
    runtime = runtime_of(catalog)
    assert read_approved(runtime).topics == {}
    first = approve_topics(runtime, {"a": "a.v2", "b": "b.v2"}, run_id="r1", by="alice")
    assert first.topics == {"a": "a.v2", "b": "b.v2"}
    second = approve_topics(runtime, {"a.v2": "a.v3", "b.v2": "b.v3"}, run_id="r2", by=None)
    # Whether the catalog still names a or already names a.v2 (the first cutover committed), the app runs a.v3.
    assert second.topics == {"a": "a.v3", "b": "b.v3", "a.v2": "a.v3", "b.v2": "b.v3"}
    assert [(c.run_id, c.by, c.topics) for c in read_approved(runtime).history] == [
        ("r1", "alice", {"a": "a.v2", "b": "b.v2"}), ("r2", None, {"a.v2": "a.v3", "b.v2": "b.v3"})]


def test_an_unreadable_approval_file_is_a_refusal_never_no_approvals(catalog):
    runtime = runtime_of(catalog)
    runtime.dir.mkdir(parents=True)
    (runtime.dir / "approved.json").write_text('{"topics": {"a": 7}}')
    with pytest.raises(SpecRefused,
                       match=r"approved\.json \(the approved changes every launch of the app keeps.*nothing was started"):
        read_approved(runtime)
    (runtime.dir / "approved.json").write_text('{"topics": {"a": "../../etc"}}')  # never a topic
    with pytest.raises(SpecRefused, match="should match pattern"):
        read_approved(runtime)


def test_the_app_runs_its_approved_topics_and_the_catalog_edit_commits_them(catalog):
    targets = cutover_targets(catalog)
    approve_topics(runtime_of(catalog), targets, run_id="reprocess__1", by="alice")
    bound = bind_app(catalog, ROUTER)
    app = catalog.app(ROUTER)
    assert bound.app.outputs == {role: targets[t] for role, t in app.outputs.items()}
    assert bound.app.dead_letter_topic == targets[app.dead_letter_topic]
    assert bound.app.inputs == app.inputs and bound.app.checkpoint_location() == app.checkpoint_location()
    assert set(bound.approved) == {*(f"outputs.{role}" for role in app.outputs), "dead_letter_topic"}
    assert bound.approved["outputs.contacts"] == "the cutover by run reprocess__1 (alice)"
    # The driver reads the bound catalog: new topics declared as copies, other apps untouched.
    written = load_catalog(bound.catalog_file)
    assert written.app(ROUTER).outputs == bound.app.outputs
    assert written.topic(targets[app.outputs["contacts"]]).partitions == catalog.topic(app.outputs["contacts"]).partitions
    assert written.app("presence-notifier") == catalog.app("presence-notifier")
    # Once the catalog names the new topics, the approval is spent: nothing is renamed twice.
    edited = with_bindings(catalog, ROUTER, targets)
    assert with_bindings(edited, ROUTER, targets).app(ROUTER) == edited.app(ROUTER)
    assert effective_catalog(catalog, ROUTER).app(ROUTER).outputs == bound.app.outputs


def test_drift_field_by_field_with_its_cause(catalog):
    runtime = runtime_of(catalog)
    declared = declared_spec(catalog, ROUTER, principal=None, kafka_cluster="cluster-A")
    assert drift(catalog, ROUTER, runtime, principal=None, kafka_cluster="cluster-A").state == "not running"

    launched(runtime, declared.to_record())
    in_sync = drift(catalog, ROUTER, runtime, principal=None, kafka_cluster="cluster-A")
    assert (in_sync.state, in_sync.fields, in_sync.catalog_edit) == ("in sync", [], "")
    assert in_sync.line() == f"{ROUTER}: in sync" and in_sync.running_digest == declared.digest()

    # A cutover (approved) and a catalog edit of the Spark conf since the launch.
    targets = cutover_targets(catalog)
    approve_topics(runtime, targets, run_id="reprocess__1", by="alice")
    bound = bind_app(catalog, ROUTER)
    spec = bound.spec(version="1.0.0+v2", spark_conf={}, code=declared.code, principal=None, kafka_cluster="cluster-A")
    launched(runtime, spec.to_record())
    router = catalog.app(ROUTER)
    edited = catalog.model_copy(update={"apps": [
        a.model_copy(update={"spark_conf": {**a.spark_conf, "spark.sql.shuffle.partitions": 8}}) if a.name == ROUTER else a
        for a in catalog.apps]})
    found = drift(edited, ROUTER, runtime, principal=None, kafka_cluster="cluster-A")
    by_field = {f.field: f for f in found.fields}
    assert found.state == "drifted"
    assert by_field["outputs.contacts"].cause == "approved"
    assert by_field["outputs.contacts"].running == targets[router.outputs["contacts"]]
    assert "the cutover by run reprocess__1 (alice)" in by_field["outputs.contacts"].note
    version = by_field["version"]
    assert (version.declared, version.running, version.cause) == ("1.0.0", "1.0.0+v2", "approved")
    shuffle_partitions = by_field["spark_conf.spark.sql.shuffle.partitions"]
    assert (shuffle_partitions.declared, shuffle_partitions.running, shuffle_partitions.cause) == ("8", "4", "catalog")
    assert ("spark_conf.spark.sql.shuffle.partitions: the catalog says 8, it runs 4 (the catalog changed since the launch)"
            in found.line())
    # The edit names every approved change and the topics to declare; not the catalog's own change.
    edit = found.catalog_edit
    assert f"-    contacts: {router.outputs['contacts']}" in edit
    assert f"+    contacts: {targets[router.outputs['contacts']]}" in edit
    assert "+  version: 1.0.0+v2" in edit and "shuffle" not in edit
    assert f"declare the topic(s) {', '.join(sorted(targets.values()))} under topics:" in edit

    # Against another cluster, and a launch from before specs were recorded.
    assert "kafka_cluster" in {f.field for f in drift(catalog, ROUTER, runtime, principal=None, kafka_cluster="cluster-B").fields}
    launched(runtime, {})
    unknown = drift(catalog, ROUTER, runtime, principal=None, kafka_cluster="cluster-A")
    assert unknown.state == "unknown" and "before launches recorded their spec" in unknown.evidence


def test_a_checkpoint_knows_its_cluster_and_refuses_another(tmp_path: Path):
    from tests.unit.streamops.test_checkpoints import commit_batch, new_query, plan_batch

    checkpoint = tmp_path / "cp"
    bind_cluster("app", checkpoint, "cluster-A", "127.0.0.1:9092")  # a new checkpoint: bound
    assert checkpoint_cluster(checkpoint)["cluster_id"] == "cluster-A"
    bind_cluster("app", checkpoint, "cluster-B", "127.0.0.2:9092")  # no offsets yet: bound again
    assert checkpoint_cluster(checkpoint)["cluster_id"] == "cluster-B"
    query = new_query(checkpoint, "route")
    plan_batch(query, 0, {"t": {"0": 6}})
    commit_batch(query, 0)
    assert cluster_problem("app", checkpoint, "cluster-B", "127.0.0.2:9092") is None
    with pytest.raises(CheckpointOfAnotherCluster) as refused:
        bind_cluster("app", checkpoint, "cluster-C", "127.0.0.3:9093")
    text = str(refused.value)
    assert f"app's checkpoint ({checkpoint}) was written against Kafka cluster cluster-B (127.0.0.2:9092)" in text
    assert "this environment's cluster is cluster-C (127.0.0.3:9093)" in text
    assert "$STREAMOPS_CHECKPOINT_ROOT" in text and "recover_rebuild_state" in text
    # The cluster travels with the checkpoint's snapshots, and comes back with a restore.
    snapshot = backup_checkpoint(checkpoint, "test")
    assert json.loads((snapshot / CLUSTER_FILE).read_text())["cluster_id"] == "cluster-B"
    (checkpoint / CLUSTER_FILE).unlink()
    restore_checkpoint(checkpoint, snapshot)
    assert checkpoint_cluster(checkpoint)["cluster_id"] == "cluster-B"
