"""The audit log: who changed what, through which DAG run, with which params, and the outcome.

One JSON line per step of every mutating DAG run (provision, deploy, stop, roll, reprocess and
cutover, the recovery DAGs' plan/apply/verify, the supervisor's restarts), refusals and failures
included, appended to $STREAMOPS_AUDIT_LOG or <checkpoint root>/_audit/audit.jsonl: the
checkpoint root is the filesystem the drivers and the DAGs already share, so every worker
writes the same log. Every line has the same fields: at, dag_id, run_id, user, app, step,
outcome, params, code, and summary (what changed) or error. `streamops audit` prints it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamops import settings
from streamops.app_runtime import AppRuntime
from streamops.catalog import CatalogError, checkpoint_root, load_catalog
from streamops.timestamps import now_iso

ERROR_CHARS = 2000
_ACTING: ContextVar[tuple[str, str] | None] = ContextVar("streamops_acting", default=None)


@contextmanager
def acting_as(user: str, run_id: str) -> Iterator[None]:
    """Who is acting, for the records the step writes beyond the audit line (an app's desired
    state names the user who asked for it)."""
    token = _ACTING.set((user, run_id))
    try:
        yield
    finally:
        _ACTING.reset(token)


def acting_user() -> str | None:
    acting = _ACTING.get()
    return acting[0] if acting else None


def audit_file() -> Path:
    return Path(settings.AUDIT_LOG.get() or checkpoint_root() / "_audit" / "audit.jsonl")


@dataclass
class AuditTrail:
    """The audit of one DAG run."""

    dag_id: str
    run_id: str
    user: str
    params: dict[str, Any] = field(default_factory=dict)

    def write(self, step: str, outcome: str, *, app: str | None = None, **details: Any) -> dict[str, Any]:
        app = app or self.params.get("app")
        if isinstance(details.get("error"), str) and len(details["error"]) > ERROR_CHARS:
            # A failure may quote a driver log's tail: the line keeps its start and its end (where the
            # outcome is said, e.g. "rolled back to ..."); the task log has it all.
            text = details["error"]
            details["error"] = (
                f"{text[:ERROR_CHARS // 2]} ... (cut; the whole text is in the task log) ... {text[-ERROR_CHARS // 2:]}"
            )
        entry = {
            "at": now_iso(), "dag_id": self.dag_id, "run_id": self.run_id, "user": self.user,
            "app": app, "step": step, "outcome": outcome, "params": self.params,
            "code": app_code(app), **details,
        }
        path = audit_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        # One write per line, O_APPEND: concurrent writers do not interleave within a line.
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry, sort_keys=True, default=str) + "\n")
        return entry


def app_code(app_name: Any) -> dict[str, Any] | None:
    """The version and code (artifact digest, or installed) the app's driver last ran: what the
    step acted on."""
    if not isinstance(app_name, str):
        return None

    try:
        record = AppRuntime(load_catalog().app(app_name).checkpoint_location()).driver()
    except (CatalogError, KeyError, OSError, ValueError):
        return None
    return {"version": record.version, **(record.code.to_json() if record.code else {})} if record is not None else None


def read_audit(app: str | None = None, run_id: str | None = None) -> list[dict[str, Any]]:
    """Every audited step, oldest first (the recovery DAGs' log of before it was shared,
    _audit/recovery.jsonl beside it, included)."""
    path = audit_file()
    legacy = path.with_name("recovery.jsonl")
    entries: list[dict[str, Any]] = []
    for log_file in ([legacy] if legacy != path else []) + [path]:
        if log_file.exists():
            entries += [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [e for e in entries if (app is None or e.get("app") == app) and (run_id is None or e.get("run_id") == run_id)]


def audit_table(entries: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    rows = [[e["at"], e["user"], e["dag_id"], e.get("app") or "-", e["step"], e["outcome"], _summary(e)] for e in entries]
    return str(tabulate(rows, headers=["at (UTC)", "user", "DAG", "app", "step", "outcome", "what"]))


def _summary(entry: dict[str, Any]) -> str:
    text = entry.get("summary") or entry.get("error") or ""
    # A refusal's problems, one line: the outcome column already says "refused".
    text = "; ".join(line.strip(" -") for line in text.splitlines() if line.strip() and not line.startswith("refused before"))
    return text if len(text) <= 100 else text[:97] + "..."
