"""The local single-node Apache Kafka broker (KRaft, no ZooKeeper), run from the jars that
bin/setup resolved from Maven Central into .cache/jars/kafka-broker."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from streamops import settings
from streamops.kafka_client import KafkaClientConfig
from streamops.local_stack.process import AlreadyRunning, ServiceError, ServiceProcess, log_tail
from streamops.paths import KAFKA_BROKER_JARS, RUN_DIR
from streamops.waiting import DeadlineExceeded, poll_until

DEFAULT_PORT = 9092

_LOG4J2 = """\
Configuration:
  name: streamops-local-broker
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.request.logger
        level: WARN
      - name: org.apache.kafka.controller
        level: INFO
      - name: state.change.logger
        level: WARN
"""


@dataclass
class LocalBroker:
    """A broker whose config, pid file, log and data all live under `state_dir`."""

    state_dir: Path = RUN_DIR / "kafka"
    port: int = DEFAULT_PORT
    controller_port: int | None = None
    data_dir: Path | None = None
    heap: str = "512m"

    @classmethod
    def from_env(cls, port: int | None = None, data_dir: Path | None = None) -> LocalBroker:
        """Settings from arguments, else STREAMOPS_KAFKA_PORT / STREAMOPS_KAFKA_DATA_DIR."""
        port = port or int(settings.KAFKA_PORT.get() or DEFAULT_PORT)
        env_data = settings.KAFKA_DATA_DIR.get()
        return cls(port=port, data_dir=data_dir or (Path(env_data) if env_data else None))

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.controller_port = self.controller_port or self.port + 1
        self.data_dir = Path(self.data_dir) if self.data_dir else self.state_dir / "data"
        self.process = ServiceProcess(
            name="Kafka broker",
            pid_file=self.state_dir / "broker.pid",
            log_file=self.state_dir / "broker.log",
        )

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def client_config(self) -> KafkaClientConfig:
        """How a client connects to this broker (PLAINTEXT, no credentials)."""
        return KafkaClientConfig.plaintext(self.bootstrap_servers, source=f"the local broker {self.bootstrap_servers}")

    @property
    def config_file(self) -> Path:
        return self.state_dir / "server.properties"

    def server_properties(self) -> dict[str, str]:
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # Typos must not become topics: only the catalog creates topics.
            "auto.create.topics.enable": "false",
            # One broker: every internal topic must fit on it.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.partitions": "1",
            # The controller writes a no-op record to the metadata log when nothing else happened
            # for this long (Kafka: 500 ms); a dev broker mostly idles, so less often.
            "metadata.max.idle.interval.ms": "5000",
            # Retention is enforced within seconds, not Kafka's 5 minutes: on a laptop a topic with a
            # short retention (a retention-runway drill, its test) shows what production does.
            "log.retention.check.interval.ms": "5000",
        }

    # -----------------------------------------------------------------------------------------

    def pid(self) -> int | None:
        return self.process.pid()

    def start(self, timeout: float = 90.0) -> str:
        running = self.pid()
        if running is not None:
            raise AlreadyRunning(
                f"Kafka broker is already running (pid {running}) at {self.bootstrap_servers}; "
                f"data in {self.data_dir}"
            )
        _require_jars()
        for port in (self.port, self.controller_port or self.port + 1):  # (set by __post_init__)
            if _port_in_use(port):
                raise ServiceError(
                    f"cannot start the Kafka broker: port {port} on 127.0.0.1 is in use by another "
                    "process; choose other ports (--port / STREAMOPS_KAFKA_PORT)"
                )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            "".join(f"{key}={value}\n" for key, value in self.server_properties().items())
        )
        (self.state_dir / "log4j2.yaml").write_text(_LOG4J2)
        self._format_storage()
        self.process.spawn(
            [*self._java(), "kafka.Kafka", str(self.config_file)],
            env=self._env(),
            cwd=self.state_dir,
        )
        try:
            poll_until(self._ready_or_dead, timeout=timeout, what=f"the Kafka broker at {self.bootstrap_servers}")
        except DeadlineExceeded:
            self.process.stop(timeout=15)
            raise ServiceError(
                f"the Kafka broker did not become healthy within {timeout:g}s; last log lines "
                f"({self.process.log_file}):\n{log_tail(self.process.log_file)}"
            ) from None
        if self.pid() is None:
            raise ServiceError(
                f"the Kafka broker exited during start-up; last log lines ({self.process.log_file}):\n"
                f"{log_tail(self.process.log_file)}"
            )
        return f"Kafka broker up at {self.bootstrap_servers} (pid {self.pid()}, data in {self.data_dir})"

    def stop(self) -> str:
        return self.process.stop(timeout=60)

    def healthy(self) -> bool:
        """True when the broker answers a metadata request and has an active controller."""
        if self.pid() is None:
            return False
        try:
            # log_level 0: a broker still starting refuses connections; that is expected, not news.
            admin = AdminClient(
                {"bootstrap.servers": self.bootstrap_servers, "socket.timeout.ms": 2000, "log_level": 0}
            )
            cluster = admin.describe_cluster(request_timeout=3).result(timeout=5)
            return cluster.controller is not None and len(cluster.nodes) >= 1
        except Exception:  # noqa: BLE001 - any failure means "not healthy yet"
            return False

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return f"Kafka broker: stopped (would listen on {self.bootstrap_servers})"
        health = "healthy" if self.healthy() else "NOT answering"
        return f"Kafka broker: running (pid {pid}) at {self.bootstrap_servers}, {health}; data in {self.data_dir}"

    # -----------------------------------------------------------------------------------------

    def _ready_or_dead(self) -> bool:
        # Stop polling early when the process died: start() then reports the log tail.
        return self.pid() is None or self.healthy()

    def _java(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ServiceError("java is not on PATH: the Kafka broker needs a JDK 17+")
        return [
            java,
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.state_dir / 'log4j2.yaml'}",
            # Keep logging until the broker has finished its controlled shutdown.
            "-Dlog4j2.shutdownHookEnabled=false",
            f"-Dkafka.logs.dir={self.state_dir}",
            *jvm_options(),
            "-cp",
            f"{KAFKA_BROKER_JARS}/*",
        ]

    def _env(self) -> dict[str, str]:
        return {key: value for key, value in os.environ.items() if not key.startswith("KAFKA_")}

    def _format_storage(self) -> None:
        """Format the KRaft metadata log once; an already formatted data dir is kept as is."""
        data_dir = Path(self.data_dir or self.state_dir / "data")  # (set by __post_init__)
        if (data_dir / "meta.properties").exists():
            return
        data_dir.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(  # noqa: S603
            [
                *self._java(),
                "kafka.tools.StorageTool",
                "format",
                # "=" form: an id may start with "-", which argparse would take for a flag.
                f"--cluster-id={_cluster_id()}",
                "--config",
                str(self.config_file),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
            env=self._env(),
            check=False,
        )
        if result.returncode != 0:
            raise ServiceError(
                f"formatting the broker's data dir {self.data_dir} failed:\n{result.stdout}{result.stderr}"
            )


def jvm_options() -> list[str]:
    """STREAMOPS_KAFKA_JVM_OPTIONS, split as a shell would (the local brokers' extra options)."""
    import shlex

    return shlex.split(settings.KAFKA_JVM_OPTIONS.get() or "")


def _cluster_id() -> str:
    # KRaft wants a base64url-encoded UUID without padding, as `kafka-storage random-uuid` makes.
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def free_port_pair() -> int:
    """A port p with p and p+1 both free now (the broker puts its controller on p+1)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if not _port_in_use(port + 1):
            return port
    raise ServiceError("no two adjacent free ports found on 127.0.0.1")


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _require_jars() -> None:
    if not any(KAFKA_BROKER_JARS.glob("kafka_2.13-*.jar")):
        raise ServiceError(
            f"the Kafka broker jars are missing from {KAFKA_BROKER_JARS}: run bin/setup first"
        )
