"""The suite against a production-shaped Kafka: three brokers, TLS on every listener, SASL/SCRAM,
ACLs enforced. The catalog's `cluster` environment, the DAGs with Airflow connections holding the
credentials, the router under its own principal, a write it is not allowed, a broker killed under
load; browser-activity (stateful) under its own principal, exactly as a golden run, refused what
its ACLs do not grant; and no password anywhere a person or another user can read it."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest
from confluent_kafka import KafkaException

from streamops.acls import AppAcl, app_acls, apply_acls
from streamops.app_runtime import AppRuntime
from streamops.catalog import load_catalog
from streamops.kafka_client import app_conn_id
from streamops.kafka_records import produce, read_all
from streamops.loadgen import LoadSpec, background_load
from streamops.loadgen import run as run_load
from streamops.local_stack.secure_cluster import ADMIN_USER
from streamops.waiting import poll_until
from tests.support import LOCAL_SPARK_CONNECTION
from tests.support.golden import caught_up, golden_run, latest_per_key
from tests.support.routes import routed, wait_until_all_routed

pytestmark = pytest.mark.timeout(1500)


@pytest.fixture
def secured(secure_cluster, tmp_path, monkeypatch, prefix):
    """The project catalog in its `cluster` environment (topic names prefixed), a user per app,
    kafka_default as the suite's admin and kafka_app_<app> per app, checkpoints under tmp_path."""
    catalog = load_catalog(environment="cluster").with_topic_prefix(prefix)
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    secure_cluster.ensure_users(catalog.app_names())
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": secure_cluster.client_settings(ADMIN_USER)}))
    for name in catalog.app_names():
        monkeypatch.setenv(f"AIRFLOW_CONN_{app_conn_id(name).upper()}", json.dumps(
            {"conn_type": "kafka", "extra": secure_cluster.client_settings(name)}))
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("STREAMOPS_QUALITY_ROOT", str(tmp_path / "quality"))
    monkeypatch.setenv("STREAMOPS_ENVIRONMENT", "cluster")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", LOCAL_SPARK_CONNECTION)
    yield catalog, catalog_file
    for name in catalog.app_names():  # never leave a driver behind
        runtime = AppRuntime(tmp_path / "checkpoints" / name)
        if runtime.is_running():
            os.kill(runtime.driver().pid, 9)


def test_the_router_on_a_secured_three_broker_cluster_under_its_own_principal(
        secured, secure_cluster, run_dag, capfd, tmp_path, spark):
    catalog, catalog_file = secured
    router = catalog.app("oplog-router")
    admin_kafka = secure_cluster.client_config(ADMIN_USER)
    admin = admin_kafka.admin()

    # provision_topics creates every topic as the environment says, and verifies it.
    provisioned = run_dag("provision_topics", catalog_file, dry_run=False, topics=[])
    assert provisioned.state == "success", provisioned.task_states
    described = admin.describe_topics(__import__("confluent_kafka").TopicCollection(catalog.topic_names()))
    for name, future in described.items():
        assert {len(p.replicas) for p in future.result(timeout=30).partitions} == {3}, name
    from streamops.provisioning import describe_broker
    snapshot = describe_broker(admin, catalog.topic_names())
    assert {snapshot.topics[name].configs["min.insync.replicas"] for name in catalog.topic_names()} == {"2"}

    # ACLs as the catalog derives them, except the router may not write its "groups" output.
    groups = router.outputs["groups"]
    withheld = AppAcl("User:oplog-router", "Topic", "Literal", groups, "Write")
    assert withheld in app_acls(catalog)
    apply_acls(admin, app_acls(catalog) - {withheld})

    run_load(router, LoadSpec(count=600, keys=20, seed=14), admin_kafka)
    deployed = run_dag("deploy_apps", catalog_file, apps=["oplog-router"], version="1.0.0")
    assert deployed.state == "success", deployed.task_states
    runtime = AppRuntime(router.checkpoint_location())
    driver = runtime.driver()
    assert " as oplog-router (SCRAM-SHA-512) (from connection kafka_app_oplog_router)" in driver.kafka
    assert driver.environment == "cluster"
    argv = [_command_line(p) for p in psutil.process_iter() if _in_group(p, driver.process_group)]
    assert any("--kafka-config" in line for line in argv)

    # The write it is not allowed fails the query with Kafka's authorization error, said plainly.
    poll_until(lambda: runtime.state() in ("failed", "stopped", "crashed"),
               timeout=240, what="the denied write to fail the router")
    # (Report only: the supervisor would restart it, and it would fail the same way until granted.)
    status = run_dag("app_status", catalog_file, apps=["oplog-router"], restart_crashed=False)
    said = status.xcoms["status"]["oplog-router"]
    assert said["state"] == "failed" and status.state == "failed"  # the run pages: the app should be running
    assert "TopicAuthorizationException" in said["reason"] and groups in said["reason"], said["reason"]
    assert said["health"]["state"] == "crashed" and "TopicAuthorizationException" in said["health"]["evidence"]

    # Granted, the restarted app routes every record exactly (nothing lost), now under a broker kill.
    apply_acls(admin, app_acls(catalog))
    again = run_dag("deploy_apps", catalog_file, apps=["oplog-router"], version="1.0.0")
    assert again.state == "success", again.task_states
    source = router.inputs["operations"]
    with background_load(router, LoadSpec(count=10_000_000, keys=20, rate=150, seed=15, start_seq=10_000), admin_kafka):
        poll_until(lambda: len(routed(admin_kafka, router)) > 300, timeout=240, what="routing under load")
        busiest = max(range(router_partitions(catalog, source)), key=lambda p: _size(admin_kafka, source, p))
        victim = secure_cluster.leader_of(source, busiest)
        secure_cluster.kill_node(victim)
        before_restart = len(routed(admin_kafka, router))
        poll_until(lambda: len(routed(admin_kafka, router)) > before_restart + 200, timeout=240,
                   what="routing to go on with a broker down")
        assert runtime.state() == "running"
        secure_cluster.start_node(victim)
        secure_cluster.wait_isr_full(catalog.topic_names(), timeout=180)
    expected, got = wait_until_all_routed(admin_kafka, router, timeout=300, what="every record routed")
    duplicates = sum(n - 1 for n in Counter(got).values())
    with capfd.disabled():  # a figure for the log of the run
        print(f"\nsecured cluster: {len(expected)} routes expected and found, {duplicates} duplicates "
              f"(broker {victim} killed, leader of {source} partition {busiest})")
    assert runtime.state() == "running"
    assert run_dag("stop_apps", catalog_file, apps=["oplog-router"], deadline_s=60).state == "success"

    # browser-activity, a stateful app, under its own principal with only the ACLs the catalog
    # derives for it (its compacted challenges table among its outputs): it runs under load while
    # the router's outputs are validated.
    browser = catalog.app("browser-activity")
    browser_runtime = AppRuntime(browser.checkpoint_location())
    logs, challenges, counts = browser.inputs["logs"], browser.outputs["challenges"], browser.outputs["activity_counts"]
    principal = "User:browser-activity"
    assert {acl for acl in app_acls(catalog) if acl.principal == principal} == {
        *(AppAcl(principal, "Topic", "Literal", logs, op) for op in ("Read", "Describe")),
        *(AppAcl(principal, "Topic", "Literal", topic, op) for topic in (challenges, counts, browser.dead_letter_topic)
          for op in ("Write", "Describe")),
        AppAcl(principal, "Group", "Prefixed", "streamops.browser-activity", "Read"),
    }
    browser_deployed = run_dag("deploy_apps", catalog_file, apps=["browser-activity"])
    assert browser_deployed.state == "success", browser_deployed.task_states
    assert " as browser-activity (SCRAM-SHA-512) (from connection kafka_app_browser_activity)" in \
        browser_runtime.driver().kafka
    with background_load(browser, LoadSpec(count=10_000_000, keys=40, rate=60, seed=16), admin_kafka):
        # validate_topic_quality reads the outputs (and, to reconcile, the input) through the same
        # connection: every routed record accounted for, the broker kill's duplicates a warning.
        outputs = [topic for topic in router.outputs.values() if topic in catalog.validated_topics()]
        quality = run_dag("validate_topic_quality", catalog_file, topics=outputs, range="last_records",
                          last_records=100_000)
        poll_until(lambda: all((p := browser_runtime.progress().get(q)) is not None and p.batch_id >= 3
                               for q in ("challenge", "window-count")), timeout=300,
                   what="browser-activity's queries to commit batches under load")
    assert quality.state == "success", quality.task_states
    outcomes = {o["topic"]: o for o in quality.xcoms["validate"]}
    assert sorted(outcomes) == sorted(outputs)
    assert {t: (o["success"], o["failed_expectations"], o["reconciliation"]["missing"]) for t, o in outcomes.items()} == {
        t: (True, [], 0) for t in outputs}
    assert sum(o["records"] for o in outcomes.values()) == len(got)

    # Its challenges table and its windows: those of a golden run over the same input. What its
    # ACLs do not grant, the brokers refuse to its principal: writing its own input, reading
    # another app's topic.
    poll_until(lambda: caught_up(browser_runtime, admin_kafka, [("challenge", [logs]), ("window-count", [logs])]),
               timeout=300, what="browser-activity to process every record of its load", max_interval=2)
    assert run_dag("stop_apps", catalog_file, apps=["browser-activity"], deadline_s=60).state == "success"
    golden = golden_run(spark, catalog, "browser-activity", admin_kafka, tmp_path / "browser-golden")
    expected_challenges = latest_per_key(admin_kafka, golden.outputs["challenges"])
    assert expected_challenges and latest_per_key(admin_kafka, challenges) == expected_challenges
    expected_windows = latest_per_key(admin_kafka, golden.outputs["activity_counts"])
    assert expected_windows and latest_per_key(admin_kafka, counts) == expected_windows
    own = secure_cluster.client_config("browser-activity")
    with pytest.raises(KafkaException, match="(?i)topic authorization failed|TOPIC_AUTHORIZATION_FAILED"):
        produce(own, logs, [("k", "{}")])
    with pytest.raises(KafkaException, match="(?i)topic authorization failed|TOPIC_AUTHORIZATION_FAILED"):
        read_all(own, catalog.app("presence-notifier").inputs["events"], timeout=30)
    with capfd.disabled():
        print(f"browser-activity under its own principal: {len(expected_challenges)} challenge keys and "
              f"{len(expected_windows)} windows as the golden run wrote them")

    # recover_reset_offsets: planned as the suite, the app restarted under its own principal from a
    # time; exactly the records written since then are routed again.
    records = read_all(admin_kafka, source)
    cut_ms = sorted(r.timestamp_ms for r in records)[-300]
    after_cut = {f"{r.topic}/{r.partition}/{r.offset}" for r in records if r.timestamp_ms >= cut_ms}
    before_reset = Counter(routed(admin_kafka, router))
    cut = datetime.fromtimestamp(cut_ms // 1000, tz=UTC) + timedelta(milliseconds=cut_ms % 1000)
    # Four eyes on the cluster: the reset waits for an approver, not the run's requester.
    reset = run_dag("recover_reset_offsets", catalog_file, app="oplog-router", mode="datetime",
                    to_datetime=cut.isoformat(), dry_run=False, approved_by="approver")
    assert reset.state == "success", reset.task_states
    assert reset.task_states["approve"] == "success"
    assert reset.xcoms["plan"]["replayed"] == len(after_cut)
    assert "every query (route) started exactly at the planned offsets" in reset.xcoms["verify"]["summary"]
    assert " as oplog-router (SCRAM-SHA-512)" in runtime.driver().kafka
    again_expected = Counter({pair: 1 for pair in expected if pair[0] in after_cut})
    poll_until(lambda: Counter(routed(admin_kafka, router)) - before_reset == again_expected, timeout=240,
               what="the records written since the reset time to be routed again")
    assert run_dag("stop_apps", catalog_file, apps=["oplog-router"], deadline_s=60).state == "success"

    # No password in any log, XCom, runtime or audit file, command line or broker log; the one
    # file per driver that holds its credentials is readable by its user only.
    passwords = [p for p in secure_cluster.passwords().values() if p]
    connection_files = [runtime.dir / "kafka-client.json", browser_runtime.dir / "kafka-client.json"]
    for connection_file in connection_files:
        assert stat.S_IMODE(connection_file.stat().st_mode) == 0o600
        assert any(p in connection_file.read_text() for p in passwords)
    assert "recover_reset_offsets" in (tmp_path / "checkpoints" / "_audit" / "audit.jsonl").read_text()  # grepped below
    printed = capfd.readouterr()
    texts = {"task logs": printed.out + printed.err, "driver argv and environment": "\n".join(argv),
             "xcom": json.dumps([provisioned.xcoms, deployed.xcoms, status.xcoms, again.xcoms, quality.xcoms, reset.xcoms,
                                 browser_deployed.xcoms], default=str)}
    for path in [*tmp_path.rglob("*"), *Path(os.environ["AIRFLOW_HOME"]).rglob("*"), *secure_cluster.state_dir.rglob("*.log")]:
        if path.is_file() and path not in connection_files and path.stat().st_size < 50_000_000:
            texts[str(path)] = path.read_text(errors="replace")
    leaked = sorted(where for where, text in texts.items() if any(p in text for p in passwords))
    assert leaked == []


def _in_group(process: psutil.Process, group: int) -> bool:
    try:
        return os.getpgid(process.pid) == group
    except (ProcessLookupError, psutil.Error):
        return False


def _command_line(process: psutil.Process) -> str:
    """Its argv and its environment (what another user, or a crash dump, could see)."""
    try:
        return " ".join(process.cmdline()) + "\n" + "\n".join(f"{k}={v}" for k, v in process.environ().items())
    except psutil.Error:  # ended (or a zombie) meanwhile
        return ""


def router_partitions(catalog, topic: str) -> int:
    return catalog.topic(topic).partitions


def _size(kafka, topic: str, partition: int) -> int:
    from streamops.kafka_offsets import end_offsets

    low, high = end_offsets(kafka, topic)[partition]
    return high - low


def test_streamops_up_on_the_secured_cluster_points_airflow_at_it_with_a_principal_per_app(cluster_profile, secure_cluster):
    """The README's main command with --cluster (the session's cluster profile is its first run,
    tests/support/cluster_profile.py): the Spark standalone cluster, PostgreSQL and Redis started beside
    the Kafka cluster, Airflow on PostgreSQL with the CeleryExecutor and two workers, its connections
    written from the cluster's client files (admin for the suite, one per app) and spark_default on the
    standalone master, the environment recorded, the topics provisioned through the DAG (on a Celery
    worker) with three replicas; no password in anything written."""
    import re

    import psycopg2

    from streamops.provisioning import describe_broker

    profile = cluster_profile
    catalog, spark, metadata, up = profile.catalog, profile.spark, profile.metadata, profile.up
    run = profile.streamops

    assert "secure Kafka cluster is already running" in up.stdout, up.stdout[:2000]
    assert f"Spark standalone cluster up at {spark.master_url}" in up.stdout
    assert f"PostgreSQL up on 127.0.0.30:{metadata.postgres_port}" in up.stdout
    assert f"Redis up on 127.0.0.30:{metadata.redis_port}" in up.stdout
    assert "provision_topics finished: success" in up.stdout
    for name in catalog.topic_names():
        assert re.search(rf"^  {re.escape(name)}\s+create$", up.stdout, re.M), name
    assert (f"Kafka bootstrap servers: {secure_cluster.bootstrap_servers} (TLS + SASL/SCRAM; catalog environment "
            "cluster; each app connects as its own user)") in up.stdout
    snapshot = describe_broker(secure_cluster.client_config(ADMIN_USER).admin(), catalog.topic_names())
    assert {snapshot.topics[n].replication_factor for n in catalog.topic_names()} == {3}

    def connection(conn_id: str) -> dict:
        got = run("airflow", "cli", "connections", "get", conn_id, "-o", "json")
        assert got.returncode == 0, got.stderr[-2000:]
        (entry,) = json.loads(got.stdout)
        return entry

    written = {conn_id: connection(conn_id) for conn_id in ["kafka_default", *map(app_conn_id, catalog.app_names())]}
    assert {c: w["extra_dejson"]["sasl.username"] for c, w in written.items()} == {
        "kafka_default": ADMIN_USER, **{app_conn_id(n): n for n in catalog.app_names()}}
    assert connection("spark_default")["host"] == spark.master_url
    assert not (profile.run_dir / "airflow" / "airflow.db").exists()  # the metadata is on PostgreSQL
    db = psycopg2.connect(host="127.0.0.30", port=metadata.postgres_port, user="airflow",
                          password=metadata.postgres.password, dbname="airflow")
    try:
        with db.cursor() as cursor:
            cursor.execute("SELECT conn_id, is_extra_encrypted FROM connection WHERE conn_id LIKE 'kafka%%'")
            encrypted = dict(cursor.fetchall())
    finally:
        db.close()
    assert encrypted == {conn_id: True for conn_id in written}  # Fernet, with the key the stack keeps (600)
    status = run("status").stdout
    assert "catalog environment cluster; Kafka: the secured cluster)" in status
    assert "CeleryExecutor on PostgreSQL, workers worker-1@127.0.0.31, worker-2@127.0.0.32" in status
    assert (f"Airflow metadata services: PostgreSQL running (pid {metadata.postgres.process.pid()}) on "
            f"127.0.0.30:{metadata.postgres_port}") in status

    # bin/setup's `airflow init` and a second `up --cluster` keep (rewrite) the cluster's connections.
    init = run("airflow", "init")
    assert init.returncode == 0, init.stderr[-2000:]
    again = run("up", "--cluster")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "Airflow connections: catalog environment cluster, Kafka: the secured cluster;" in again.stdout
    assert {c: connection(c)["extra_dejson"]["sasl.username"] for c in written} == {
        "kafka_default": ADMIN_USER, **{app_conn_id(n): n for n in catalog.app_names()}}

    # The single-broker `up` is refused while this Airflow works for the cluster, and starts nothing.
    local = run("up")
    assert local.returncode == 1
    assert ("Airflow is running for the secured cluster (catalog environment cluster), not the local broker "
            "(environment local); stop it first (`streamops airflow stop`), then run this again") in local.stderr
    assert "Kafka broker: stopped" in run("broker", "status").stdout

    # Connection extras are encrypted in the metadata DB (its files too), logs carry none.
    passwords = [p for p in secure_cluster.passwords().values() if p]
    files = [path for folder in (profile.run_dir, metadata.state_dir) for path in folder.rglob("*") if path.is_file()]
    # The one file per driver that holds its credentials on purpose is readable by its user only.
    assert [p for p in files if p.name == "kafka-client.json" and stat.S_IMODE(p.stat().st_mode) != 0o600] == []
    leaked = sorted(str(path) for path in files if path.name != "kafka-client.json"
                    and any(p.encode() in path.read_bytes() for p in passwords))
    assert leaked == []
