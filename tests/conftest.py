"""Shared fixtures: one real Kafka broker and one Airflow metadata DB for the whole session.

Each test gets its own topic names (a unique prefix) and its own catalog file, so tests share
the broker without seeing each other's topics.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

# Airflow reads its configuration when first imported: point it at a throwaway home before
# any test module imports it.
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="streamops-tests-"))
os.environ["AIRFLOW_HOME"] = str(_SESSION_DIR / "airflow")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(Path(__file__).resolve().parents[1] / "dags")
os.environ.setdefault("STREAMOPS_CATALOG", str(Path(__file__).resolve().parents[1] / "catalog" / "pipelines.yaml"))
# Whatever a test writes under the run dir (artifacts, quality results, reprocessing folders) stays
# in the session's folder: never the checkout's .run/ (the local stack's), never another process's.
os.environ["STREAMOPS_RUN_DIR"] = str(_SESSION_DIR / "run")
# The drivers tests launch (spark-submit, through the DAGs and the CLI) live for seconds to minutes:
# C2's compiling never pays back there, and C1 alone started and ran them about 15% faster here.
# The session's own Spark (the `spark` fixture) too: it lives one run, where its C2 thread took a
# third of its CPU; C1 alone ran the in-process Spark modules with 17-21% less CPU (docs/testing.md).
SPARK_DRIVER_JIT = "-XX:TieredStopAtLevel=1"
os.environ.setdefault("SPARK_SUBMIT_OPTS", SPARK_DRIVER_JIT)
# The brokers the tests start live minutes, too: C1 alone started the secured cluster's three nodes
# with 40% less CPU and halved their idle CPU here (its C2 compiles never pay back).
os.environ.setdefault("STREAMOPS_KAFKA_JVM_OPTIONS", SPARK_DRIVER_JIT)

from streamops.local_stack.broker import LocalBroker  # noqa: E402
from tests.support import LOCAL_SPARK_CONNECTION, PROJECT_ROOT  # noqa: E402
from tests.support.ports import free_port_pair  # noqa: E402
from tests.support.shared import kept_dir_requested, locked_unless_busy, make_shared_dir, shared_broker, shared_dir, stop_shared  # noqa: E402

# The time per module, slowest first, at the end of every run (the suite's budget, made visible).
pytest_plugins = ["tests.support.budget"]

# Two tiers. tests/unit/ mirrors the package: pure functions, plans, parsers, selectors, in
# seconds, with none of the session's real components. Every other test runs on real Kafka,
# Spark, Airflow or processes and is marked `integration` (`bin/test -m "not integration"` is
# the fast tier alone).
UNIT_TESTS = Path(__file__).resolve().parent / "unit"
REAL_COMPONENT_FIXTURES = {
    "broker", "secure_cluster", "cluster_profile", "local_stack", "airflow_db", "admin", "run_dag", "spark", "app_catalog",
    "app_env",
}


_SHARED = pytest.StashKey[Path]()


def pytest_unconfigure(config):
    # The session folder goes at the end even when no test asked for it (the fast tier).
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)
    if _SHARED in config.stash:  # the controlling process of a two-process run, its test processes ended
        stop_shared(config.stash[_SHARED])


def pytest_configure(config):
    config.addinivalue_line("markers", "integration: runs on real components (Kafka, Spark, Airflow, processes); "
                                       "every test outside tests/unit/")
    if not hasattr(config, "workerinput"):
        # A version pins code: the shipped apps' catalog versions are built once, from this
        # checkout, before any test process starts (they inherit the store's location).
        from tests.support.artifacts import build_shipped_artifacts

        build_shipped_artifacts(_SESSION_DIR / "artifacts")
    if kept_dir_requested():
        return  # components kept between runs: the folder the caller named, never stopped here
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        config.stash[_SHARED] = make_shared_dir()  # before the test processes start: they inherit it


# The tests on the secured Kafka cluster and the cluster profile (which runs on it) run one after
# the other, first: those components start once and stop after their last user, so no other test
# shares the machine with three idle brokers and a second Airflow.
CLUSTER_MODULES = ("test_secure_cluster.py", "test_secured_pipeline.py", "test_airflow_cluster.py", "test_spark_cluster.py",
                   "test_stateful_clusters.py")


def _run_order(item) -> tuple[int, int]:
    name = Path(str(item.path)).name
    if name in CLUSTER_MODULES or {"secure_cluster", "cluster_profile"} & set(item.fixturenames):
        return 0, CLUSTER_MODULES.index(name) if name in CLUSTER_MODULES else len(CLUSTER_MODULES)
    return 1, 0


def _xdist_group(item) -> str | None:
    """Under pytest-xdist (`--dist loadgroup`) tests of one group run in one process, one after the
    other: those that share a component started once per run (the secured cluster and the cluster
    profile; the local stack), and those of a module with a module-scoped fixture. Every other test
    is a unit of its own, run by whichever process is free."""
    if _run_order(item)[0] == 0:
        return "secured-cluster-and-cluster-profile"
    if "local_stack" in item.fixturenames:
        return "local-stack"
    if any(defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values()):
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    items.sort(key=_run_order)  # stable: file order within each block
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if UNIT_TESTS in Path(str(item.path)).resolve().parents:
            heavy = REAL_COMPONENT_FIXTURES.intersection(item.fixturenames)
            if heavy:
                raise pytest.UsageError(f"{item.nodeid} is in tests/unit/ but uses {', '.join(sorted(heavy))}: "
                                        "a test on real components belongs outside tests/unit/")
        else:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def session_dir() -> Path:
    yield _SESSION_DIR
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def broker(session_dir: Path) -> LocalBroker:
    """The session's Kafka broker, on free ports, with its data in the session dir; with two test
    processes, the run's one broker (the first to ask starts it, the controlling process stops it)."""
    shared = shared_dir()
    if shared is not None:
        instance = shared_broker(shared, free_port_pair)
    else:
        instance = LocalBroker(state_dir=session_dir / "kafka", port=free_port_pair())
        instance.start()
    os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"] = (
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": instance.bootstrap_servers}})
    )
    yield instance
    # confluent-kafka's AdminClient has no close(): a client is closed when it is collected. Do
    # that while the broker is up, or its threads go on retrying a stopped broker (log lines
    # after pytest's summary). Every other client is closed where it is used.
    gc.collect()
    if shared is None:
        instance.stop()


@pytest.fixture(scope="session", autouse=True)
def driver_class_archive(request, session_dir: Path):
    """Drivers launched by the tests map one class-data-sharing archive (tests/support/class_archive.py):
    built once per machine (kept in .cache/), before the first test on real components; the fast
    tier never builds it. STREAMOPS_TEST_CLASS_ARCHIVE=off runs without it (to compare)."""
    if os.environ.get("STREAMOPS_TEST_CLASS_ARCHIVE") == "off" or \
            not any(item.get_closest_marker("integration") for item in request.session.items):
        yield None
        return
    from tests.support.class_archive import ARCHIVE_SILENT, archive_path, build_driver_class_archive

    base_opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
    archive: Path | None = None
    try:
        archive = archive_path(PROJECT_ROOT / ".cache" / "class-archives", base_opts)
        # One process builds it. Another test process does not wait: its drivers name the archive
        # from the start, and the JVM maps it once it exists (it gets its name only when whole).
        with locked_unless_busy(archive.parent / ".build.lock") as ours:
            if not ours:
                outcome = f"driver class archive: {archive} is being built by another test process; drivers use it once it is"
            elif archive.exists():
                outcome = f"driver class archive: {archive} (built before); drivers start with it"
            else:
                outcome = build_driver_class_archive(archive, session_dir / "class-archive",
                                                     request.getfixturevalue("broker").client_config,
                                                     request.getfixturevalue("admin"), base_opts)
        usable = archive.exists() or not ours
    except Exception as exc:  # only speed is at stake: the suite runs on without it
        outcome = f"driver class archive: not built ({type(exc).__name__}: {exc}); drivers start without one"
        usable = False
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # one line in the session's output, not a test's
            reporter.write_line(f"\n{outcome}")
    if usable:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{base_opts} -XX:SharedArchiveFile={archive} {ARCHIVE_SILENT}".strip()
    yield archive if usable else None
    os.environ["SPARK_SUBMIT_OPTS"] = base_opts


@pytest.fixture(scope="session")
def secure_cluster(session_dir: Path, request):
    """The production-shaped cluster, once per session for the tests that need it: three KRaft
    nodes on 127.0.0.11-13 (ports free now), TLS everywhere, SASL/SCRAM users, ACLs enforced.
    Stopped after the last test that uses it (`stop_after_last_user`), not at the end of the
    session: three idle brokers took CPU from every test that came after them."""
    from streamops.local_stack.secure_cluster import SecureCluster, free_cluster_ports

    instance = SecureCluster(session_dir / "secure-cluster", **free_cluster_ports())
    instance.start()
    stop_after_last_user(request, "secure_cluster", lambda: _stop_secure_cluster(instance))
    yield instance
    _stop_secure_cluster(instance)


def _stop_secure_cluster(instance) -> None:
    import psutil

    gc.collect()  # confluent-kafka clients close when collected: before the nodes go
    pids = [instance.pid(node) for node in instance.node_ids]
    instance.stop()  # stopping a stopped cluster does nothing
    assert [p for p in pids if p and psutil.pid_exists(p)] == [], "stop() left node processes running"
    assert "0/3 nodes running" in instance.status()


@pytest.fixture(scope="session")
def cluster_profile(secure_cluster, tmp_path_factory, request):
    """The session's one cluster profile (tests/support/cluster_profile.py): `streamops up --cluster`
    on the secured cluster, with Spark standalone, PostgreSQL, Redis and Airflow with two Celery
    workers; stopped after the last test that uses it, before the Kafka cluster."""
    from tests.support.cluster_profile import start_cluster_profile, stop_cluster_profile

    profile = start_cluster_profile(secure_cluster, tmp_path_factory.mktemp("cluster-profile"),
                                    f"c{uuid.uuid4().hex[:10]}")
    stopped: list[str] = []

    def stop() -> None:
        if not stopped:
            stopped.append(stop_cluster_profile(profile))

    stop_after_last_user(request, "cluster_profile", stop)
    yield profile
    stop()


@pytest.fixture
def cluster_profile_paths(cluster_profile, monkeypatch):
    """This process reads the apps' runtime folders (status, records) and catalog where the cluster
    profile's drivers and DAGs do."""
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", cluster_profile.env["STREAMOPS_CHECKPOINT_ROOT"])
    monkeypatch.setenv("STREAMOPS_CATALOG", str(cluster_profile.catalog_file))


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory, request):
    """The session's one `streamops up` (tests/support/local_stack.py): its own broker and Airflow on
    SQLite; `streamops down` after the last test that uses it, checked."""
    from tests.support.local_stack import start_local_stack, stop_local_stack

    stack = start_local_stack(tmp_path_factory.mktemp("local-stack"), f"ui{uuid.uuid4().hex[:8]}")
    stopped: list[bool] = []

    def stop() -> None:
        if not stopped:
            stopped.append(True)
            stop_local_stack(stack)

    stop_after_last_user(request, "local_stack", stop)
    yield stack
    stop()


_LAST_USER_STOPS = pytest.StashKey()


def stop_after_last_user(request, fixture: str, stop) -> None:
    """Call `stop` right after the last test that uses `fixture` (directly or through another
    fixture), not at the end of the session: an idle cluster takes CPU from every later test.
    Components registered later are stopped first (a stack before the Kafka it runs on)."""
    request.config.stash.setdefault(_LAST_USER_STOPS, {})[fixture] = stop


@pytest.hookimpl(trylast=True)  # after the test's own fixtures (its clients) are gone
def pytest_runtest_teardown(item, nextitem):
    stops = item.config.stash.get(_LAST_USER_STOPS, {})
    items = item.session.items
    later = items[items.index(item) + 1:] if item in items else []
    for fixture in reversed(list(stops)):
        if fixture in item.fixturenames and not any(fixture in other.fixturenames for other in later):
            stops.pop(fixture)()


@pytest.fixture(scope="session")
def airflow_db(session_dir: Path) -> Path:
    """A migrated SQLite metadata DB for in-process DAG runs (`dag.test`)."""
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
    )
    return Path(os.environ["AIRFLOW_HOME"])


class ClosableAdmin:
    """An AdminClient that can be closed: confluent-kafka's has no close(); its connections end
    when the object goes, but pytest keeps a session fixture's value until the session ends. So
    the fixture hands out this proxy and drops the client itself at teardown."""

    def __init__(self, kafka):
        self._client = kafka.admin()

    def __getattr__(self, name):
        if self.__dict__.get("_client") is None:
            raise RuntimeError("the session's AdminClient is closed")
        return getattr(self._client, name)

    def close(self) -> None:
        self._client = None
        gc.collect()


@pytest.fixture(scope="session")
def admin(broker: LocalBroker):
    client = ClosableAdmin(broker.client_config)
    yield client
    client.close()


@pytest.fixture
def prefix() -> str:
    """A topic-name prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}"


class DagRunResult:
    """What a test looks at after a real in-process DAG run."""

    def __init__(self, dag_run):
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        from tests.support.task_failures import TaskStates, errors_of

        self.run_id = dag_run.run_id
        self.state = str(dag_run.state)
        # Compared as a dict; printed in an assertion message, it names each failed task's error.
        self.task_states = TaskStates({ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()},
                                      errors_of(dag_run.dag_id, dag_run.run_id))
        with create_session() as session:
            rows = (
                session.query(XComModel)
                .filter(XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id)
                .all()
            )
            self.xcoms = {row.task_id: XComModel.deserialize_value(row) for row in rows if row.key == "return_value"}


@pytest.fixture
def run_dag(airflow_db, monkeypatch):
    """Parse `dag_id` from dags/ with the given catalog and run it once with `conf` (`dag.test`)."""

    def run(dag_id: str, catalog: Path, approved_by: str | None = None, **conf) -> DagRunResult:
        """`approved_by`: the run waits for an approval, which that user gives (as the UI would)."""
        from airflow.dag_processing.dagbag import DagBag

        from streamops.dag_tasks.approval import APPROVE_PARAM
        from tests.support.task_failures import install as install_task_failure_recorder

        monkeypatch.setenv("STREAMOPS_CATALOG", str(catalog))
        if not os.environ.get("STREAMOPS_CHECKPOINT_ROOT"):  # the audit log is under it: never the project's own
            monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(_SESSION_DIR / "checkpoints"))
        bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
        assert not bag.import_errors, bag.import_errors
        dag = bag.get_dag(dag_id)
        # In-process runs are unattended, like the API's: no waiting for a UI approval (the
        # browser test approves plans in the real UI).
        if APPROVE_PARAM in dag.params and APPROVE_PARAM not in conf:
            conf[APPROVE_PARAM] = approved_by is not None
        install_task_failure_recorder()
        answering = _answer_approvals(dag_id, approved_by) if approved_by else None
        try:
            result = DagRunResult(dag.test(run_conf=conf))
        finally:
            if answering:
                answering.set()
        if set(result.task_states.values()) != {"success"}:  # a task raised (failed, retried or skipped)
            _release_failed_tasks_frames()  # a full heap scan: about 1-2 s in this process
        return result

    return run


def _answer_approvals(dag_id: str, user: str) -> threading.Event:
    """Approve, as `user`, the approval requests of `dag_id` made from now on: the API's own answer
    (its route function, on the metadata DB the in-process run shares; the auth manager's check of
    who may answer is the browser test's), as when that user presses Approve. `dag.test` rewrites
    the run's task rows while it waits: a parked task whose answer is recorded is resumed again
    (as the API resumes it) until it leaves its parked state. Set the event returned to stop."""
    from types import SimpleNamespace

    from airflow.api_fastapi.core_api.datamodels.hitl import UpdateHITLDetailPayload
    from airflow.api_fastapi.core_api.routes.public.hitl import update_hitl_detail
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import handle_event_submit
    from airflow.triggers.base import TriggerEvent
    from airflow.utils import timezone
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    stop, since = threading.Event(), timezone.utcnow()
    answerer = SimpleNamespace(get_id=lambda: user, get_name=lambda: user)

    def answer_once() -> None:
        with create_session() as session:
            parked = session.execute(
                select(TaskInstance, HITLDetail).join(HITLDetail, TaskInstance.id == HITLDetail.ti_id)
                .where(TaskInstance.dag_id == dag_id, TaskInstance.state == TaskInstanceState.AWAITING_INPUT,
                       HITLDetail.created_at >= since)).all()
            for ti, detail in parked:
                if detail.responded_at is None:
                    update_hitl_detail(dag_id, ti.run_id, ti.task_id, UpdateHITLDetailPayload(
                        chosen_options=["Approve"], params_input={}), answerer, session, ti.map_index)
                else:  # answered, and parked again by the run's own writes: resume it as the API did
                    handle_event_submit(TriggerEvent(detail.as_resume_event_payload()), task_instance=ti, session=session)

    def answer() -> None:
        while not stop.wait(0.5):
            try:
                answer_once()
            except Exception as exc:
                logging.getLogger(__name__).info("answering %s's approval as %s: %s; again", dag_id, user, exc)

    threading.Thread(target=answer, name=f"approve-{dag_id}-as-{user}", daemon=True).start()
    return stop


def _release_failed_tasks_frames() -> None:
    """An in-process run keeps a failed task's exception, whose traceback keeps the task's frames
    and so the Kafka clients the task made, retrying a broker long stopped (in Airflow proper the
    task's process ends). Clear the locals of those finished frames of the suite's own code."""
    import traceback
    import types

    ours = (str(PROJECT_ROOT / "plugins"), str(PROJECT_ROOT / "dags"))
    gc.collect()
    for obj in gc.get_objects():
        if type(obj) is types.TracebackType:
            tb, frames = obj, []
            while tb is not None:
                frames.append(tb.tb_frame)
                tb = tb.tb_next
            if any(f.f_code.co_filename.startswith(ours) for f in frames):
                traceback.clear_frames(obj)
    gc.collect()


@pytest.fixture(scope="session")
def spark(session_dir):
    """One local Spark session for every app test (each query has its own checkpoint)."""
    from streamops.driver.session import build_session

    # py4j logs its shutdown at interpreter exit, after pytest has closed the captured streams.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    session = build_session(
        "streamops-tests",
        master="local[2]",
        extra_conf={"spark.ui.enabled": "false", "spark.sql.warehouse.dir": str(session_dir / "warehouse")},
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def app_catalog(admin, prefix):
    """The project catalog with every topic renamed `<prefix>.<name>`, all created on the broker."""
    from streamops.catalog import load_catalog
    from streamops.provisioning import ensure_topics

    catalog = load_catalog().with_topic_prefix(prefix)
    ensure_topics(admin, catalog.topics)
    return catalog


@pytest.fixture
def app_env(app_catalog, tmp_path, monkeypatch):
    """The app catalog as a file, checkpoints under tmp_path and spark_default in local mode, for
    DAG runs that launch real drivers; a driver left running is killed at the end."""
    from streamops.app_runtime import AppRuntime

    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(app_catalog.to_yaml())
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", LOCAL_SPARK_CONNECTION)
    yield catalog_file, AppRuntime(tmp_path / "checkpoints" / "oplog-router")
    for name in app_catalog.app_names():  # never leave a driver behind
        runtime = AppRuntime(tmp_path / "checkpoints" / name)
        if runtime.is_running():
            os.kill(runtime.driver().pid, signal.SIGKILL)


@pytest.fixture
def canary(tmp_path) -> tuple[Path, Path]:
    """A canary path that must never appear, and a 'Python' that would create it if it ever ran."""
    canary = tmp_path / "CANARY"
    evil = tmp_path / "evil-python.sh"
    evil.write_text(f"#!/bin/sh\ntouch {canary}\nexec python3 \"$@\"\n")
    evil.chmod(0o755)
    return canary, evil
