"""The session's one production-shaped stack, as the README's main command with `--cluster` brings it
up: the secured three-broker Kafka (TLS, SASL/SCRAM, ACLs), a Spark standalone master with two
workers, PostgreSQL and Redis, and Airflow on them with the CeleryExecutor and two workers, each on a
loopback address of its own. Started once (`streamops up --cluster`, a real subprocess) for every
test that needs the cluster profile: `up --cluster` itself, the Celery scenarios, and the apps on the
Spark standalone cluster; stopped after the last of them (conftest: `stop_after_last_user`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from streamops.app_runtime import AppRuntime
from streamops.catalog import Catalog, load_catalog
from streamops.kafka_client import KafkaClientConfig
from streamops.local_stack.airflow_api import AirflowApi
from streamops.local_stack.airflow_stack import ADMIN_USER as AIRFLOW_ADMIN
from streamops.local_stack.airflow_stack import CELERY_WORKER_ADDRESSES as CELERY_WORKERS
from streamops.local_stack.airflow_stack import LocalAirflow, _profile_from_record, read_stack_record
from streamops.local_stack.history_server import SparkHistoryServer
from streamops.local_stack.metadata_services import MetadataServices
from streamops.local_stack.secure_cluster import ADMIN_USER
from streamops.local_stack.spark_cluster import WORKER_ADDRESSES as SPARK_WORKERS
from streamops.local_stack.spark_cluster import SparkStandalone, free_spark_ports
from tests.support.ports import free_port, free_port_pair

STREAMOPS = str(Path(sys.executable).parent / "streamops")
# The DAGs the profile's tests trigger, parsed before the first test asks for one.
DAGS = ("provision_topics", "deploy_apps", "stop_apps", "app_status", "roll_restart_apps", "recover_restart_app", "reprocess")


@dataclass
class ClusterProfile:
    env: dict[str, str]  # the environment of `streamops` commands for this stack
    run_dir: Path
    catalog: Catalog  # the project catalog in its `cluster` environment, topics under a prefix of their own
    catalog_file: Path
    up: subprocess.CompletedProcess  # the first `streamops up --cluster`, as it printed
    airflow: LocalAirflow
    api: AirflowApi
    spark: SparkStandalone
    metadata: MetadataServices
    kafka: KafkaClientConfig  # the suite's admin on the secured cluster (load, reads)

    def api_as(self, user: str) -> AirflowApi:
        """The REST API as one of the stack's users (one per role of streamops.access)."""
        return AirflowApi(self.airflow.url, user, self.airflow.password_of(user) or "")

    def streamops(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run([STREAMOPS, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    @property
    def checkpoints(self) -> Path:
        return Path(self.env["STREAMOPS_CHECKPOINT_ROOT"])

    def runtime(self, app: str) -> AppRuntime:
        return AppRuntime(self.checkpoints / app)

    def all_workers_up(self) -> None:
        """Both Celery workers take tasks and both Spark workers run (an earlier test may have
        stopped or killed one)."""
        for name in CELERY_WORKERS:
            if self.airflow.processes[f"celery-{name}"].pid() is None:
                self.airflow.start_worker(name)
        for worker, address in SPARK_WORKERS.items():
            if address not in self.spark.alive_worker_hosts():
                self.spark.start_worker(worker)

    def kill_drivers(self) -> None:
        """Never leave a driver behind: the whole process group of each app's running driver."""
        for name in self.catalog.app_names():
            runtime = self.runtime(name)
            if runtime.is_running() and runtime.driver_process() is not None:
                os.killpg(runtime.driver().process_group, signal.SIGKILL)


def start_cluster_profile(secure_cluster, work: Path, prefix: str) -> ClusterProfile:
    """`streamops up --cluster` on the session's secured cluster, with its own run dir and ports."""
    catalog = load_catalog(environment="cluster").with_topic_prefix(prefix)
    # The scenarios kill drivers on purpose and then run a recovery DAG: a supervisor restart in
    # between would take that step from them (STREAMOPS_SUPERVISOR=manual below: no scheduled runs).
    catalog = catalog.model_copy(update={"apps": [
        app.model_copy(update={"supervision": app.supervision.model_copy(update={"restart": "never"})}) for app in catalog.apps]})
    catalog_file = work / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    run_dir = work / "run"
    # PostgreSQL runs as the `postgres` user, who must reach its folder: not under pytest's 700 tmp.
    metadata = MetadataServices(Path(tempfile.mkdtemp(prefix="streamops-cluster-profile-")), free_port(), free_port())
    metadata.state_dir.chmod(0o711)
    spark = SparkStandalone(work / "spark", **free_spark_ports())
    # The run's artifact store (tests/support/artifacts.py): the profile's every process, a Celery
    # worker the test starts again included, runs the versions the tests publish there.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "STREAMOPS_")) or k in ("STREAMOPS_KAFKA_JVM_OPTIONS", "STREAMOPS_ARTIFACT_STORE")}
    env.update(
        STREAMOPS_RUN_DIR=str(run_dir), STREAMOPS_AIRFLOW_PORT=str(free_port()),
        STREAMOPS_SPARK_HISTORY_PORT=str(free_port()),
        STREAMOPS_KAFKA_PORT=str(free_port_pair()),  # the single broker's: `up` without --cluster is refused here
        STREAMOPS_CATALOG=str(catalog_file), STREAMOPS_CHECKPOINT_ROOT=str(run_dir / "checkpoints"),
        STREAMOPS_CLUSTER_DIR=str(secure_cluster.state_dir),
        STREAMOPS_CLUSTER_PORTS=f"{secure_cluster.client_port},{secure_cluster.controller_port},{secure_cluster.internal_port}",
        STREAMOPS_METADATA_DIR=str(metadata.state_dir),
        STREAMOPS_METADATA_PORTS=f"{metadata.postgres_port},{metadata.redis_port}",
        STREAMOPS_SPARK_DIR=str(spark.state_dir), STREAMOPS_CELERY_LOG_PORTS=f"{free_port()},{free_port()}",
        STREAMOPS_SPARK_PORTS=",".join(str(p) for p in (spark.master_port, spark.master_ui_port, spark.worker_port,
                                                         spark.worker_ui_port)),
        # The supervisor and the snapshot policies run when a test triggers them, never on their own.
        STREAMOPS_SUPERVISOR="manual", STREAMOPS_SNAPSHOTS="manual",
    )
    try:
        up = subprocess.run([STREAMOPS, "up", "--cluster"], env=env, capture_output=True, text=True, timeout=900)
        if up.returncode != 0:
            raise AssertionError(f"`streamops up --cluster` failed (exit {up.returncode}):\n{up.stdout[-4000:]}\n"
                                 f"{up.stderr[-4000:]}")
        return _connected(env, run_dir, catalog, catalog_file, up, metadata, spark, secure_cluster)
    except BaseException:
        _stop(env, metadata, spark)  # never leave a half-set-up stack running
        raise


def _connected(env, run_dir, catalog, catalog_file, up, metadata, spark, secure_cluster) -> ClusterProfile:
    """The profile `up` started, as this process reaches it, once its DAGs are parsed."""
    home = run_dir / "airflow"
    record = read_stack_record(home) or {}
    airflow = LocalAirflow(
        home=home, port=int(env["STREAMOPS_AIRFLOW_PORT"]), kafka_bootstrap=record.get("kafka_bootstrap", ""),
        kafka_settings_files={k: Path(v) for k, v in (record.get("kafka_settings_files") or {}).items()},
        environment=record.get("environment"), **_profile_from_record(record.get("celery")),
        # A worker this process starts again gets what `up` gave it (catalog, checkpoints, run dir).
        extra_env={k: v for k, v in env.items() if k.startswith("STREAMOPS_")},
    )
    api = AirflowApi(airflow.url, AIRFLOW_ADMIN, airflow.admin_password() or "")
    for dag_id in DAGS:
        api.wait_for_dag(dag_id, timeout=300)
    # Every deploy and roll starts a validation of the app's outputs (an asset event), and the
    # validation's Spark app holds one of the standalone cluster's two cores for minutes: the
    # scenarios here are about Celery and the cluster, not validation (the local stack's browser
    # test checks the deploy-triggered validation). Paused, it starts no run.
    api.client.patch("/dags/validate_topic_quality", json={"is_paused": True}).raise_for_status()
    return ClusterProfile(env, run_dir, catalog, catalog_file, up, airflow, api, spark, metadata,
                          secure_cluster.client_config(ADMIN_USER))


def stop_cluster_profile(profile: ClusterProfile) -> str:
    """Drivers killed, Airflow stopped (`streamops airflow stop`: the Kafka cluster is the session's),
    PostgreSQL, Redis and the Spark cluster stopped; raise if Airflow did not stop cleanly."""
    profile.kill_drivers()
    stopped = _stop(profile.env, profile.metadata, profile.spark)
    leftovers = profile.airflow._task_processes()
    if stopped.returncode != 0 or "Airflow celery-worker-2 stopped" not in stopped.stdout or leftovers:
        raise AssertionError(f"the cluster profile's Airflow did not stop cleanly (exit {stopped.returncode}, task processes "
                             f"left: {leftovers}):\n{stopped.stdout[-2000:]}\n{stopped.stderr[-2000:]}")
    return stopped.stdout


def _stop(env: dict[str, str], metadata: MetadataServices, spark: SparkStandalone) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([STREAMOPS, "airflow", "stop"], env=env, capture_output=True, text=True, timeout=300)
    finally:
        # `up --cluster` started it; `down` would stop the session's secured cluster too.
        SparkHistoryServer(state_dir=Path(env["STREAMOPS_RUN_DIR"]) / "spark-history",
                           port=int(env["STREAMOPS_SPARK_HISTORY_PORT"])).stop()
        metadata.stop()
        spark.stop()
        shutil.rmtree(metadata.state_dir, ignore_errors=True)


def processes_on(address: str) -> list[int]:
    """Processes started for the Spark worker on this address (the worker, its executors' JVMs)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if f"--host {address}" in line or f"--hostname {address}" in line:
            found.append(process.info["pid"])
    return found
