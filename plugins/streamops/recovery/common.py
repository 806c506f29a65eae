"""What the recoveries share: refusals, parameter checks, and the questions every plan asks (does
the app keep state, is it running). The checkpoint's files are read through streamops.checkpoints."""

from __future__ import annotations

import string

from streamops.app_runtime import AppRuntime, DriverRecord, shown
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import has_state
from streamops.refusals import Refused


class RecoveryRefused(Refused):
    """A recovery refused before anything was changed; the message lists every problem."""


# Names that reach file paths and command lines (apps, topics, snapshots) are plain tokens.
_NAME_CHARS = set(string.ascii_letters + string.digits + "._-+")


def name_problem(value: object, what: str) -> str | None:
    """Why `value` cannot be a name (None: it can). Refuses paths and shell metacharacters, so a
    parameter can never climb out of the checkpoint folder or smuggle a command."""
    if not isinstance(value, str) or not value:
        return f"{what} must be a non-empty name, got {value!r}"
    if "/" in value or "\\" in value or value.startswith(".") or ".." in value:
        return f"{what} {value!r} looks like a path; give the name only (no '/', '\\\\' or '..')"
    bad = sorted(set(value) - _NAME_CHARS)
    if bad:
        shown = " ".join(repr(c) for c in bad)
        return f"{what} {value!r} contains {shown}: shell metacharacters and spaces are not allowed in names"
    return None


def resolve_app(catalog: Catalog, name: object, problems: list[str]) -> AppSpec | None:
    """The catalog app called `name`, or None with the problem appended."""
    problem = name_problem(name, "app")
    if problem is None and name not in catalog.app_names():
        problem = f"app {name!r} is not in the catalog; choose from: {', '.join(catalog.app_names()) or '(none)'}"
    if problem:
        problems.append(problem)
        return None
    return catalog.app(str(name))


def keeps_state(app: AppSpec) -> bool:
    """Does the app keep state a new checkpoint would lose? (state folders, or declared state)"""
    checkpoint = app.checkpoint_location()
    if has_state(checkpoint):
        return True
    declared = (AppRuntime(checkpoint).driver() or DriverRecord()).stateful_operators
    return any(declared.values())


def refuse_if_running(app: AppSpec, what: str, problems: list[str]) -> None:
    runtime = AppRuntime(app.checkpoint_location())
    if runtime.is_running():
        driver = runtime.driver() or DriverRecord()
        problems.append(
            f"{app.name} is running (driver pid {shown(driver.pid)} on {shown(driver.host)}, version "
            f"{shown(driver.version)}, started {shown(driver.started_at)}); {what} needs it stopped: "
            "stop it with the stop_apps DAG first"
        )
