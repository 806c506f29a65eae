"""What the recoveries share: refusals, parameter checks, and the checkpoint as it stands."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

from streamops.app_runtime import AppRuntime, DriverRecord, shown
from streamops.app_status import committed_offsets
from streamops.catalog import AppSpec, Catalog


class RecoveryRefused(ValueError):
    """Refused before anything was changed; the message lists every problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(["refused before anything was changed:", *(f"  - {p}" for p in problems)]))


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


def query_dirs(checkpoint: str | Path) -> list[Path]:
    root = Path(checkpoint)
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_") and (p / "offsets").exists())


def last_batch_id(query_dir: Path) -> int | None:
    commits = [int(p.name) for p in (query_dir / "commits").glob("[0-9]*") if p.name.isdigit()]
    return max(commits) if commits else None


@dataclass
class QueryPosition:
    query: str
    batch: int | None  # last committed micro-batch (None: none yet)
    offsets: dict[str, dict[int, int]]  # topic -> partition -> next offset to read


def positions(checkpoint: str | Path) -> dict[str, QueryPosition]:
    """Per query of the checkpoint: its last committed batch and the offsets it will read next."""
    return {
        d.name: QueryPosition(d.name, last_batch_id(d), committed_offsets(d) or {})
        for d in query_dirs(checkpoint)
    }


def batch_marks(checkpoint: str | Path) -> dict[str, int | None]:
    """query -> last committed batch: compared between plan and apply to catch a moved checkpoint."""
    return {name: pos.batch for name, pos in positions(checkpoint).items()}


def keeps_state(app: AppSpec) -> bool:
    """Does the app keep state a new checkpoint would lose? (state folders, or a stateful plan)"""
    checkpoint = app.checkpoint_location()
    if any((d / "state").exists() for d in query_dirs(checkpoint)):
        return True
    fingerprint = (AppRuntime(checkpoint).driver() or DriverRecord()).plan_fingerprint
    return any(fingerprint.values())


def refuse_if_running(app: AppSpec, what: str, problems: list[str]) -> None:
    runtime = AppRuntime(app.checkpoint_location())
    if runtime.is_running():
        driver = runtime.driver() or DriverRecord()
        problems.append(
            f"{app.name} is running (driver pid {shown(driver.pid)} on {shown(driver.host)}, version "
            f"{shown(driver.version)}, started {shown(driver.started_at)}); {what} needs it stopped: "
            "stop it with the stop_apps DAG first"
        )
