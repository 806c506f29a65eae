"""The Spark standalone cluster of this machine (the session's one, the cluster profile's): a master
and two workers on their own loopback addresses, the CLI that finds it, and two drivers of one app
on it one after the other (a paused one taken over). An app's executors on both workers and a
worker killed under load: tests/test_stateful_clusters.py (the presence notifier, through Celery)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from streamops.loadgen import LoadSpec, background_load
from streamops.local_stack.process import AlreadyRunning
from streamops.local_stack.spark_cluster import MASTER_ADDRESS, WORKER_ADDRESSES, SparkStandalone
from streamops.spark_submit import SparkTarget, driver_env, submit_spec
from streamops.waiting import poll_until
from tests.support.ports import free_port
from tests.support.routes import wait_until_all_routed

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture
def spark_cluster(cluster_profile) -> SparkStandalone:
    """The session's one Spark standalone cluster, the cluster profile's (no app of the profile's
    Airflow runs on it while these tests do: each scenario there stops what it started)."""
    poll_until(lambda: cluster_profile.spark.applications() == [], timeout=120,
               what="the apps of earlier tests to leave the Spark cluster")
    return cluster_profile.spark


def test_a_master_and_two_workers_each_on_its_own_address(spark_cluster):
    assert sorted((w["host"], w["state"], w["cores"]) for w in spark_cluster.workers()) == [
        (address, "ALIVE", 1) for address in sorted(WORKER_ADDRESSES.values())]
    assert spark_cluster.master_url == f"spark://{MASTER_ADDRESS}:{spark_cluster.master_port}"
    with pytest.raises(AlreadyRunning, match="the Spark standalone cluster is already running at spark://127.0.0.21:"):
        spark_cluster.start()
    assert "2/2 worker(s) alive (127.0.0.22, 127.0.0.23)" in spark_cluster.status()



def test_the_cli_finds_the_cluster_it_is_pointed_at(spark_cluster):
    env = _cli_env(spark_cluster)
    streamops = str(Path(sys.executable).parent / "streamops")
    up = subprocess.run([streamops, "spark", "up"], env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert f"the Spark standalone cluster is already running at {spark_cluster.master_url}" in up.stdout
    status = subprocess.run([streamops, "spark", "status"], env=env, capture_output=True, text=True, timeout=120)
    assert f"Spark standalone cluster at {spark_cluster.master_url}: master ALIVE, 2/2 worker(s) alive" in status.stdout
    bad = subprocess.run([streamops, "spark", "status"], env={**env, "STREAMOPS_SPARK_PORTS": "1,2"},
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "STREAMOPS_SPARK_PORTS '1,2' is not four ports: master,master-ui,worker,worker-ui" in bad.stderr

def test_a_paused_driver_is_taken_over_and_stops_without_committing_when_it_wakes(spark_cluster, broker, app_catalog,
                                                                                   tmp_path):
    """Two drivers of one app on the cluster, one after the other on the same checkpoint: the first
    is paused (SIGSTOP of its whole process group, as a frozen host), the second takes the lease
    over once the first's heartbeat is older than its ttl, and when the first wakes (SIGCONT) it
    stops without committing. Zero loss, and the checkpoint stays one the second driver runs on."""
    from streamops.app_runtime import AppRuntime, DriverRecord

    for worker, address in WORKER_ADDRESSES.items():  # one core each: one per driver
        if address not in spark_cluster.alive_worker_hosts():
            spark_cluster.start_worker(worker)
    router = app_catalog.app("oplog-router")
    kafka = broker.client_config
    checkpoint = tmp_path / "checkpoint"
    runtime = AppRuntime(checkpoint)
    catalog = _catalog_file(app_catalog, tmp_path)

    def start_driver(name: str) -> subprocess.Popen:
        spec = submit_spec(router, kafka=kafka, catalog=catalog, trigger="1 second", checkpoint=str(checkpoint))
        spec = dataclasses.replace(spec, conf={**spec.conf, **spark_cluster.app_conf(cores=1), "spark.ui.port": str(free_port()),
                                               "spark.port.maxRetries": "0", "spark.driver.host": "127.0.0.1",
                                               "spark.driver.bindAddress": "127.0.0.1"})
        with open(tmp_path / f"{name}.log", "wb") as log:
            return subprocess.Popen(spec.argv(SparkTarget(spark_cluster.master_url)),
                                    env=driver_env(STREAMOPS_LEASE_TTL_S="8"), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def committed() -> int:
        return max((int(f.name) for f in (checkpoint / "route" / "commits").glob("[0-9]*")), default=-1)

    old = new = None
    try:
        with background_load(router, LoadSpec(count=10_000_000, keys=20, rate=100, seed=44, start_seq=20_000_000), kafka):
            old = start_driver("old")
            poll_until(lambda: committed() >= 2, timeout=300, what="the first driver to commit batches")
            old_record = runtime.driver()
            os.killpg(old.pid, signal.SIGSTOP)
            paused_at = committed()
            # While its heartbeat is fresh the paused driver still holds the app: a new one is refused.
            assert runtime.is_running()
            poll_until(lambda: not runtime.is_running(), timeout=60, what="the paused driver's lease to run out")
            new = start_driver("new")
            poll_until(lambda: (runtime.driver() or DriverRecord()).lease_epoch == old_record.lease_epoch + 1, timeout=300,
                       what="the second driver to take the lease")
            new_record = runtime.driver()
            poll_until(lambda: committed() >= paused_at + 3, timeout=300, what="the second driver to commit batches")
            os.killpg(old.pid, signal.SIGCONT)
            assert old.wait(timeout=180) == 4, (tmp_path / "old.log").read_text()[-3000:]
            fenced = [e for e in runtime.history() if e["event"] == "fenced"]
            assert [(e["pid"], e["lease_epoch"]) for e in fenced] == [(old_record.pid, old_record.lease_epoch)]
            assert fenced[0]["reason"].startswith(f"the lease of epoch {old_record.lease_epoch} was taken over by driver "
                                                  f"pid {new_record.pid} on ")
            # The record and the state are the new driver's; it goes on.
            assert (runtime.driver().pid, runtime.state()) == (new_record.pid, "running")
            resumed_at = committed()
            poll_until(lambda: committed() >= resumed_at + 2, timeout=300, what="the second driver to go on committing")
            assert new.poll() is None
        expected, got = wait_until_all_routed(kafka, router, timeout=300, what="every record routed after the takeover")
        runtime.request_stop(by="test")
        assert new.wait(timeout=180) == 0
        assert runtime.driver().outcome == "stopped"
        offsets = max(int(f.name) for f in (checkpoint / "route" / "offsets").glob("[0-9]*"))
        assert committed() == offsets, "a batch planned but not committed after a graceful stop"
        print(f"\nlease takeover: {len(expected)} routes expected and found, {sum(n - 1 for n in Counter(got).values())} "
              f"duplicates; paused driver fenced at batch {paused_at}, the new driver committed up to {offsets}")
    finally:
        for driver in (old, new):
            if driver is not None and driver.poll() is None:
                os.killpg(driver.pid, signal.SIGCONT)
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(timeout=60)


def _cli_env(cluster) -> dict[str, str]:
    ports = ",".join(str(p) for p in (cluster.master_port, cluster.master_ui_port, cluster.worker_port, cluster.worker_ui_port))
    return {**os.environ, "STREAMOPS_SPARK_DIR": str(cluster.state_dir), "STREAMOPS_SPARK_PORTS": ports}


def _catalog_file(catalog, tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(catalog.to_yaml())
    return path



@pytest.mark.parametrize("ui", ["http://x:abc/y", "file:///etc/passwd", "http://127.0.0.1:4040/../../admin", ""])
def test_status_asks_nothing_but_a_driver_ui_address(ui):
    from streamops.app_status import executor_hosts

    assert executor_hosts(ui, "app-20261123-0001") is None  # unknown, and no request made
    assert executor_hosts("http://127.0.0.1:9", "app/../../x") is None
