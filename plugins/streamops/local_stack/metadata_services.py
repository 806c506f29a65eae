"""The cluster profile's Airflow services on this machine: PostgreSQL (the metadata database) and
Redis (the CeleryExecutor's broker), each on the metadata "host" 127.0.0.30, initialised and run
from Debian's binaries under a state folder of the project's run directory.

PostgreSQL will not run as root: when this process is root the server runs as the `postgres`
system user (Debian's package creates it) and its data folder belongs to that user; a developer
running as themselves runs it as themselves. Both services take a password kept in a 600 file,
so the connection strings never appear in a process list or a log line of ours.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from streamops import settings
from streamops.local_stack.process import AlreadyRunning, ServiceError, ServiceProcess, ports_from_env
from streamops.paths import RUN_DIR

METADATA_ADDRESS = "127.0.0.30"
DEFAULT_POSTGRES_PORT = 15432
DEFAULT_REDIS_PORT = 16379
POSTGRES_BIN = Path(settings.POSTGRES_BIN.get() or "/usr/lib/postgresql/15/bin")
DATABASE = "airflow"
DB_USER = "airflow"


def _secret(path: Path) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(24))
    return path.read_text().strip()


def _server_user() -> pwd.struct_passwd | None:
    """The user the database server runs as: None for this user, `postgres` when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise ServiceError("PostgreSQL will not run as root and there is no `postgres` user: install Debian's "
                           "postgresql-15 package (bin/setup does), or run as an unprivileged user") from None


@dataclass
class PostgresServer:
    state_dir: Path
    port: int
    address: str = METADATA_ADDRESS
    process: ServiceProcess = field(init=False)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.process = ServiceProcess("PostgreSQL", self.state_dir / "postgres.pid", self.state_dir / "postgres.log")

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def password(self) -> str:
        return _secret(self.state_dir / "db-password")

    def url(self, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://{DB_USER}:{self.password}@{self.address}:{self.port}/{DATABASE}"

    def _as_server_user(self) -> dict:
        user = _server_user()
        return {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def _give_to_server_user(self, path: Path) -> None:
        user = _server_user()
        if user is not None:
            shutil.chown(path, user.pw_uid, user.pw_gid)

    def init(self) -> None:
        """initdb once: password authentication for TCP, the socket folder beside the data."""
        if (self.data_dir / "PG_VERSION").exists():
            return
        if not (POSTGRES_BIN / "initdb").exists():
            raise ServiceError(f"no PostgreSQL at {POSTGRES_BIN}: install Debian's postgresql-15 (bin/setup does) "
                               "or set STREAMOPS_POSTGRES_BIN")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The server user must reach its folder; nothing else in the state folder is readable.
        self.state_dir.chmod(0o711)
        if _server_user() is not None:
            closed = [str(d) for d in [*reversed(self.state_dir.resolve().parents)] if not os.stat(d).st_mode & 0o001]
            if closed:
                raise ServiceError(f"PostgreSQL runs as the `postgres` user, who cannot enter {closed[0]} (no x for others) "
                                   f"on the way to {self.state_dir}: keep the state folder under a path others can traverse")
        password_file = self.state_dir / ".initdb-password"
        password_file.unlink(missing_ok=True)
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.password)
        self._give_to_server_user(password_file)
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        self._give_to_server_user(self.data_dir)
        try:
            result = subprocess.run(  # noqa: S603 - fixed argv
                [str(POSTGRES_BIN / "initdb"), "-D", str(self.data_dir), "-U", DB_USER, "--pwfile", str(password_file),
                 "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"],
                capture_output=True, text=True, check=False, **self._as_server_user())
        finally:
            password_file.unlink(missing_ok=True)
        if result.returncode != 0:
            raise ServiceError(f"initdb failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
        # Our own database for Airflow; the initial one (`postgres`) stays for maintenance.
        (self.data_dir / "postgresql.auto.conf").write_text(
            f"listen_addresses = '{self.address}'\nport = {self.port}\nunix_socket_directories = '{self.data_dir}'\n"
            "max_connections = 200\nfsync = on\n")

    def start(self, timeout: float = 60.0) -> str:
        if self.process.pid() is not None:
            raise AlreadyRunning(f"PostgreSQL is already running on {self.address}:{self.port} (pid {self.process.pid()})")
        self.init()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = self.process.log_file
        log.touch()
        self._give_to_server_user(log)
        argv = [str(POSTGRES_BIN / "postgres"), "-D", str(self.data_dir), "-h", self.address, "-p", str(self.port)]
        self.process.spawn(argv, env={"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8"}, cwd=self.state_dir,
                           **self._as_server_user())
        self.process.await_ready(self._ready, timeout, f"PostgreSQL on {self.address}:{self.port} to accept connections")
        self._create_database()
        return f"PostgreSQL up on {self.address}:{self.port} (pid {self.process.pid()}), data {self.data_dir}"

    def _ready(self) -> bool:
        result = subprocess.run([str(POSTGRES_BIN / "pg_isready"), "-h", self.address, "-p", str(self.port)],  # noqa: S603
                                capture_output=True, check=False)
        return result.returncode == 0

    def _create_database(self) -> None:
        import psycopg2

        conn = psycopg2.connect(host=self.address, port=self.port, user=DB_USER, password=self.password, dbname="postgres")
        try:
            conn.autocommit = True  # CREATE DATABASE runs outside a transaction
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
                if cursor.fetchone() is None:
                    cursor.execute(f"CREATE DATABASE {DATABASE}")  # a constant name, not input
        finally:
            conn.close()

    def stop(self) -> str:
        # SIGINT is PostgreSQL's "fast" shutdown: open sessions are ended (SIGTERM's "smart" one
        # would wait for every client), then it checkpoints and exits.
        return self.process.stop(timeout=60, sig=signal.SIGINT)


@dataclass
class RedisServer:
    state_dir: Path
    port: int
    address: str = METADATA_ADDRESS
    process: ServiceProcess = field(init=False)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.process = ServiceProcess("Redis", self.state_dir / "redis.pid", self.state_dir / "redis.log")

    @property
    def password(self) -> str:
        return _secret(self.state_dir / "redis-password")

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.address}:{self.port}/0"

    def start(self, timeout: float = 60.0) -> str:
        if self.process.pid() is not None:
            raise AlreadyRunning(f"Redis is already running on {self.address}:{self.port} (pid {self.process.pid()})")
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServiceError("no redis-server: install Debian's redis-server (bin/setup does)")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)  # its append-only file holds Celery's messages
        config = self.state_dir / "redis.conf"
        # The password in a 600 config file, not on the command line; Celery's queue is durable
        # enough with the append-only file.
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"bind {self.address}\nport {self.port}\nrequirepass {self.password}\ndir {self.state_dir}\n"
                      "appendonly yes\nsave \"\"\nprotected-mode yes\n")
        self.process.spawn([binary, str(config)], env={"PATH": os.environ.get("PATH", "")}, cwd=self.state_dir)
        self.process.await_ready(self._ready, timeout, f"Redis on {self.address}:{self.port} to answer")
        return f"Redis up on {self.address}:{self.port} (pid {self.process.pid()})"

    def _ready(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(host=self.address, port=self.port, password=self.password, socket_timeout=2).ping())
        except redis.RedisError:
            return False

    def stop(self) -> str:
        return self.process.stop(timeout=30)


@dataclass
class MetadataServices:
    """PostgreSQL and Redis of the cluster profile, started and stopped together."""

    state_dir: Path
    postgres_port: int = DEFAULT_POSTGRES_PORT
    redis_port: int = DEFAULT_REDIS_PORT

    @classmethod
    def from_env(cls) -> MetadataServices:
        """$STREAMOPS_METADATA_DIR (default <run dir>/cluster-metadata) and $STREAMOPS_METADATA_PORTS
        ("postgres,redis", default 15432,16379), both on 127.0.0.30."""
        ports = ports_from_env(settings.METADATA_PORTS, ("postgres_port", "redis_port"))
        return cls(state_dir=Path(settings.METADATA_DIR.get() or RUN_DIR / "cluster-metadata"), **ports)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.postgres = PostgresServer(self.state_dir / "postgres", self.postgres_port)
        self.redis = RedisServer(self.state_dir / "redis", self.redis_port)

    def start(self) -> list[str]:
        """Start both (a running one is reported, not restarted); stop what this call started if
        the other fails."""
        said, started = [], []
        for service in (self.postgres, self.redis):
            try:
                said.append(service.start())
                started.append(service)
            except AlreadyRunning as exc:
                said.append(str(exc))
            except ServiceError:
                for done in reversed(started):
                    done.stop()
                raise
        return said

    def stop(self) -> list[str]:
        return [self.redis.stop(), self.postgres.stop()]

    def is_running(self) -> bool:
        return self.postgres.process.pid() is not None or self.redis.process.pid() is not None

    def status(self) -> str:
        def one(name: str, service, port: int) -> str:
            pid = service.process.pid()
            return f"{name} {'running (pid ' + str(pid) + ')' if pid else 'stopped'} on {METADATA_ADDRESS}:{port}"

        return (f"Airflow metadata services: {one('PostgreSQL', self.postgres, self.postgres_port)}, "
                f"{one('Redis', self.redis, self.redis_port)}")
