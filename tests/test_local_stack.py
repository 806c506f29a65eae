"""The local stack: broker start/check/stop and the README's main command (`streamops up`)."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from streamops.local_stack.broker import LocalBroker
from streamops.local_stack.process import AlreadyRunning, ServiceError
from streamops.toolchain import check
from tests.support.ports import free_port_pair


def test_installed_versions_fit_together():
    assert check() == []


def test_second_start_of_a_running_broker_says_so(broker):
    same = LocalBroker(state_dir=broker.state_dir, port=broker.port)
    with pytest.raises(AlreadyRunning) as caught:
        same.start()
    assert str(caught.value) == (
        f"Kafka broker is already running (pid {broker.pid()}) at {broker.bootstrap_servers}; "
        f"data in {broker.data_dir}"
    )
    assert same.status() == (
        f"Kafka broker: running (pid {broker.pid()}) at {broker.bootstrap_servers}, healthy; data in {broker.data_dir}"
    )


def test_broker_refuses_a_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServiceError) as caught:
            LocalBroker(state_dir=tmp_path, port=port).start()
    assert str(caught.value) == (
        f"cannot start the Kafka broker: port {port} on 127.0.0.1 is in use by another process; "
        "choose other ports (--port / STREAMOPS_KAFKA_PORT)"
    )


def test_broker_that_dies_at_start_up_reports_its_log_tail(tmp_path):
    broker = LocalBroker(state_dir=tmp_path, port=free_port_pair(), heap="1k")  # the JVM refuses this heap
    with pytest.raises(ServiceError) as caught:
        broker.start(timeout=60)
    message = str(caught.value)
    assert message.startswith("formatting the broker's data dir") or "the Kafka broker exited during start-up" in message
    assert "heap" in message.lower()
    assert broker.pid() is None


def test_broker_stop_is_clean_and_keeps_the_data(tmp_path):
    broker = LocalBroker(state_dir=tmp_path, port=free_port_pair())
    broker.start()
    admin = broker.client_config.admin()
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic("kept.after.restart", 2, 1)])["kept.after.restart"].result()
    pid = broker.pid()

    assert broker.stop() == f"Kafka broker stopped (pid {pid})"
    assert broker.pid() is None
    assert broker.status() == f"Kafka broker: stopped (would listen on {broker.bootstrap_servers})"
    assert "shut down completed" in broker.process.log_file.read_text()

    broker.start()
    try:
        topics = broker.client_config.admin().list_topics(timeout=10).topics
        assert len(topics["kept.after.restart"].partitions) == 2
    finally:
        broker.stop()


def test_streamops_up_brings_the_suite_up_and_provisions_the_catalog(local_stack):
    """The README's main command, with its own run dir, ports and catalog (the session's one local
    stack: its first `up` is this test's; `streamops down` after the browser test, checked there)."""
    first, streamops = local_stack.up, local_stack.streamops
    names = local_stack.catalog.topic_names()
    kafka_port, airflow_port = local_stack.kafka_port, local_stack.airflow_port
    assert "provision_topics finished: success" in first.stdout
    for name in names:
        assert re.search(rf"^  {re.escape(name)}\s+create$", first.stdout, re.M), (name, first.stdout)
    # How to log in as each role, never a password: `streamops airflow password <user>` prints it
    # from a file only its owner reads.
    assert f"Airflow UI: http://127.0.0.1:{airflow_port}  one user per role, each password printed by " \
           "`streamops airflow password <user>`" in first.stdout, first.stdout
    for user, duty in (("viewer", "Sees the apps page"), ("operator", "Deploys, stops, rolls and recovers apps"),
                       ("approver", "Approves or rejects the plans others triggered"), ("admin", "Everything")):
        assert re.search(rf"^  {user}\s+{duty}", first.stdout, re.M), (user, first.stdout)
    users_file = local_stack.run_dir / "airflow" / "users.json"
    assert oct(users_file.stat().st_mode & 0o777) == "0o600"
    password = local_stack.password("admin")
    assert len(password) >= 16 and password not in first.stdout + first.stderr
    unknown = streamops("airflow", "password", "root")
    assert unknown.returncode == 1 and "no user 'root' in" in unknown.stderr
    assert "(its users: viewer, operator, approver, admin)" in unknown.stderr

    topics = AdminClient({"bootstrap.servers": f"127.0.0.1:{kafka_port}"}).list_topics(timeout=10).topics
    assert {name: len(topics[name].partitions) for name in names} == {
        name: local_stack.catalog.topic(name).partitions for name in names}

    status = streamops("status")
    assert "Kafka broker: running" in status.stdout and ", healthy;" in status.stdout
    assert (
        "metadatabase healthy, scheduler healthy, triggerer healthy, dag_processor healthy" in status.stdout
    ), status.stdout

    # validate_topic_quality's Data Docs are served by the API server (the plugin in plugins/),
    # behind the UI's login, with GX's CDN addresses pointing at the suite's copies.
    jwt = httpx.post(f"http://127.0.0.1:{airflow_port}/auth/token", json={"username": "admin", "password": password},
                     timeout=30).json()["access_token"]
    site = local_stack.run_dir / "quality" / "gx" / "uncommitted" / "data_docs" / "local_site"
    (site / "validations").mkdir(parents=True, exist_ok=True)
    served = site / "validations" / "a page.html"
    served.write_text('<html>suite oplog.category.contacts<script src="https://code.jquery.com/jquery-3.7.1.min.js"></script></html>')
    try:
        page_url = f"http://127.0.0.1:{airflow_port}/streamops/data-docs/validations/a%20page.html"
        assert httpx.get(page_url, timeout=30).status_code == 401
        page = httpx.get(page_url, headers={"Authorization": f"Bearer {jwt}"}, timeout=30)
        assert (page.status_code, page.text) == (200, '<html>suite oplog.category.contacts<script src='
                                                      '"/streamops/data-docs/_assets/jquery@3.7.1/dist/jquery.min.js"></script></html>')
    finally:
        served.unlink()  # the browser test reads the site as a new stack has it
    script = httpx.get(f"http://127.0.0.1:{airflow_port}/streamops/data-docs/_assets/jquery@3.7.1/dist/jquery.min.js",
                       headers={"Authorization": f"Bearer {jwt}"}, timeout=30)
    assert script.status_code == 200 and script.text.startswith("/*! jQuery v3.7.1")

    # The apps' metrics (the other plugin): refused without credentials, served to the scrape
    # token that `up` made and printed, and to an Airflow login.
    metrics_url = f"http://127.0.0.1:{airflow_port}/streamops/metrics"
    token_file = re.search(r"^Metrics: \S+/streamops/metrics  \(Prometheus bearer token in (\S+)\)$", first.stdout, re.M)
    assert token_file, first.stdout
    assert oct(os.stat(token_file[1]).st_mode & 0o777) == "0o600"
    refused = httpx.get(metrics_url, timeout=30)
    assert refused.status_code == 401 and "send the scrape token" in refused.json()["detail"]
    assert httpx.get(metrics_url, headers={"Authorization": "Bearer not-the-token"}, timeout=30).status_code == 403
    scraped = httpx.get(metrics_url, headers={"Authorization": f"Bearer {Path(token_file[1]).read_text().strip()}"}, timeout=60)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain; version=")
    assert "# TYPE streamops_app_state gauge" in scraped.text and "# TYPE streamops_app_offset_lag gauge" in scraped.text
    assert httpx.get(metrics_url, headers={"Authorization": f"Bearer {jwt}"}, timeout=60).status_code == 200

    # A task log an operator reads: no deprecation noise from pinned packages at its top, and no
    # return value dumped at its end (the tasks log their own summaries).
    from streamops.local_stack.airflow_api import AirflowApi

    api = AirflowApi(f"http://127.0.0.1:{airflow_port}", "admin", password)
    dry = api.trigger("provision_topics", {"dry_run": True})
    assert api.wait_for_run("provision_topics", dry, timeout=300) == "success"
    plan_log = api.task_log("provision_topics", dry, "plan")
    assert "no change" in plan_log, plan_log[-2000:]
    assert "GitWildMatchPattern" not in plan_log and "DeprecationWarning" not in plan_log, plan_log[:2000]
    assert "Returned value was" not in plan_log, plan_log[-2000:]

    second = streamops("up")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "Kafka broker is already running" in second.stdout
    assert "Airflow is already running" in second.stdout
    assert f"plan: {len(names)} no change" in second.stdout
