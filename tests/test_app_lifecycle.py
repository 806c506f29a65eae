"""Driver lifecycle through spark-submit: one driver per app, graceful stop, crash and restart."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streamops.app_runtime import AppRuntime
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import read_all
from streamops.loadgen import LoadSpec, background_load
from streamops.waiting import poll_until
from tests.support.routes import wait_until_all_routed

STREAMOPS = str(Path(sys.executable).parent / "streamops")


@pytest.fixture
def launcher(broker, app_catalog, tmp_path):
    """Start `streamops app run APP` as its own process on the test's catalog copy."""
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(app_catalog.to_yaml())
    env = {
        **os.environ,
        "STREAMOPS_CATALOG": str(catalog_file),
        "STREAMOPS_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "STREAMOPS_KAFKA_PORT": str(broker.port),
    }
    started: list[subprocess.Popen] = []

    def launch(app: str, *args: str) -> subprocess.Popen:
        log = open(tmp_path / f"driver-{len(started)}.log", "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [STREAMOPS, "app", "run", app, "--master", "local[2]", "--trigger", "1 second", *args],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        process.log_path = log.name
        started.append(process)
        return process

    launch.runtime = lambda app: AppRuntime(tmp_path / "checkpoints" / app)
    launch.env = env
    yield launch
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # spark-submit runs in a process group of its own (so Ctrl-C reaches only the CLI).
    for app in app_catalog.app_names():
        runtime = launch.runtime(app)
        if runtime.is_running():
            os.killpg(runtime.driver().process_group, signal.SIGKILL)


def end_offsets_total(broker, spec) -> int:
    return sum(high for _, high in end_offsets(broker.client_config, spec.inputs["operations"]).values())


def wait_running(runtime: AppRuntime, process: subprocess.Popen, query: str) -> None:
    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"driver exited ({process.returncode}):\n{Path(process.log_path).read_text()[-3000:]}")
        return runtime.state() == "running" and query in runtime.progress()

    poll_until(up, timeout=180, what="the driver's first progress", max_interval=1)


def test_second_launch_is_refused_and_ctrl_c_stops_gracefully(launcher, broker):
    runtime = launcher.runtime("oplog-router")
    first = launcher("oplog-router")
    wait_running(runtime, first, "route")
    running = runtime.driver()

    second = launcher("oplog-router")
    assert second.wait(timeout=300) == 3
    log = Path(second.log_path).read_text()
    assert (
        f"refused: oplog-router is already running: driver pid {running.pid} on {running.host}, "
        f"version 1.0.0, Spark application {running.application_id}, started {running.started_at}"
    ) in log
    assert runtime.state() == "running" and runtime.driver().pid == running.pid

    os.killpg(first.pid, signal.SIGINT)  # Ctrl-C at the terminal reaches the CLI's process group
    assert first.wait(timeout=120) == 0
    record = runtime.driver()
    assert runtime.state() == "stopped"
    assert record.outcome == "stopped"
    assert record.reason == (f"stop requested by Ctrl-C at the terminal (streamops app run (pid {first.pid})); "
                                "oplog-router.route: stopped between micro-batches")
    assert [entry["event"] for entry in runtime.history()] == ["started", "stopped"]


def test_kill_dash_9_shows_crashed_and_a_restart_loses_nothing(launcher, broker, app_catalog):
    spec = app_catalog.app("oplog-router")
    runtime = launcher.runtime("oplog-router")
    first = launcher("oplog-router")
    wait_running(runtime, first, "route")
    # The load runs until the block ends, so the kill lands mid-stream however fast this machine is.
    with background_load(spec, LoadSpec(count=10_000_000, keys=30, rate=400, seed=5), broker.client_config) as producer:
        poll_until(lambda: runtime.progress()["route"].input_rows > 0, timeout=120, what="a micro-batch with data")
        os.kill(runtime.driver().pid, signal.SIGKILL)
        at_kill = end_offsets_total(broker, spec)
        first.wait(timeout=60)
        assert runtime.state() == "crashed"
        # Records keep arriving while no driver runs: the restart must catch up on them too.
        poll_until(lambda: end_offsets_total(broker, spec) > at_kill, timeout=60, what="records produced after the kill")
    assert not producer.is_alive()

    second = launcher("oplog-router")
    wait_running(runtime, second, "route")
    routing = wait_until_all_routed(broker.client_config, spec)
    expected, duplicates = routing.expected, routing.duplicates
    print(f"kill -9 and restart: {len(expected)} routed records, none lost, {duplicates} duplicates")
    runtime.request_stop(by="test")
    assert second.wait(timeout=120) == 0

    # The processed offsets are in the consumer group named after the app, for Kafka lag tools.
    from confluent_kafka import TopicPartition

    topic = spec.inputs["operations"]
    consumer = broker.client_config.consumer("streamops.oplog-router")
    committed = consumer.committed([TopicPartition(topic, p) for p in range(6)], timeout=15)
    consumer.close()
    ends = {}
    for record in read_all(broker.client_config, topic):
        ends[record.partition] = record.offset + 1
    assert {tp.partition: tp.offset for tp in committed} == {p: ends.get(p, 0) for p in range(6)}


def test_kill_dash_9_of_the_spark_jvm_is_recorded_as_what_happened(launcher, broker):
    import psutil

    runtime = launcher.runtime("oplog-router")
    first = launcher("oplog-router")
    wait_running(runtime, first, "route")
    jvm = runtime.driver().jvm_pid
    assert "java" in psutil.Process(jvm).name()
    os.kill(jvm, signal.SIGKILL)
    first.wait(timeout=120)  # the CLI ends with its spark-submit; the Python driver notices next
    poll_until(lambda: runtime.state() != "running", timeout=120, what="the driver to record its end")
    record = runtime.driver()
    assert runtime.state() == "failed"
    assert re.fullmatch(
        rf"the driver's Spark JVM \(pid {jvm}\) went away after \d+ s of running \(killed, or out of memory: see the driver "
        r"log\); the app stopped with it\. Last error: .{1,400}", record.reason), record.reason
