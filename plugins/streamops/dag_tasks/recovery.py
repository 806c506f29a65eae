"""The recovery DAGs as a table: each is a Procedure (plan -> approve -> apply -> verify, run by
streamops.dag_tasks.procedures), its steps below. The logic is in streamops.recovery.

The plan is logged as a table and handed on for approval; a dry run (the default) stops there.
Apply re-checks what the plan assumed, backs up, changes, and starts; verify waits for the
outcome. Refusals fail the task without retries, naming every problem; nothing was changed by then.
"""

from __future__ import annotations

import re
from typing import Any

from streamops.dag_tasks import reprocess as reprocessing
from streamops.dag_tasks.procedures import Procedure, Result, Step
from streamops.downstream import InputRange, PlanEffect
from streamops.recovery.common import RecoveryRefused
from streamops.recovery.extend import ExtendPlan, ExtendRequest, apply_extend, plan_extend, verify_extend
from streamops.recovery.lifecycle import await_resumed
from streamops.recovery.rebuild import RebuildPlan, apply_rebuild_live, plan_rebuild
from streamops.recovery.replay import ReplayPlan, ReplayRequest, apply_replay, plan_replay, verify_replay
from streamops.recovery.reset import ResetPlan, ResetRequest, apply_reset, plan_reset, verify_reset
from streamops.recovery.restart import RestartPlan, apply_restart, plan_restart
from streamops.recovery.restore import RestorePlan, apply_restore, plan_restore, verify_restore
from streamops.recovery.skip import SkipPlan, apply_skip, plan_skip, verify_skip
from streamops.reprocess import VERSION_SUFFIX_PATTERN
from streamops.snapshots import SnapshotGone, hold, release
from streamops.timestamps import run_tag, utc_now


def await_progress(step: Step, app_name: str, lag_before: int | None, caught_up: bool = False) -> Result:
    """Wait until the restarted app commits batches (and, with `caught_up`, has no lag left)."""
    result = await_resumed(step.catalog.app(app_name), step.kafka, lag_before, step.verify_deadline_s, caught_up=caught_up)
    result["summary"] = (f"{app_name} is making progress: batches {result['batches']}, lag {lag_before} -> "
                         f"{result['lag_after']} after {result['seconds']} s")
    return result


# --- restart ------------------------------------------------------------------------------------------


def _restart_plan(step: Step) -> RestartPlan:
    plan = plan_restart(step.catalog, step.params["app"], step.kafka)
    step.app(plan.app).trusted(plan.version, plan.spark_conf)  # what the apply starts, checked now
    return plan


def _restart_apply(step: Step, plan: RestartPlan) -> Result:
    app = step.app(plan.app)
    return apply_restart(app.app, plan, app.start_version())


RESTART = Procedure(
    name="restart plan", plan_type=RestartPlan, plan=_restart_plan, apply=_restart_apply,
    verify=lambda step, plan, _applied: await_progress(step, plan.app, plan.lag),
)


# --- reset ----------------------------------------------------------------------------------------------


def reset_request(params: Any) -> ResetRequest:
    return ResetRequest(
        app=params["app"], mode=params["mode"], to_datetime=params.get("to_datetime") or None,
        duration=params.get("duration") or None, shift=params.get("shift"), offsets=params.get("offsets") or None,
        partitions=list(params.get("partitions") or []),
    )


def _reset_plan(step: Step) -> ResetPlan:
    return plan_reset(step.admin, step.catalog, reset_request(step.params), for_apply=step.params["dry_run"] is False)


def _reset_apply(step: Step, plan: ResetPlan) -> Result:
    app = step.app(plan.app)
    return apply_reset(app.app, plan, app.start_on_new_checkpoint())


def _reset_verify(step: Step, plan: ResetPlan, _applied: Result) -> Result:
    app = step.catalog.app(plan.app)
    started = verify_reset(app, plan)
    progress = await_resumed(app, step.kafka, None, step.verify_deadline_s)
    return {**started, "progress": progress, "summary": f"{started['summary']}; lag now {progress['lag_after']}"}


def _reset_effect(plan: ResetPlan) -> PlanEffect:
    """Back: [new, now) is processed again; forward: [now, new) never is (an app that never read
    has written nothing yet)."""
    rows = [r for r in plan.rows if r.selected and r.current is not None]
    return PlanEffect(
        again=tuple(InputRange(r.topic, r.partition, r.new, r.current) for r in rows
                    if r.current is not None and r.new < r.current),
        never=tuple(InputRange(r.topic, r.partition, r.current, r.new) for r in rows
                    if r.current is not None and r.new > r.current))


RESET = Procedure(name="offset reset plan", plan_type=ResetPlan, plan=_reset_plan, apply=_reset_apply, verify=_reset_verify,
                  effect=_reset_effect)


# --- dead-letter replay ---------------------------------------------------------------------------------


def _replay_plan(step: Step) -> ReplayPlan:
    p = step.params
    request = ReplayRequest(app=p["app"], start=p["start"], end=p["end"], reason_contains=p.get("reason_contains") or "")
    return plan_replay(step.spark, step.admin, step.kafka, step.catalog, request)


def _replay_apply(step: Step, plan: ReplayPlan) -> Result:
    return apply_replay(step.spark, step.kafka, step.catalog, plan, step.run_id)


def _replay_verify(step: Step, _plan: ReplayPlan, applied: Result) -> Result:
    return verify_replay(step.kafka, applied)


REPLAY = Procedure(name="dead-letter replay plan", plan_type=ReplayPlan, plan=_replay_plan, apply=_replay_apply,
                   verify=_replay_verify, effect=lambda plan: PlanEffect(replayed=plan.totals.get("replay", 0)))


# --- rebuild ----------------------------------------------------------------------------------------------


def _rebuild_plan(step: Step) -> RebuildPlan:
    version = step.params.get("version") or "v2"
    if not re.fullmatch(VERSION_SUFFIX_PATTERN, str(version)):
        # It becomes part of the new topics' names.
        raise RecoveryRefused([f"version {version!r} must look like v2: 'v' and up to 6 digits (it becomes the topic suffix)"])
    return plan_rebuild(step.admin, step.catalog, step.params["app"], step.params["target"], version)


def _rebuild_reprocess_plan(step: Step, plan: RebuildPlan) -> Result:
    """A versioned rebuild is the reprocess DAG's run: its plan, with its refusals (e.g. targets
    that already hold records), made now and handed on for approval with the rebuild's."""
    if plan.target != "versioned":
        return {}
    return {"reprocess_plan": reprocessing.plan(step.admin, step.kafka, {
        "app": plan.app, "start": "earliest", "end": "now", "target": "versioned",
        "version": step.params.get("version") or "v2", "tag": "rebuild-" + run_tag(utc_now()),
        "cutover": True,
    })}


def _rebuild_apply(step: Step, plan: RebuildPlan) -> Result:
    if plan.target == "live":
        app = step.app(plan.app)
        return apply_rebuild_live(app.app, plan, app.start_on_new_checkpoint(), app.stopper())
    reprocess_plan = step.handed["reprocess_plan"]
    ran = reprocessing.run(reprocess_plan, step.run_id, step.kafka, step.admin, step.spark_target)
    reprocessing.validate(reprocess_plan, step.run_id, step.kafka, step.admin, step.spark_master)
    handed = reprocessing.cutover(reprocess_plan, ran, step.run_id, step.kafka)
    return {"reprocessed": ran["summary"], **handed,
            "summary": f"rebuilt into {', '.join(handed['new_topics'])} ({ran['summary']}); cut over, old checkpoint "
                       f"kept at {handed['backup']}"}


def _rebuild_effect(plan: RebuildPlan) -> PlanEffect:
    """Live: every retained input record is processed again into the live topics; versioned: the
    outputs move to new topics at the cutover."""
    if plan.target == "live":
        return PlanEffect(again=tuple(InputRange(i["topic"], i["partition"], i["earliest"], i["latest"]) for i in plan.inputs))
    return PlanEffect(moved_to=f"the versioned topics ({plan.target})")


REBUILD = Procedure(
    name="state rebuild plan", plan_type=RebuildPlan, plan=_rebuild_plan, apply=_rebuild_apply,
    verify=lambda step, plan, _applied: await_progress(step, plan.app, None, caught_up=plan.target == "live"),
    handed_on=_rebuild_reprocess_plan, effect=_rebuild_effect,
)


# --- restore ----------------------------------------------------------------------------------------------


def _restore_plan(step: Step) -> RestorePlan:
    p = step.params
    plan = plan_restore(step.catalog, p["app"], p["snapshot"], stop_if_running=p["stop_if_running"],
                        for_apply=p["dry_run"] is False)
    step.app(plan.app).trusted(plan.version, plan.spark_conf)
    if p["dry_run"] is False:
        # No snapshot policy prunes the chosen snapshot while the plan waits for its approval.
        try:
            hold(step.catalog.app(plan.app).checkpoint_location(), plan.snapshot, step.run_id, "recover_restore_checkpoint")
        except SnapshotGone as exc:
            raise RecoveryRefused([f"{exc}: run the DAG again"]) from None
    return plan


def _restore_apply(step: Step, plan: RestorePlan) -> Result:
    app = step.app(plan.app)
    try:
        return apply_restore(app.app, plan, app.start_version(), app.stopper())
    finally:
        release(app.app.checkpoint_location(), step.run_id)


def _restore_verify(step: Step, plan: RestorePlan, _applied: Result) -> Result:
    app = step.catalog.app(plan.app)
    progress = await_resumed(app, step.kafka, None, step.verify_deadline_s)
    continued = verify_restore(app, plan)
    return {**continued, "progress": progress, "summary": f"{continued['summary']}; lag now {progress['lag_after']}"}


def _restore_effect(plan: RestorePlan) -> PlanEffect:
    """The snapshot's positions are behind the current ones: what lies between is processed again."""
    return PlanEffect(again=tuple(InputRange(m["topic"], m["partition"], m["restored"], m["now"]) for m in plan.moves
                                  if m["now"] is not None and m["restored"] is not None and m["restored"] < m["now"]))


RESTORE = Procedure(name="checkpoint restore plan", plan_type=RestorePlan, plan=_restore_plan, apply=_restore_apply,
                    effect=_restore_effect,
                    verify=_restore_verify)


# --- skip records ---------------------------------------------------------------------------------------


def _skip_plan(step: Step) -> SkipPlan:
    p = step.params
    plan = plan_skip(step.admin, step.kafka, step.catalog, p["app"], p.get("records"), p.get("note"),
                     user=step.user, run_id=step.run_id)
    step.app(plan.app).trusted(plan.version, plan.spark_conf)  # the restart after the skip starts this
    return plan


def _skip_apply(step: Step, plan: SkipPlan) -> Result:
    app = step.app(plan.app)
    return apply_skip(app.app, plan, app.start_version(), step.kafka)


def _skip_verify(step: Step, plan: SkipPlan, applied: Result) -> Result:
    return verify_skip(step.catalog.app(plan.app), plan, applied, step.kafka, step.verify_deadline_s)


def _skip_effect(plan: SkipPlan) -> PlanEffect:
    return PlanEffect(never=tuple(InputRange(e["topic"], e["partition"], e["first"], e["last"] + 1) for e in plan.entries))


SKIP = Procedure(name="skip-records plan", plan_type=SkipPlan, plan=_skip_plan, apply=_skip_apply, verify=_skip_verify,
                 effect=_skip_effect)


# --- extend retention ------------------------------------------------------------------------------


def _extend_plan(step: Step) -> ExtendPlan:
    p = step.params
    return plan_extend(step.admin, step.kafka, step.catalog, ExtendRequest(p["app"], p["extend_by"], p["hold_for"]))


EXTEND = Procedure(
    name="retention extension plan", plan_type=ExtendPlan, plan=_extend_plan,
    apply=lambda step, plan: apply_extend(step.admin, plan, run_id=step.run_id, by=step.user),
    verify=lambda step, plan, _applied: verify_extend(step.admin, plan),
)


# The table: one recovery DAG a row.
PROCEDURES: dict[str, Procedure] = {
    "recover_restart_app": RESTART,
    "recover_reset_offsets": RESET,
    "recover_replay_dead_letters": REPLAY,
    "recover_rebuild_state": REBUILD,
    "recover_restore_checkpoint": RESTORE,
    "recover_skip_records": SKIP,
    "recover_extend_retention": EXTEND,
}
