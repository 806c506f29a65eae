"""The session's one local stack as the README's main command brings it up: `streamops up` (a real
subprocess) with its own run dir, ports and catalog (the project catalog, topics under a prefix of
their own): a single Kafka broker and Airflow on SQLite with the LocalExecutor. Started once for the
tests of the main command and of the operator's path in a browser; `streamops down` after the last
of them (conftest: `stop_after_last_user`), which checks that everything stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from streamops.app_runtime import AppRuntime
from streamops.catalog import Catalog, load_catalog
from tests.support.ports import free_port, free_port_pair
from tests.support.webhook import WebhookReceiver

STREAMOPS = str(Path(sys.executable).parent / "streamops")


@dataclass
class LocalStack:
    env: dict[str, str]  # the environment of `streamops` commands for this stack
    run_dir: Path
    catalog: Catalog
    up: subprocess.CompletedProcess  # the first `streamops up`, as it printed
    base: str  # the Airflow UI's address
    webhook: WebhookReceiver  # on-call's webhook, as `up` was told it (STREAMOPS_NOTIFY_WEBHOOK_FILE)

    def password(self, user: str = "admin") -> str:
        """A user's password, as `streamops airflow password` prints it (one user per role)."""
        printed = self.streamops("airflow", "password", user, timeout=60)
        assert printed.returncode == 0, printed.stderr
        return printed.stdout.strip()

    @property
    def kafka_port(self) -> int:
        return int(self.env["STREAMOPS_KAFKA_PORT"])

    @property
    def history_url(self) -> str:
        return f"http://127.0.0.1:{self.env['STREAMOPS_SPARK_HISTORY_PORT']}"

    @property
    def airflow_port(self) -> int:
        return int(self.env["STREAMOPS_AIRFLOW_PORT"])

    def streamops(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([STREAMOPS, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def runtime(self, app: str) -> AppRuntime:
        return AppRuntime(self.run_dir / "checkpoints" / app)

    def api(self, user: str = "admin"):
        from streamops.local_stack.airflow_api import AirflowApi

        return AirflowApi(self.base, user, self.password(user))


def start_local_stack(work: Path, prefix: str) -> LocalStack:
    catalog = load_catalog().with_topic_prefix(prefix)
    catalog_file = work / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    run_dir = work / "run"
    webhook = WebhookReceiver()
    webhook_file = work / "on-call-webhook"
    webhook_file.write_text(webhook.url + "\n")
    webhook_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "STREAMOPS_")) or k == "STREAMOPS_KAFKA_JVM_OPTIONS"}
    env.update(STREAMOPS_RUN_DIR=str(run_dir), STREAMOPS_KAFKA_PORT=str(free_port_pair()),
               STREAMOPS_AIRFLOW_PORT=str(free_port()), STREAMOPS_SPARK_HISTORY_PORT=str(free_port()),
               STREAMOPS_CATALOG=str(catalog_file),
               STREAMOPS_CHECKPOINT_ROOT=str(run_dir / "checkpoints"), STREAMOPS_NOTIFY_WEBHOOK_FILE=str(webhook_file),
               # The supervisor runs when a driver ends (its event-driven restart is under test), never
               # on a timer in between (a timed run must not race a test's own steps); no timed
               # snapshots either (tests count an app's snapshots).
               STREAMOPS_SUPERVISOR="events", STREAMOPS_SNAPSHOTS="manual")
    try:
        up = subprocess.run([STREAMOPS, "up"], env=env, capture_output=True, text=True, timeout=900)
    except BaseException:
        subprocess.run([STREAMOPS, "down"], env=env, capture_output=True, text=True, timeout=300)
        raise
    login = re.search(rf"Airflow UI: http://127.0.0.1:{env['STREAMOPS_AIRFLOW_PORT']}  one user per role", up.stdout)
    stack = LocalStack(env, run_dir, catalog, up, f"http://127.0.0.1:{env['STREAMOPS_AIRFLOW_PORT']}", webhook)
    if up.returncode != 0 or login is None:
        stop_local_stack(stack, check=False)
        raise AssertionError(f"`streamops up` failed (exit {up.returncode}):\n{up.stdout[-4000:]}\n{up.stderr[-4000:]}")
    return stack


def stop_local_stack(stack: LocalStack, check: bool = True) -> None:
    """`streamops down`, then kill the drivers left running; with `check`, raise unless it stopped
    the broker and Airflow and `status` says so. (In that order: a driver killed while Airflow runs
    is a driver exit, and the supervisor would start it again.)"""
    try:
        down = stack.streamops("down", timeout=300)
    finally:
        stack.webhook.close()
        for name in stack.catalog.app_names():  # never leave a driver behind
            runtime = stack.runtime(name)
            if runtime.is_running():
                os.kill(runtime.driver().pid, signal.SIGKILL)
    if not check:
        return
    after = stack.streamops("status")
    problems = []
    if down.returncode != 0 or "Kafka broker stopped" not in down.stdout or "Airflow api-server stopped" not in down.stdout \
            or "Spark History Server stopped" not in down.stdout:
        problems.append(f"`streamops down` (exit {down.returncode}) said:\n{down.stdout}\n{down.stderr[-2000:]}")
    if "Kafka broker: stopped" not in after.stdout or "Airflow: stopped" not in after.stdout \
            or "Spark History Server: stopped" not in after.stdout:
        problems.append(f"`streamops status` after `down` said:\n{after.stdout}")
    if problems:
        raise AssertionError("\n".join(problems))
