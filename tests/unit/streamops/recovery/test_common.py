"""streamops.recovery.common: names that reach paths and command lines, the app a request names,
whether an app keeps state, and the running app a recovery refuses to touch."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from streamops.app_runtime import AppRuntime
from streamops.catalog import load_catalog
from streamops.recovery.common import keeps_state, name_problem, refuse_if_running, resolve_app

CATALOG = load_catalog(check_programs=False)


@pytest.mark.parametrize("value, problem", [
    ("20261125T010000-before-reset", None),
    ("v2+build.7", None),
    ("", "snapshot must be a non-empty name, got ''"),
    (None, "snapshot must be a non-empty name, got None"),
    ("../x", "snapshot '../x' looks like a path; give the name only (no '/', '\\\\' or '..')"),
    ("a/b", "snapshot 'a/b' looks like a path; give the name only (no '/', '\\\\' or '..')"),
    (".hidden", "snapshot '.hidden' looks like a path; give the name only (no '/', '\\\\' or '..')"),
    ("x;touch y", "snapshot 'x;touch y' contains ' ' ';': shell metacharacters and spaces are not allowed in names"),
    ("$(id)", "snapshot '$(id)' contains '$' '(' ')': shell metacharacters and spaces are not allowed in names"),
])
def test_a_name_is_a_plain_token_never_a_path_or_a_command(value, problem):
    assert name_problem(value, "snapshot") == problem


def test_the_app_a_request_names_is_a_catalog_app_or_a_problem():
    problems: list[str] = []
    assert resolve_app(CATALOG, "oplog-router", problems).name == "oplog-router" and problems == []
    assert resolve_app(CATALOG, "nope", problems) is None
    assert resolve_app(CATALOG, "../etc", problems) is None
    assert problems == [
        "app 'nope' is not in the catalog; choose from: oplog-router, presence-notifier, browser-activity",
        "app '../etc' looks like a path; give the name only (no '/', '\\\\' or '..')",
    ]


@pytest.fixture
def router(tmp_path):
    return CATALOG.app("oplog-router").model_copy(update={"checkpoint": str(tmp_path / "cp")})


def test_an_app_keeps_state_when_its_checkpoint_has_state_or_its_program_declares_it(router):
    checkpoint = Path(router.checkpoint_location())
    runtime = AppRuntime(str(checkpoint))
    runtime.dir.mkdir(parents=True)
    assert not keeps_state(router)
    runtime.driver_file.write_text(json.dumps({"stateful_operators": {"route": []}}))
    assert not keeps_state(router)  # stateless
    runtime.driver_file.write_text(json.dumps({"stateful_operators": {"route": ["groupBy(user_id).count"]}}))
    assert keeps_state(router)
    # A driver from before Spark's state check recorded its plan's stateful lines under the old name.
    runtime.driver_file.write_text(json.dumps({"plan_fingerprint": {"route": ["StateStoreSave"]}}))
    assert keeps_state(router)
    runtime.driver_file.unlink()
    (checkpoint / "route" / "offsets").mkdir(parents=True)
    assert not keeps_state(router)
    (checkpoint / "route" / "state" / "0").mkdir(parents=True)  # a state store, whatever the record says
    assert keeps_state(router)


def test_a_running_app_is_refused_naming_its_driver_and_what_to_do(router):
    problems: list[str] = []
    refuse_if_running(router, "a reset", problems)
    assert problems == []
    runtime = AppRuntime(router.checkpoint_location())
    runtime.acquire({"app": "oplog-router", "version": "1.0.3"})
    try:
        refuse_if_running(router, "a reset", problems)
    finally:
        runtime.release("stopped")
    (problem,) = problems
    assert problem.startswith(
        f"oplog-router is running (driver pid {os.getpid()} on {socket.gethostname()}, version 1.0.3, started ")
    assert problem.endswith("); a reset needs it stopped: stop it with the stop_apps DAG first")
    assert not runtime.is_running()
