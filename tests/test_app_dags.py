"""deploy_apps, app_status and stop_apps as real Airflow task runs, with a real detached driver."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamops.audit import read_audit
from streamops.loadgen import LoadSpec
from streamops.loadgen import run as run_load
from streamops.waiting import poll_until
from tests.support.artifacts import same_code_as


def test_deploy_status_refuse_and_stop_through_the_dags(run_dag, app_env, app_catalog, broker, capfd):
    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")

    same_code_as(spec, "1.0.1")
    deployed = run_dag("deploy_apps", catalog_file, apps=["oplog-router"], version="1.0.1")
    assert deployed.state == "success", deployed.task_states
    driver = runtime.driver()
    assert deployed.xcoms["launch"]["pid"] == driver.pid
    assert driver.version == "1.0.1" and driver.launched_by.startswith("manual__")
    assert runtime.state() == "running"  # the driver outlived the task
    (audited,) = read_audit(run_id=deployed.run_id)
    assert (audited["step"], audited["outcome"], audited["app"], audited["user"]) == (
        "deploy", "done", "oplog-router", "dag_test")
    assert audited["result"]["pid"] == driver.pid and audited["code"]["version"] == "1.0.1"
    assert runtime.desired().state == "running" and runtime.desired().run_id == deployed.run_id

    capfd.readouterr()
    again = run_dag("deploy_apps", catalog_file, apps=["oplog-router"])
    assert again.state == "failed"
    task_log = capfd.readouterr().out
    assert f"refused: oplog-router is already running: driver pid {driver.pid} on {driver.host}, version 1.0.1" in task_log
    assert runtime.driver().pid == driver.pid

    run_load(spec, LoadSpec(count=1000, keys=10, seed=9), broker.client_config)
    def caught_up() -> bool:
        lags = _status(spec, broker).lags  # empty until the first batch commits
        return bool(lags) and sum(p.end for p in lags) == 1000 and sum(p.lag for p in lags) == 0

    poll_until(caught_up, timeout=120, what="the router to catch up")
    status = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert status.state == "success"
    router = status.xcoms["status"]["oplog-router"]
    assert router["state"] == "running" and router["version"] == "1.0.1"
    assert router["total_lag"] == 0 and router["batches"]["route"] >= 1
    assert {(lag["topic"], lag["partition"]) for lag in router["lags"]} == {(spec.inputs["operations"], p) for p in range(6)}
    assert sum(lag["end"] for lag in router["lags"]) == 1000

    stopped = run_dag("stop_apps", catalog_file, apps=["oplog-router"], deadline_s=30)
    assert stopped.state == "success"
    assert stopped.xcoms["stop"].startswith(f"oplog-router stopped (pid {driver.pid}): stop requested by {stopped.run_id};")
    assert runtime.state() == "stopped"
    assert [(e["step"], e["outcome"], e["app"]) for e in read_audit(run_id=stopped.run_id)] == [("stop", "done", "oplog-router")]
    after = run_dag("app_status", catalog_file, apps=["oplog-router"])
    assert after.state == "success"  # stopped on purpose: nothing to page about, nothing restarted
    assert after.xcoms["status"]["oplog-router"]["state"] == "stopped"
    assert after.xcoms["status"]["oplog-router"]["health"]["state"] == "stopped"
    assert after.xcoms["status"]["oplog-router"]["health"]["evidence"].startswith(
        f"stopped on purpose by dag_test (run {stopped.run_id})")


def _status(spec, broker):
    from streamops.app_status import app_status

    return app_status(spec, broker.client_config)


def test_a_driver_that_loses_a_launch_race_shows_its_own_log(app_env, app_catalog, broker, monkeypatch):
    """Two deploys at once both pass launch()'s check; the driver that finds the lock taken exits,
    and the error shows that driver's own log (one file per start), not the winner's output."""
    from streamops import app_ops
    from streamops.app_runtime import AppRuntime
    from streamops.catalog import load_catalog
    from streamops.dag_tasks.launching import AppLauncher

    catalog_file, _ = app_env
    monkeypatch.setenv("STREAMOPS_CATALOG", str(catalog_file))
    spec = app_catalog.app("oplog-router")
    checkpoint = spec.checkpoint_location()
    checks: list[bool] = []

    class RacingRuntime(AppRuntime):
        def is_running(self) -> bool:  # the launch's own check ran just before the winner took the lock
            checks.append(True)
            return len(checks) > 1 and super().is_running()

    winner = AppRuntime(checkpoint)
    winner.acquire({"app": "oplog-router", "version": "9.9.9"})
    monkeypatch.setattr(app_ops, "AppRuntime", RacingRuntime)
    try:
        with pytest.raises(app_ops.LaunchError) as lost:
            command = AppLauncher.of(load_catalog(), "oplog-router", "manual__loser").command(None, {})
            app_ops.launch(spec, command, checkpoint=checkpoint, launched_by="manual__loser", version="1.0.0")
    finally:
        winner.release("stopped", "test")
    (log,) = (Path(checkpoint) / "_runtime" / "logs").glob("driver-*.log")
    message = str(lost.value)
    assert message.startswith(f"oplog-router: the driver exited with code 3 during start-up; last lines of {log}:")
    assert f"refused: oplog-router is already running: driver pid {os.getpid()}" in message
