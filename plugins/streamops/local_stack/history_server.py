"""The Spark History Server of the local stack and the cluster profile (`streamops up` starts it,
`streamops down` stops it), reading every driver's event log (streamops.spark_history), started
from the pip-installed Spark (`spark-class org.apache.spark.deploy.history.HistoryServer`).

    server = SparkHistoryServer.from_env()
    server.start()          # waits until its REST API answers
    server.url              # http://127.0.0.1:18180
    server.stop()
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from streamops.local_stack.process import AlreadyRunning, ServiceProcess
from streamops.paths import RUN_DIR
from streamops.spark_history import HISTORY_FILES_KEPT, HISTORY_MAX_AGE, event_log_dir, event_log_uri, history_port
from streamops.spark_submit import spark_env

ADDRESS = "127.0.0.1"


@dataclass
class SparkHistoryServer:
    state_dir: Path = RUN_DIR / "spark-history"
    port: int = field(default_factory=history_port)
    log_dir: str = field(default_factory=event_log_uri)  # a file: or remote URI
    daemon_memory: str = "384m"
    # New and growing logs show within this; a shorter scan re-reads every running driver's
    # growing log that often, which costs a small host a core (a test's short-lived server: less).
    update_interval: str = "30s"

    @classmethod
    def from_env(cls) -> SparkHistoryServer:
        """$STREAMOPS_SPARK_HISTORY_PORT (default 18180), the drivers' event log folder."""
        return cls()

    def __post_init__(self) -> None:
        self.process = ServiceProcess("Spark History Server", self.state_dir / "history.pid", self.state_dir / "history.log")

    @property
    def url(self) -> str:
        return f"http://{ADDRESS}:{self.port}"

    def start(self, timeout: float = 120.0) -> str:
        if self.process.pid() is not None:
            raise AlreadyRunning(f"the Spark History Server is already running at {self.url} (pid {self.process.pid()})")
        local = event_log_dir()
        if local is not None and self.log_dir == event_log_uri():
            local.mkdir(parents=True, exist_ok=True)
        spark_home = Path(spark_env()["SPARK_HOME"])
        self.process.spawn([str(spark_home / "bin" / "spark-class"), "org.apache.spark.deploy.history.HistoryServer"],
                           env=self._env(), cwd=self.state_dir)
        self.process.await_ready(self._answers, timeout, f"the Spark History Server at {self.url} to answer")
        return f"Spark History Server up at {self.url}, reading {self.log_dir}"

    def stop(self) -> str:
        return self.process.stop(timeout=30)

    def status(self) -> str:
        pid = self.process.pid()
        if pid is None:
            return f"Spark History Server: stopped (would be {self.url})"
        return f"Spark History Server at {self.url}: {'answering' if self._answers() else 'NOT answering'} (pid {pid})"

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/api/v1/applications", params={"limit": 1}, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPARK_"))}
        options = {
            "spark.history.fs.logDirectory": self.log_dir,
            "spark.history.ui.port": str(self.port),
            "spark.port.maxRetries": "0",  # on its port or not at all: the links name it
            "spark.history.fs.update.interval": self.update_interval,
            "spark.history.fs.cleaner.enabled": "true",
            "spark.history.fs.cleaner.maxAge": HISTORY_MAX_AGE,
            "spark.history.fs.eventLog.rolling.maxFilesToRetain": str(HISTORY_FILES_KEPT),
            "spark.history.store.path": str(self.state_dir / "store"),
        }
        return {**env, **spark_env(), "SPARK_LOCAL_IP": ADDRESS, "SPARK_DAEMON_MEMORY": self.daemon_memory,
                "SPARK_HISTORY_OPTS": " ".join(f"-D{k}={v}" for k, v in options.items())}
