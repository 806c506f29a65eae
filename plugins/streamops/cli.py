"""`streamops`: bring the local suite up and down, check it, and validate the catalog.

    streamops up [--cluster]     Kafka + Airflow up, topics provisioned through the DAG
    streamops down               stop Airflow, then Kafka
    streamops cluster up|status|down   the secured three-broker Kafka and the Spark standalone cluster
    streamops spark up|status|down     only the Spark standalone cluster
    streamops status             what runs, and whether it is healthy
    streamops broker start|stop|status
    streamops airflow init|start|stop|status|cli ARGS...
    streamops catalog check [FILE]
    streamops artifact build --app APP --version V       package a program version (immutable)
    streamops artifact ensure                            build the catalog's versions the store lacks
    streamops artifact list [NAME]
    streamops app run APP [--trigger available-now]    a streaming app in the foreground
    streamops loadgen APP --count N [--rate R] ...       realistic input for an app
    streamops quality results [--topic T] [--failed]     kept results of validate_topic_quality
    streamops audit [--app APP] [--run RUN_ID] [--dag D] the audit log of every mutating DAG
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import KafkaException

from streamops import settings, stack_secrets
from streamops.access import ROLES
from streamops.acls import app_acls, apply_acls
from streamops.app_runtime import AppRuntime, DriverRecord, LaunchRecord
from streamops.artifacts import ArtifactError, ArtifactStore, build, ensure_catalog_artifacts
from streamops.audit import audit_file, audit_table, read_audit
from streamops.bench import parse_benchmark, router_benchmark, table
from streamops.bench_report import PARTS, roll_restart, run_report, tables
from streamops.bench_stateful import STATEFUL_APPS, STATEFUL_RATES
from streamops.catalog import CatalogError, catalog_path, load_catalog, selected_environment
from streamops.checkpoints import list_backups
from streamops.driver.session import build_session
from streamops.effective_spec import SpecRefused, bind_app, installed_code, launch_cluster
from streamops.kafka_client import DEFAULT_CONN_ID, KafkaClientConfig, KafkaConfigError, app_conn_id
from streamops.launch_overrides import LaunchOverrideRefused, checked_version
from streamops.loadgen import LoadSpec
from streamops.loadgen import run as run_load
from streamops.local_stack.airflow_api import AirflowApi, AirflowApiError
from streamops.local_stack.airflow_stack import (
    ADMIN_USER,
    CELERY_WORKER_ADDRESSES,
    DEFAULT_CELERY_LOG_PORTS,
    STACK_USERS,
    LocalAirflow,
)
from streamops.local_stack.broker import LocalBroker
from streamops.local_stack.history_server import SparkHistoryServer
from streamops.local_stack.metadata_services import MetadataServices
from streamops.local_stack.process import AlreadyRunning, ServiceError, ports_from_env
from streamops.local_stack.secure_cluster import ADMIN_USER as KAFKA_ADMIN_USER
from streamops.local_stack.secure_cluster import SecureCluster
from streamops.local_stack.spark_cluster import SparkStandalone
from streamops.paths import RUN_DIR
from streamops.programs import ProgramError
from streamops.quality import results
from streamops.snapshots import listing as snapshot_listing
from streamops.snapshots import listing_table as snapshot_table
from streamops.spark_submit import SparkTarget, driver_env, submit_spec
from streamops.state_query import MAX_ROWS, StateRefused, StateRequest, read_state

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
broker_app = typer.Typer(help="The local Kafka broker (KRaft, single node).", no_args_is_help=True)
airflow_app = typer.Typer(help="The local Airflow (API server + UI, scheduler, DAG processor, triggerer).", no_args_is_help=True)
catalog_app = typer.Typer(help="The pipeline catalog.", no_args_is_help=True)
apps_app = typer.Typer(help="The streaming apps.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks: figures on this machine, printed.", no_args_is_help=True)
quality_app = typer.Typer(help="Output topic quality (validate_topic_quality).", no_args_is_help=True)
cluster_app = typer.Typer(
    help="A production-shaped Kafka on this host: 3 KRaft brokers on 127.0.0.11-13, TLS, SASL/SCRAM, ACLs.",
    no_args_is_help=True,
)
app.add_typer(broker_app, name="broker")
app.add_typer(apps_app, name="app")
app.add_typer(bench_app, name="bench")
app.add_typer(airflow_app, name="airflow")
app.add_typer(catalog_app, name="catalog")
app.add_typer(quality_app, name="quality")
app.add_typer(cluster_app, name="cluster")
artifact_app = typer.Typer(
    help="Versioned program artifacts: build once per version, deploy and roll back to exactly that code.",
    no_args_is_help=True,
)
app.add_typer(artifact_app, name="artifact")
spark_app = typer.Typer(
    help="A Spark standalone cluster on this host: master on 127.0.0.21, two workers on 127.0.0.22-23.",
    no_args_is_help=True,
)
app.add_typer(spark_app, name="spark")

PortOpt = Annotated[int | None, typer.Option("--port", help="Listener port (default: env or the standard port).")]


def _fail(message: str) -> typer.Exit:
    typer.secho(message, err=True, fg=typer.colors.RED)
    return typer.Exit(code=1)


def _start(start) -> None:
    """Start a local service: already running is news, not an error; a failed start is one."""
    try:
        typer.echo(start())
    except AlreadyRunning as exc:
        typer.echo(str(exc))
    except ServiceError as exc:
        raise _fail(str(exc)) from None


def _broker(port: int | None = None, data_dir: Path | None = None) -> LocalBroker:
    return LocalBroker.from_env(port=port, data_dir=data_dir)


# --- broker ------------------------------------------------------------------------------------


@broker_app.command("start")
def broker_start(
    port: PortOpt = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where the broker keeps its log segments.")] = None,
) -> None:
    """Start the broker and wait until it is healthy (or fail with its log's tail)."""
    _start(_broker(port, data_dir).start)


@broker_app.command("stop")
def broker_stop(port: PortOpt = None) -> None:
    """Stop the broker cleanly (controlled shutdown)."""
    typer.echo(_broker(port).stop())


@broker_app.command("status")
def broker_status(port: PortOpt = None) -> None:
    """Running or not, and whether it answers."""
    broker = _broker(port)
    typer.echo(broker.status())
    if broker.pid() is not None and not broker.healthy():
        raise typer.Exit(code=1)


# --- airflow -----------------------------------------------------------------------------------


@airflow_app.command("init")
def airflow_init(port: PortOpt = None) -> None:
    """Create/upgrade the metadata database and the kafka_default and spark_default connections."""
    try:
        typer.echo(LocalAirflow.from_env(port=port).init())
    except ServiceError as exc:
        raise _fail(str(exc)) from None


@airflow_app.command("start")
def airflow_start(port: PortOpt = None) -> None:
    """Start every component and wait until the health endpoint reports all healthy."""
    airflow = LocalAirflow.from_env(port=port)
    _start(airflow.start)
    _print_login(airflow)


@airflow_app.command("stop")
def airflow_stop(port: PortOpt = None) -> None:
    """Stop every component."""
    typer.echo(LocalAirflow.from_env(port=port).stop())


@airflow_app.command("cli", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def airflow_cli(ctx: typer.Context, port: PortOpt = None) -> None:
    """Any `airflow` command in the local stack's environment, e.g.
    `streamops airflow cli dags test recover_restart_app -c '{"app": "oplog-router"}'`."""
    airflow = LocalAirflow.from_env(port=port)
    binary = str(Path(sys.executable).parent / "airflow")
    os.execve(binary, [binary, *ctx.args], airflow.env())


@airflow_app.command("password")
def airflow_password(
    user: Annotated[str, typer.Argument(help="One of the stack's users: " + ", ".join(STACK_USERS))],
    users_file: Annotated[Path | None, typer.Option(
        help="The users file of another stack (docker/: /opt/airflow/users/users.json in airflow-init)")] = None,
) -> None:
    """The password of one of the stack's users (one per role), for the UI's login or /auth/token."""
    path = users_file or LocalAirflow.from_env().users_file
    try:
        known = stack_secrets.read_users(path)
    except FileNotFoundError:
        raise _fail(f"no users file {path} (none yet: run `streamops up`)") from None
    if user not in known:
        raise _fail(f"no user {user!r} in {path} (its users: {', '.join(known)})")
    typer.echo(known[user]["password"])


@app.command("stack-secrets")
def stack_secrets_command(
    directory: Annotated[Path, typer.Argument(help="Where the stack keeps its secrets (docker/: the airflow-auth volume)")],
    database_host: Annotated[str, typer.Option(help="The metadata database's host, for Airflow's database URL")] = "postgres",
    owner: Annotated[int | None, typer.Option(help="The uid the Airflow containers run as (the files' owner)")] = None,
    users_dir: Annotated[Path | None, typer.Option(
        help="Where the users file goes (a volume only the init container mounts); default: DIRECTORY")] = None,
) -> None:
    """Generate a stack's secrets once (docker/compose.yaml's secrets-init): keys, tokens, the database
    password and one user per role, each in a file; existing ones are kept, none is printed."""
    for line in stack_secrets.compose_secrets(directory, database_host, owner=owner, users_directory=users_dir):
        typer.echo(line)


@airflow_app.command("status")
def airflow_status(port: PortOpt = None) -> None:
    """Running components and their health."""
    airflow = LocalAirflow.from_env(port=port)
    typer.echo(airflow.status())
    if any(airflow.running().values()) and not airflow.healthy():
        raise typer.Exit(code=1)


def _print_login(airflow: LocalAirflow) -> None:
    """How to log in as each role; the passwords stay in their file (a terminal's scrollback and
    CI logs keep what is printed)."""
    typer.echo(f"Airflow UI: {airflow.url}  one user per role, each password printed by `streamops airflow password "
               f"<user>` (kept in {airflow.users_file}, readable by you only):")
    for name, entry in airflow.users().items():
        typer.echo(f"  {name:<9} {ROLES[entry['role']].description}")
    typer.echo(f"Metrics: {airflow.url}/streamops/metrics  (Prometheus bearer token in {airflow.metrics_token_file()})")


@app.command("settings")
def show_settings() -> None:
    """Every environment variable streamops reads, with the value in effect (or its default)."""
    from tabulate import tabulate

    rows = [[row["variable"], row["kind"], row["value"], row["what"]] for row in settings.table()]
    typer.echo(tabulate(rows, headers=["variable", "kind", "value", "what it is for"]))


# --- the whole suite ---------------------------------------------------------------------------


@app.command()
def up(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only plan the topics; change nothing.")] = False,
    cluster: Annotated[bool, typer.Option(
        "--cluster", help="On the secured three-broker cluster of this machine (TLS, SASL/SCRAM, ACLs; catalog "
                          "environment 'cluster', each app as its own user) instead of the single local broker.")] = False,
) -> None:
    """Start Kafka, Airflow and the Spark History Server, then provision every catalog topic through the DAG."""
    environment = (settings.ENVIRONMENT.get() or "cluster") if cluster else selected_environment()
    try:
        # A version pins code: the catalog's versions are built (once) before anything launches.
        for line in ensure_catalog_artifacts(
            load_catalog(environment=environment, check_programs=False), built_by="streamops up"
        ):
            typer.echo(line)
        catalog = load_catalog(environment=environment)
        _check_environment_fits(catalog, brokers=3 if cluster else 1)
        running = LocalAirflow.from_env()  # as recorded by the last init
        record = running.record()
        if any(running.running().values()):
            wanted = ("the secured cluster" if cluster else "the local broker", environment)
            had = ("the secured cluster" if record and record.get("kafka_settings_files") else "the local broker",
                   (record or {}).get("environment"))
            if record is None:
                raise ServiceError("Airflow is running, started by an earlier version without a record of its Kafka "
                                   "target; stop it first (`streamops airflow stop`), then run this again")
            if had != wanted:
                raise ServiceError(
                    f"Airflow is running for {had[0]} (catalog environment {had[1] or 'unknown'}), not {wanted[0]} "
                    f"(environment {environment}); stop it first (`streamops airflow stop`), then run this again")
        if cluster:
            kafka_cluster, files = _cluster_for_airflow(catalog)
            bootstrap = kafka_cluster.bootstrap_servers
            airflow = LocalAirflow.from_env(kafka_bootstrap=bootstrap, kafka_settings_files=files, environment=environment,
                                            **_cluster_profile())
        else:
            broker = _broker()
            bootstrap = broker.bootstrap_servers
            airflow = LocalAirflow.from_env(kafka_bootstrap=bootstrap, kafka_settings_files={}, environment=environment)
            try:
                typer.echo(broker.start())
            except AlreadyRunning as exc:
                typer.echo(str(exc))
        if any(airflow.running().values()):
            # The connections and the roles, always: a catalog app added since, a cluster user
            # re-created, a role's permissions changed in streamops.access.
            typer.echo(f"Airflow connections: {airflow.write_connections()}; {airflow.sync_users()}")
        else:
            # Migrates the DB and points the Kafka connections at this broker or cluster.
            typer.echo(airflow.init())
        try:
            typer.echo(airflow.start())
        except AlreadyRunning as exc:
            typer.echo(str(exc))
        try:  # every driver's history, crashed ones included (streamops.spark_history)
            typer.echo(SparkHistoryServer.from_env().start())
        except AlreadyRunning as exc:
            typer.echo(str(exc))
        api = AirflowApi(airflow.url, ADMIN_USER, airflow.admin_password() or "")
        api.wait_for_dag("provision_topics")
        started = time.monotonic()
        run_id = api.trigger("provision_topics", {"dry_run": dry_run, "approve_in_ui": False, "topics": []})
        typer.echo(f"triggered provision_topics (dry_run={dry_run}), run {run_id}; waiting for it to finish")
        state = api.wait_for_run("provision_topics", run_id)
    except (CatalogError, ServiceError, AirflowApiError, TimeoutError, KafkaConfigError, KafkaException, ArtifactError) as exc:
        raise _fail(str(exc)) from None

    plan = api.xcom("provision_topics", run_id, "plan") or {}
    typer.echo(f"provision_topics finished: {state} in {time.monotonic() - started:.0f}s; plan: {plan.get('summary', '?')}")
    for topic in plan.get("topics", []):
        typer.echo(f"  {topic['topic']:<36} {', '.join(topic['actions'])}")
    _print_login(airflow)
    typer.echo(f"Kafka bootstrap servers: {bootstrap}" + (
        f" (TLS + SASL/SCRAM; catalog environment {environment}; each app connects as its own user)" if cluster else ""))
    if state != "success":
        raise _fail(f"provision_topics failed; the whole log of each task is in the UI.\n"
                    f"{api.run_report('provision_topics', run_id)}")


@app.command()
def down() -> None:
    """Stop Airflow and the Spark History Server, then Kafka: the broker, and when `up --cluster` set the stack up for it, the
    metadata services, the Spark cluster (unless apps run on it) and the secured Kafka cluster."""
    airflow = LocalAirflow.from_env()
    on_cluster = bool((airflow.record() or {}).get("kafka_settings_files"))
    typer.echo(airflow.stop())
    typer.echo(SparkHistoryServer.from_env().stop())
    # The profile's services, also when the stack was switched back to the local default since.

    for metadata in {id(m): m for m in (airflow.metadata, MetadataServices.from_env()) if m is not None}.values():
        if metadata.is_running():
            for line in metadata.stop():
                typer.echo(line)
    typer.echo(_broker().stop())
    try:
        if on_cluster:
            spark = _spark_cluster()
            if spark.is_running():
                try:
                    typer.echo(_stop_spark(spark, force=False))
                except ServiceError as exc:  # apps run on it: they keep their executors
                    typer.echo(f"left running: {exc}")
        kafka_cluster = _secure_cluster()
        if kafka_cluster.is_running():
            typer.echo(kafka_cluster.stop() if on_cluster else
                       f"left running: the secured cluster at {kafka_cluster.bootstrap_servers} (not this stack's; "
                       "`streamops cluster down` stops it)")
    except ServiceError as exc:
        raise _fail(str(exc)) from None


def _check_environment_fits(catalog, brokers: int) -> None:
    """Refuse a catalog environment made for another Kafka before anything starts (replication 1
    on the cluster would lose data with a broker; replication 3 cannot exist on one broker)."""
    env = catalog.environments.get(catalog.environment)
    if env is not None and env.brokers is not None and env.brokers != brokers:
        target = "the secured cluster (3 brokers; `--cluster`)" if brokers == 3 else "the single local broker"
        raise ServiceError(f"catalog environment {catalog.environment!r} describes {env.brokers} broker(s), but this runs on "
                           f"{target}: set STREAMOPS_ENVIRONMENT to an environment for it (or unset it)")


@app.command()
def status() -> None:
    """Status of Kafka and Airflow."""
    broker = _broker()
    airflow = LocalAirflow.from_env()
    typer.echo(broker.status())
    try:
        kafka_cluster = _secure_cluster()
        if kafka_cluster.is_running():
            typer.echo(kafka_cluster.status())
    except ServiceError as exc:
        typer.echo(str(exc))
    typer.echo(airflow.status() + f" (catalog environment {airflow.environment}; Kafka: {airflow.target})")
    typer.echo(SparkHistoryServer.from_env().status())
    if airflow.metadata is not None:
        typer.echo(airflow.metadata.status())


# --- the secured three-broker cluster -------------------------------------------------------------


def _secure_cluster():
    return SecureCluster.from_env()


def _cluster_ready(catalog) -> tuple:
    """The cluster started (or found running), a SCRAM user per catalog app, the catalog's ACLs
    applied, each principal's client settings written (mode 600): (cluster, user -> file)."""

    kafka_cluster = _secure_cluster()
    _start(kafka_cluster.start)
    kafka_cluster.ensure_users(catalog.app_names())
    created = apply_acls(kafka_cluster.client_config(KAFKA_ADMIN_USER).admin(), app_acls(catalog))
    typer.echo(f"ACLs: {len(created)} created" + "".join(f"\n  {line}" for line in created))
    files = kafka_cluster.write_client_files([KAFKA_ADMIN_USER, *catalog.app_names()])
    for user, path in files.items():
        typer.echo(f"client settings for {user}: {path}")
    return kafka_cluster, files


def _cluster_profile() -> dict:
    """The rest of the cluster profile, started (or found running): the Spark standalone cluster
    with the client conf the Airflow workers launch apps with, PostgreSQL and Redis; LocalAirflow's
    fields for the CeleryExecutor with two workers on their own addresses."""
    spark = _spark_cluster()
    _start(spark.start)
    metadata = MetadataServices.from_env()
    for line in metadata.start():
        typer.echo(line)
    log_ports = ports_from_env(settings.CELERY_LOG_PORTS, tuple(CELERY_WORKER_ADDRESSES)) or dict(DEFAULT_CELERY_LOG_PORTS)
    return {"metadata": metadata, "celery_workers": dict(CELERY_WORKER_ADDRESSES), "celery_log_ports": log_ports,
            "spark_master": spark.master_url, "spark_conf_dir": spark.write_client_conf(cores=1)}


def _cluster_for_airflow(catalog) -> tuple:
    """As _cluster_ready, the files keyed by the Airflow connection each one becomes."""

    kafka_cluster, files = _cluster_ready(catalog)
    return kafka_cluster, {
        (DEFAULT_CONN_ID if user == KAFKA_ADMIN_USER else app_conn_id(user)): path for user, path in files.items()
    }


@cluster_app.command("up")
def cluster_up() -> None:
    """Start the Kafka cluster, create a SCRAM user per catalog app, apply the catalog's ACLs, and
    write each principal's client settings (mode 600) for --kafka-config and the Airflow
    connections; then the Spark standalone cluster (master + two workers).
    `streamops up --cluster` does the Kafka part and points the local Airflow at the cluster."""
    try:
        _cluster_ready(load_catalog())
        spark = _spark_cluster()
    except (CatalogError, ServiceError, KafkaException) as exc:
        raise _fail(str(exc)) from None
    _start(spark.start)
    typer.echo("Use them: `streamops up --cluster` (Airflow's connections from these files), or STREAMOPS_ENVIRONMENT=cluster "
               "with the Airflow connections kafka_default (the admin's settings) and kafka_app_<app> (each app's), "
               "or --kafka-config <file> on the CLI.")


ForceOpt = Annotated[bool, typer.Option("--force", help="Stop Spark even while apps run on it.")]


@cluster_app.command("down")
def cluster_down(force: ForceOpt = False) -> None:
    """Stop the Spark standalone cluster and every Kafka node (data, users and certificates are kept)."""
    try:
        typer.echo(_stop_spark(_spark_cluster(), force))
    except ServiceError as exc:  # Kafka is stopped all the same
        typer.secho(str(exc), err=True, fg=typer.colors.RED)
    typer.echo(_secure_cluster().stop())


@cluster_app.command("status")
def cluster_status() -> None:
    typer.echo(_secure_cluster().status())
    try:
        typer.echo(_spark_cluster().status())
    except ServiceError as exc:
        raise _fail(str(exc)) from None


def _spark_cluster():
    return SparkStandalone.from_env()


def _stop_spark(cluster, force: bool) -> str:
    """Stop it, but not from under running apps unless forced: their drivers would stay "running"
    with no executor and no progress."""
    apps = cluster.applications()
    if apps and not force:
        raise ServiceError(f"apps run on the Spark cluster at {cluster.master_url}: "
                           f"{', '.join(a['name'] + ' (' + a['id'] + ')' for a in apps)}; stop them first (stop_apps, "
                           "or Ctrl-C `streamops app run`), or pass --force")
    return cluster.stop()


@spark_app.command("up")
def spark_up() -> None:
    """Start the Spark standalone cluster: master on 127.0.0.21, workers on 127.0.0.22-23."""
    try:
        cluster = _spark_cluster()
    except ServiceError as exc:
        raise _fail(str(exc)) from None
    _start(cluster.start)


@spark_app.command("down")
def spark_down(force: ForceOpt = False) -> None:
    try:
        typer.echo(_stop_spark(_spark_cluster(), force))
    except ServiceError as exc:
        raise _fail(str(exc)) from None


@spark_app.command("status")
def spark_status() -> None:
    try:
        typer.echo(_spark_cluster().status())
    except ServiceError as exc:
        raise _fail(str(exc)) from None


# --- catalog -----------------------------------------------------------------------------------


@catalog_app.command("check")
def catalog_check(path: Annotated[Path | None, typer.Argument(help="Catalog file (default: the project's).")] = None) -> None:
    """Validate a catalog file; print every problem with its entry, field and line."""
    try:
        catalog = load_catalog(path)
    except CatalogError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"{catalog_path(path)}: valid, {len(catalog.topics)} topics, {len(catalog.apps)} apps")


# --- artifacts -----------------------------------------------------------------------------------


@artifact_app.command("build")
def artifact_build(
    version: Annotated[str, typer.Option(help="The version this code is, a semantic version such as 1.2.0.")],
    app_name: Annotated[
        str | None, typer.Option("--app", help="Take the artifact name and program from this catalog app.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Artifact name (default: the app's `artifact`).")] = None,
    program: Annotated[str | None, typer.Option(help="Program reference, module[:attribute] (default: the app's).")] = None,
    source: Annotated[Path | None, typer.Option(help="Folder holding the program's top-level package (default: where "
                                                        "this environment imports it from).")] = None,
    requirements: Annotated[Path | None, typer.Option(help="requirements.txt of the program's own dependencies, "
                                                              "installed into the artifact (not pyspark or streamops: "
                                                              "the runtime brings those).")] = None,
) -> None:
    """Package a program (and its dependencies) as an immutable artifact of one version."""
    if app_name:
        try:  # the catalog may name this very version, not built yet: its programs are not checked here
            app_spec = load_catalog(check_programs=False).app(app_name)
        except (CatalogError, KeyError) as exc:
            raise _fail(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)) from None
        name, program = name or app_spec.artifact, program or app_spec.program
        if not name:
            raise _fail(f"app {app_name} runs installed code (code: installed): give --name, or drop `code: installed` "
                        "so the app runs its artifact")
    if not name or not program:
        raise _fail("give --app, or --name and --program")
    try:
        artifact, new = build(name, version, program, source=source, requirements=requirements, store=ArtifactStore())
    except ArtifactError as exc:
        raise _fail(str(exc)) from None
    said = "built" if new else "already in the store with these exact bytes (nothing written)"
    typer.echo(f"{artifact.name} {artifact.version}: {said}\n  {artifact.path}\n  {artifact.digest}\n  "
               f"program {artifact.program}, {artifact.manifest['files']} files")


@artifact_app.command("ensure")
def artifact_ensure() -> None:
    """Build every catalog app's artifact at its catalog version that the store lacks, from the code
    installed here (what `streamops up` does first; compose's airflow-init runs it too)."""
    try:
        lines = ensure_catalog_artifacts(load_catalog(check_programs=False), built_by="streamops artifact ensure")
    except (CatalogError, ArtifactError) as exc:
        raise _fail(str(exc)) from None
    typer.echo("\n".join(lines))


@artifact_app.command("list")
def artifact_list(name: Annotated[str | None, typer.Argument(help="One artifact name (default: all).")] = None) -> None:
    """The artifacts in the store, with version, digest and when and from what each was built."""
    from tabulate import tabulate

    store = ArtifactStore()
    names = [name] if name else sorted(p.name for p in store.root.iterdir() if p.is_dir()) if store.root.is_dir() else []
    rows = []
    for each in names:
        for version in store.versions(each):
            try:
                artifact = store.resolve(each, version)
                rows.append([each, version, artifact.digest[:23], artifact.program, artifact.manifest.get("built_at")])
            except ArtifactError as exc:
                rows.append([each, version, "REFUSED", str(exc)[:80], ""])
    typer.echo(tabulate(rows, headers=["artifact", "version", "digest", "program", "built at"]) if rows
               else f"No artifacts in {store.root}.")


# --- apps ----------------------------------------------------------------------------------------

BootstrapOpt = Annotated[
    str | None, typer.Option("--bootstrap-servers", help="A PLAINTEXT Kafka without credentials (default: the local broker).")
]
KafkaConfigOpt = Annotated[
    Path | None, typer.Option(
        "--kafka-config", envvar=settings.KAFKA_CONFIG.name,
        help="JSON file of librdkafka settings (bootstrap.servers, security.protocol, sasl.*, ssl.*), "
             "as in the Airflow connection's extra; readable by you only. Default: the local broker.")
]


def _kafka(bootstrap_servers: str | None, kafka_config: Path | None) -> KafkaClientConfig:
    """The connection a command uses: a settings file, a plaintext broker, or the local broker."""
    if bootstrap_servers and kafka_config:
        raise _fail("give --kafka-config or --bootstrap-servers, not both")
    try:
        if kafka_config:
            return KafkaClientConfig.read_file(kafka_config, private=True)
        return KafkaClientConfig.plaintext(bootstrap_servers or _broker().bootstrap_servers,
                                           source="--bootstrap-servers" if bootstrap_servers else "the local broker")
    except KafkaConfigError as exc:
        raise _fail(str(exc)) from None


def _print_settings_file(kafka: KafkaClientConfig) -> Path:
    """For --print without --kafka-config: the plaintext broker's settings (no secret) in a file
    of the run dir, so the printed command runs as printed."""
    if kafka.secured:
        raise _fail("--print with a secured connection needs --kafka-config <file>: the command names that file")
    return kafka.write_private(RUN_DIR / "print" / f"kafka-{kafka.bootstrap_servers.replace(':', '_').replace(',', '+')}.json")


def _app_spec(name: str):
    catalog = load_catalog()
    try:
        return catalog.app(name)
    except KeyError as exc:
        raise _fail(str(exc.args[0])) from None


@apps_app.command("run")
def app_run(
    name: Annotated[str, typer.Argument(help="App name in the catalog.")],
    trigger: Annotated[
        str | None,
        typer.Option(help="'2 seconds', available-now to process what is there and stop, or real-time (stateless apps)."),
    ] = None,
    bootstrap_servers: BootstrapOpt = None,
    kafka_config: KafkaConfigOpt = None,
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint root (default: from the catalog).")] = None,
    version: Annotated[str | None, typer.Option(
        help="Version (default: the catalog's); an artifact app runs that version's artifact.")] = None,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[*]",
    print_only: Annotated[bool, typer.Option("--print", help="Print the spark-submit command; run nothing.")] = False,
) -> None:
    """Run a streaming app with spark-submit in the foreground. Ctrl-C stops it gracefully (the
    micro-batch in flight finishes); a second Ctrl-C stops it at once."""
    import shlex

    app_spec = _app_spec(name)
    kafka = _kafka(bootstrap_servers, kafka_config)
    settings_file: Path | None
    if print_only and kafka_config is None:
        # A printed command must name a settings file that exists and stays: the operator's own.
        settings_file = _print_settings_file(kafka)
    else:
        settings_file = kafka_config if print_only else None

    bound = None
    try:
        if checkpoint is None:
            # The app's own checkpoint: it runs what every launch of the app runs, the catalog with
            # the live app's approved changes (a cutover's topics: streamops.effective_spec).
            bound = bind_app(load_catalog(), name)
            app_spec = bound.app
        version = checked_version(version, "--version")
        spec = submit_spec(app_spec, kafka=kafka, trigger=trigger, checkpoint=checkpoint, version=version,
                           settings_file=settings_file, catalog=bound.catalog_file if bound else None)
    except (ProgramError, LaunchOverrideRefused, SpecRefused) as exc:
        raise _fail(str(exc)) from None
    argv = spec.argv(SparkTarget(master))
    typer.echo(shlex.join(argv), err=not print_only)
    if not print_only:
        launch = _launch_record(bound, spec, kafka) if bound is not None else None
        raise typer.Exit(run_in_foreground(argv, checkpoint or app_spec.checkpoint_location(), launch=launch))


@apps_app.command("state")
def app_state(
    name: Annotated[str, typer.Argument(help="A stateful app in the catalog.")],
    key: Annotated[str | None, typer.Option(help="Only rows whose key has this text (a user id, a fingerprint).")] = None,
    query: Annotated[str | None, typer.Option(help="One stateful query (default: all of them).")] = None,
    limit: Annotated[int, typer.Option(help=f"Rows per state store, at most {MAX_ROWS}.")] = 50,
    checkpoint: Annotated[str | None, typer.Option(help="The checkpoint folder to read (default: the app's, from the "
                                                       "catalog).")] = None,
    snapshot: Annotated[str | None, typer.Option(help="Read one of the app's checkpoint snapshots instead (a name "
                                                      "`streamops app snapshots` lists).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
    json_out: Annotated[Path | None, typer.Option(help="Write the answer as JSON to this file (Spark's log stays on "
                                                       "stdout).")] = None,
) -> None:
    """What a stateful app holds now, per key and window: its state stores read through Spark's
    state data source as of each query's last committed batch (the live app is not paused)."""
    try:  # the state's schema is in the checkpoint: no program or artifact is needed to read it
        spec = load_catalog(check_programs=False).app(name)
    except KeyError as exc:
        raise _fail(str(exc.args[0])) from None
    if snapshot is not None:
        kept = {p.name: p for p in list_backups(checkpoint or spec.checkpoint_location())}
        if snapshot not in kept:
            raise _fail(f"refused: snapshot {snapshot!r} is not among {name}'s snapshots; the latest are: "
                        f"{', '.join(list(kept)[-5:]) or 'none'}")
        checkpoint = str(kept[snapshot])
    try:
        request = StateRequest(query=query, key=key, limit=limit)
    except ValueError as exc:
        raise _fail(f"refused: {exc}") from None
    spark = build_session(f"streamops-state-{name}", master="local[2]", extra_conf=STATE_READ_CONF)
    try:
        answer = read_state(spark, spec, request, checkpoint)
    except StateRefused as exc:
        if json_out is not None:
            json_out.write_text(json.dumps({"refused": exc.operator_text()}))
        raise _fail(exc.operator_text()) from None
    finally:
        spark.stop()
    if json_out is not None:  # the page's read: the answer goes to the file only
        json_out.write_text(json.dumps(answer.to_json()))
        return
    typer.echo(json.dumps(answer.to_json(), indent=2) if as_json else answer.text())


@apps_app.command("snapshots")
def app_snapshots(
    name: Annotated[str, typer.Argument(help="An app in the catalog.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON.")] = False,
) -> None:
    """The app's checkpoint snapshots, oldest first: each one's batches, time and code, and why
    its snapshot policy keeps it (or that the next prune removes it)."""
    try:
        spec = load_catalog(check_programs=False).app(name)
    except KeyError as exc:
        raise _fail(str(exc.args[0])) from None
    rows = snapshot_listing(spec)
    typer.echo(json.dumps(rows, indent=2) if as_json else snapshot_table(spec, rows))


# A state read is a small batch job beside the live app: no UI port taken, few shuffle partitions.
STATE_READ_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}


def _launch_record(bound, spec, kafka: KafkaClientConfig) -> str:
    """STREAMOPS_LAUNCH for a run on the app's own checkpoint: its effective spec, after the
    checkpoint's cluster was checked (a checkpoint of another cluster is refused: nothing starts)."""
    app = bound.app
    try:
        cluster = launch_cluster(app, kafka)
    except SpecRefused as exc:
        raise _fail(str(exc)) from None
    effective = bound.spec(version=spec.version, spark_conf={}, code=spec.digest or installed_code(app.program),
                           principal=kafka.principal, kafka_cluster=cluster)
    return LaunchRecord(version=spec.version, spark_conf={}, spec=effective.to_record()).to_env()


def run_in_foreground(argv: list[str], checkpoint: str, launch: str | None = None) -> int:
    """spark-submit in a process group of its own, so Ctrl-C at the terminal reaches only this
    process, which asks the driver for a graceful stop (as stop_apps does); a second Ctrl-C (or
    SIGTERM) sends SIGTERM to the driver's group. Returns the driver's exit code."""
    import os
    import signal
    import subprocess

    runtime = AppRuntime(checkpoint)
    runtime.dir.mkdir(parents=True, exist_ok=True)
    me = f"streamops app run (pid {os.getpid()})"
    # Not this folder: Spark's Python workers put their working folder first on the path.
    extra = {"STREAMOPS_LAUNCH": launch} if launch else {}  # its launch record: the effective spec it runs
    process = subprocess.Popen(argv, env=driver_env(STREAMOPS_LAUNCHED_BY=me, **extra), process_group=0,  # noqa: S603
                               cwd=runtime.dir)
    signals: list[signal.Signals] = []

    def on_signal(signum, _frame):
        signals.append(signum)
        if len(signals) == 1:
            typer.echo("stopping after the micro-batch in flight (Ctrl-C again to stop at once) ...", err=True)
        else:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:  # it has ended meanwhile
                pass

    # A closed terminal (SIGHUP) stops it too: its own process group would not get the hang-up,
    # and a driver nobody watches would keep running.
    for handled in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(handled, on_signal)
    asked = False
    while True:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        # The request is written once our driver holds the lock: a driver still starting would
        # clear a stop request it found (it belongs to the driver before).
        if signals and not asked and runtime.is_running() and (runtime.driver() or DriverRecord()).launched_by == me:
            said = {signal.SIGINT: f"Ctrl-C at the terminal ({me})", signal.SIGHUP: f"the terminal of {me} closing"}
            runtime.request_stop(by=said.get(signals[0], f"SIGTERM to {me}"))
            # Stopped on purpose: the supervisor must not take it for a crash and restart it.
            runtime.set_desired("stopped", run_id=me, by=os.environ.get("USER") or "a terminal")
            asked = True


@app.command()
def loadgen(
    name: Annotated[str, typer.Argument(help="App whose inputs get the records.")],
    count: Annotated[int, typer.Option(min=1, help="How many records.")] = 10_000,
    rate: Annotated[float, typer.Option(min=0, help="Records per second (0: as fast as possible).")] = 0,
    keys: Annotated[int, typer.Option(min=1, help="Distinct keys (users or browsers).")] = 100,
    malformed: Annotated[float, typer.Option(min=0, max=1, help="Fraction of malformed records.")] = 0.0,
    late: Annotated[float, typer.Option(min=0, max=1, help="Fraction of late records.")] = 0.0,
    late_by: Annotated[float, typer.Option(min=0, help="How late a late record is, in seconds.")] = 300,
    skew: Annotated[float, typer.Option(min=0, help="Event-time jitter, in seconds either way.")] = 0,
    start_seq: Annotated[int, typer.Option(help="First sequence number.")] = 1,
    seed: Annotated[int | None, typer.Option(help="Random seed, for a repeatable load.")] = None,
    bootstrap_servers: BootstrapOpt = None,
    kafka_config: KafkaConfigOpt = None,
) -> None:
    """Produce realistic, sequence-numbered input for an app and print what was produced."""
    from datetime import timedelta

    load = LoadSpec(
        count=count, keys=keys, rate=rate, malformed=malformed, late=late, late_by=timedelta(seconds=late_by),
        skew=timedelta(seconds=skew), start_seq=start_seq, seed=seed,
    )
    report = run_load(_app_spec(name), load, _kafka(bootstrap_servers, kafka_config))
    typer.echo(report.summary())


@bench_app.command("router")
def bench_router(
    events: Annotated[int, typer.Option(min=1000, help="Events to preload and drain.")] = 200_000,
    bootstrap_servers: Annotated[
        str | None, typer.Option("--bootstrap-servers", help="Use this broker (default: a temporary local one).")
    ] = None,
    kafka_config: KafkaConfigOpt = None,
) -> None:
    """Router drain throughput: Spark vs a plain confluent-kafka loop on the same backlog."""
    kafka = _kafka(bootstrap_servers, kafka_config) if bootstrap_servers or kafka_config else None
    typer.echo(table(router_benchmark(events, kafka)))


def _rates_option(option: str, given: str) -> tuple[int, ...]:
    try:
        chosen = tuple(int(rate) for rate in given.split(","))
    except ValueError:
        raise typer.BadParameter(f"{option} {given!r}: give whole events/s separated by commas, e.g. 2000,10000") from None
    if any(rate <= 0 for rate in chosen):
        raise typer.BadParameter(f"{option} {given!r}: every rate must be above 0 events/s")
    return chosen


@bench_app.command("report")
def bench_report(
    out: Annotated[
        Path, typer.Option(help="Folder for figures.json and the plots (drain, latency, roll).")
    ] = Path("bench-report"),
    events: Annotated[int, typer.Option(min=1000, help="Backlog to drain.")] = 200_000,
    rates: Annotated[str, typer.Option(help="Steady loads for the latency runs, events/s, comma-separated.")] = "2000,10000",
    seconds: Annotated[float, typer.Option(
        min=5, help="Measured seconds of each latency and stateful run (after 30 s of warm-up).")] = 30,
    micro_batch: Annotated[str, typer.Option(help="The micro-batch trigger the live router is compared on.")] = "2 seconds",
    roll_rate: Annotated[float, typer.Option(min=1, help="Load during the roll-restarts, events/s.")] = 1000,
    bootstrap_servers: Annotated[
        str | None, typer.Option("--bootstrap-servers", help="Use this broker (default: a temporary local one).")
    ] = None,
    kafka_config: KafkaConfigOpt = None,
    parts: Annotated[str, typer.Option(help="Which parts to measure, comma-separated: drain, warm, cores, parse, "
                                            "latency, roll, stateful.")] = ",".join(PARTS),
    warm_events: Annotated[int, typer.Option(min=1000, help="Records given to the warm long-running router.")] = 1_000_000,
    stateful_rates: Annotated[str, typer.Option(help="Rising loads for the stateful apps, events/s, comma-separated "
                                                     "(each app stops at the first it does not sustain).")]
        = ",".join(str(rate) for rate in STATEFUL_RATES),
    stateful_apps: Annotated[str, typer.Option(help="Which stateful apps the stateful part measures, comma-separated.")]
        = ",".join(app.name for app in STATEFUL_APPS),
) -> None:
    """Every router figure side by side (drain, latency in micro-batch and real-time mode, roll-restart), printed,
    written as JSON and drawn as PNG into --out. Figures only: nothing is asserted."""
    chosen = _rates_option("--rates", rates)
    chosen_stateful = _rates_option("--stateful-rates", stateful_rates)
    chosen_parts = tuple(part.strip() for part in parts.split(",") if part.strip())
    unknown = sorted(set(chosen_parts) - set(PARTS))
    if unknown or not chosen_parts:
        raise typer.BadParameter(f"--parts {parts!r}: {', '.join(unknown) or 'none given'}; choose from {', '.join(PARTS)}")
    known_apps = [app.name for app in STATEFUL_APPS]
    chosen_apps = tuple(name.strip() for name in stateful_apps.split(",") if name.strip())
    if not chosen_apps or set(chosen_apps) - set(known_apps):
        raise typer.BadParameter(f"--stateful-apps {stateful_apps!r}: "
                                 f"{', '.join(sorted(set(chosen_apps) - set(known_apps))) or 'none given'}; "
                                 f"choose from {', '.join(known_apps)}")
    kafka = _kafka(bootstrap_servers, kafka_config) if bootstrap_servers or kafka_config else None
    figures = run_report(out, events, chosen, seconds, micro_batch, roll_rate, kafka, chosen_parts, warm_events,
                         chosen_stateful, chosen_apps)
    typer.echo(tables(figures))
    typer.echo(f"figures and plots in {out}/")


@bench_app.command("roll-restart")
def bench_roll_restart(
    rate: Annotated[float, typer.Option(min=1, help="Load in records/s during the roll.")] = 300,
    trigger: Annotated[str, typer.Option(help="The router's trigger: a micro-batch interval, or real-time.")] = "2 seconds",
) -> None:
    """Roll the router to a new version under load: downtime, output gap, loss and duplicates."""
    figure = roll_restart(trigger, rate)
    typer.echo(f"roll-restart of the router ({figure.mode}) under {figure.rate:g} records/s: downtime (no driver) "
               f"{figure.downtime_s:.1f} s, largest gap between output records {figure.largest_gap_s:.1f} s")
    typer.echo(f"reconciliation: {figure.expected} routed records expected, {figure.lost} lost, {figure.duplicates} duplicates")


@bench_app.command("parse")
def bench_parse(
    records: Annotated[int, typer.Option(min=1000, max=5_000_000, help="Loadgen records to parse (1% malformed).")] = 200_000,
    app_name: Annotated[str, typer.Option("--app", help="Catalog app whose inputs and fields to parse.")] = "oplog-router",
    repeats: Annotated[int, typer.Option(min=1, max=50, help="Passes; the best is reported (the JIT needs several).")] = 10,
) -> None:
    """Parse speed: records.parse over N in-memory records on one Spark session, with the input
    contract's JVM pass and with Spark's checks alone, interleaved."""
    typer.echo(table(parse_benchmark(records, repeats, app_name)))


@quality_app.command("results")
def quality_results(
    topic: Annotated[str | None, typer.Option(help="Only this topic.")] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Only failed validations.")] = False,
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Every field as JSON lines.")] = False,
) -> None:
    """Validation results kept by validate_topic_quality (one row per topic per run)."""
    from tabulate import tabulate

    rows = results.query(topic=topic, failed_only=failed, limit=limit)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    if not rows:
        typer.echo(f"No validation results in {results.results_path()}.")
        return
    table = [
        [r["validated_at"], r["topic"], "passed" if r["success"] else "FAILED", r["records"], r["range_description"],
         "; ".join(r["failed_expectations"])[:120] or "-"]
        for r in rows
    ]
    typer.echo(tabulate(table, headers=["validated at", "topic", "result", "records", "range", "failed expectations"]))


@app.command("audit")
def audit(
    app_name: Annotated[str | None, typer.Option("--app", help="Only this app.")] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Only this DAG run.")] = None,
    dag_id: Annotated[
        str | None, typer.Option("--dag", help="Only this DAG (e.g. app_status: the supervisor's restarts).")
    ] = None,
    limit: Annotated[int, typer.Option(help="How many steps, newest last.")] = 30,
    as_json: Annotated[bool, typer.Option("--json", help="Every field as JSON lines.")] = False,
) -> None:
    """The audit log: every change made through a DAG (provision, deploy, stop, roll, reprocess,
    recovery, the supervisor's restarts): who, which run, params, outcome, what changed."""
    entries = [e for e in read_audit(app=app_name, run_id=run_id) if dag_id is None or e.get("dag_id") == dag_id][-limit:]
    if as_json:
        for entry in entries:
            typer.echo(json.dumps(entry, sort_keys=True))
    elif not entries:
        typer.echo(f"No audited steps recorded in {audit_file()}.")
    else:
        typer.echo(audit_table(entries))


if __name__ == "__main__":
    app()

