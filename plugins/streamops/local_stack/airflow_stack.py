"""The local Airflow 3: API server (with the UI), scheduler, DAG processor and triggerer, each a
background process, on the embedded SQLite metadata database under .run/airflow (LocalExecutor).

The cluster profile runs the same components on PostgreSQL with the CeleryExecutor (Redis as its
broker) and Celery workers, each on a loopback address of its own: tasks run on several "hosts"."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from streamops import settings, stack_secrets
from streamops.access import ROLES
from streamops.catalog import CATALOG_ENV_VAR, ENVIRONMENT_ENV_VAR, selected_environment
from streamops.local_stack.broker import LocalBroker
from streamops.local_stack.metadata_services import MetadataServices
from streamops.local_stack.process import AlreadyRunning, ServiceError, ServiceProcess, log_tail
from streamops.paths import PROJECT_ROOT, RUN_DIR
from streamops.waiting import DeadlineExceeded, poll_until

DEFAULT_PORT = 8080
ADMIN_USER = "admin"
# One user per role of streamops.access, named as the role.
STACK_USERS = tuple(ROLES)
FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# Airflow's LocalExecutor with a guard against a race that fails an approval as it is approved
# (streamops.airflow_executor; the plugins folder is on every Airflow process's path).
LOCAL_EXECUTOR = "streamops.airflow_executor.LocalExecutor"
# /api/v2/monitor/health names the components with underscores.
_HEALTH_KEYS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
# What `streamops up` set the stack up for: catalog environment and Kafka target (connections).
STACK_RECORD = "streamops-stack.json"
# The cluster profile's Celery workers, each a "host" of its own.
CELERY_WORKER_ADDRESSES = {"worker-1": "127.0.0.31", "worker-2": "127.0.0.32"}
DEFAULT_CELERY_LOG_PORTS = {"worker-1": 18793, "worker-2": 18794}


@dataclass
class LocalAirflow:
    home: Path = RUN_DIR / "airflow"
    port: int = DEFAULT_PORT
    kafka_bootstrap: str = "127.0.0.1:9092"
    # The secured cluster instead: conn id (kafka_default, kafka_app_<app>) -> its settings file
    # (mode 600); `init` writes the connections from them.
    kafka_settings_files: dict[str, Path] = field(default_factory=dict)
    # The catalog environment the whole stack works in (its tasks and the drivers they start).
    environment: str | None = None
    # The cluster profile (empty: embedded SQLite and the LocalExecutor): the metadata database's
    # SQLAlchemy URL, Celery's broker, the Celery workers (name -> the address of its "host") with
    # their log-server ports, the Spark master spark_default points at, and the Spark client conf
    # (SPARK_CONF_DIR) the workers launch apps with.
    database_url: str | None = None
    celery_broker_url: str | None = None
    # PostgreSQL and Redis run by `up --cluster` (the URLs come from them; their place is recorded).
    metadata: MetadataServices | None = None
    celery_workers: dict[str, str] = field(default_factory=dict)
    celery_log_ports: dict[str, int] = field(default_factory=dict)
    spark_master: str | None = None
    spark_conf_dir: Path | None = None
    # Settings put last into every component's environment (a test's own DAG folder, executors).
    extra_env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, ServiceProcess] = field(init=False)

    @classmethod
    def from_env(cls, port: int | None = None, kafka_bootstrap: str | None = None,
                 kafka_settings_files: dict[str, Path] | None = None, environment: str | None = None,
                 **profile) -> LocalAirflow:
        """The stack of this run dir. Without a Kafka target given (`airflow init|start|stop`), the
        one `streamops up` recorded, with its executor profile: `airflow init` (bin/setup) keeps a
        cluster stack on the cluster, and `airflow stop` stops its Celery workers too. `profile`:
        the cluster profile's fields (metadata, celery_workers, celery_log_ports, spark_master,
        spark_conf_dir) when `up --cluster` sets it up."""
        port = port or int(settings.AIRFLOW_PORT.get() or DEFAULT_PORT)
        home = RUN_DIR / "airflow"
        record = read_stack_record(home)
        if kafka_bootstrap is None and kafka_settings_files is None and record:
            kafka_bootstrap = record.get("kafka_bootstrap")
            kafka_settings_files = {k: Path(v) for k, v in (record.get("kafka_settings_files") or {}).items()}
            environment = environment or record.get("environment")
            profile = profile or _profile_from_record(record.get("celery"))
        return cls(home=home, port=port, kafka_bootstrap=kafka_bootstrap or LocalBroker.from_env().bootstrap_servers,
                   kafka_settings_files=kafka_settings_files or {}, environment=environment, **profile)

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        if self.metadata is not None:
            self.database_url = self.database_url or self.metadata.postgres.url()
            self.celery_broker_url = self.celery_broker_url or self.metadata.redis.url
        if self.environment is None:  # as `streamops up` recorded it, else as this process selects it
            self.environment = (read_stack_record(self.home) or {}).get("environment") or selected_environment()
        self.processes = {
            name: ServiceProcess(
                name=f"Airflow {name}",
                pid_file=self.home / "pids" / f"{name}.pid",
                log_file=self.home / "service-logs" / f"{name}.log",
            )
            for name in self.components
        }

    @property
    def components(self) -> tuple[str, ...]:
        return COMPONENTS + tuple(f"celery-{name}" for name in self.celery_workers)

    @property
    def executor(self) -> str:
        return "CeleryExecutor" if self.celery_broker_url else LOCAL_EXECUTOR

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment every Airflow command of this stack runs with."""
        venv_bin = str(Path(sys.executable).parent)
        env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
                "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": self.executor,
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                # Airflow reads plugins/.airflowignore through a pathspec class deprecated in the
                # pinned release (the task runner ignores the ignore-file syntax setting): without
                # this, that warning tops every task log.
                "PYTHONWARNINGS": "ignore:GitWildMatchPattern:DeprecationWarning",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
                # Users and roles (streamops.access) in FAB's tables of the metadata DB.
                "AIRFLOW__CORE__AUTH_MANAGER": FAB_AUTH_MANAGER,
                # FAB's Flask session (the login form) signed with one key for every API worker.
                "AIRFLOW__API__SECRET_KEY": self._secret("api_secret_key"),
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__BASE_URL": self.url,
                # One secret shared by the API server and the task runners that call it.
                "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt_secret"),
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
                # A small stack on a small machine: tasks run one after another, and every step of a
                # run waits for the scheduler's next loop. It sleeps 0.25 s when idle (Airflow: 1 s),
                # a few cheap queries more per second. A task process whose exit the supervisor
                # missed is noticed after 2 s, not 5 (each heartbeat is one small write). DAG files
                # unchanged since their last parse are parsed again every 2 minutes, not every 30 s
                # (each parse forks a process that reads the catalog): a catalog edit reaches the
                # trigger forms within 2 minutes; an edited DAG file is parsed again at once.
                "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.25",
                "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "120",
                CATALOG_ENV_VAR: settings.CATALOG.get() or str(PROJECT_ROOT / "catalog" / "pipelines.yaml"),
                ENVIRONMENT_ENV_VAR: self.environment or selected_environment(),
                # Connection extras (the secured cluster's passwords) encrypted in the metadata DB.
                "AIRFLOW__CORE__FERNET_KEY": self._fernet_key(),
                # The bearer token Prometheus scrapes /streamops/metrics with (streamops.metrics).
                "STREAMOPS_METRICS_TOKEN_FILE": str(self.metrics_token_file()),
            }
        )
        if self.database_url:
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = self.database_url
        if self.celery_broker_url:
            env.update({
                "AIRFLOW__CELERY__BROKER_URL": self.celery_broker_url,
                # Task results in the metadata database (Celery's SQLAlchemy backend, `db+` URL).
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + (self.database_url or "").replace("postgresql+psycopg2", "postgresql"),
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
                # Send tasks to Celery from the scheduler's own process (Airflow's default forks a
                # pool per batch of sends on a machine with more than two cores).
                "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",
            })
        if self.spark_conf_dir:
            env["SPARK_CONF_DIR"] = str(self.spark_conf_dir)
        return env | self.extra_env

    def worker_env(self, name: str) -> dict[str, str]:
        """A Celery worker's environment: its own "host" address, for Airflow's task records
        (hostname_callable) and for the drivers it launches (SPARK_LOCAL_IP), and its log server."""
        address = self.celery_workers[name]
        return {**self.env(), "STREAMOPS_HOST_ADDRESS": address, "SPARK_LOCAL_IP": address,
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": "streamops.host_identity.host_address",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.celery_log_ports[name])}

    @property
    def target(self) -> str:
        """Which Kafka this stack's connections point at (for messages and the switch guard)."""
        return "the secured cluster" if self.kafka_settings_files else f"the local broker {self.kafka_bootstrap}"

    def record(self) -> dict | None:
        """What `init` last set this stack up for: environment and Kafka target (None before)."""
        return read_stack_record(self.home)

    def _fernet_key(self) -> str:
        from cryptography.fernet import Fernet

        key = stack_secrets.fernet_key(self.home)
        try:
            Fernet(key)
        except ValueError:
            raise ServiceError(f"{self.home / 'fernet_key'} does not hold a Fernet key: connection extras cannot be "
                               "encrypted. It must be the key the metadata DB was written with; restore it, or re-create "
                               "the DB") from None
        return key

    def metrics_token_file(self) -> Path:
        """The scrape token of /streamops/metrics, made once (mode 600): Prometheus reads the file
        (`authorization: {credentials_file: ...}`), so the token is never on a command line."""
        stack_secrets.secret(self.home, "metrics_token")
        return self.home / "metrics_token"

    def _secret(self, name: str) -> str:
        """A secret of this stack, generated on first use into <home>/<name> (mode 600)."""
        return stack_secrets.secret(self.home, name)

    @property
    def users_file(self) -> Path:
        """One user per role (streamops.access), each with a password generated once (mode 600)."""
        return self.home / stack_secrets.USERS_FILE

    def users(self) -> dict[str, dict[str, str]]:
        """The stack's users: name -> {"role", "password"}; generated the first time."""
        return stack_secrets.users(self.home)

    def sync_users(self) -> str:
        """The suite's roles and the stack's users in FAB's tables, as declared (after `db migrate`)."""
        self.users()
        result = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "streamops.local_stack.fab_roles", str(self.users_file)],
            env=self.env(), capture_output=True, text=True, check=False, timeout=300,
        )
        if result.returncode != 0:
            raise ServiceError(f"creating the roles and users failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
        return f"roles {', '.join(STACK_USERS)} and one user each (passwords in {self.users_file})"

    def airflow(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """Run one `airflow` CLI command in this stack's environment; raise with its output on failure."""
        result = subprocess.run(  # noqa: S603
            [str(Path(sys.executable).parent / "airflow"), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise ServiceError(
                f"`airflow {' '.join(args)}` failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-4000:]}"
            )
        return result

    # -----------------------------------------------------------------------------------------

    def init(self) -> str:
        """Create or upgrade the metadata database and create/update the suite's connections."""
        if self.metadata is not None and self.metadata.postgres.process.pid() is None:
            # bin/setup runs this: not an error, the database is simply not up right now.
            return (f"Airflow metadata DB not touched: this stack runs on PostgreSQL ({self.metadata.status()}); "
                    "`streamops up --cluster` starts and migrates it")
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)  # the DB, keys and logs are this user's
        self.airflow("db", "migrate")
        if not self.database_url:
            (self.home / "airflow.db").chmod(0o600)
        return f"Airflow metadata DB ready in {self.home}; {self.sync_users()}; {self.write_connections()}"

    def write_connections(self) -> str:
        """kafka_default (and kafka_app_<app> on the cluster) for this stack's Kafka target, and
        spark_default; records the target and the catalog environment. Safe while Airflow runs
        (tasks read connections when they start)."""
        self._refuse_running_without_the_key()
        if self.kafka_settings_files:
            kafka = [f"--settings={conn_id}={path}" for conn_id, path in self.kafka_settings_files.items()]
            described = ", ".join(self.kafka_settings_files)
        else:
            kafka, described = [self.kafka_bootstrap], f"kafka_default ({self.kafka_bootstrap})"
        spark = ["--spark-master", self.spark_master] if self.spark_master else []
        webhook_file = settings.NOTIFY_WEBHOOK_FILE.get()
        notify = ["--notify-webhook-file", webhook_file] if webhook_file else []
        result = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "streamops.local_stack.connections", *kafka, *spark, *notify],
            env=self.env(), capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise ServiceError(f"writing the Airflow connections failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
        record = {"environment": self.environment, "kafka_bootstrap": self.kafka_bootstrap,
                  "kafka_settings_files": {k: str(v) for k, v in self.kafka_settings_files.items()},
                  "celery": self._profile_record()}
        tmp = self.home / f".stack.json.{secrets.token_hex(8)}"
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, self.home / STACK_RECORD)
        return (f"catalog environment {self.environment}, Kafka: {self.target}; "
                f"connections {described} and spark_default ({self.spark_master or 'local[*]'})"
                + (f"; on-call's webhook streamops_notify (from {webhook_file})" if webhook_file else ""))

    def _profile_record(self) -> dict | None:
        """Where the cluster profile's pieces are (never a password: those stay in their 600 files)."""
        if self.metadata is None:
            return None
        return {"metadata_dir": str(self.metadata.state_dir),
                "metadata_ports": [self.metadata.postgres_port, self.metadata.redis_port],
                "workers": self.celery_workers, "log_ports": self.celery_log_ports, "spark_master": self.spark_master,
                "spark_conf_dir": str(self.spark_conf_dir) if self.spark_conf_dir else None}

    def _key_fingerprint(self) -> str:
        import hashlib

        return hashlib.sha256(self._fernet_key().encode()).hexdigest()[:16]

    @property
    def _started_with_file(self) -> Path:
        # Which key the running components got (their environment cannot be read back: Airflow
        # sets its process titles over it).
        return self.home / "pids" / "fernet-key-fingerprint"

    def _refuse_running_without_the_key(self) -> None:
        """Connections are written encrypted: components started without the key (before the
        stack had one) could not read them, and every task would fail. Say so instead."""
        running = {name: pid for name, pid in self.running().items() if pid}
        if not running:
            return
        try:
            started_with = self._started_with_file.read_text().strip()
        except FileNotFoundError:
            started_with = None
        if started_with != self._key_fingerprint():
            raise ServiceError(f"Airflow ({_pids(running)}) was started without this stack's Fernet key "
                               f"({self.home / 'fernet_key'}) and could not read connections written now; "
                               "`streamops airflow stop`, then run this again")

    def running(self) -> dict[str, int | None]:
        return {name: proc.pid() for name, proc in self.processes.items()}

    def start(self, timeout: float = 180.0) -> str:
        running = {name: pid for name, pid in self.running().items() if pid is not None}
        if len(running) == len(self.components):
            raise AlreadyRunning(f"Airflow is already running at {self.url} (pids: {_pids(running)})")
        if running:
            raise ServiceError(
                f"Airflow is partly running ({_pids(running)}); run `streamops airflow stop` first"
            )
        if not self.database_url and not (self.home / "airflow.db").exists():
            raise ServiceError(f"no Airflow metadata database in {self.home}: run `streamops airflow init` (or bin/setup)")
        env = self.env()
        self._started_with_file.parent.mkdir(parents=True, exist_ok=True)
        self._started_with_file.write_text(self._key_fingerprint() + "\n")
        airflow_bin = str(Path(sys.executable).parent / "airflow")
        for name in COMPONENTS:
            argv = [airflow_bin, name]
            if name == "api-server":
                argv += ["--port", str(self.port), "--host", "127.0.0.1"]
            self.processes[name].spawn(argv, env=env, cwd=self.home)
        for worker in self.celery_workers:
            self._spawn_worker(worker)
        try:
            poll_until(lambda: self._healthy_or_dead() and self._workers_ready_or_dead(), timeout=timeout,
                       what=f"Airflow at {self.url} to report healthy")
        except DeadlineExceeded:
            tails = self._tails()
            self.stop()
            raise ServiceError(f"Airflow did not become healthy within {timeout:g}s.\n{tails}") from None
        dead = [name for name, pid in self.running().items() if pid is None]
        if dead:
            tails = self._tails(dead)
            self.stop()
            raise ServiceError(f"Airflow component(s) exited during start-up: {', '.join(dead)}\n{tails}")
        return f"Airflow up at {self.url} (pids: {_pids(self.running())})"

    def stop(self) -> str:
        lines = [proc.stop(timeout=60) for proc in reversed(self.processes.values())]
        strays = self._task_processes()
        if strays:
            lines.append(f"ended {len(strays)} task process(es) the stopped components left running: "
                         f"{_end_processes(strays, grace_s=15)}")
        return "\n".join(lines)

    def _task_processes(self, host_address: str | None = None) -> list[psutil.Process]:
        """Task processes of this stack (and the Spark JVMs they started), also those of a worker
        that is gone: Airflow runs each task in a process group of its own, so stopping a
        component's group misses them. Known by their AIRFLOW_HOME (and STREAMOPS_HOST_ADDRESS for
        one worker's); the drivers they launch carry no AIRFLOW_* variable and are never among them."""
        found = []
        for process in psutil.process_iter(["pid"]):
            if process.pid == os.getpid():
                continue
            try:
                env = process.environ()
            except (psutil.Error, OSError):
                continue
            if env.get("AIRFLOW_HOME") == str(self.home) and (
                host_address is None or env.get("STREAMOPS_HOST_ADDRESS") == host_address
            ):
                found.append(process)
        return found

    # --- Celery workers (the cluster profile) ---------------------------------------------------

    def _spawn_worker(self, name: str) -> None:
        process = self.processes[f"celery-{name}"]
        # A fresh log per start: readiness is read from it.
        process.log_file.parent.mkdir(parents=True, exist_ok=True)
        process.log_file.write_text("")
        airflow_bin = str(Path(sys.executable).parent / "airflow")
        process.spawn([airflow_bin, "celery", "worker", "--celery-hostname", f"{name}@{self.celery_workers[name]}"],
                      env=self.worker_env(name), cwd=self.home)

    def _worker_ready(self, name: str) -> bool:
        log = self.processes[f"celery-{name}"].log_file
        return log.exists() and f"{name}@{self.celery_workers[name]} ready" in log.read_text(errors="replace")

    def _workers_ready_or_dead(self) -> bool:
        return all(self.processes[f"celery-{n}"].pid() is None or self._worker_ready(n) for n in self.celery_workers)

    def start_worker(self, name: str, timeout: float = 120.0) -> str:
        """Start one Celery worker (again) and wait until it takes tasks."""
        self._spawn_worker(name)
        process = self.processes[f"celery-{name}"]
        try:
            poll_until(lambda: process.pid() is None or self._worker_ready(name), timeout=timeout,
                       what=f"Celery worker {name} to be ready")
        except DeadlineExceeded:
            pass
        if not self._worker_ready(name):
            tail = log_tail(process.log_file, 30)
            process.stop(timeout=30)
            raise ServiceError(f"Celery worker {name} did not become ready; last lines of {process.log_file}:\n{tail}")
        return f"Celery worker {name} ready on {self.celery_workers[name]} (pid {process.pid()})"

    def kill_worker(self, name: str) -> str:
        """kill -9 of a Celery worker and its task processes (a lost machine). The drivers it
        launched run in sessions of their own and are not touched."""
        process = self.processes[f"celery-{name}"]
        pid = process.pid()
        if pid is None:
            raise ServiceError(f"Celery worker {name} is not running")
        os.killpg(pid, signal.SIGKILL)
        poll_until(process.exited, timeout=30, what=f"Celery worker {name} (pid {pid}) to die")
        tasks = self._task_processes(host_address=self.celery_workers[name])
        _end_processes(tasks, grace_s=0)
        return f"Celery worker {name} killed (pid {pid}) with {len(tasks)} task process(es)"

    def health(self) -> dict[str, str]:
        """Status per component from the API server's health endpoint (empty if it is down)."""
        try:
            body = httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return {}
        return {key: (body.get(key) or {}).get("status", "unknown") for key in _HEALTH_KEYS}

    def healthy(self) -> bool:
        health = self.health()
        return bool(health) and all(status == "healthy" for status in health.values())

    def status(self) -> str:
        pids = self.running()
        if not any(pids.values()):
            return f"Airflow: stopped (would serve {self.url})"
        health = self.health() or {"api-server": "not answering"}
        parts = ", ".join(f"{k} {v}" for k, v in health.items())
        return f"Airflow: running at {self.url} ({self.describe_profile()}; pids: {_pids(pids)}); {parts}"

    def describe_profile(self) -> str:
        if not self.celery_broker_url:
            return "LocalExecutor on SQLite"
        workers = ", ".join(f"{name}@{address}" for name, address in self.celery_workers.items())
        return f"CeleryExecutor on PostgreSQL, workers {workers}"

    def admin_password(self) -> str | None:
        """The admin user's password (None before `init` made the users)."""
        return self.password_of(ADMIN_USER)

    def password_of(self, user: str) -> str | None:
        try:
            return stack_secrets.read_users(self.users_file)[user]["password"]
        except (FileNotFoundError, KeyError, ValueError):
            return None

    # -----------------------------------------------------------------------------------------

    def _healthy_or_dead(self) -> bool:
        return any(pid is None for pid in self.running().values()) or self.healthy()

    def _tails(self, names: list[str] | None = None) -> str:
        return "\n".join(
            f"--- last lines of {self.processes[name].log_file} ---\n{log_tail(self.processes[name].log_file, 25)}"
            for name in (names or self.components)
        )


def _end_processes(processes: list[psutil.Process], grace_s: float) -> str:
    """SIGTERM (none with no grace), SIGKILL what is left after `grace_s`; 'pid name, ...'."""
    said = []
    for process in processes:
        try:
            said.append(f"{process.pid} {process.name()}")
            process.send_signal(signal.SIGTERM if grace_s else signal.SIGKILL)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(processes, timeout=grace_s or 5)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=10)
    return ", ".join(said)


def _profile_from_record(celery: dict | None) -> dict:
    """LocalAirflow's cluster-profile fields from the stack record ({} for the local default)."""
    if not celery:
        return {}
    postgres_port, redis_port = celery["metadata_ports"]
    return {"metadata": MetadataServices(Path(celery["metadata_dir"]), postgres_port, redis_port),
            "celery_workers": dict(celery["workers"]), "celery_log_ports": {k: int(v) for k, v in celery["log_ports"].items()},
            "spark_master": celery.get("spark_master"),
            "spark_conf_dir": Path(celery["spark_conf_dir"]) if celery.get("spark_conf_dir") else None}


def read_stack_record(home: Path) -> dict | None:
    """The record `write_connections` keeps in the Airflow home (None if never written)."""
    try:
        data = json.loads((Path(home) / STACK_RECORD).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _pids(pids: Mapping[str, int | None]) -> str:
    return ", ".join(f"{name} {pid}" for name, pid in pids.items() if pid is not None)
