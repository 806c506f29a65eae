"""Apps as operators run them: restarted mid-stream from the checkpoint, and via spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from spark_apps import oplog_router
from streamops.driver.options import RunOptions
from streamops.driver.queries import start_app
from streamops.kafka_records import end_offsets, produce
from streamops.loadgen import LoadSpec
from streamops.loadgen import run as run_load
from streamops.waiting import poll_until
from tests.support.routes import expected_routes, routed, wait_until_all_routed


def test_router_stopped_mid_stream_and_restarted_loses_nothing(spark, broker, app_catalog, tmp_path):
    spec = app_catalog.app("oplog-router")
    kafka, source = broker.client_config, spec.inputs["operations"]
    options = RunOptions(kafka=kafka, checkpoint=str(tmp_path / "ckpt"), trigger="1 second")
    # The load runs until the restarted router has read some of it: it overlaps the stop however
    # slow the machine is (a fixed-length load once ended before the stop on a busy host).
    stop_load = threading.Event()
    load = LoadSpec(count=10_000_000, keys=50, rate=400, seed=7)
    # A daemon, stopped in the outer finally: a failed test never leaves a producer writing.
    producer = threading.Thread(target=run_load, args=(spec, load, kafka, stop_load), daemon=True)
    try:
        (query,) = start_app(spark, spec, oplog_router.program, options)
        try:
            poll_until(lambda: query.recentProgress, timeout=120, what="the router's first micro-batch")
            producer.start()
            poll_until(lambda: sum(p.numInputRows for p in query.recentProgress) > 0, timeout=60,
                       what="the router's first rows")
        finally:
            query.stop()  # mid-stream: the producer is still writing
        written_at_stop = sum(high for _, high in end_offsets(kafka, source).values())

        (query,) = start_app(spark, spec, oplog_router.program, options)
        try:
            poll_until(lambda: sum(p.numInputRows for p in query.recentProgress) > 0, timeout=120,
                       what="the restarted router's first rows")
            stop_load.set()
            producer.join(timeout=60)
            assert not producer.is_alive(), "the load did not stop"
            assert sum(high for _, high in end_offsets(kafka, source).values()) > written_at_stop, \
                "no record was written after the stop: the test would not have stopped mid-stream"
            routing = wait_until_all_routed(kafka, spec)
            expected, duplicates = routing.expected, routing.duplicates
        finally:
            query.stop()
    finally:
        stop_load.set()
    print(f"router restart: {len(expected)} routed records expected, all present; {duplicates} duplicates")


def test_partitions_added_to_a_running_apps_input_are_read_with_no_record_lost(spark, broker, admin, app_catalog, tmp_path):
    """The provisioning plan grows the router's input while the router runs: the running app reads
    the new partitions from their first record (Spark's Kafka source finds them at the next
    batch), and every record, old partitions and new, is routed."""
    from streamops.provisioning import apply_plan, describe_broker, plan_topics

    spec = app_catalog.app("oplog-router")
    kafka, source = broker.client_config, spec.inputs["operations"]
    before = len(end_offsets(kafka, source))
    run_load(spec, LoadSpec(count=200, keys=20, seed=11), kafka)
    options = RunOptions(kafka=kafka, checkpoint=str(tmp_path / "ckpt"), trigger="1 second")
    (query,) = start_app(spark, spec, oplog_router.program, options)
    try:
        wait_until_all_routed(kafka, spec, what="the records written before the partitions were added")
        grown = app_catalog.topic(source).model_copy(update={"partitions": before + 2})
        plan = plan_topics([grown], describe_broker(admin, [source]), report_unmanaged=False)
        assert [t.actions for t in plan.topics] == [["add partitions"]], plan
        apply_plan(admin, plan)
        poll_until(lambda: len(end_offsets(kafka, source)) == before + 2, timeout=60, what="the new partitions")
        # Records in the new partitions only (one key each, as a producer's partitioner would put
        # them after the change), then more load over every partition.
        for partition in (before, before + 1):
            user = f"new-{partition}"
            produce(kafka, source, [(user, json.dumps({"seq": seq, "user_id": user, "op_type": "SEND_MESSAGE",
                                                       "event_time": "2026-11-28T05:00:00Z"})) for seq in range(5)],
                    partition=partition)
        run_load(spec, LoadSpec(count=200, keys=20, seed=12, start_seq=200), kafka)
        routing = wait_until_all_routed(kafka, spec, what="every record, the new partitions' too")
    finally:
        query.stop()
    new_partitions = {event_id for event_id, _ in routing.got
                      if int(event_id.split("/")[1]) >= before}
    assert {f"{source}/{p}/{o}" for p in (before, before + 1) for o in range(5)} <= new_partitions
    assert len(routing.expected) == len(set(routing.got)), "a routed record missing or unexplained"


def test_an_app_runs_through_spark_submit_from_the_cli(broker, app_catalog, admin, tmp_path):
    """The README's app command, on its own catalog copy: spark-submit, process, exit 0; on the
    app's own checkpoint it runs the app's effective spec, a cutover's approved topic included."""
    from streamops.app_runtime import AppRuntime
    from streamops.effective_spec import approve_topics, with_bindings
    from streamops.provisioning import ensure_topics

    declared = app_catalog.app("oplog-router")
    moved = {declared.outputs["contacts"]: declared.outputs["contacts"] + ".v2"}
    approve_topics(AppRuntime(tmp_path / "checkpoints" / "oplog-router"), moved, run_id="reprocess__cutover", by="alice")
    bound = with_bindings(app_catalog, "oplog-router", moved)
    ensure_topics(admin, [bound.topic(t) for t in moved.values()])
    spec = bound.app("oplog-router")
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(app_catalog.to_yaml())
    load = run_load(spec, LoadSpec(count=500, keys=10, seed=3), broker.client_config)
    env = {
        **os.environ,
        "STREAMOPS_CATALOG": str(catalog_file),
        "STREAMOPS_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "STREAMOPS_KAFKA_PORT": str(broker.port),
    }
    streamops = str(Path(sys.executable).parent / "streamops")
    result = subprocess.run(
        [streamops, "app", "run", "oplog-router", "--trigger", "available-now", "--master", "local[2]"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert '"records_in": 500' in result.stdout
    assert set(routed(broker.client_config, spec)) == expected_routes(broker.client_config, spec)
    # The catalog's contacts topic got nothing: the approved topic took its records.
    assert sum(high for _, high in end_offsets(broker.client_config, declared.outputs["contacts"]).values()) == 0
    record = AppRuntime(tmp_path / "checkpoints" / "oplog-router").driver()
    assert record.launch.spec["outputs"]["contacts"] == moved[declared.outputs["contacts"]]
    assert record.launch.spec["kafka_cluster"]
    assert (tmp_path / "checkpoints" / "oplog-router" / "route" / "commits" / "0").exists()
    assert load.produced == 500
    # The run's batch is recorded however fast the driver exits (Spark's listener is asynchronous;
    # about 1 run in 5 used to leave no progress and no group offsets): progress file and group.
    from confluent_kafka import TopicPartition

    topic = spec.inputs["operations"]
    ends = {p: high for p, (_, high) in end_offsets(broker.client_config, topic).items()}
    progress = AppRuntime(tmp_path / "checkpoints" / "oplog-router").progress()["route"]
    assert progress.batch_id == 0 and progress.input_rows == 500
    assert progress.end_offsets == {topic: {str(p): end for p, end in ends.items()}}
    group = broker.client_config.consumer("streamops.oplog-router")
    try:
        committed = group.committed([TopicPartition(topic, p) for p in ends], timeout=15)
    finally:
        group.close()
    assert {tp.partition: tp.offset for tp in committed} == ends


def test_a_printed_app_command_names_the_operators_settings_file_and_writes_no_credentials(tmp_path):
    settings = {"bootstrap.servers": "127.0.0.11:19092", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "oplog-router", "sasl.password": "s3cret-for-print"}
    (tmp_path / "kafka.json").write_text(json.dumps(settings))
    (tmp_path / "kafka.json").chmod(0o600)  # the CLI refuses a credentials file others can read
    env = {**os.environ, "STREAMOPS_CHECKPOINT_ROOT": str(tmp_path / "checkpoints")}
    streamops = str(Path(sys.executable).parent / "streamops")
    result = subprocess.run([streamops, "app", "run", "oplog-router", "--print", "--kafka-config", str(tmp_path / "kafka.json")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    # The command names the operator's own file (it exists and stays), not the launcher's runtime
    # file that every deploy rewrites, and nothing with credentials is written for a print.
    assert f"--kafka-config {tmp_path / 'kafka.json'}" in result.stdout
    assert not (tmp_path / "checkpoints" / "oplog-router" / "_runtime" / "kafka-client.json").exists()
    assert "s3cret-for-print" not in result.stdout + result.stderr

def test_an_in_process_spark_jvm_logs_to_stdout_not_stderr(tmp_path):
    """Airflow files a task's stderr lines under [error]: the JVM an Airflow task starts (quality
    checks, backfills, replays) writes its log lines to stdout, WARN included."""
    script = (
        "from streamops.driver.session import build_session\n"
        "spark = build_session('log-check', master='local[1]', extra_conf={'spark.ui.enabled': 'false'})\n"
        "spark._jvm.org.apache.logging.log4j.LogManager.getLogger('streamops.canary').warn('canary warning line')\n"
        "spark.stop()\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARN canary: canary warning line" in result.stdout
    assert "canary warning line" not in result.stderr and " WARN " not in result.stderr, result.stderr[-2000:]
