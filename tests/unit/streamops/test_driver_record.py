"""driver.json read as a DriverRecord (streamops.app_runtime): records of this version and of
older ones, torn files, and the launch record's trip from a launcher through STREAMOPS_LAUNCH and
driver.json back to the version and conf a restart starts. Pure: files in tmp_path only."""

from __future__ import annotations

import json
import os
import socket

from streamops.app_runtime import AppRuntime, CodeRecord, DriverRecord, LaunchRecord
from streamops.process_identity import start_mark

# driver.json as this version's driver leaves it after a graceful stop (streamops.driver.run's DriverRecord, then
# acquire, update and release), sort_keys and indent as AppRuntime writes it.
CURRENT = {
    "app": "oplog-router",
    "program": "spark_apps.oplog_router:program",
    "version": "1.1.0",
    "code": {"artifact": "/store/oplog-router/1.1.0/oplog-router-1.1.0.zip", "digest": "sha256:" + "ab" * 32},
    "trigger": "10 seconds",
    "spark_conf": {"spark.sql.shuffle.partitions": "4"},
    "catalog": "/repo/catalog/pipelines.yaml",
    "kafka": "127.0.0.1:9092 over PLAINTEXT (from --bootstrap-servers)",
    "environment": "local",
    "launched_by": "manual__2026-01-02T03:04:05",
    "launch": {"version": "1.1.0", "spark_conf": {"spark.driver.memory": "2g"}, "launch_id": "0f" * 16},
    "process_group": 4100,
    "jvm_pid": 4101,
    "driver_log": "/ckpt/oplog-router/_runtime/logs/driver-20260102T030405.000000Z-4000.log",
    "pid": 4102,
    "pid_created": 1767322245.25,
    "pid_start": "0b1e5a4c-7d1f-4c0e-9a55-3f0d8f6c2b11+2217548",
    "host": "worker-a",
    "started_at": "2026-01-02T03:04:06.000Z",
    "lease_epoch": 3,
    "application_id": "local-1767322246000",
    "spark_master": "local[2]",
    "spark_ui": "http://worker-a:4040",
    "driver_host": "worker-a",
    "stateful_operators": {"route": []},
    "queries_started": ["route"],
    "queries_started_at": "2026-01-02T03:04:20.000Z",
    "last_idle_at": "2026-01-02T03:05:00.000Z",
    "stopped_at": "2026-01-02T04:00:00.000Z",
    "outcome": "stopped",
    "reason": "stop requested by manual__x; oplog-router.route: stopped between micro-batches",
}


def write(tmp_path, payload) -> AppRuntime:
    runtime = AppRuntime(tmp_path)
    runtime.dir.mkdir(parents=True, exist_ok=True)
    runtime.driver_file.write_text(payload if isinstance(payload, str) else json.dumps(payload, indent=1, sort_keys=True))
    return runtime


def test_a_current_record_is_read_field_by_field(tmp_path):
    record = write(tmp_path, CURRENT).driver()
    assert record == DriverRecord(
        app="oplog-router", program="spark_apps.oplog_router:program", version="1.1.0",
        code=CodeRecord(artifact="/store/oplog-router/1.1.0/oplog-router-1.1.0.zip", digest="sha256:" + "ab" * 32),
        trigger="10 seconds", spark_conf={"spark.sql.shuffle.partitions": "4"}, catalog="/repo/catalog/pipelines.yaml",
        kafka="127.0.0.1:9092 over PLAINTEXT (from --bootstrap-servers)", environment="local",
        launched_by="manual__2026-01-02T03:04:05",
        launch=LaunchRecord(version="1.1.0", spark_conf={"spark.driver.memory": "2g"}, launch_id="0f" * 16),
        process_group=4100, jvm_pid=4101, driver_log="/ckpt/oplog-router/_runtime/logs/driver-20260102T030405.000000Z-4000.log",
        pid=4102, pid_created=1767322245.25, pid_start="0b1e5a4c-7d1f-4c0e-9a55-3f0d8f6c2b11+2217548", host="worker-a",
        started_at="2026-01-02T03:04:06.000Z", lease_epoch=3,
        application_id="local-1767322246000", spark_master="local[2]", spark_ui="http://worker-a:4040", driver_host="worker-a",
        stateful_operators={"route": []}, queries_started=["route"], queries_started_at="2026-01-02T03:04:20.000Z",
        last_idle_at="2026-01-02T03:05:00.000Z", failed_batches=[], stopped_at="2026-01-02T04:00:00.000Z", outcome="stopped",
        reason="stop requested by manual__x; oplog-router.route: stopped between micro-batches",
    )
    assert (record.launched_version, record.launched_spark_conf) == ("1.1.0", {"spark.driver.memory": "2g"})
    assert record.artifact_digest == "sha256:" + "ab" * 32 and record.code.label == "sha256:" + "ab" * 32
    assert record.code.to_json() == CURRENT["code"] and record.launch.to_json() == CURRENT["launch"]


def test_every_key_the_driver_writes_has_a_field_and_back():
    from dataclasses import fields

    # checkpoint_interval (real-time apps only) and failed_batches (a failed query only) are not in CURRENT.
    assert {f.name for f in fields(DriverRecord)} == set(CURRENT) | {"checkpoint_interval", "failed_batches"}


def test_a_record_of_a_driver_from_before_launch_records_and_artifacts(tmp_path):
    """The oldest driver.json: no launch, no code, no lease epoch, no queries_started."""
    old = {"app": "oplog-router", "version": "1.0.0", "pid": 77, "host": "worker-a", "started_at": "2025-01-01T00:00:00.000Z",
           "launched_by": "command line", "spark_conf": {}}
    record = write(tmp_path, old).driver()
    assert record.launch == LaunchRecord() and record.launch.to_json() == {}
    assert (record.code, record.artifact_digest, record.lease_epoch, record.stopped_at, record.outcome) == (
        None, None, None, None, None)
    assert (record.queries_started, record.failed_batches, record.stateful_operators) == ([], [], {})
    # A restart starts what it ran: the version it recorded, no conf overrides.
    assert (record.launched_version, record.launched_spark_conf) == ("1.0.0", {})
    assert AppRuntime(tmp_path).state() == "crashed"  # no stop recorded, no lease


def test_a_launch_record_from_before_launch_ids(tmp_path):
    record = write(tmp_path, {**CURRENT, "launch": {"version": "1.0.9", "spark_conf": {}}}).driver()
    assert record.launch == LaunchRecord(version="1.0.9", spark_conf={}, launch_id=None)
    assert record.launch.to_json() == {"version": "1.0.9", "spark_conf": {}}  # written back as it was
    assert (record.launched_version, record.launched_spark_conf) == ("1.0.9", {})


def test_a_driver_started_by_hand_records_an_empty_launch(tmp_path):
    record = write(tmp_path, {**CURRENT, "launch": {}}).driver()
    assert record.launch == LaunchRecord() and record.launched_version == "1.1.0"


def test_missing_null_and_empty_lists_and_objects_read_alike(tmp_path):
    for value in (None, [], {}):
        record = write(tmp_path, {**CURRENT, "queries_started": value, "failed_batches": value, "stateful_operators": value,
                                  "launch": value, "code": value}).driver()
        assert (record.queries_started, record.failed_batches, record.stateful_operators) == ([], [], {})
        assert (record.launch, record.code) == (LaunchRecord(), None)


def test_values_are_kept_as_the_file_has_them_for_the_checks_where_they_are_used(tmp_path):
    """driver.json is on a shared volume: a tampered launch record reaches checked_version and
    checked_spark_conf as it is, so their refusal names it (nothing is quietly replaced)."""
    record = write(tmp_path, {**CURRENT, "pid": "4102", "launch": {"version": "1.0.0; touch x", "spark_conf": "oops"}}).driver()
    assert record.pid == "4102" and record.launched_version == "1.0.0; touch x" and record.launched_spark_conf == "oops"
    # Nested records of another kind count as absent.
    record = write(tmp_path, {**CURRENT, "launch": "1.0.0", "code": ["x"]}).driver()
    assert (record.launch, record.code, record.launched_version) == (LaunchRecord(), None, "1.1.0")


def test_a_torn_missing_or_foreign_file_reads_as_none(tmp_path):
    runtime = AppRuntime(tmp_path)
    assert runtime.driver() is None and runtime.state() == "never started"
    torn = json.dumps(CURRENT, indent=1, sort_keys=True)[:200]
    assert write(tmp_path, torn).driver() is None
    assert write(tmp_path, "").driver() is None
    assert write(tmp_path, [CURRENT]).driver() is None
    assert DriverRecord.from_json("driver") is None and DriverRecord.from_json(None) is None


def test_code_records_of_an_artifact_and_of_installed_code():
    artifact = CodeRecord.from_json({"artifact": "/store/a.zip", "digest": "sha256:1"})
    assert (artifact.artifact_digest, artifact.label, artifact.to_json()) == (
        "sha256:1", "sha256:1", {"artifact": "/store/a.zip", "digest": "sha256:1"})
    installed = CodeRecord.from_json({"installed": "/repo/spark_apps/oplog_router.py", "digest": "sha256:2"})
    assert (installed.artifact_digest, installed.label, installed.to_json()) == (
        None, "installed", {"installed": "/repo/spark_apps/oplog_router.py", "digest": "sha256:2"})


def test_the_launch_record_in_the_environment_is_what_launchers_always_sent():
    """STREAMOPS_LAUNCH's bytes are unchanged: a driver of an older artifact reads them too."""
    launch = LaunchRecord(version="1.2.0", spark_conf={"spark.driver.memory": "2g"}, launch_id="abc")
    assert launch.to_env() == json.dumps({"version": "1.2.0", "spark_conf": {"spark.driver.memory": "2g"}, "launch_id": "abc"})
    assert LaunchRecord(version="1.2.0", spark_conf={}, launch_id="abc").to_env() == \
        '{"version": "1.2.0", "spark_conf": {}, "launch_id": "abc"}'
    assert LaunchRecord().to_env() == "{}"


def test_the_launch_record_goes_through_the_environment_and_driver_json_and_back(tmp_path, monkeypatch):
    """Launcher -> STREAMOPS_LAUNCH -> the driver's record (as streamops.driver.run builds it) ->
    driver.json -> the version and conf a restart or rollback builds its command from."""
    sent = LaunchRecord(version="1.2.0+v2", spark_conf={"spark.sql.shuffle.partitions": "8"}, launch_id="f" * 32)
    monkeypatch.setenv("STREAMOPS_LAUNCH", sent.to_env())
    runtime = AppRuntime(tmp_path)
    info = {"app": "oplog-router", "version": "1.2.0+v2", "extra_from_a_newer_driver": [1, 2],
            "launch": json.loads(os.environ.get("STREAMOPS_LAUNCH") or "{}")}
    runtime.acquire(info)
    try:
        on_disk = json.loads(runtime.driver_file.read_text())
        # The writer is untouched: the driver's keys, as it gave them, plus acquire's own.
        assert on_disk == {**info, "pid": os.getpid(), "pid_created": on_disk["pid_created"],
                           "pid_start": start_mark(), "host": socket.gethostname(),
                           "started_at": on_disk["started_at"], "lease_epoch": 1}
        runtime.update(application_id="local-1", queries_started=["route"])
        record = runtime.driver()
        assert record.launch == sent and record.launch.launch_id == "f" * 32
        assert (record.launched_version, record.launched_spark_conf) == ("1.2.0+v2", {"spark.sql.shuffle.partitions": "8"})
        assert (record.pid, record.host, record.lease_epoch, record.application_id, record.queries_started) == (
            os.getpid(), socket.gethostname(), 1, "local-1", ["route"])
        assert runtime.driver_process() is not None  # this very process
    finally:
        runtime.release("stopped", "test")
    # A key this version does not know survives the driver's rewrites (a newer reader may want it).
    assert json.loads(runtime.driver_file.read_text())["extra_from_a_newer_driver"] == [1, 2]
    record = runtime.driver()
    assert (record.outcome, record.reason, runtime.state()) == ("stopped", "test", "stopped")


def test_an_empty_record_stands_for_none():
    empty = DriverRecord()
    assert (empty.pid, empty.version, empty.launch, empty.code, empty.launched_version, empty.launched_spark_conf,
            empty.artifact_digest) == (None, None, LaunchRecord(), None, None, {}, None)
