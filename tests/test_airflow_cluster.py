"""The cluster profile through Airflow, on the session's one cluster profile (`streamops up --cluster`,
tests/support/cluster_profile.py): metadata on PostgreSQL, the CeleryExecutor (Redis) with two
workers on their own loopback addresses, spark_default on a Spark standalone master, Kafka the
secured three-broker cluster with each app under its own principal. Deploy from one worker, kill -9
that worker (the driver goes on), status and stop from the other, and two deploys of one app at
once: exactly one driver, the other run refused naming it and its host; then roll_restart_apps,
recover_restart_app and a reprocess backfill with its cutover run through Celery on the standalone
cluster."""

from __future__ import annotations

import os
import signal

import httpx
import psutil
import pytest

from streamops.app_status import app_status
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import read_all
from streamops.loadgen import LoadSpec
from streamops.loadgen import run as run_load
from streamops.local_stack.airflow_stack import CELERY_WORKER_ADDRESSES as AIRFLOW_WORKERS
from streamops.local_stack.spark_cluster import WORKER_ADDRESSES
from streamops.reprocess import target_catalog
from streamops.waiting import poll_until
from tests.support.artifacts import same_code_as
from tests.support.cluster_profile import ClusterProfile
from tests.support.routes import wait_until_all_routed

pytestmark = [pytest.mark.timeout(1800), pytest.mark.usefixtures("cluster_profile_paths")]


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


def test_deploy_on_one_worker_survives_it_and_is_stopped_from_the_other(cluster_profile):
    profile, api = cluster_profile, cluster_profile.api
    profile.all_workers_up()
    router = profile.catalog.app("oplog-router")
    runtime = profile.runtime("oplog-router")
    kafka = profile.kafka
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
    assert " as oplog-router (SCRAM-SHA-512) (from connection kafka_app_oplog_router)" in driver.kafka
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


def test_roll_restart_recover_restart_and_reprocess_through_celery_on_the_standalone_cluster(cluster_profile):
    profile, api = cluster_profile, cluster_profile.api
    router = profile.catalog.app("oplog-router")
    runtime = profile.runtime("oplog-router")
    kafka = profile.kafka
    profile.all_workers_up()
    if not runtime.is_running():
        deployed = api.trigger("deploy_apps", {"apps": ["oplog-router"]})
        assert api.wait_for_run("deploy_apps", deployed, timeout=600) == "success"
    before = runtime.driver()

    run_load(router, LoadSpec(count=200, keys=20, seed=52, start_seq=30_000_000), kafka)
    same_code_as(router, "1.1.0")
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
    # A cutover repeats records for the new topics' readers: the operator's plan waits for an
    # approver (four eyes: streamops.access), who approves it through the API.
    operator, approver = profile.api_as("operator"), profile.api_as("approver")
    backfill = operator.trigger("reprocess", {"app": "oplog-router", "start": "earliest", "end": "now", "target": "versioned",
                                              "version": "v2", "dry_run": False, "cutover": True})
    poll_until(lambda: api.task_states("reprocess", backfill).get("approve") == "awaiting_input", timeout=600,
               what="the reprocessing plan to wait for approval")
    assert operator.answer_approval("reprocess", backfill).status_code == 403
    answered = approver.answer_approval("reprocess", backfill)
    assert answered.status_code == 200, answered.text
    assert api.wait_for_run("reprocess", backfill, timeout=900) == "success", api.task_log("reprocess", backfill, "run")
    assert {ti["task_id"]: ti["state"] for ti in api.task_instances("reprocess", backfill)} == {
        "plan": "success", "approve": "success", "run": "success", "validate": "success", "cut_over": "success"}
    assert api.xcom("reprocess", backfill, "approve")["responded_by_user"]["name"] == "approver"
    inputs = sum(high - low for low, high in end_offsets(kafka, router.inputs["operations"]).values())
    assert api.xcom("reprocess", backfill, "run")["records_in"] == inputs
    # Every driver's history on the profile's History Server: the one killed above (its whole
    # process group: its event log never ended) with its jobs, and the backfill, named apart.
    history = f"http://127.0.0.1:{profile.env['STREAMOPS_SPARK_HISTORY_PORT']}/api/v1/applications"

    def listed() -> dict[str, dict]:
        return {a["id"]: a for a in httpx.get(history, params={"limit": 200}, timeout=30).json()}

    poll_until(lambda: after.application_id in listed() and "streamops-oplog-router-backfill" in
               {a["name"] for a in listed().values()}, timeout=120, what="the History Server to list both drivers")
    killed = listed()[after.application_id]
    assert killed["name"] == "streamops-oplog-router" and killed["attempts"][0]["completed"] is False, killed
    assert httpx.get(f"{history}/{after.application_id}/jobs", timeout=30).json(), "no jobs in the killed driver's history"
    cut = runtime.driver()
    assert runtime.is_running() and cut.version == "1.1.0+v2" and cut.spark_master == profile.spark.master_url
    # Under its own principal on the new topics: the cutover granted it exactly what the catalog gives
    # it on the old ones.
    granted = api.xcom("reprocess", backfill, "cut_over")["acls_granted"]
    assert sorted(granted) == sorted(f"allow User:oplog-router {op} on topic {topic}.v2 (literal)"
                                     for topic in [*router.outputs.values(), router.dead_letter_topic]
                                     for op in ("Describe", "Write"))
    for live in router.outputs.values():  # every routed record is on the new topics too (the old may hold duplicates)
        assert {(r.key, r.value) for r in read_all(kafka, live)} <= {(r.key, r.value) for r in read_all(kafka, f"{live}.v2")}
    # And it writes them: what arrives after the cutover is routed there too.
    run_load(router, LoadSpec(count=100, keys=20, seed=54, start_seq=32_000_000), kafka)
    moved = target_catalog(profile.catalog, "oplog-router",
                           {t: f"{t}.v2" for t in [*router.outputs.values(), router.dead_letter_topic]}).app("oplog-router")
    wait_until_all_routed(kafka, moved, timeout=300, what="the router on its new topics to route what came after the cutover")
    runtime.request_stop(by="test")
    poll_until(lambda: not runtime.is_running(), timeout=180, what="the router to stop")
