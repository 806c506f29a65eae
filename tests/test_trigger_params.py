"""Trigger params cannot run code and cannot break a task (issue 13, points 1 and 4).

Hostile Spark conf and version labels are refused by the trigger form's schema (Airflow's own
validation, as for an API trigger) and again by the code with the schema bypassed, naming the key;
no spark-submit starts and the canary file never appears. A launch record on disk is checked the
same way before a restart or rollback uses it. Numbers and times beyond their bounds are refused
with one clear reason instead of an overflow deep in a task.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC
from pathlib import Path

import pytest

from streamops.launch_overrides import LaunchOverrideRefused
from tests.support import LOCAL_SPARK_CONNECTION, PROJECT_ROOT
from tests.support.hostile import KEY_REFUSED, hostile_confs

PROJECT_CATALOG = PROJECT_ROOT / "catalog" / "pipelines.yaml"
APP = "oplog-router"
MAX_OFFSET = 2**63 - 1


@pytest.fixture
def submits(monkeypatch) -> list[list[str]]:
    """Every spark-submit started in this test (recorded, then started for real)."""
    started: list[list[str]] = []
    real = subprocess.Popen

    def recording(command, *args, **kwargs):
        if isinstance(command, (list, tuple)) and any("spark-submit" in str(word) for word in command):
            started.append(list(command))
        return real(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording)
    return started


@pytest.fixture
def launch_env(tmp_path, monkeypatch):
    """The project catalog, checkpoints under tmp_path, spark_default in local mode, and a Kafka
    connection (its address only reaches argv here; nothing connects to it)."""
    monkeypatch.setenv("STREAMOPS_CATALOG", str(PROJECT_CATALOG))
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", LOCAL_SPARK_CONNECTION)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", '{"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:1"}}')
    return tmp_path / "checkpoints"


def tamper_launch_record(checkpoint: Path, spark_conf: dict, version: str = "1.0.0") -> None:
    """A driver record as a crashed driver leaves it, with a launch conf someone edited on disk."""
    runtime = checkpoint / "_runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    (runtime / "driver.json").write_text(json.dumps({
        "app": APP, "version": version, "pid": 2**22 + 17, "host": "elsewhere", "started_at": "2026-11-23T03:00:00+00:00",
        "launch": {"version": version, "spark_conf": spark_conf},
    }))


# --- point 1: Spark conf and version label -------------------------------------------------------------


def test_a_hostile_trigger_creates_no_run(run_dag, canary):
    from airflow.sdk.definitions.param import ParamValidationError

    (conf, _), *_ = hostile_confs(*canary)
    for dag_id in ("deploy_apps", "roll_restart_apps"):
        with pytest.raises(ParamValidationError) as refused:
            run_dag(dag_id, PROJECT_CATALOG, apps=[APP], spark_conf=conf)
        assert "Invalid input for param spark_conf: Additional properties are not allowed " \
               "('spark.driver.extraJavaOptions' was unexpected)" in str(refused.value)
    assert not canary[0].exists()


def test_the_code_refuses_hostile_spark_conf_without_the_form(launch_env, canary, submits):
    from airflow.sdk.exceptions import AirflowFailException

    from streamops.catalog import load_catalog
    from streamops.dag_tasks import apps as steps
    from streamops.dag_tasks.launching import AppLauncher

    for conf, reason in hostile_confs(*canary):
        with pytest.raises(AirflowFailException) as refused:
            steps.deploy(APP, None, conf, "manual__hostile")
        assert str(refused.value) == f"refused: {reason}"
        with pytest.raises(AirflowFailException) as refused:
            steps.roll(APP, "1.0.1", conf, 30, 0.05, "manual__hostile")
        assert str(refused.value) == f"refused: {reason}"
        with pytest.raises(LaunchOverrideRefused) as refused:
            AppLauncher.of(load_catalog(), APP, "manual__hostile").command(None, conf)
        assert str(refused.value) == reason
    for version in ("1.0.0; touch x", "1.0.0\n--conf", "$(touch x)", "1.0.0-" + "a" * 80):
        with pytest.raises(AirflowFailException) as refused:
            steps.deploy(APP, version, {}, "manual__hostile")
        assert str(refused.value) == (f"refused: version {version!r} must be a semantic version such as 1.2.0 or 1.2.0-rc.1 "
                                      "(digits, dots, letters and '-+' only, at most 64 characters)")
    assert submits == []  # no spark-submit (nor anything else) was started
    assert not (launch_env / APP / "_runtime" / "logs").exists()  # no driver was ever started
    assert not canary[0].exists()


def test_an_allowed_key_reaches_spark_submit_as_conf(launch_env, broker, monkeypatch):
    from streamops.catalog import load_catalog
    from streamops.dag_tasks.launching import AppLauncher
    from tests.support.artifacts import same_code_as

    # A launch asks the cluster its id (the checkpoint's cluster): a real one here.
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT",
                       json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers}}))
    same_code_as(load_catalog().app(APP), "1.2.3")
    launch = AppLauncher.of(load_catalog(), APP, "manual").command("1.2.3", {
        "spark.driver.memory": "2g", "spark.sql.shuffle.partitions": 8, "spark.sql.streaming.noDataMicroBatches.enabled": False})
    argv = launch.argv
    pairs = {argv[i + 1] for i, word in enumerate(argv) if word == "--conf"}
    assert {"spark.driver.memory=2g", "spark.sql.shuffle.partitions=8",
            "spark.sql.streaming.noDataMicroBatches.enabled=false"} <= pairs
    assert argv[argv.index("--version") + 1] == "1.2.3"
    # The Python still comes from this environment, not from the trigger.
    assert f"spark.pyspark.python={sys.executable}" in pairs
    # The launch's effective spec carries the overrides as approved by the trigger, and the cluster.
    assert launch.spec["spark_conf"]["spark.driver.memory"] == "2g"
    assert launch.spec["approved"]["spark_conf.spark.driver.memory"] == "the launch's Spark conf (a roll, restore or trigger)"
    assert launch.spec["kafka_cluster"] and launch.spec["version"] == "1.2.3"


def test_a_spark_default_extra_reaches_a_live_app_and_a_backfill_alike(launch_env, broker, monkeypatch, tmp_path):
    """One launch builder: spark_default made from a URI (spark://host:port, the scheme in its type)
    with a deploy mode and a queue gives a live launch and a backfill the same spark-submit target."""
    from streamops.catalog import load_catalog
    from streamops.dag_tasks.connections import spark_target
    from streamops.dag_tasks.launching import AppLauncher
    from streamops.kafka_client import KafkaClientConfig
    from streamops.reprocess import ReprocessPlan, backfill_command
    from tests.support.artifacts import same_code_as

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT",
                       json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "spark-master.example", "port": 7077,
         "extra": {"deploy-mode": "client", "queue": "streaming"}}))
    app = load_catalog().app(APP)
    artifact = same_code_as(app, "1.2.3")
    live = AppLauncher(load_catalog(), app, "manual").command("1.2.3", {}).argv
    plan = ReprocessPlan(app=APP, request={}, inputs=[], targets={}, estimate_s=0.0, rate=0.0, rate_measured=False,
                         program_version="1.2.3", program_digest=artifact.digest)
    backfill = backfill_command(app, plan, KafkaClientConfig.plaintext(broker.bootstrap_servers, source="test"),
                                tmp_path / "c.yaml", tmp_path / "backfill", app.checkpoint_location(), spark_target())

    def target(argv: list[str]) -> list[str]:
        return [word for flag in ("--master", "--deploy-mode", "--queue") for word in (flag, argv[argv.index(flag) + 1])]

    assert target(live) == target(backfill) == ["--master", "spark://spark-master.example:7077", "--deploy-mode", "client",
                                                "--queue", "streaming"]
    assert live[0] == backfill[0] and live[0].endswith("spark-submit")
    assert backfill[backfill.index("--trigger") + 1] == "available-now" and "--no-consumer-group" in backfill


def test_a_spark_default_extra_the_launches_cannot_carry_out_is_refused_by_name(launch_env, monkeypatch):
    from streamops.dag_tasks.connections import spark_target
    from streamops.spark_submit import SparkTargetError

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT",
                       json.dumps({"conn_type": "spark", "host": "yarn", "extra": {"keytab": "AAAA"}}))
    with pytest.raises(SparkTargetError,
                       match=r"^connection spark_default: extra keytab is not supported by the suite's launches"):
        spark_target()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT",
                       json.dumps({"conn_type": "spark", "host": "yarn", "extra": {"spark-binary": "/tmp/x"}}))
    with pytest.raises(SparkTargetError, match=r"spark-binary '/tmp/x' is not one of spark-submit, spark2-submit, spark3-submit"):
        spark_target()


def test_a_tampered_launch_record_is_not_started_again(run_dag, app_env, app_catalog, broker, canary, submits, monkeypatch):
    """A restart, a reset and a rollback start what the last launch record says: an edited record
    is refused before anything is stopped, backed up or started."""
    from airflow.sdk.exceptions import AirflowFailException

    from streamops.audit import read_audit
    from streamops.catalog import load_catalog
    from streamops.checkpoints import list_backups
    from streamops.dag_tasks import apps as steps
    from streamops.dag_tasks import launching
    from streamops.recovery.common import RecoveryRefused

    catalog_file, _ = app_env
    checkpoint = Path(app_catalog.app(APP).checkpoint_location())
    hostile = {"spark.driver.extraJavaOptions": f"-XX:MaxMetaspaceSize=16m -XX:OnOutOfMemoryError='touch {canary[0]}'"}
    tamper_launch_record(checkpoint, hostile)
    reason = (f"{APP}'s last launch record (_runtime/driver.json) cannot be started again: "
              + KEY_REFUSED.format(key="spark.driver.extraJavaOptions"))

    result = run_dag("recover_restart_app", catalog_file, app=APP, dry_run=False)
    assert result.task_states == {
        "plan": "failed", "approve": "upstream_failed", "apply": "upstream_failed", "verify": "upstream_failed"}
    (entry,) = read_audit(run_id=result.run_id)
    assert (entry["step"], entry["outcome"]) == ("plan", "refused")
    assert entry["error"] == f"refused before anything was changed:\n  - {reason}"

    monkeypatch.setenv("STREAMOPS_CATALOG", str(catalog_file))
    with pytest.raises(RecoveryRefused) as refused:  # reset and rebuild start the last launch's conf
        launching.AppLauncher.of(load_catalog(), APP, "manual__reset").start_on_new_checkpoint()("{}")
    assert refused.value.problems == [reason]
    tamper_launch_record(checkpoint, {"spark.pyspark.python": str(canary[1])})
    with pytest.raises(AirflowFailException) as refused:  # the rollback target of a rolling restart
        steps.roll(APP, "1.0.1", {}, 30, 0.05, "manual__roll")
    assert str(refused.value) == (f"refused: the running version's launch record ({APP}): "
                                  + KEY_REFUSED.format(key="spark.pyspark.python"))
    assert submits == [] and not canary[0].exists()
    assert list_backups(str(checkpoint)) == []  # nothing was stopped or backed up either


# --- point 4: numbers and times within bounds ------------------------------------------------------------


def test_out_of_range_numbers_and_times_are_refused_by_the_parsing_code(admin, app_catalog, broker):
    from datetime import datetime

    from streamops.kafka_offsets import parse_time, time_back
    from streamops.quality.ranges import RangeError, RangeRequest, resolve
    from streamops.recovery.common import RecoveryRefused
    from streamops.recovery.replay import ReplayRequest, resolve_spans
    from streamops.recovery.reset import ResetRequest, plan_reset
    from streamops.reprocess import ReprocessRefused, ReprocessRequest, plan_reprocess

    now = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)
    out_of_range = ("is out of range: a time must be from 1970-01-01T00:00:00Z (where Kafka timestamps start) to "
                    "before 3000-01-01T00:00:00Z")
    with pytest.raises(ValueError) as refused:
        parse_time("0001-01-01T00:00:00Z", "to_datetime")
    assert str(refused.value) == f"to_datetime '0001-01-01T00:00:00Z' {out_of_range}"
    with pytest.raises(ValueError) as refused:
        parse_time("9999-12-31T23:59:59-05:00", "end")
    assert str(refused.value) == f"end '9999-12-31T23:59:59-05:00' {out_of_range}"
    with pytest.raises(ValueError) as refused:
        time_back("99999999999999999 days", "duration", now)
    assert str(refused.value) == (
        "duration '99999999999999999 days' is more than 3650 days back; for everything retained use 'earliest'")
    assert time_back("3650 days", "duration", now) == datetime(2016, 11, 25, 3, 0, tzinfo=UTC)

    def reset_problems(**request) -> list[str]:
        with pytest.raises(RecoveryRefused) as refused:
            plan_reset(admin, app_catalog, ResetRequest(app=APP, **request), now=now)
        return refused.value.problems

    source = app_catalog.app(APP).inputs["operations"]
    assert reset_problems(mode="shift", shift=2**70) == [
        f"shift {2**70} is beyond Kafka's offsets: it must be from -{MAX_OFFSET} to {MAX_OFFSET}"]
    assert reset_problems(mode="shift", shift=-(2**70)) == [
        f"shift {-(2**70)} is beyond Kafka's offsets: it must be from -{MAX_OFFSET} to {MAX_OFFSET}"]
    assert reset_problems(mode="offsets", offsets={source: {"0": 2**70}}) == [
        f"offsets: '{source}' partition 0: offset {2**70} must be a whole number from 0 to {MAX_OFFSET} "
        "(Kafka offsets are 64-bit)"]
    assert reset_problems(mode="duration", duration="100000000 days") == [
        "duration '100000000 days' is more than 3650 days back; for everything retained use 'earliest'"]
    assert reset_problems(mode="datetime", to_datetime="0001-01-01T00:00:00Z") == [
        f"to_datetime '0001-01-01T00:00:00Z' {out_of_range}"]

    with pytest.raises(ReprocessRefused) as refused:
        plan_reprocess(admin, broker.client_config, app_catalog, ReprocessRequest(app=APP, start="0001-01-01T00:00:00Z"), now=now)
    assert refused.value.problems == [
        f"start '0001-01-01T00:00:00Z' {out_of_range}; or use 'earliest' or a duration such as '6 hours'"]
    with pytest.raises(ReprocessRefused) as refused:
        plan_reprocess(admin, broker.client_config, app_catalog, ReprocessRequest(app=APP, start="9999999999 days"), now=now)
    assert refused.value.problems == [
        "start '9999999999 days' is more than 3650 days back; for everything retained use 'earliest'"]

    with pytest.raises(RecoveryRefused) as refused:
        resolve_spans(admin, app_catalog, ReplayRequest(app=APP, start="99999999999 hours", end="0001-01-01T00:00:00+01:00"),
                      now=now)
    assert refused.value.problems == [
        "start '99999999999 hours' is more than 3650 days back; for everything retained use 'earliest'",
        f"end '0001-01-01T00:00:00+01:00' {out_of_range}",
    ]

    topic = app_catalog.validated_topics()[0]

    def range_problems(**request) -> list[str]:
        with pytest.raises(RangeError) as refused:
            resolve(admin, app_catalog, [topic], RangeRequest(**request))
        return refused.value.problems

    assert range_problems(mode="last_records", last_records=10**30) == [
        f"last_records {10**30} is more than 1000000 records per partition; validate a longer stretch as several ranges"]
    assert range_problems(mode="offsets", offsets={topic: {"0": [0, 2**70]}}) == [
        f"offsets['{topic}']['0'] = [0, {2**70}]: end is beyond Kafka's offsets (at most {MAX_OFFSET})"]
    assert range_problems(mode="time_range", start_time="0001-01-01T00:00:00Z", end_time="2026-11-22T00:00:00Z") == [
        f"start_time '0001-01-01T00:00:00Z' {out_of_range}"]


def test_a_reset_with_out_of_range_params_fails_with_one_clear_line(run_dag, app_env, app_catalog, broker):
    """A real run: beyond 64 bits the form refuses the trigger; a duration the form lets through
    but the code bounds fails the plan task with the reason, and nothing else runs."""
    from airflow.sdk.definitions.param import ParamValidationError

    from streamops.audit import read_audit

    catalog_file, _ = app_env
    with pytest.raises(ParamValidationError) as refused:
        run_dag("recover_reset_offsets", catalog_file, app=APP, mode="shift", shift=2**70, dry_run=False)
    assert str(refused.value).splitlines()[0] == (
        f"Invalid input for param shift: {2**70} is greater than the maximum of {MAX_OFFSET}")

    result = run_dag("recover_reset_offsets", catalog_file, app=APP, mode="duration", duration="3651 days", dry_run=False)
    assert result.task_states == {
        "plan": "failed", "approve": "upstream_failed", "apply": "upstream_failed", "verify": "upstream_failed"}
    (entry,) = read_audit(run_id=result.run_id)
    assert (entry["step"], entry["outcome"]) == ("plan", "refused")
    assert entry["error"] == ("refused before anything was changed:\n"
                              "  - duration '3651 days' is more than 3650 days back; for everything retained use 'earliest'")


def test_numeric_params_of_the_apps_dags_are_bounded_in_code_too(launch_env, submits):
    from airflow.sdk.exceptions import AirflowFailException

    from streamops.dag_tasks import apps as steps
    from streamops.dag_tasks.reconcile_apps import reconcile_app
    from streamops.dag_tasks.recovery_params import shared_param_problems

    def refusal(call, *args) -> str:
        with pytest.raises(AirflowFailException) as refused:
            call(*args)
        return str(refused.value)

    assert refusal(steps.roll, APP, "1.0.1", {}, 2**70, 0.05, "manual__x") == (
        f"refused: gate_deadline_s must be a whole number from 30 to 3600, got {2**70}")
    assert refusal(steps.roll, APP, "1.0.1", {}, 60, float("nan"), "manual__x") == (
        "refused: max_dead_letter_rate must be a number from 0 to 1, got nan")
    assert refusal(steps.roll, APP, None, {}, 60, 0.05, "manual__x") == "refused: a rolling restart needs the new version label"
    assert refusal(steps.stop_app, APP, 10**6, "manual__x") == (
        "refused: deadline_s must be a whole number from 5 to 3600, got 1000000")
    assert refusal(reconcile_app, APP, "manual__x", "127.0.0.1:1", None, "local[1]", 1.5) == (
        "refused: max_mismatch_ratio must be a number from 0 to 1, got 1.5")
    assert shared_param_problems({"verify_deadline_s": 2**70}) == [
        f"verify_deadline_s must be a whole number from 30 to 7200, got {2**70}"]
    assert shared_param_problems({"verify_deadline_s": 300}) == []
    assert submits == []


# --- what a task reads back: plans handed between tasks, names matched whole -------------------------


def reprocess_plan(app_catalog, **request) -> dict:
    """A reprocess plan as the plan task hands it to the next (XCom), for oplog-router."""
    from dataclasses import asdict

    from streamops.reprocess import ReprocessPlan, target_topics

    app = app_catalog.app(APP)
    req = {"app": APP, "start": "earliest", "end": "now", "target": "scratch", "version": "v2", "tag": "t1", "cutover": False,
           **request}
    plan = ReprocessPlan(app=APP, request=req, inputs=[], targets=target_topics(app, req["target"], req["version"], req["tag"]),
                         estimate_s=0.0, rate=1.0, rate_measured=False)
    return asdict(plan)


def test_a_plan_handed_between_tasks_is_checked_again(app_env, app_catalog, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from streamops.dag_tasks.reprocess import checked_plan

    catalog_file, _ = app_env
    monkeypatch.setenv("STREAMOPS_CATALOG", str(catalog_file))
    monkeypatch.setenv("STREAMOPS_REPROCESS_ROOT", str(tmp_path / "reprocess"))
    _, folder = checked_plan(reprocess_plan(app_catalog))
    assert folder == tmp_path / "reprocess" / APP / "t1"

    tampered = reprocess_plan(app_catalog)
    tampered["request"]["tag"] = "../../../../tmp/x"
    with pytest.raises(AirflowFailException) as refused:
        checked_plan(tampered)
    assert str(refused.value) == ("refused: the plan this task received is not one the plan task makes: "
                                  "tag '../../../../tmp/x' is not 1-40 lowercase letters, digits or '-'")
    tampered = reprocess_plan(app_catalog)
    tampered["targets"][app_catalog.app(APP).outputs["contacts"]] = app_catalog.app("presence-notifier").outputs["notifications"]
    with pytest.raises(AirflowFailException) as refused:
        checked_plan(tampered)
    assert str(refused.value).endswith("its targets are not the topics its request names")


def test_a_reprocess_tag_is_never_reused(run_dag, app_env, app_catalog, tmp_path, monkeypatch, capfd):
    catalog_file, _ = app_env
    monkeypatch.setenv("STREAMOPS_REPROCESS_ROOT", str(tmp_path / "reprocess"))
    (tmp_path / "reprocess" / APP / "t1").mkdir(parents=True)  # an earlier run's folder, with its checkpoint
    capfd.readouterr()
    reused = run_dag("reprocess", catalog_file, dry_run=True, app=APP, target="scratch", tag="t1")
    assert reused.task_states["plan"] == "failed"
    assert (f"a reprocessing run tagged 't1' of {APP} already exists ({tmp_path / 'reprocess' / APP / 't1'}): choose another "
            "tag (or leave it empty for a timestamp)") in capfd.readouterr().out
    reserved = run_dag("reprocess", catalog_file, dry_run=True, app=APP, target="scratch", tag="recon-1")
    assert reserved.task_states["plan"] == "failed"
    assert "tag 'recon-1': tags starting with recon- belong to the nightly reconciliation" in capfd.readouterr().out


def test_a_live_catalog_topic_is_never_a_backfill_target(admin, broker, app_catalog):
    from streamops.reprocess import ReprocessRefused, ReprocessRequest, plan_reprocess

    contacts = app_catalog.topic(app_catalog.app(APP).outputs["contacts"])
    live_v2 = contacts.model_copy(update={"name": f"{contacts.name}.v2"})  # someone's live topic of that name
    catalog = app_catalog.model_copy(update={"topics": [*app_catalog.topics, live_v2]})
    with pytest.raises(ReprocessRefused) as refused:
        plan_reprocess(admin, broker.client_config, catalog, ReprocessRequest(app=APP, target="versioned", version="v2"))
    assert refused.value.problems == [
        f"target topic '{contacts.name}.v2' is a topic of the catalog (a live topic): choose another version"]


def test_a_tampered_restore_or_skip_plan_is_refused(app_env, app_catalog):
    from streamops.recovery.common import RecoveryRefused
    from streamops.recovery.restore import RestorePlan, apply_restore
    from streamops.recovery.skip import entry_problems

    app = app_catalog.app(APP)
    started = []
    plan = RestorePlan(app=APP, snapshot="../../oplog-router", history=[], current={}, restored={}, moves=[], running=False,
                       version="1.0.0", spark_conf={})
    with pytest.raises(RecoveryRefused) as refused:
        apply_restore(app, plan, lambda *a: started.append(a), lambda: started.append("stop"))
    assert refused.value.problems == [
        "snapshot '../../oplog-router' looks like a path; give the name only (no '/', '\\\\' or '..')"]
    plan.snapshot = "20261123T030000.000000Z-before-reset"
    with pytest.raises(RecoveryRefused) as refused:
        apply_restore(app, plan, lambda *a: started.append(a), lambda: started.append("stop"))
    assert refused.value.problems == [
        f"snapshot '20261123T030000.000000Z-before-reset' is not among {APP}'s snapshots: run the DAG again"]
    assert started == []

    source = app.inputs["operations"]
    good = {"topic": source, "partition": 1, "first": 5, "last": 5, "reason": "skipped by operator ops (run r1)"}
    assert entry_problems(app, [good]) == []
    for bad in ({**good, "topic": app.outputs["contacts"]}, {**good, "first": -1}, {**good, "last": 2**70},
                {**good, "reason": "anything"}, {**good, "partition": "1"}):
        assert entry_problems(app, [bad]) == [
            f"entry {str(bad)[:200]} is not an input record range of {APP} with an operator's reason"], bad


