"""A stateful app beyond one host, on the session's one cluster profile (`streamops up --cluster`,
tests/support/cluster_profile.py): the presence notifier deployed through Celery with an executor on
each Spark standalone worker, connecting to the secured three-broker Kafka as its own principal. A
roll while the app holds every core of the cluster (its state check on the Airflow worker), then a
worker killed under load (the app goes on on the other one, its state reloaded from the
checkpoint): its records, its per-user state and its count windows are exactly what its rules give
for the batches it committed (a golden replay, tests/support/golden.py). browser-activity under its
own principal: tests/test_secured_pipeline.py."""

from __future__ import annotations

import pytest

from streamops.acls import AppAcl, app_acls
from streamops.app_status import app_status, status_table
from streamops.kafka_records import read_all
from streamops.loadgen import LoadSpec, background_load
from streamops.loadgen import run as run_load
from streamops.local_stack.airflow_stack import CELERY_WORKER_ADDRESSES as AIRFLOW_WORKERS
from streamops.local_stack.spark_cluster import WORKER_ADDRESSES
from streamops.state_query import MAX_ROWS, StateRequest, read_state
from streamops.waiting import poll_until
from tests.support.artifacts import same_code_as
from tests.support.cluster_profile import processes_on
from tests.support.golden import canonical_values, caught_up, latest_per_key, presence_replay

pytestmark = [pytest.mark.timeout(1800), pytest.mark.usefixtures("cluster_profile_paths")]


@pytest.fixture
def profile(cluster_profile):
    """The cluster profile, both Celery workers and both Spark workers up and no earlier test's app
    on the Spark cluster; no driver left running after the test."""
    cluster_profile.all_workers_up()
    poll_until(lambda: cluster_profile.spark.applications() == [], timeout=180,
               what="the apps of earlier tests to leave the Spark cluster")
    yield cluster_profile
    cluster_profile.kill_drivers()


def test_presence_notifier_rolled_holding_every_core_then_a_worker_lost_under_load_keeps_state_and_windows_exact(
        profile, spark):
    api, operator = profile.api, profile.api_as("operator")
    spec = profile.catalog.app("presence-notifier")
    runtime = profile.runtime("presence-notifier")
    kafka = profile.kafka
    # Its principal may read its inputs and the notifications it counts, write its outputs (the
    # compacted latest-state table among them) and dead letters, use its own consumer groups;
    # nothing else (`streamops up --cluster` applied these).
    principal = "User:presence-notifier"
    assert {acl for acl in app_acls(profile.catalog) if acl.principal == principal} == {
        *(AppAcl(principal, "Topic", "Literal", topic, op) for topic in [*spec.inputs.values(), spec.outputs["notifications"]]
          for op in ("Read", "Describe")),
        *(AppAcl(principal, "Topic", "Literal", topic, op) for topic in [*spec.outputs.values(), spec.dead_letter_topic]
          for op in ("Write", "Describe")),
        AppAcl(principal, "Group", "Prefixed", "streamops.presence-notifier", "Read"),
    }
    # Both cores of the cluster: an executor on each worker, each holding some of the state's
    # partitions. Every batch's offsets kept, for the replay below.
    conf = {"spark.cores.max": 2, "spark.sql.streaming.minBatchesToRetain": 10_000}
    deployed = operator.trigger("deploy_apps", {"apps": ["presence-notifier"], "spark_conf": conf})
    assert api.wait_for_run("deploy_apps", deployed, timeout=600) == "success", api.run_report("deploy_apps", deployed)
    first = runtime.driver()
    assert (first.launched_by, first.spark_master) == (deployed, profile.spark.master_url)
    assert first.driver_host in AIRFLOW_WORKERS.values()
    assert " as presence-notifier (SCRAM-SHA-512) (from connection kafka_app_presence_notifier)" in first.kafka
    workers = sorted(WORKER_ADDRESSES.values())

    def executors() -> list[str] | None:
        return app_status(spec, kafka).executor_hosts

    poll_until(lambda: executors() == workers, timeout=180, what="an executor on each worker")
    assert (f"{first.driver_host} @ {profile.spark.master_url} ({', '.join(workers)}); {first.spark_ui}"
            in status_table([app_status(spec, kafka)]))
    assert [app["name"] for app in profile.spark.applications()] == ["streamops-presence-notifier"]
    refused = profile.streamops("spark", "down")
    assert refused.returncode == 1
    assert (f"apps run on the Spark cluster at {profile.spark.master_url}: streamops-presence-notifier (app-"
            in refused.stderr), refused.stderr

    def batches() -> dict[str, int]:
        return {query: p.batch_id for query, p in runtime.progress().items()}

    notifications = spec.outputs["notifications"]

    def processed_everything() -> bool:
        return caught_up(runtime, kafka, [("notify", list(spec.inputs.values())), ("count", [notifications])])

    # A roll while the app holds every core: its standby gets no executor until the running version
    # stops, so the state check runs on the Airflow worker (a --check-state driver). The app has
    # processed what its inputs hold, so its health gate judges the roll, not the host's speed.
    run_load(spec, LoadSpec(count=1_500, keys=30, seed=81), kafka)
    poll_until(processed_everything, timeout=600, what="the notifier to process the first records", max_interval=2)
    same_code_as(spec, "3.1.0")
    rolled = operator.trigger("roll_restart_apps", {
        "apps": ["presence-notifier"], "version": "3.1.0", "spark_conf": conf, "approve_in_ui": False})
    roll_state = api.wait_for_run("roll_restart_apps", rolled, timeout=900)
    roll_log = api.task_log("roll_restart_apps", rolled, "roll")
    assert roll_state == "success", roll_log[-4000:]
    assert ("presence-notifier: the standby could not judge the restart from the checkpoint (no executor registered "
            "within 10s on spark://") in roll_log, roll_log[-4000:]
    assert "a --check-state driver judges it on this host (local[1])" in roll_log
    assert "the checkpoint carries over to the new version" in roll_log
    rolled_driver = runtime.driver()
    assert (rolled_driver.version, rolled_driver.spark_master, rolled_driver.launched_spark_conf) == (
        "3.1.0", profile.spark.master_url, {k: str(v) for k, v in conf.items()})
    assert rolled_driver.pid != first.pid
    poll_until(lambda: executors() == workers, timeout=180, what="the rolled version's executors on both workers")

    # A lost machine under load: worker 2 killed, its executor JVM with it. The app goes on on
    # worker 1, which loads the lost executor's state partitions from the checkpoint.
    with background_load(spec, LoadSpec(count=10_000_000, keys=30, rate=60, seed=82, start_seq=1_000_000), kafka):
        before_loss = batches()
        poll_until(lambda: all(batches()[q] > before_loss[q] for q in before_loss), timeout=300,
                   what="both queries to commit a batch under load")
        profile.spark.kill_worker(2)
        poll_until(lambda: not processes_on(WORKER_ADDRESSES[2]), timeout=60, what="worker 2's processes to be gone")
        poll_until(lambda: executors() == [WORKER_ADDRESSES[1]], timeout=120,
                   what="the lost worker's executor to be gone from the app")
        after_loss = batches()
        poll_until(lambda: all(batches()[q] > after_loss[q] for q in after_loss), timeout=300,
                   what="both queries to commit a batch on the worker left")
        assert runtime.state() == "running" and runtime.driver().pid == rolled_driver.pid
    poll_until(processed_everything, timeout=600, what="the notifier to process every record of the load", max_interval=2)
    stopped = api.trigger("stop_apps", {"apps": ["presence-notifier"], "deadline_s": 60})
    assert api.wait_for_run("stop_apps", stopped, timeout=600) == "success", api.run_report("stop_apps", stopped)
    assert runtime.driver().outcome == "stopped"

    # What the notifier's rules give for the batches it committed, across the roll and the lost
    # worker: exactly its notifications (each at least once), its latest-state table, its windows
    # (a notification written twice counts once) and each user's presence history in its state.
    expected = presence_replay(kafka, spec, runtime.checkpoint)
    written = read_all(kafka, notifications)
    got = canonical_values(written)
    assert expected.notifications and got == expected.notifications, (
        f"{len(expected.notifications - got)} notifications missing (e.g. {sorted(expected.notifications - got)[:2]}), "
        f"{len(got - expected.notifications)} unexpected (e.g. {sorted(got - expected.notifications)[:2]})")
    assert latest_per_key(kafka, spec.outputs["latest_state"]) == expected.latest_state
    windows = latest_per_key(kafka, spec.outputs["notification_counts"])
    assert windows == expected.windows, {k: (windows.get(k), v) for k, v in expected.windows.items() if windows.get(k) != v}
    assert read_all(kafka, spec.dead_letter_topic) == []
    (notify_state,) = read_state(spark, spec, StateRequest(query="notify", limit=MAX_ROWS)).stores
    held = {row["key"]["user_id"]: [(e["time_ms"], e["action"], e["event_id"]) for e in row["value"]["groupState"]["history"]]
            for row in notify_state.rows}
    assert held == expected.history and len(held) == 30
    print(f"\npresence notifier on the standalone cluster, rolled, then worker 2 killed under load: "
          f"{len(got)} notifications over {expected.batches} batches as its rules give them, "
          f"{len(written) - len(got)} duplicates (counted once), {len(windows)} windows exact")
