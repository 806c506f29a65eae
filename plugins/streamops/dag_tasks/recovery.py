"""Tasks of the recovery DAGs: each is plan -> apply -> verify, every step audited.

The plan is logged as a table and returned for XCom; a dry run (the default) stops there. Apply
re-checks what the plan assumed, backs up, changes, and starts; verify waits for the outcome.
Refusals fail the task without retries, naming every problem; nothing was changed by then.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from streamops.catalog import load_catalog
from streamops.audit import acting_as, audit_file
from streamops.dag_tasks import trail
from streamops.recovery.common import RecoveryRefused
from streamops.kafka_client import KafkaClientConfig

log = logging.getLogger(__name__)


def _snapshots(app_name: object) -> set[str]:
    """The app's checkpoint snapshots now (none for a name the catalog does not know)."""
    from streamops.checkpoints import list_backups

    catalog = load_catalog()
    if app_name not in catalog.app_names():
        return set()
    return {str(p) for p in list_backups(catalog.app(str(app_name)).checkpoint_location())}


def audited(context, step: str, action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one step; write its outcome (or refusal, or failure) to the audit log, with the
    snapshots it took; fail the task without retries on a refusal or error."""
    from airflow.sdk.exceptions import AirflowFailException

    from streamops.dag_tasks.recovery_params import shared_param_problems

    audit = trail(context)
    before = _snapshots(audit.params.get("app"))
    try:
        problems = shared_param_problems(audit.params) if step == "plan" else []
        if problems:
            raise RecoveryRefused(problems)
        from contextlib import nullcontext

        from streamops.dag_tasks import operating_on

        marked = operating_on(audit.params.get("app"), audit.run_id, f"{audit.dag_id} {step}") if step == "apply" else nullcontext()
        with acting_as(audit.user, audit.run_id), marked:
            result = action()
    except RecoveryRefused as exc:
        audit.write(step, "refused", error=str(exc))
        raise AirflowFailException(f"{context['dag_run'].dag_id}: {exc}") from None
    except Exception as exc:
        taken = sorted(_snapshots(audit.params.get("app")) - before)
        audit.write(step, "failed", error=f"{type(exc).__name__}: {exc}", snapshots_taken=taken)
        hint = (f"\nThe checkpoint was backed up before the failure: {', '.join(taken)}; recover_restore_checkpoint "
                "puts it back.") if taken else ""
        raise AirflowFailException(f"{step} failed: {exc}{hint}") from exc
    from streamops.dag_tasks import is_dry_run

    dry = step == "plan" and is_dry_run(context["params"])
    taken = sorted(_snapshots(audit.params.get("app")) - before)
    audit.write(step, "planned (dry run: nothing changed)" if dry else "done", summary=result.get("summary", ""),
                result=result, snapshots_taken=taken)
    log.info("audit: %s %s by %s recorded in %s", audit.dag_id, step, audit.user, audit_file())
    return result


def _plan_fields(plan: dict, *derived: str) -> dict:
    """A plan's XCom without what the task added (summary) or derived: the plan's own fields."""
    return {k: v for k, v in plan.items() if k not in ("summary", *derived)}


def guard_apply(context) -> None:
    """Before an apply changes anything: skipped on a dry run, refused without an approval."""
    from airflow.sdk.exceptions import AirflowSkipException

    from streamops.dag_tasks import is_dry_run
    from streamops.dag_tasks.approval import check_approved

    if is_dry_run(context["params"]):
        raise AirflowSkipException("Dry run: nothing was changed. The plan is in the 'plan' task's log; "
                                   "trigger again with 'Dry run' off to apply it.")
    check_approved(context)


# --- what starts and stops the apps -----------------------------------------------------------


def trusted_launch(app_name: str, version: object, spark_conf: object) -> tuple[str, dict[str, str]]:
    """A version and Spark conf read back from a launch record (or a plan made from one), checked
    like a trigger's: a file on disk may have been edited, so it is not trusted. RecoveryRefused."""
    from streamops.launch_overrides import LaunchOverrideRefused, checked_spark_conf, checked_version

    try:
        return (checked_version(version) or load_catalog().app(app_name).version), checked_spark_conf(spark_conf)
    except LaunchOverrideRefused as exc:
        raise RecoveryRefused([f"{app_name}'s last launch record (_runtime/driver.json) cannot be started again: {exc}"]) from None


def last_launch(app_name: str) -> tuple[str, dict]:
    """The version and Spark conf the app last ran with (the catalog's version if never run)."""
    from streamops.app_runtime import AppRuntime, DriverRecord

    app = load_catalog().app(app_name)
    driver = AppRuntime(app.checkpoint_location()).driver() or DriverRecord()
    return trusted_launch(app_name, driver.launched_version or app.version, driver.launched_spark_conf)


def _launch(app_name: str, run_id: str, version: str, spark_conf: dict, starting_offsets: str | None = None,
            expected_digest: str | None = None, record_desired: bool = True):
    from streamops.app_ops import launch
    from streamops.dag_tasks.apps import command_for

    version, spark_conf = trusted_launch(app_name, version, spark_conf)
    app = load_catalog().app(app_name)
    command = command_for(app_name, version, spark_conf, starting_offsets, expected_digest=expected_digest)
    return launch(app, command, checkpoint=app.checkpoint_location(),
                  launched_by=run_id, version=version, spark_conf=spark_conf, record_desired=record_desired)


def start_version(app_name: str, run_id: str):
    """start(version, spark_conf): launch the app detached via spark_default from its checkpoint."""
    return lambda version, spark_conf, expected_digest=None: _launch(app_name, run_id, version, spark_conf,
                                                                     expected_digest=expected_digest)


def start_on_new_checkpoint(app_name: str, run_id: str):
    """start(starting_offsets): launch the version it last ran with on a new checkpoint at those offsets."""
    return lambda starting_offsets: _launch(app_name, run_id, *last_launch(app_name), starting_offsets)


def stopper(app_name: str, run_id: str, deadline_s: float = 60.0):
    from streamops.app_ops import stop

    app = load_catalog().app(app_name)
    return lambda: stop(app, checkpoint=app.checkpoint_location(), requested_by=run_id, deadline_s=deadline_s)


# --- restart ------------------------------------------------------------------------------------------


def restart_plan(context, kafka: KafkaClientConfig) -> dict:
    from streamops.recovery.restart import plan_restart

    def action():
        plan = plan_restart(load_catalog(), context["params"]["app"], kafka)
        trusted_launch(plan.app, plan.version, plan.spark_conf)
        log.info("Restart plan:\n%s", plan.table())
        return {**plan.to_json(), "summary": plan.summary()}

    return audited(context, "plan", action)


def restart_apply(context, plan: dict) -> dict:
    from streamops.recovery.restart import RestartPlan, apply_restart

    guard_apply(context)

    def action():
        the_plan = RestartPlan(**_plan_fields(plan))
        result = apply_restart(load_catalog().app(the_plan.app), the_plan, start_version(the_plan.app, context["run_id"]))
        log.info(result["summary"])
        return result

    return audited(context, "apply", action)


def await_progress(context, app_name: str, kafka: KafkaClientConfig, lag_before: int | None, caught_up: bool = False) -> dict:
    from streamops.recovery.lifecycle import await_resumed

    def action():
        result = await_resumed(load_catalog().app(app_name), kafka, lag_before, float(context["params"]["verify_deadline_s"]),
                               caught_up=caught_up)
        result["summary"] = (f"{app_name} is making progress: batches {result['batches']}, lag {lag_before} -> "
                             f"{result['lag_after']} after {result['seconds']} s")
        log.info(result["summary"])
        return result

    return audited(context, "verify", action)


# --- reset ----------------------------------------------------------------------------------------------


def reset_request(params: dict):
    from streamops.recovery.reset import ResetRequest

    return ResetRequest(
        app=params["app"], mode=params["mode"], to_datetime=params.get("to_datetime") or None,
        duration=params.get("duration") or None, shift=params.get("shift"), offsets=params.get("offsets") or None,
        partitions=list(params.get("partitions") or []),
    )


def reset_plan(context, admin) -> dict:
    from streamops.recovery.reset import plan_reset

    def action():
        params = context["params"]
        plan = plan_reset(admin, load_catalog(), reset_request(params), for_apply=not params["dry_run"])
        log.info("Reset plan for %s:\n%s", plan.app, plan.table())
        return {**plan.to_json(), "summary": f"{plan.replayed} replayed, {plan.skipped} skipped"}

    return audited(context, "plan", action)


def reset_apply(context, plan: dict) -> dict:
    from streamops.recovery.reset import ResetPlan, apply_reset

    guard_apply(context)

    def action():
        the_plan = ResetPlan.from_json(_plan_fields(plan))
        result = apply_reset(load_catalog().app(the_plan.app), the_plan, start_on_new_checkpoint(the_plan.app, context["run_id"]))
        log.info(result["summary"])
        return result

    return audited(context, "apply", action)


def reset_verify(context, plan: dict, kafka: KafkaClientConfig) -> dict:
    from streamops.recovery.lifecycle import await_resumed
    from streamops.recovery.reset import ResetPlan, verify_reset

    def action():
        the_plan = ResetPlan.from_json(_plan_fields(plan))
        app = load_catalog().app(the_plan.app)
        started = verify_reset(app, the_plan)
        log.info(started["summary"])
        progress = await_resumed(app, kafka, None, float(context["params"]["verify_deadline_s"]))
        return {**started, "progress": progress, "summary": f"{started['summary']}; lag now {progress['lag_after']}"}

    return audited(context, "verify", action)


# --- dead-letter replay ---------------------------------------------------------------------------------


def replay_plan(context, spark, admin, kafka: KafkaClientConfig) -> dict:
    from streamops.recovery.replay import ReplayRequest, plan_replay

    def action():
        p = context["params"]
        request = ReplayRequest(app=p["app"], start=p["start"], end=p["end"], reason_contains=p.get("reason_contains") or "")
        plan = plan_replay(spark, admin, kafka, load_catalog(), request)
        log.info("Dead-letter replay plan:\n%s", plan.table())
        return {**plan.to_json(), "summary": f"{plan.totals['replay']} to replay, {plan.totals['still fails']} still fail, "
                                             f"{plan.totals['already replayed']} replayed before"}

    return audited(context, "plan", action)


def replay_apply(context, spark, plan: dict, kafka: KafkaClientConfig) -> dict:
    from streamops.recovery.replay import ReplayPlan, apply_replay

    guard_apply(context)

    def action():
        result = apply_replay(spark, kafka, load_catalog(), ReplayPlan.from_json(_plan_fields(plan)),
                              context["run_id"])
        log.info(result["summary"])
        return result

    return audited(context, "apply", action)


def replay_verify(context, applied: dict, kafka: KafkaClientConfig) -> dict:
    from streamops.recovery.replay import verify_replay

    def action():
        result = verify_replay(kafka, applied)
        log.info(result["summary"])
        return result

    return audited(context, "verify", action)


# --- rebuild ----------------------------------------------------------------------------------------------


def rebuild_plan(context, admin, kafka: KafkaClientConfig) -> dict:
    from streamops.dag_tasks import reprocess as reprocessing
    from streamops.recovery.rebuild import plan_rebuild
    from streamops.reprocess import VERSION_SUFFIX_PATTERN

    def action():
        p = context["params"]
        version = p.get("version") or "v2"
        if not re.fullmatch(VERSION_SUFFIX_PATTERN, str(version)):
            # It becomes part of the new topics' names.
            raise RecoveryRefused([f"version {version!r} must look like v2: 'v' and up to 6 digits (it becomes the topic suffix)"])
        plan = plan_rebuild(admin, load_catalog(), p["app"], p["target"], version)
        log.info("Rebuild plan for %s:\n%s", plan.app, plan.table())
        result = {**plan.to_json(), "summary": f"{plan.target}: {plan.records} record(s) from earliest"}
        if plan.target == "versioned":
            # The reprocess DAG's plan, with its refusals (e.g. targets that already hold records).
            result["reprocess_plan"] = reprocessing.plan(admin, kafka, {
                "app": p["app"], "start": "earliest", "end": "now", "target": "versioned",
                "version": p.get("version") or "v2", "tag": datetime.now(timezone.utc).strftime("rebuild-%Y%m%dt%H%M%S"),
                "cutover": True,
            })
        return result

    return audited(context, "plan", action)


def rebuild_apply(context, plan: dict, admin, kafka: KafkaClientConfig, spark_master: str) -> dict:
    from streamops.dag_tasks import reprocess as reprocessing
    from streamops.recovery.rebuild import RebuildPlan, apply_rebuild_live

    guard_apply(context)
    run_id = context["run_id"]

    def action():
        fields = _plan_fields(plan, "records", "reprocess_plan")
        the_plan = RebuildPlan(**fields)
        if the_plan.target == "live":
            result = apply_rebuild_live(load_catalog().app(the_plan.app), the_plan, start_on_new_checkpoint(the_plan.app, run_id),
                                        stopper(the_plan.app, run_id))
        else:
            ran = reprocessing.run(plan["reprocess_plan"], run_id, kafka, admin, spark_master)
            reprocessing.validate(plan["reprocess_plan"], run_id, kafka, admin, spark_master)
            handed = reprocessing.cutover(plan["reprocess_plan"], ran, run_id, kafka)
            result = {"reprocessed": ran["summary"], **handed,
                      "summary": f"rebuilt into {', '.join(handed['new_topics'])} ({ran['summary']}); cut over, old checkpoint "
                                 f"kept at {handed['backup']}"}
        log.info(result["summary"])
        return result

    return audited(context, "apply", action)


# --- restore ----------------------------------------------------------------------------------------------


def restore_plan(context) -> dict:
    from streamops.recovery.restore import plan_restore

    def action():
        p = context["params"]
        plan = plan_restore(load_catalog(), p["app"], p["snapshot"], stop_if_running=p["stop_if_running"], for_apply=not p["dry_run"])
        trusted_launch(plan.app, plan.version, plan.spark_conf)
        log.info("Restore plan:\n%s", plan.table())
        return {**plan.to_json(), "summary": f"restore {plan.snapshot}: batches {plan.current} -> {plan.restored}"}

    return audited(context, "plan", action)


def restore_apply(context, plan: dict) -> dict:
    from streamops.recovery.restore import RestorePlan, apply_restore

    guard_apply(context)

    def action():
        the_plan = RestorePlan.from_json(_plan_fields(plan))
        result = apply_restore(load_catalog().app(the_plan.app), the_plan, start_version(the_plan.app, context["run_id"]),
                               stopper(the_plan.app, context["run_id"]))
        log.info(result["summary"])
        return result

    return audited(context, "apply", action)


def restore_verify(context, plan: dict, kafka: KafkaClientConfig) -> dict:
    from streamops.recovery.lifecycle import await_resumed
    from streamops.recovery.restore import RestorePlan, verify_restore

    def action():
        the_plan = RestorePlan.from_json(_plan_fields(plan))
        app = load_catalog().app(the_plan.app)
        progress = await_resumed(app, kafka, None, float(context["params"]["verify_deadline_s"]))
        continued = verify_restore(app, the_plan)
        return {**continued, "progress": progress, "summary": f"{continued['summary']}; lag now {progress['lag_after']}"}

    return audited(context, "verify", action)


# --- skip records ---------------------------------------------------------------------------------------


def skip_plan(context, admin, kafka: KafkaClientConfig) -> dict:
    from streamops.recovery.skip import plan_skip

    def action():
        p = context["params"]
        plan = plan_skip(admin, kafka, load_catalog(), p["app"], p.get("records"), p.get("note"),
                         user=trail(context).user, run_id=context["run_id"])
        trusted_launch(plan.app, plan.version, plan.spark_conf)  # the restart after the skip starts this
        log.info("Skip plan:\n%s", plan.table())
        return {**plan.to_json(), "summary": f"skip {plan.records} record(s) of {plan.app} "
                                             f"({', '.join(str(r) for r in p.get('records') or [])})"}

    return audited(context, "plan", action)


def skip_apply(context, plan: dict, kafka: KafkaClientConfig) -> dict:
    from streamops.recovery.skip import SkipPlan, apply_skip

    guard_apply(context)

    def action():
        the_plan = SkipPlan.from_json(_plan_fields(plan))
        result = apply_skip(load_catalog().app(the_plan.app), the_plan, start_version(the_plan.app, context["run_id"]), kafka)
        log.info(result["summary"])
        return result

    return audited(context, "apply", action)


def skip_verify(context, plan: dict, applied: dict, kafka: KafkaClientConfig) -> dict:
    from streamops.recovery.skip import SkipPlan, verify_skip

    def action():
        the_plan = SkipPlan.from_json(_plan_fields(plan))
        result = verify_skip(load_catalog().app(the_plan.app), the_plan, applied, kafka,
                             float(context["params"]["verify_deadline_s"]))
        log.info(result["summary"])
        return result

    return audited(context, "verify", action)
