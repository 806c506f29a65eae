"""A Spark standalone cluster on this machine: one master and two workers, each on a loopback
address of its own (a "host": Linux routes all of 127.0.0.0/8 to `lo`, nothing outside the
machine is addressed), started from the pip-installed Spark the project pins
(`spark-class org.apache.spark.deploy.master.Master` / `...worker.Worker`).

Executors get the Kafka connector from the workers' own disk (`spark.executor.extraClassPath`,
the jars bin/setup resolved), as a real cluster would have it installed on every worker.

    cluster = SparkStandalone(state_dir)
    cluster.start()              # master, then both workers; waits until the master lists them ALIVE
    cluster.master_url           # spark://127.0.0.21:17077 for spark-submit --master / spark_default
    cluster.workers()            # what the master says about each worker
    cluster.kill_worker(2)       # kill -9, as a lost machine; start_worker(2) brings it back
    cluster.stop()
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from streamops import settings
from streamops.local_stack.process import AlreadyRunning, ServiceError, ServiceProcess, log_tail, ports_from_env
from streamops.paths import RUN_DIR
from streamops.spark_submit import spark_env
from streamops.toolchain import driver_jars
from streamops.waiting import DeadlineExceeded, poll_until

MASTER_ADDRESS = "127.0.0.21"
WORKER_ADDRESSES = {1: "127.0.0.22", 2: "127.0.0.23"}
DEFAULT_MASTER_PORT = 17077
DEFAULT_MASTER_UI_PORT = 18080
DEFAULT_WORKER_PORT = 17078
DEFAULT_WORKER_UI_PORT = 18081


class SparkClusterError(ServiceError):
    """The standalone cluster (or one of its processes) is not in the state asked for; says which and why."""


@dataclass
class SparkStandalone:
    state_dir: Path = RUN_DIR / "spark-standalone"
    master_port: int = DEFAULT_MASTER_PORT
    master_ui_port: int = DEFAULT_MASTER_UI_PORT
    worker_port: int = DEFAULT_WORKER_PORT
    worker_ui_port: int = DEFAULT_WORKER_UI_PORT
    worker_cores: int = 1
    worker_memory: str = "1g"
    # The daemons' own heap (not the executors'): they only schedule.
    daemon_memory: str = "256m"
    master_address: str = MASTER_ADDRESS
    worker_addresses: dict[int, str] = field(default_factory=lambda: dict(WORKER_ADDRESSES))

    @classmethod
    def from_env(cls) -> SparkStandalone:
        """The cluster the CLI manages: $STREAMOPS_SPARK_DIR (default <run dir>/spark-standalone) and
        $STREAMOPS_SPARK_PORTS ("master,master-ui,worker,worker-ui", default 17077,18080,17078,18081)."""
        numbers = ports_from_env(settings.SPARK_PORTS, ("master_port", "master_ui_port", "worker_port", "worker_ui_port"),
                                 SparkClusterError)
        return cls(state_dir=Path(settings.SPARK_DIR.get() or RUN_DIR / "spark-standalone"), **numbers)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        addresses = [self.master_address, *self.worker_addresses.values()]
        for address in addresses:
            try:
                loopback = ipaddress.ip_address(address).is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                raise SparkClusterError(f"{address!r}: every host of the local Spark cluster is a 127.x.y.z address")
        if len(set(addresses)) != len(addresses):
            raise SparkClusterError(f"the master and each worker need their own address, got {addresses}")
        self.master = ServiceProcess(f"Spark master ({self.master_address})", self.state_dir / "master" / "master.pid",
                                     self.state_dir / "master" / "master.log")
        self.worker_processes = {
            n: ServiceProcess(
                f"Spark worker {n} ({address})", self.worker_dir(n) / "worker.pid", self.worker_dir(n) / "worker.log"
            )
            for n, address in self.worker_addresses.items()
        }

    # --- where things are -----------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://{self.master_address}:{self.master_port}"

    @property
    def master_ui(self) -> str:
        return f"http://{self.master_address}:{self.master_ui_port}"

    def worker_dir(self, worker: int) -> Path:
        return self.state_dir / f"worker-{worker}"

    def app_conf(self, cores: int = 1) -> dict[str, str]:
        """Spark conf for an app on this small cluster (two 1-core workers): the connector from each
        worker's disk, one-core executors of 512 MiB, and at most `cores` of the two cores, so
        a second app still gets an executor (without a cap the first app takes every core and
        the next one waits for executors forever)."""
        return {
            "spark.executor.extraClassPath": os.pathsep.join(str(jar) for jar in driver_jars()),
            "spark.executor.cores": "1",
            "spark.executor.memory": "512m",
            "spark.cores.max": str(cores),
        }

    def write_client_conf(self, cores: int = 1) -> Path:
        """A SPARK_CONF_DIR for spark-submit on the hosts that launch apps (the Airflow workers):
        spark-defaults.conf with `app_conf(cores)`, so every app launched through spark_default
        gets executors this cluster can give, with no per-app setting. The master itself comes
        from spark_default; an app's catalog spark_conf still wins (it is passed with --conf)."""
        conf_dir = self.state_dir / "client-conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{key} {value}" for key, value in sorted(self.app_conf(cores).items())]
        (conf_dir / "spark-defaults.conf").write_text("# written by streamops for the standalone cluster at "
                                                       f"{self.master_url}\n" + "\n".join(lines) + "\n")
        return conf_dir

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> str:
        running = {name: pid for name, pid in self._pids().items() if pid is not None}
        if len(running) == 1 + len(self.worker_addresses):
            raise AlreadyRunning(f"the Spark standalone cluster is already running at {self.master_url} "
                                 f"({', '.join(f'{k} pid {v}' for k, v in running.items())}); UI {self.master_ui}")
        try:
            return self._start(timeout)
        except BaseException:
            # Nothing half-started outlives a failed start (each daemon is in a session of its own).
            for name, process in [("master", self.master), *((f"worker {n}", p) for n, p in self.worker_processes.items())]:
                if name not in running:
                    process.stop(timeout=30)
            raise

    def _start(self, timeout: float) -> str:
        if self.master.pid() is None:
            self._check_free(self.master_address, (self.master_port, self.master_ui_port), "master")
            self.master.spawn(self._daemon("org.apache.spark.deploy.master.Master", "--host", self.master_address,
                                           "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)),
                              env=self._env(self.master_address), cwd=self.master.pid_file.parent)
            try:
                poll_until(lambda: self.master.exited() or self._master_json() is not None, timeout=timeout,
                           what=f"the Spark master at {self.master_ui} to answer")
            except DeadlineExceeded:
                pass
            if self._master_json() is None:
                tail = log_tail(self.master.log_file, 30)
                raise SparkClusterError(f"the Spark master did not start at {self.master_url}; last lines of "
                                        f"{self.master.log_file}:\n{tail}")
        for worker in self.worker_addresses:
            if self.worker_processes[worker].pid() is None:
                self.start_worker(worker, timeout=timeout)
        return f"Spark standalone cluster up at {self.master_url}: {self.describe_workers()}; UI {self.master_ui}"

    def start_worker(self, worker: int, timeout: float = 120.0) -> str:
        address = self.worker_addresses[worker]
        process = self.worker_processes[worker]
        self._check_free(address, (self.worker_port, self.worker_ui_port), f"worker {worker}")
        work_dir = self.worker_dir(worker) / "work"
        work_dir.mkdir(parents=True, exist_ok=True)
        process.spawn(self._daemon("org.apache.spark.deploy.worker.Worker", "--host", address,
                                   "--port", str(self.worker_port), "--webui-port", str(self.worker_ui_port),
                                   "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                                   "--work-dir", str(work_dir), self.master_url),
                      env=self._env(address), cwd=self.worker_dir(worker))
        try:
            poll_until(lambda: process.exited() or address in self.alive_worker_hosts(), timeout=timeout,
                       what=f"Spark worker {worker} ({address}) to register with the master")
        except DeadlineExceeded:
            pass
        if address not in self.alive_worker_hosts():
            tail = log_tail(process.log_file, 30)
            process.stop(timeout=30)
            raise SparkClusterError(f"Spark worker {worker} ({address}) did not register with {self.master_url}; "
                                    f"last lines of {process.log_file}:\n{tail}")
        return f"Spark worker {worker} ({address}) registered"

    def kill_worker(self, worker: int) -> str:
        """kill -9 of the worker and the executors it launched (a lost machine)."""
        pid = self.worker_processes[worker].pid()
        if pid is None:
            raise SparkClusterError(f"Spark worker {worker} is not running")
        os.killpg(pid, signal.SIGKILL)  # executors are children in the worker's process group
        poll_until(self.worker_processes[worker].exited, timeout=30, what=f"Spark worker {worker} (pid {pid}) to die")
        return f"Spark worker {worker} ({self.worker_addresses[worker]}) killed (pid {pid})"

    def is_running(self) -> bool:
        return any(pid is not None for pid in self._pids().values())

    def stop(self) -> str:
        lines = [process.stop(timeout=30) for process in self.worker_processes.values()]
        lines.append(self.master.stop(timeout=30))
        return "\n".join(lines)

    def status(self) -> str:
        pids = self._pids()
        if not any(pids.values()):
            return f"Spark standalone cluster: stopped (would be {self.master_url})"
        state = self._master_json()
        health = f"master {state.get('status', '?')}, {self.describe_workers()}" if state else "master NOT answering"
        return (f"Spark standalone cluster at {self.master_url}: {health}; UI {self.master_ui}\n"
                + "\n".join(f"  {name}: {f'running (pid {pid})' if pid else 'stopped'}" for name, pid in pids.items()))

    # --- what the master says -----------------------------------------------------------------

    def workers(self) -> list[dict]:
        """The master's view of each worker: host, state (ALIVE, DEAD), cores, cores used."""
        state = self._master_json() or {}
        return [{"host": w.get("host"), "state": w.get("state"), "cores": w.get("cores"), "coresused": w.get("coresused")}
                for w in state.get("workers", [])]

    def alive_worker_hosts(self) -> set[str]:
        return {w["host"] for w in self.workers() if w["state"] == "ALIVE"}

    def describe_workers(self) -> str:
        alive = sorted(self.alive_worker_hosts())
        return f"{len(alive)}/{len(self.worker_addresses)} worker(s) alive ({', '.join(alive) or 'none'})"

    def applications(self) -> list[dict]:
        """Running applications as the master lists them: id, name, cores."""
        state = self._master_json() or {}
        return [{"id": a.get("id"), "name": a.get("name"), "cores": a.get("cores")} for a in state.get("activeapps", [])]

    # -----------------------------------------------------------------------------------------

    def _master_json(self) -> dict | None:
        try:
            response = httpx.get(f"{self.master_ui}/json/", timeout=5)
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def _pids(self) -> dict[str, int | None]:
        return {"master": self.master.pid(), **{f"worker {n}": p.pid() for n, p in self.worker_processes.items()}}

    def _daemon(self, main_class: str, *args: str) -> list[str]:
        return [str(Path(spark_env()["SPARK_HOME"]) / "bin" / "spark-class"), main_class, *args]

    def _env(self, address: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPARK_"))}
        # Executors inherit the worker's environment: SPARK_LOCAL_IP makes them bind the worker's
        # own address too. No port fallback (a daemon on port+1 would not be where master_url
        # says); workers delete the files of finished apps after a day.
        return {**env, **spark_env(), "SPARK_LOCAL_IP": address, "SPARK_DAEMON_MEMORY": self.daemon_memory,
                "SPARK_MASTER_OPTS": "-Dspark.port.maxRetries=0",
                "SPARK_WORKER_OPTS": "-Dspark.port.maxRetries=0 -Dspark.worker.cleanup.enabled=true "
                                     "-Dspark.worker.cleanup.appDataTtl=86400"}

    @staticmethod
    def _check_free(address: str, ports: tuple[int, ...], what: str) -> None:
        for port in ports:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((address, port))
                except OSError:
                    raise SparkClusterError(f"cannot start the Spark {what}: port {port} on {address} is in use by "
                                            "another process; choose other ports") from None


def free_spark_ports() -> dict[str, int]:
    """Master, master UI, worker and worker UI ports free now on every address (for tests)."""
    chosen: list[int] = []
    while len(chosen) < 4:
        with socket.socket() as probe:
            probe.bind((MASTER_ADDRESS, 0))
            port = probe.getsockname()[1]
        if port in chosen:
            continue
        free_everywhere = True
        for address in WORKER_ADDRESSES.values():
            with socket.socket() as probe:
                try:
                    probe.bind((address, port))
                except OSError:
                    free_everywhere = False
        if free_everywhere:
            chosen.append(port)
    return dict(zip(("master_port", "master_ui_port", "worker_port", "worker_ui_port"), chosen, strict=True))
