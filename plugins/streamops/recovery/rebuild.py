"""Rebuild an app's state: the counterpart of Kafka Streams' `cleanUp()` plus a restart.

Two ways, both starting from a backup:
  * live: stop the app, back up and retire its checkpoint, start it on a new checkpoint from the
    earliest retained input. It reprocesses everything into the LIVE output topics (downstream
    readers see those records again; each carries its event id) and goes on live by itself.
  * versioned: reprocess from earliest into new `<topic>.<version>` topics while the live app
    keeps running, validate them, then cut over (the reprocess DAG's code): the old checkpoint
    is kept as a snapshot and the old topics stay untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient
from tabulate import tabulate

from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import backup_checkpoint, batch_marks, query_dirs, retire_queries
from streamops.kafka_offsets import topic_partitions, watermarks
from streamops.plans import JsonPlan
from streamops.recovery.common import RecoveryRefused, keeps_state, resolve_app

TARGETS = ("live", "versioned")


@dataclass
class RebuildPlan(JsonPlan):
    DERIVED = ("records",)

    app: str
    target: str
    running: bool
    stateful: bool
    batches: dict[str, int | None]
    inputs: list[dict]  # topic, partition, earliest, latest
    outputs: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(i["latest"] - i["earliest"] for i in self.inputs)

    def table(self) -> str:
        head = tabulate(
            [[i["topic"], i["partition"], i["earliest"], i["latest"], i["latest"] - i["earliest"]] for i in self.inputs],
            headers=["input topic", "partition", "earliest", "latest", "records"],
        )
        if self.target == "live":
            steps = (("stop the running app gracefully, " if self.running else "")
                     + "back up and retire the checkpoint (batches " + str(self.batches or "none") + "), start the app on a new "
                     f"checkpoint from earliest: {self.records} record(s) reprocessed into the LIVE topics "
                     f"{', '.join(self.outputs)}, then it continues live")
        else:
            steps = (f"reprocess {self.records} record(s) from earliest into {', '.join(self.outputs)} while the live app runs, "
                     "validate them, then cut over (the old checkpoint is kept as a snapshot, the old topics untouched)")
        return "\n".join([head, f"will: {steps}"] + [f"NOTE: {n}" for n in self.notes])

    def summary(self) -> str:
        return f"{self.target}: {self.records} record(s) from earliest"


def plan_rebuild(admin: AdminClient, catalog: Catalog, app_name: str, target: str, version: str = "v2") -> RebuildPlan:
    problems: list[str] = []
    app = resolve_app(catalog, app_name, problems)
    if target not in TARGETS:
        problems.append(f"target {target!r} must be one of: {', '.join(TARGETS)}")
    if app is None or problems:
        raise RecoveryRefused(problems)
    read_back = [app.outputs[role] for role in app.reads_outputs]
    if target == "live" and read_back:
        raise RecoveryRefused([
            f"{app.name} reads its own output {', '.join(read_back)}: rebuilt into the live topics it would read the old "
            "and the new copies of those records and count them twice; use target 'versioned'"
        ])
    inputs = sorted(set(app.inputs.values()))
    layout = topic_partitions(admin, inputs)
    missing = [t for t, parts in layout.items() if parts is None]
    if missing:
        raise RecoveryRefused([f"input topic {t!r} does not exist on the broker" for t in missing])
    rows = [{"topic": t, "partition": p, "earliest": lo, "latest": hi}
            for t in inputs for p, (lo, hi) in watermarks(admin, t, layout[t] or []).items()]
    outputs = [*app.outputs.values(), app.dead_letter_topic]
    notes = []
    if target == "live":
        notes.append("downstream readers of the live topics see every rebuilt record again (de-duplicate by event id)")
    else:
        outputs = [f"{t}.{version}" for t in outputs]
    if not query_dirs(app.checkpoint_location()):
        notes.append("the app has no checkpoint yet: there is no state to rebuild, only a first start from earliest")
    return RebuildPlan(app.name, target, AppRuntime(app.checkpoint_location()).is_running(), keeps_state(app),
                       batch_marks(app.checkpoint_location()), rows, outputs, notes)


def apply_rebuild_live(app: AppSpec, plan: RebuildPlan, start, stop_app) -> dict:
    """Stop, back up and retire the checkpoint, start on a new one from earliest."""
    checkpoint = app.checkpoint_location()
    stopped = stop_app() if AppRuntime(checkpoint).is_running() else None
    backup = str(backup_checkpoint(checkpoint, "before-rebuild")) if query_dirs(checkpoint) else None
    retire_queries(checkpoint)
    started = start("earliest")
    return {"stopped": stopped, "backup": backup, "pid": started.pid, "driver_log": started.driver_log,
            "summary": f"{app.name} rebuilding from earliest as pid {started.pid}; old checkpoint backed up to {backup}"}
