"""Reconciling what runs with what the catalog declares (the reconcile_desired_state DAG).

For every app whose drift (streamops.effective_spec.drift) the catalog caused, the plan says the
change that brings it in line, or why it cannot be made by a roll:

    roll      a rolling restart (warm standby, plan check, health gate, rollback) onto the
              catalog's values; approved changes the catalog does not say yet (a cutover's topics,
              a roll's version or conf) are kept: reconcile never undoes them on its own
    refuse    not a roll: another Kafka cluster, other input topics, or a stateful plan the new
              values change (a reprocess or a rebuild instead, named)
    decide    only approved changes differ: commit them to the catalog (the edit is shown), or
              undo them deliberately; nothing is planned
    none      in sync, stopped (its next start runs the catalog), or never started here

An app's catalog `reconcile` policy says what happens to its roll: report (shown only), approve
(applied after an approval), auto (applied without one, audited). A run an operator starts by
hand treats `report` like `approve`: they asked. No Airflow here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tabulate import tabulate

from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.catalog import Catalog
from streamops.checkpoints import has_state
from streamops.effective_spec import Drift, drift
from streamops.plans import JsonPlan
from streamops.runtime_files import read_json_object, write_json_atomic
from streamops.runtime_records import FailedRoll, RuntimeRecordError
from streamops.timestamps import now_iso

log = logging.getLogger("streamops.desired_state")

ROLL, REFUSE, DECIDE, NONE = "roll", "refuse", "decide", "none"
# In the app's runtime folder: the catalog entry (its declared spec's digest) a reconcile roll failed
# to bring in (health gate failed, rolled back). That entry is not rolled again until it changes.
FAILED_ROLL_FILE = "reconcile-failed.json"
REBUILD_OR_REPROCESS = ("reprocess it (the reprocess DAG with cutover: the new version's output from the earliest offsets, "
                        "then the live app moves onto it) or rebuild its state (recover_rebuild_state)")


@dataclass
class SyncItem:
    app: str
    policy: str  # the catalog's report | approve | auto, as this run applies it
    action: str  # roll | refuse | decide | none
    reason: str
    fields: list[dict[str, Any]] = field(default_factory=list)  # DriftField.to_dict of the drifted fields
    version: str | None = None  # what the roll starts (an approved version is kept)
    spark_conf: dict[str, str] = field(default_factory=dict)  # the launch's approved overrides, kept
    catalog_edit: str = ""
    running_digest: str | None = None
    declared_digest: str | None = None  # the catalog entry's spec, as planned (a failed roll names it)

    @property
    def applied(self) -> bool:
        """Rolled by this run (with or without an approval)."""
        return self.action == ROLL and self.policy in ("approve", "auto")


@dataclass
class SyncPlan(JsonPlan):
    """The reconcile plan of one run: one item per app."""

    items: list[SyncItem]
    planned_at: str
    on_demand: bool = False
    DERIVED: ClassVar = ("summary", "table", "approval_not_needed")

    def rolls(self, policy: str) -> list[SyncItem]:
        return [i for i in self.items if i.applied and i.policy == policy]

    @property
    def approval_not_needed(self) -> str | None:
        """Why this plan's approval step is skipped (nothing in it waits for one), else None."""
        if self.rolls("approve"):
            return None
        auto = [i.app for i in self.rolls("auto")]
        return ("Nothing in this plan needs an approval: " + (f"{', '.join(auto)} roll(s) without one (policy auto)"
                                                               if auto else "no roll is planned") + ".")

    @property
    def summary(self) -> str:
        counts = {action: [i.app for i in self.items if i.action == action] for action in (ROLL, REFUSE, DECIDE)}
        parts = [f"{action}: {', '.join(apps)}" for action, apps in counts.items() if apps]
        return "reconcile plan: " + ("; ".join(parts) if parts else "every app runs what the catalog says (or is not running)")

    @property
    def table(self) -> str:
        rows = [[i.app, i.policy, i.action, "; ".join(_field_line(f) for f in i.fields) or "-", i.reason] for i in self.items]
        return tabulate(rows, headers=["app", "policy", "action", "drift (catalog -> running)", "why"], tablefmt="simple")


def _field_line(item: dict[str, Any]) -> str:
    return f"{item['field']}: {item['declared']} -> {item['running']} ({item['cause']})"


def plan_sync(catalog: Catalog, names: list[str], *, principal_of: Callable[[str], str | None],
              kafka_cluster: str | None, state_check_of: Callable[[str, str, dict[str, str]], list[str] | None],
              on_demand: bool) -> SyncPlan:
    """The plan for `names`. `state_check_of(app, version, spark_conf)`: why the roll's new driver
    cannot restart from the app's checkpoint, as Spark judges it on a copy ([]: it can; None: it
    could not be judged), asked for stateful apps only."""
    items = [_item(catalog, name, principal_of(name), kafka_cluster, state_check_of, on_demand) for name in names]
    return SyncPlan(items=items, planned_at=now_iso(), on_demand=on_demand)


def _item(catalog: Catalog, name: str, principal: str | None, kafka_cluster: str | None,
          state_check_of: Callable[[str, str, dict[str, str]], list[str] | None], on_demand: bool) -> SyncItem:
    app = catalog.app(name)
    policy = "approve" if on_demand and app.reconcile == "report" else app.reconcile
    runtime = AppRuntime(app.checkpoint_location())
    found: Drift = drift(catalog, name, runtime, principal=principal, kafka_cluster=kafka_cluster)
    item = SyncItem(name, policy, NONE, "", [f.to_dict() for f in found.fields], catalog_edit=found.catalog_edit,
                    running_digest=found.running_digest, declared_digest=found.declared_digest)
    if found.state != "drifted":
        item.reason = found.state + (f": {found.evidence}" if found.evidence else "")
        return item
    if runtime.state() != "running":
        item.reason = f"{runtime.state()}: its next start (deploy_apps, recover_restart_app) runs what the catalog says"
        return item
    ours = [f for f in found.fields if f.cause == "catalog"]
    if not ours:
        item.action, item.reason = DECIDE, ("it runs approved changes the catalog does not say yet: commit them with the "
                                            "catalog edit shown, or undo them on purpose; reconcile never undoes them")
        return item
    heads = {f.field.split(".", 1)[0] for f in ours}
    if "kafka_cluster" in heads:
        item.action, item.reason = REFUSE, ("its checkpoint runs against another Kafka cluster than this environment's: give "
                                            "each environment a checkpoint root of its own, or " + REBUILD_OR_REPROCESS)
        return item
    if "inputs" in heads:
        item.action, item.reason = REFUSE, ("the catalog changes the topics it reads: its checkpoint's offsets belong to the "
                                            "old ones, so a roll cannot carry it over; " + REBUILD_OR_REPROCESS)
        return item
    failed = failed_roll(runtime)
    if failed and failed.declared_digest == found.declared_digest:
        item.action, item.reason = REFUSE, (
            f"the last reconcile roll onto this catalog entry failed (run {failed.run_id} at {failed.at}: "
            f"{str(failed.error)[:300]}) and was rolled back; it is not tried again until the entry changes: fix "
            "the entry, or roll it by hand (roll_restart_apps)")
        return item
    record = runtime.driver() or DriverRecord()
    # The version: the catalog's when the catalog changed it, else the one running (approved).
    item.version = catalog.app(name).version if "version" in heads else str(record.launched_version or app.version)
    item.spark_conf = dict(record.launched_spark_conf)
    # Stateful: its state must carry over to the new values, as Spark judges it before anything stops.
    if any(record.stateful_operators.values()) or has_state(app.checkpoint_location()):
        verdict = state_check_of(name, item.version, item.spark_conf)
        problems = verdict if verdict is not None else [
            "Spark's check of the new values against the checkpoint could not run (see the plan task's log)"]
        if problems:
            item.action = REFUSE
            item.reason = (f"a state-incompatible change ({'; '.join(problems)}): its state cannot carry over, so a roll "
                           f"would fail; {REBUILD_OR_REPROCESS}")
            return item
    item.action = ROLL
    kept = [f.field for f in found.fields if f.cause == "approved"]
    item.reason = (f"roll to the catalog's {', '.join(sorted(heads))} (version {item.version})"
                   + (f", keeping the approved {', '.join(kept)}" if kept else "")
                   + ("" if policy != "report" else "; policy report: shown only"))
    return item


def failed_roll(runtime: AppRuntime) -> FailedRoll | None:
    """The reconcile roll that failed for this app, if any (a file that is not a FailedRoll counts
    as none, with a warning naming it: the entry is tried again)."""
    path = runtime.dir / FAILED_ROLL_FILE
    value = read_json_object(path)
    try:
        return FailedRoll.from_file_value(value, str(path)) if value is not None else None
    except RuntimeRecordError as exc:
        log.warning("%s; taken as no failed roll", exc)
        return None


def record_roll_outcome(runtime: AppRuntime, item: SyncItem, run_id: str, error: str | None) -> None:
    """Remember a failed reconcile roll (so that entry is not rolled again on every run), or forget
    it once a roll succeeded."""
    if error is None:
        (runtime.dir / FAILED_ROLL_FILE).unlink(missing_ok=True)
        return
    runtime.dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(runtime.dir / FAILED_ROLL_FILE, FailedRoll(declared_digest=item.declared_digest, run_id=run_id,
                                                                 at=now_iso(), error=error[:2000]).to_json(), indent=1)

