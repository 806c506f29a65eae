"""Desired state on real components (README "Desired state and drift"): a checkpoint knows the Kafka
cluster it was written against, so a stateful app deployed on one broker, stopped, and deployed
again against another cluster is refused with the reason (never started into a crash loop), and
status names the cause."""

from __future__ import annotations

import json

from streamops.kafka_records import produce


def test_a_stateful_app_deployed_against_another_cluster_is_refused_and_held_never_crash_looped(
    run_dag, app_env, app_catalog, broker, tmp_path, monkeypatch, capfd
):
    from tests.support.ports import free_port_pair

    from streamops.app_runtime import AppRuntime
    from streamops.checkpoints import checkpoint_cluster, positions
    from streamops.local_stack.broker import LocalBroker
    from streamops.provisioning import ensure_topics
    from streamops.waiting import poll_until

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
                           '{"conn_type": "kafka", "extra": {"bootstrap.servers": "%s"}}' % other.bootstrap_servers)
        capfd.readouterr()
        refused = run_dag("deploy_apps", catalog_file, apps=["presence-notifier"])
        said = capfd.readouterr().out + capfd.readouterr().err
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
