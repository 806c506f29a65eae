"""Desired state on real components (docs/architecture.md "Desired state and drift"): a checkpoint knows the Kafka
cluster it was written against, so a stateful app deployed on one broker, stopped, and deployed
again against another cluster is refused with the reason (never started into a crash loop), and
status names the cause."""

from __future__ import annotations

import json

from streamops.kafka_records import produce


def test_a_stateful_app_deployed_against_another_cluster_is_refused_and_held_never_crash_looped(
    run_dag, app_env, app_catalog, broker, tmp_path, monkeypatch, capfd, caplog
):
    from streamops.app_runtime import AppRuntime
    from streamops.checkpoints import checkpoint_cluster, positions
    from streamops.local_stack.broker import LocalBroker
    from streamops.provisioning import ensure_topics
    from streamops.waiting import poll_until
    from tests.support.ports import free_port_pair

    catalog_file, _ = app_env
    spec = app_catalog.app("presence-notifier")
    runtime = AppRuntime(spec.checkpoint_location())
    assert run_dag("deploy_apps", catalog_file, apps=["presence-notifier"]).state == "success"
    event = {"seq": 1, "user_id": "u1", "action": "Close", "event_time": "2026-01-01T00:10:00Z"}
    produce(broker.client_config, spec.inputs["events"], [("u1", json.dumps(event))], partition=0)
    poll_until(lambda: any(p.batch is not None and p.offsets for p in positions(runtime.checkpoint).values()),
               timeout=180, what="the notifier to commit a batch on the first broker")
    assert run_dag("stop_apps", catalog_file, apps=["presence-notifier"]).state == "success"
    first_cluster = checkpoint_cluster(runtime.checkpoint)["cluster_id"]

    # Another cluster (a broker of its own: another cluster id) with the same topics, as a new
    # environment would have; the same checkpoint root.
    other = LocalBroker(state_dir=tmp_path / "other-kafka", port=free_port_pair())
    other.start()
    try:
        from confluent_kafka.admin import AdminClient

        from streamops.kafka_client import KafkaClientConfig

        ensure_topics(AdminClient({"bootstrap.servers": other.bootstrap_servers}), app_catalog.topics)
        monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT",
                           json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": other.bootstrap_servers}}))
        capfd.readouterr()
        caplog.clear()
        refused = run_dag("deploy_apps", catalog_file, apps=["presence-notifier"])
        said = "".join(capfd.readouterr()) + caplog.text  # where a task's log goes depends on the process
        assert refused.state == "failed" and not runtime.is_running()
        assert (f"presence-notifier's checkpoint ({runtime.checkpoint}) was written against Kafka cluster {first_cluster} "
                f"({broker.bootstrap_servers})") in said
        other_id = KafkaClientConfig.plaintext(other.bootstrap_servers).cluster_id()
        assert other_id != first_cluster and f"this environment's cluster is {other_id} ({other.bootstrap_servers})" in said
        assert "recover_rebuild_state" in said and "nothing was started" in said
        assert runtime.driver().stopped_at and runtime.driver().outcome == "stopped"  # the first broker's stop, untouched

        # The supervisor holds it with the reason: it never restarts it into the same failure.
        runtime.set_desired("running", run_id="test", by="test")  # as if it had been asked to run
        status = run_dag("app_status", catalog_file, apps=["presence-notifier"])
        health = status.xcoms["status"]["presence-notifier"]["health"]
        assert health["state"] == "held" and health["action"] is None
        assert f"was written against Kafka cluster {first_cluster}" in health["evidence"]
        assert "The supervisor does not start it." in health["evidence"]
        assert runtime.restarts() == [] and not runtime.is_running()
    finally:
        other.stop()


def routed(seq: int, user: str) -> tuple[str, str]:
    return user, json.dumps({"seq": seq, "user_id": user, "op_type": "SEND_MESSAGE", "event_time": "2026-11-27T03:00:00.000Z"})


def test_a_catalog_edit_shows_as_drift_and_reconcile_rolls_it_out_or_refuses_it_with_the_reason(
    run_dag, app_env, app_catalog, broker, tmp_path, monkeypatch, capfd, caplog
):
    """The catalog changes the router's version (an artifact of other code) and Spark conf, and the
    notifier's window (state-incompatible). Drift shows it on every surface; reconcile rolls the
    router onto the new version's artifact and refuses the notifier's change with the reason, the
    notifier untouched; then, under policy auto, a compatible change rolls without an approval."""
    import yaml
    from fastapi.testclient import TestClient

    from streamops.app_runtime import AppRuntime
    from streamops.apps_page import app_rows, rows_as_json
    from streamops.artifacts import build
    from streamops.audit import read_audit
    from streamops.catalog import load_catalog
    from streamops.kafka_records import read_all
    from streamops.metrics import metrics_app
    from streamops.waiting import poll_until
    from tests.support.artifacts import private_store, router_source

    catalog_file, router_runtime = app_env
    kafka = broker.client_config
    private_store(tmp_path, monkeypatch)  # 1.1.0 here is other code than the run's 1.1.0 label
    notifier_runtime = AppRuntime(app_catalog.app("presence-notifier").checkpoint_location())
    assert run_dag("deploy_apps", catalog_file, apps=["oplog-router", "presence-notifier"]).state == "success"
    v110, _ = build("oplog-router", "1.1.0", "spark_apps.oplog_router", source=router_source(tmp_path, "1.1.0"))
    notifier_pid = notifier_runtime.driver().pid

    def edit(**changes) -> None:
        data = yaml.safe_load(catalog_file.read_text())
        for entry in data["apps"]:
            for key, value in changes.get(entry["name"], {}).items():
                if key == "spark_conf" or key == "settings":
                    entry[key] = {**entry.get(key, {}), **value}
                else:
                    entry[key] = value
        catalog_file.write_text(yaml.safe_dump(data, sort_keys=False))

    edit(**{"oplog-router": {"version": "1.1.0", "spark_conf": {"spark.sql.shuffle.partitions": 3}, "reconcile": "approve"},
            "presence-notifier": {"settings": {"count_window": "11 minutes"}, "reconcile": "auto"}})
    monkeypatch.setenv("STREAMOPS_CATALOG", str(catalog_file))
    catalog = load_catalog(catalog_file)

    # Drift, field by field: the status run's log and result, the apps page's JSON, the metric.
    capfd.readouterr()
    caplog.clear()
    status = run_dag("app_status", catalog_file, apps=["oplog-router", "presence-notifier"])
    said = "".join(capfd.readouterr()) + caplog.text
    assert "oplog-router: drifted: version: the catalog says 1.1.0, it runs 1.0.0 (the catalog changed since the launch)" in said
    assert "spark_conf.spark.sql.shuffle.partitions: the catalog says 3, it runs 4" in said
    assert "presence-notifier: drifted: settings.count_window: the catalog says 11 minutes, it runs 10 minutes" in said
    drifted = {f["field"]: f for f in status.xcoms["status"]["oplog-router"]["drift"]["fields"]}
    version_drift = drifted["version"]
    assert (version_drift["declared"], version_drift["running"], version_drift["cause"]) == ("1.1.0", "1.0.0", "catalog")
    assert drifted["code"]["declared"] == v110.digest
    page = {row["app"]: row for row in rows_as_json(app_rows(catalog, kafka))}
    assert page["oplog-router"]["drift"]["state"] == "drifted"
    assert {f["field"] for f in page["oplog-router"]["drift"]["fields"]} == {
        "version", "code", "spark_conf.spark.sql.shuffle.partitions"}
    assert page["oplog-router"]["code"].startswith("sha256:")
    (tmp_path / "scrape-token").write_text("a-scrape-token\n")
    monkeypatch.setenv("STREAMOPS_METRICS_TOKEN_FILE", str(tmp_path / "scrape-token"))
    scraped = TestClient(metrics_app()).get("/metrics", headers={"Authorization": "Bearer a-scrape-token"}).text
    assert 'streamops_app_drift_fields{app="oplog-router"} 3.0' in scraped
    assert 'streamops_app_drift_fields{app="presence-notifier"} 1.0' in scraped

    # Reconcile (unattended: approval off, as from the API): the router rolls onto 1.1.0's artifact;
    # the notifier's window change cannot carry its state over: refused, the notifier untouched.
    capfd.readouterr()
    caplog.clear()
    reconciled = run_dag("reconcile_desired_state", catalog_file, gate_deadline_s=120)
    said = "".join(capfd.readouterr()) + caplog.text
    assert reconciled.state == "success", reconciled.task_states
    items = {i["app"]: i for i in reconciled.xcoms["plan"]["items"]}
    assert (items["oplog-router"]["action"], items["oplog-router"]["policy"], items["oplog-router"]["version"]) == (
        "roll", "approve", "1.1.0"), items["oplog-router"]["reason"]
    assert items["presence-notifier"]["action"] == "refuse"
    assert "a state-incompatible change" in items["presence-notifier"]["reason"]
    # Judged by the new values' driver on a copy of the checkpoint (its --check-state), not for want
    # of a verdict: Spark's check passes (a window's key schema is the same for every length), the
    # program's declared state setting does not.
    assert ("query 'count': setting count_window changes from 10 minutes to 11 minutes, and the state holds what 10 "
            "minutes made") in items["presence-notifier"]["reason"], items["presence-notifier"]
    assert "recover_rebuild_state" in items["presence-notifier"]["reason"] and "reprocess" in items["presence-notifier"]["reason"]
    assert "presence-notifier" in said and "refuse" in said
    assert router_runtime.driver().version == "1.1.0" and router_runtime.driver().code.digest == v110.digest
    assert router_runtime.driver().launch.spec["spark_conf"]["spark.sql.shuffle.partitions"] == "3"
    assert notifier_runtime.driver().pid == notifier_pid and notifier_runtime.is_running()
    assert reconciled.xcoms["verify"]["apps"]["oplog-router"]["state"] == "in sync"
    spec = catalog.app("oplog-router")
    produce(kafka, spec.inputs["operations"], [routed(seq, "after-reconcile") for seq in range(1, 6)])
    def records_after_reconcile() -> list:
        return [r for r in read_all(kafka, spec.outputs["messages"]) if r.json()["user_id"] == "after-reconcile"]

    poll_until(lambda: len(records_after_reconcile()) >= 5, timeout=120, what="the reconciled router's output")
    assert {r.json().get("code") for r in records_after_reconcile()} == {"1.1.0"}

    # Policy auto: a compatible change rolls without an approval, even in a run that waits for
    # approvals (nothing in its plan needs one), and is audited.
    edit(**{"oplog-router": {"spark_conf": {"spark.sql.shuffle.partitions": 2}, "reconcile": "auto"},
            "presence-notifier": {"settings": {"count_window": "10 minutes"}}})
    auto = run_dag("reconcile_desired_state", catalog_file, gate_deadline_s=120, approve_in_ui=True)
    assert auto.task_states == {"plan": "success", "roll_auto": "success", "approve": "skipped", "roll_approved": "skipped",
                                "verify": "success"}, auto.task_states
    assert router_runtime.driver().launch.spec["spark_conf"]["spark.sql.shuffle.partitions"] == "2"
    assert [(e["step"], e["outcome"], e["app"]) for e in read_audit(run_id=auto.run_id) if e["step"] == "roll"] == [
        ("roll", "done", "oplog-router")]
    assert notifier_runtime.driver().pid == notifier_pid  # in sync again: not touched
    assert run_dag("stop_apps", catalog_file, apps=["oplog-router", "presence-notifier"]).state == "success"
