"""The cluster profile through Airflow: metadata on PostgreSQL, the CeleryExecutor (Redis) with two
workers on their own loopback addresses, spark_default on a Spark standalone master. Deploy from
one worker, kill -9 that worker (the driver goes on), status and stop from the other, and two
deploys of one app at once: exactly one driver, the other run refused naming it and its host; then
roll_restart_apps, recover_restart_app and a reprocess backfill with its cutover run through Celery
on the standalone cluster."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support.ports import free_port
from tests.support.routes import wait_until_all_routed
from streamops.app_runtime import AppRuntime
from streamops.app_status import app_status
from streamops.catalog import Catalog, load_catalog
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import read_all
from streamops.loadgen import LoadSpec
from streamops.loadgen import run as run_load
from streamops.local_stack.airflow_api import AirflowApi
from streamops.local_stack.airflow_stack import LocalAirflow
from streamops.local_stack.metadata_services import PostgresServer, RedisServer
from streamops.local_stack.spark_cluster import WORKER_ADDRESSES, SparkStandalone, free_spark_ports
from streamops.provisioning import ensure_topics
from streamops.waiting import poll_until

pytestmark = pytest.mark.timeout(1800)

AIRFLOW_WORKERS = {"worker-1": "127.0.0.31", "worker-2": "127.0.0.32"}


@dataclass
class ClusterProfile:
    airflow: LocalAirflow
    spark: SparkStandalone
    catalog: Catalog
    api: AirflowApi


@pytest.fixture(scope="module")
def cluster_profile(broker, admin, tmp_path_factory):
    # PostgreSQL runs as the `postgres` user, who must reach its folder: not under pytest's 700 tmp.
    state = Path(tempfile.mkdtemp(prefix="streamops-cluster-profile-"))
    state.chmod(0o711)
    work = tmp_path_factory.mktemp("cluster-profile")
    catalog = load_catalog().with_topic_prefix(f"c{uuid.uuid4().hex[:10]}")
    # The scheduler runs app_status (the supervisor) on its own here: with restarts on, it could
    # restart a driver these tests kill on purpose before their recovery DAG runs.
    catalog = catalog.model_copy(update={"apps": [
        app.model_copy(update={"supervision": app.supervision.model_copy(update={"restart": "never"})}) for app in catalog.apps]})
    ensure_topics(admin, catalog.topics)
    catalog_file = work / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    postgres = PostgresServer(state / "postgres", free_port())
    redis = RedisServer(state / "redis", free_port())
    spark = SparkStandalone(work / "spark", **free_spark_ports())
    airflow = None
    with pytest.MonkeyPatch.context() as env:
        env.setenv("STREAMOPS_CATALOG", str(catalog_file))
        env.setenv("STREAMOPS_CHECKPOINT_ROOT", str(work / "checkpoints"))
        try:
            postgres.start()
            redis.start()
            spark.start()
            airflow = LocalAirflow(
                home=work / "airflow", port=free_port(), kafka_bootstrap=broker.bootstrap_servers,
                database_url=postgres.url(), celery_broker_url=redis.url, celery_workers=dict(AIRFLOW_WORKERS),
                celery_log_ports={name: free_port() for name in AIRFLOW_WORKERS}, spark_master=spark.master_url,
                spark_conf_dir=spark.write_client_conf(cores=1))
            airflow.init()
            airflow.start(timeout=300)
            api = AirflowApi(airflow.url, "admin", airflow.admin_password())
            for dag_id in ("deploy_apps", "stop_apps", "app_status", "roll_restart_apps", "recover_restart_app", "reprocess"):
                api.wait_for_dag(dag_id, timeout=300)
            yield ClusterProfile(airflow, spark, catalog, api)
        finally:
            for name in catalog.app_names():  # never leave a driver behind
                runtime = AppRuntime(work / "checkpoints" / name)
                if runtime.is_running() and runtime.driver_process() is not None:
                    os.killpg(runtime.driver().process_group, signal.SIGKILL)
            if airflow is not None:
                airflow.stop()
                assert airflow._task_processes() == []  # no task process outlives the stack
            spark.stop()
            redis.stop()
            postgres.stop()
            shutil.rmtree(state, ignore_errors=True)


def _launch(profile: ClusterProfile, run_id: str) -> dict:
    (ti,) = [ti for ti in profile.api.task_instances("deploy_apps", run_id) if ti["task_id"] == "launch"]
    return ti


def test_the_metadata_is_on_postgres_and_tasks_run_on_two_celery_hosts(cluster_profile):
    env = cluster_profile.airflow.env()
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
    assert not (cluster_profile.airflow.home / "airflow.db").exists()
    # The API server answers its health check within 5 s only when the machine is not too busy.
    poll_until(lambda: cluster_profile.airflow.health().get("metadatabase") == "healthy", timeout=120,
               what="the API server to report its PostgreSQL metadata database healthy")
    for name, address in AIRFLOW_WORKERS.items():
        assert cluster_profile.airflow.processes[f"celery-{name}"].pid() is not None
        assert f"{name}@{address} ready" in cluster_profile.airflow.processes[f"celery-{name}"].log_file.read_text()


def test_deploy_on_one_worker_survives_it_and_is_stopped_from_the_other(cluster_profile, broker):
    profile, api = cluster_profile, cluster_profile.api
    router = profile.catalog.app("oplog-router")
    runtime = AppRuntime(router.checkpoint_location())
    kafka = broker.client_config
    run_load(router, LoadSpec(count=300, keys=20, seed=51), kafka)

    # Deploy while only worker 1 takes tasks.
    profile.airflow.processes["celery-worker-2"].stop()
    deployed = api.trigger("deploy_apps", {"apps": ["oplog-router"]})
    assert api.wait_for_run("deploy_apps", deployed, timeout=600) == "success", api.task_log(
        "deploy_apps", deployed, "launch", map_index=0)
    assert _launch(profile, deployed)["hostname"] == AIRFLOW_WORKERS["worker-1"]
    driver = runtime.driver()
    assert (driver.launched_by, driver.spark_master, driver.driver_host) == (
        deployed, profile.spark.master_url, AIRFLOW_WORKERS["worker-1"])
    # Executors on the standalone cluster's workers (the client conf caps an app at one core).
    poll_until(lambda: len(app_status(router, kafka).executor_hosts or []) == 1, timeout=120,
               what="the router's executor on a Spark worker")
    assert set(app_status(router, kafka).executor_hosts) <= set(WORKER_ADDRESSES.values())
    wait_until_all_routed(kafka, router, timeout=300, what="the router deployed through Celery to route the load")

    # kill -9 of the Airflow worker that launched the driver: the driver is not its child any more.
    profile.airflow.kill_worker("worker-1")
    assert profile.airflow._task_processes(host_address=AIRFLOW_WORKERS["worker-1"]) == []  # the whole "host" is gone
    assert runtime.is_running() and psutil.pid_exists(driver.pid)
    profile.airflow.start_worker("worker-2")
    status_run = api.trigger("app_status", {"apps": ["oplog-router"]})
    assert api.wait_for_run("app_status", status_run, timeout=600) == "success"
    (status_ti,) = [ti for ti in api.task_instances("app_status", status_run) if ti["task_id"] == "status"]
    assert status_ti["hostname"] == AIRFLOW_WORKERS["worker-2"]
    status_log = api.task_log("app_status", status_run, "status")
    assert f"{AIRFLOW_WORKERS['worker-1']} @ {profile.spark.master_url}" in status_log
    assert "running" in status_log

    # Stop from worker 2: graceful, recorded with the run that asked.
    stopped = api.trigger("stop_apps", {"apps": ["oplog-router"], "deadline_s": 60})
    assert api.wait_for_run("stop_apps", stopped, timeout=600) == "success"
    (stop_ti,) = [ti for ti in api.task_instances("stop_apps", stopped) if ti["task_id"] == "stop"]
    assert stop_ti["hostname"] == AIRFLOW_WORKERS["worker-2"]
    record = runtime.driver()
    assert record.pid == driver.pid and record.outcome == "stopped"
    assert record.reason.startswith(f"stop requested by {stopped}; ")
    assert "stopped between micro-batches" in record.reason
    assert not runtime.is_running()

    # Two deploys of the stopped app at the same moment, both workers up: exactly one driver.
    profile.airflow.start_worker("worker-1")
    runs = [api.trigger("deploy_apps", {"apps": ["oplog-router"]}) for _ in range(2)]
    states = {run: api.wait_for_run("deploy_apps", run, timeout=600) for run in runs}
    assert sorted(states.values()) == ["failed", "success"]
    (winner,) = [run for run, state in states.items() if state == "success"]
    (loser,) = [run for run, state in states.items() if state == "failed"]
    running = runtime.driver()
    assert running.launched_by == winner and runtime.is_running()
    refusal = api.task_log("deploy_apps", loser, "launch", map_index=0)
    # Which guard answers depends on the moment: while the winner is still starting, its run holds
    # the app (_runtime/operation.json); once its driver runs, the driver's lease does.
    if "is being changed by another run" in refusal:
        assert f"oplog-router is being changed by another run: deploy_apps deploy (run {winner}, since " in refusal
    else:
        assert f"oplog-router is already running: driver pid {running.pid} on " in refusal
        # The host, with the Airflow worker's address the driver was launched from.
        assert f" ({_launch(profile, winner)['hostname']}), version " in refusal
    starts = [e for e in runtime.history() if e["event"] == "started" and e.get("launched_by") in runs]
    assert [e["launched_by"] for e in starts] == [winner]
    print(f"\ntwo deploys at once: {winner} won on {_launch(profile, winner)['hostname']}, "
          f"{loser} was refused on {_launch(profile, loser)['hostname']}")
    # The winner keeps running for the next test (the module's fixture kills what is left).


def test_roll_restart_recover_restart_and_reprocess_through_celery_on_the_standalone_cluster(cluster_profile, broker):
    profile, api = cluster_profile, cluster_profile.api
    router = profile.catalog.app("oplog-router")
    runtime = AppRuntime(router.checkpoint_location())
    kafka = broker.client_config
    for name in AIRFLOW_WORKERS:  # both workers take tasks (an earlier test may have stopped one)
        if profile.airflow.processes[f"celery-{name}"].pid() is None:
            profile.airflow.start_worker(name)
    if not runtime.is_running():
        deployed = api.trigger("deploy_apps", {"apps": ["oplog-router"]})
        assert api.wait_for_run("deploy_apps", deployed, timeout=600) == "success"
    before = runtime.driver()

    run_load(router, LoadSpec(count=200, keys=20, seed=52, start_seq=30_000_000), kafka)
    rolled = api.trigger("roll_restart_apps", {"apps": ["oplog-router"], "version": "1.1.0", "gate_deadline_s": 240,
                                              "approve_in_ui": False})
    assert api.wait_for_run("roll_restart_apps", rolled, timeout=900) == "success", api.task_log(
        "roll_restart_apps", rolled, "roll")
    after = runtime.driver()
    assert (after.version, after.spark_master) == ("1.1.0", profile.spark.master_url)
    assert after.pid != before.pid and after.driver_host in AIRFLOW_WORKERS.values()
    wait_until_all_routed(kafka, router, timeout=300, what="the rolled router to route the load")

    # A crash: the driver's whole process group killed; recover_restart_app brings back 1.1.0.
    os.killpg(after.process_group, signal.SIGKILL)
    poll_until(lambda: runtime.state() == "crashed", timeout=60, what="the killed driver to show as crashed")
    run_load(router, LoadSpec(count=200, keys=20, seed=53, start_seq=31_000_000), kafka)
    restarted = api.trigger("recover_restart_app", {"app": "oplog-router", "dry_run": False, "approve_in_ui": False})
    assert api.wait_for_run("recover_restart_app", restarted, timeout=900) == "success"
    again = runtime.driver()
    assert runtime.is_running() and again.version == "1.1.0" and again.pid != after.pid
    assert again.spark_master == profile.spark.master_url
    expected, got = wait_until_all_routed(kafka, router, timeout=300, what="the restarted router to route the load")
    print(f"\nroll + recover_restart through Celery: {len(expected)} routes, {len(got) - len(set(got))} duplicates")

    # A backfill from earliest and a cutover, on a Celery worker: the backfill's Spark session on
    # the standalone master, then the live router stopped and started again on the new topics.
    backfill = api.trigger("reprocess", {"app": "oplog-router", "start": "earliest", "end": "now", "target": "versioned",
                                         "version": "v2", "dry_run": False, "approve_in_ui": False, "cutover": True})
    assert api.wait_for_run("reprocess", backfill, timeout=900) == "success", api.task_log("reprocess", backfill, "run")
    assert {ti["task_id"]: ti["state"] for ti in api.task_instances("reprocess", backfill)} == {
        "plan": "success", "approve": "skipped", "run": "success", "validate": "success", "cut_over": "success"}
    inputs = sum(high - low for low, high in end_offsets(kafka, router.inputs["operations"]).values())
    assert api.xcom("reprocess", backfill, "run")["records_in"] == inputs
    cut = runtime.driver()
    assert runtime.is_running() and cut.version == "1.1.0+v2" and cut.spark_master == profile.spark.master_url
    for live in router.outputs.values():  # every routed record is on the new topics too (the old may hold duplicates)
        assert {(r.key, r.value) for r in read_all(kafka, live)} <= {(r.key, r.value) for r in read_all(kafka, f"{live}.v2")}
    runtime.request_stop(by="test")
    poll_until(lambda: not runtime.is_running(), timeout=180, what="the router to stop")
