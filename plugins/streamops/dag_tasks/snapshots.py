"""The snapshot_checkpoints DAG's step: each app's snapshot policy applied (streamops.snapshots),
one app at a time; one app's failure does not keep the others from their turn."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from airflow.exceptions import AirflowFailException

from streamops import settings
from streamops.audit import acting_as
from streamops.catalog import load_catalog
from streamops.dag_tasks import trail
from streamops.dag_tasks.apps import selected
from streamops.snapshots import apply_policy

log = logging.getLogger(__name__)

# How often the policies are looked at: a policy's "every" is met to within this.
CHECK_EVERY = timedelta(minutes=10)
SNAPSHOT_MODES = ("scheduled", "manual")


def snapshot_schedule() -> timedelta | None:
    """$STREAMOPS_SNAPSHOTS: scheduled (every CHECK_EVERY), or manual (only when triggered)."""
    mode = (settings.SNAPSHOTS.get() or "scheduled").lower()
    if mode not in SNAPSHOT_MODES:
        raise ValueError(f"STREAMOPS_SNAPSHOTS={mode!r}: use one of {', '.join(SNAPSHOT_MODES)}")
    return CHECK_EVERY if mode == "scheduled" else None


def apply_policies(context: Mapping[str, Any], names: Sequence[str] | None, dry_run: bool) -> dict[str, Any]:
    """Every chosen app's policy (all apps that have one when none are chosen). What changed (a
    snapshot taken, snapshots removed) and every failure go to the audit log; a run that changed
    nothing for an app (most runs: nothing due) is in the task log only, not 144 lines a day."""
    catalog = load_catalog(check_programs=False)  # copying files never runs an app's code
    chosen = selected(catalog, names) if names else [a.name for a in catalog.apps if a.snapshots is not None]
    if not chosen:
        log.info("no app of the catalog has a snapshot policy ('snapshots:' in its entry): nothing to do")
    audit = trail(context)
    runs: list[dict[str, Any]] = []
    failed: list[str] = []
    for name in chosen:
        try:
            with acting_as(audit.user, audit.run_id):
                run = apply_policy(catalog.app(name), dry_run=dry_run)
        except Exception as exc:  # the next apps still get their turn; this one fails the run
            log.exception("%s: its snapshot policy could not be applied", name)
            audit.write("snapshot", "failed", app=name, error=f"{type(exc).__name__}: {exc}")
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        result = {**asdict(run), "summary": run.summary()}
        if run.taken or (run.removed and not dry_run):
            audit.write("snapshot", "done", app=name, summary=result["summary"], result=result,
                        snapshots_taken=[run.taken] if run.taken else [])
        runs.append(result)
    if failed:
        raise AirflowFailException("the snapshot policy failed for " + "; ".join(failed))
    return {"apps": runs, "summary": "; ".join(r["summary"] for r in runs) or "no app has a snapshot policy"}
