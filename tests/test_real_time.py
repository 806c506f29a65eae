"""The router in Spark's real-time mode through the suite's own lifecycle: deploy, kill -9 and
recover_restart_app, roll_restart_apps under load, status and lag, offsets in the consumer
group, a graceful stop at a checkpoint, and recover_reset_offsets; zero loss throughout."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime

import pytest
from confluent_kafka import TopicPartition

from streamops.app_status import app_status
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import read_all
from streamops.loadgen import LoadSpec, background_load
from streamops.loadgen import run as run_load
from streamops.waiting import poll_until
from tests.support.artifacts import same_code_as
from tests.support.routes import routed, wait_until_all_routed


@pytest.fixture
def real_time_env(app_env, app_catalog):
    """app_env with the router on trigger: real-time (checkpoints every 5 seconds)."""
    catalog_file, runtime = app_env
    apps = [a.model_copy(update={"trigger": "real-time", "checkpoint_interval": "5 seconds"}) if a.name == "oplog-router"
            else a for a in app_catalog.apps]
    catalog = app_catalog.model_copy(update={"apps": apps})
    catalog_file.write_text(catalog.to_yaml())
    return catalog_file, runtime, catalog.app("oplog-router")


def test_max_offsets_per_trigger_bounds_every_batch_of_a_catch_up(spark, broker, app_catalog, tmp_path):
    """Back pressure from the catalog: a backlog is taken in batches of at most the limit (here an
    available-now run, as backfills and rebuilds run), and every record is still routed."""
    from tests.support.apps import run_available_now

    apps = [a.model_copy(update={"max_offsets_per_trigger": 100}) if a.name == "oplog-router" else a for a in app_catalog.apps]
    bounded = app_catalog.model_copy(update={"apps": apps})
    spec = bounded.app("oplog-router")
    run_load(spec, LoadSpec(count=450, keys=20, seed=33), broker.client_config)
    (query,) = run_available_now(spark, bounded, "oplog-router", broker, tmp_path / "ckpt")
    sizes = [p.numInputRows for p in query.recentProgress if p.numInputRows]
    assert sum(sizes) == 450 and max(sizes) <= 100 and len(sizes) >= 5, sizes
    expected, _ = wait_until_all_routed(broker.client_config, spec, timeout=60)
    assert expected


def committed_offsets(broker, topic: str, partitions: int) -> dict[int, int]:
    consumer = broker.client_config.consumer("streamops.oplog-router")
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def test_the_real_time_router_through_its_whole_lifecycle_loses_nothing(run_dag, real_time_env, broker):
    catalog_file, runtime, spec = real_time_env
    source = spec.inputs["operations"]
    deployed = run_dag("deploy_apps", catalog_file, apps=["oplog-router"], version="1.0.0")
    assert deployed.state == "success", deployed.task_states
    record = runtime.driver()
    # Six input partitions: spark_default's local[2] became local[6] (one long-lived task each).
    assert (record.trigger, record.checkpoint_interval, record.spark_master) == ("real-time", "5 seconds", "local[6]")

    with background_load(spec, LoadSpec(count=10_000_000, keys=40, rate=300, seed=31), broker.client_config) as load:
        poll_until(lambda: (p := runtime.progress().get("route")) is not None and p.input_rows > 0, timeout=120,
                   what="a real-time checkpoint with data")
        dead = runtime.driver()
        os.kill(dead.pid, signal.SIGKILL)  # mid-stream: records since the last checkpoint are in flight
        poll_until(lambda: not runtime.is_running(), timeout=30, what="the lock to be released")
        assert runtime.state() == "crashed"
        restarted = run_dag("recover_restart_app", catalog_file, app="oplog-router", dry_run=False)
        assert restarted.state == "success", restarted.task_states
        assert runtime.driver().pid != dead.pid and runtime.driver().trigger == "real-time"

        same_code_as(spec, "1.1.0")
        rolled = run_dag("roll_restart_apps", catalog_file, apps=["oplog-router"], version="1.1.0", gate_deadline_s=120)
        assert rolled.state == "success", rolled.task_states
        assert load.is_alive(), "the load ended before the roll: it was not a roll under load"
    (summary,) = rolled.xcoms["roll"]
    assert (summary["version"], summary["previous_version"]) == ("1.1.0", "1.0.0")
    assert runtime.driver().version == "1.1.0" and runtime.driver().trigger == "real-time"
    routing = wait_until_all_routed(broker.client_config, spec)
    expected, duplicates = routing.expected, routing.duplicates
    print(f"real-time router, kill -9 + recover_restart_app + roll under load: {len(expected)} routed records, none lost, "
          f"{duplicates} duplicates; roll downtime {summary['downtime_s']} s")

    # Status and lag come from its checkpoints; its consumer group has what it processed.
    ends = {p: high for p, (_, high) in end_offsets(broker.client_config, source).items()}
    poll_until(lambda: sum(lag.lag for lag in app_status(spec, broker.client_config).lags) == 0, timeout=60,
               what="status to show no lag once a checkpoint covers everything")
    status = run_dag("app_status", catalog_file, apps=["oplog-router"]).xcoms["status"]["oplog-router"]
    assert (status["state"], status["version"], status["total_lag"]) == ("running", "1.1.0", 0)
    assert status["health"]["state"] == "healthy", status["health"]
    assert committed_offsets(broker, source, len(ends)) == ends

    # Records written after a cut, routed live; then a graceful stop, which ends right after a checkpoint.
    cut_ms = max(r.timestamp_ms for r in read_all(broker.client_config, source)) + 1
    poll_until(lambda: time.time() * 1000 > cut_ms + 1, timeout=5, what="the clock to pass the cut")
    run_load(spec, LoadSpec(count=200, keys=20, seed=32, start_seq=50_000_000), broker.client_config)
    after_cut = {f"{r.topic}/{r.partition}/{r.offset}"
                 for r in read_all(broker.client_config, source) if r.timestamp_ms >= cut_ms}
    assert len(after_cut) == 200
    expected, _ = wait_until_all_routed(broker.client_config, spec)
    routed_before = Counter(routed(broker.client_config, spec))
    runtime.request_stop(by="test")
    poll_until(lambda: not runtime.is_running(), timeout=120, what="the driver to stop")
    assert runtime.state() == "stopped"
    assert runtime.driver().reason.startswith("stop requested by test; oplog-router.route: stopped right after checkpoint ")

    # Reset to the cut: the real-time checkpoint goes back, and exactly those 200 records are routed again.
    reset = run_dag("recover_reset_offsets", catalog_file, app="oplog-router", mode="datetime",
                    to_datetime=datetime.fromtimestamp(cut_ms / 1000, tz=UTC).isoformat(), dry_run=False)
    assert reset.state == "success", reset.task_states
    assert reset.xcoms["plan"]["replayed"] == 200 and runtime.driver().trigger == "real-time"
    again = Counter({pair: 1 for pair in expected if pair[0] in after_cut})
    poll_until(lambda: Counter(routed(broker.client_config, spec)) - routed_before == again, timeout=180,
               what="the records after the cut to be routed again, each once")
    runtime.request_stop(by="test")
    poll_until(lambda: not runtime.is_running(), timeout=120, what="the driver to stop")
