"""Tasks of the deploy_apps, app_status, stop_apps and roll_restart_apps DAGs."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from functools import cache

from streamops.app_ops import Launch, LaunchCommand, stop
from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.app_status import AppStatus, app_status, lag_table, status_table
from streamops.audit import AuditTrail, acting_user
from streamops.catalog import Catalog, load_catalog
from streamops.dag_tasks import checked_number, refusals_fail
from streamops.dag_tasks.connections import admin_client, kafka_connection
from streamops.dag_tasks.launching import AppLauncher
from streamops.kafka_client import app_principal
from streamops.launch_overrides import checked_spark_conf, checked_version
from streamops.notifications import notify_attention
from streamops.programs import DriverProtocolRefused, ProgramError
from streamops.recovery.extend import end_holds
from streamops.refusals import OneLineRefused
from streamops.rollout import RolloutFailed, roll_restart
from streamops.supervision import Health, act, app_drift, attention_message, evaluate, health_table, unreadable

log = logging.getLogger(__name__)

# Bounds of the apps DAGs' numeric params (the forms use them too).
GATE_DEADLINE_S = (30, 3600)
STOP_DEADLINE_S = (5, 3600)


def suggested_version(catalog: Catalog) -> str:
    """The roll form's suggestion: the next patch version after the newest one in the catalog
    (pre-release and build labels set aside), e.g. 1.0.0 and 1.2.3 -> 1.2.4."""
    import re

    found = [re.match(r"(\d+)\.(\d+)\.(\d+)", app.version) for app in catalog.apps]
    newest = max((tuple(int(n) for n in m.groups()) for m in found if m), default=(0, 0, 0))
    return f"{newest[0]}.{newest[1]}.{newest[2] + 1}"


def selected(catalog: Catalog, names: Sequence[str] | None) -> list[str]:
    if not names:
        return catalog.app_names()
    unknown = sorted(set(names) - set(catalog.app_names()))
    if unknown:
        raise ValueError(f"apps not in the catalog: {', '.join(unknown)}; choose from: {', '.join(catalog.app_names())}")
    return [name for name in catalog.app_names() if name in set(names)]


def checked_overrides(version: object, spark_conf: object, where: str = "") -> tuple[str | None, dict[str, str]]:
    """The trigger's version and Spark conf, checked and normalised (LaunchOverrideRefused naming
    what is not allowed), before anything is built or started."""
    return checked_version(version, f"{where}version"), checked_spark_conf(spark_conf, f"{where}spark_conf")


@refusals_fail
def deploy(app_name: str, version: str | None, spark_conf: dict, run_id: str) -> dict:
    """Start one app detached through spark_default; refused (no retries) if it is already
    running, or if its version, conf or artifact is not allowed."""
    version, spark_conf = checked_overrides(version, spark_conf)
    launcher = AppLauncher.of(load_catalog(), app_name, run_id)
    app = launcher.app
    started = launcher.launch(version, spark_conf)
    log.info(
        "%s is running: driver pid %s, Spark application %s, version %s; driver log %s",
        app.name, started.pid, started.application_id, started.version, started.driver_log,
    )
    return {"app": app.name, "pid": started.pid, "application_id": started.application_id,
            "version": started.version, "driver_log": started.driver_log}


@refusals_fail
def roll(app_name: str, version: str | None, spark_conf: dict, gate_deadline_s: float, max_dead_letter_rate: float,
         run_id: str) -> dict:
    """Roll one app to `version`/`spark_conf`, or refuse, or roll back and fail loudly."""
    from airflow.sdk.exceptions import AirflowFailException

    version, spark_conf = checked_overrides(version, spark_conf)
    if version is None:
        raise OneLineRefused("a rolling restart needs the new version label")
    checked_number(gate_deadline_s, "gate_deadline_s", *GATE_DEADLINE_S)
    checked_number(max_dead_letter_rate, "max_dead_letter_rate", 0, 1, whole=False)
    launcher = AppLauncher.of(load_catalog(), app_name, run_id)
    app = launcher.app
    # A rollback restarts what the launch record on disk says: check it before anything is stopped.
    previous = AppRuntime(app.checkpoint_location()).driver() or DriverRecord()
    checked_overrides(previous.launched_version, previous.launched_spark_conf,
                      f"the running version's launch record ({app.name}): ")

    def previous_command(previous: DriverRecord) -> LaunchCommand:
        # Exactly the code that ran: an artifact whose digest changed since is refused.
        return launcher.command(previous.launched_version, previous.launched_spark_conf,
                                expected_digest=previous.artifact_digest)

    rollback: Callable[[DriverRecord], LaunchCommand] | None = previous_command
    try:
        new_command = launcher.command(version, spark_conf)
    except ProgramError as exc:  # no artifact for the version, not the bytes it was built with, another protocol
        raise OneLineRefused(f"{exc}; nothing was stopped") from None
    try:
        previous_command(previous)  # the rollback's code must be there, unchanged, before anything stops
    except DriverProtocolRefused as exc:
        # The running version's artifact predates this platform's driver: it can never start here
        # again, so there is nothing to roll back to; rolling forward is the way off it.
        log.warning("No rollback for this roll: %s. If version %s fails its health gate, nothing older can be started: "
                    "fix forward (roll to a fixed version) or stop the app.", exc, version)
        rollback = None
    except ProgramError as exc:  # no artifact for a version, or not the bytes it was built with (or ran)
        raise OneLineRefused(f"{exc}; nothing was stopped") from None
    try:
        return roll_restart(
            app,
            new_command=new_command,
            previous_command=rollback,
            new_version=version,
            new_spark_conf=spark_conf,
            kafka=kafka_connection(),
            run_id=run_id,
            gate_deadline_s=gate_deadline_s,
            max_dead_letter_rate=max_dead_letter_rate,
            log=log.info,
        )
    except RolloutFailed as exc:  # rolled back: the previous version runs again
        raise AirflowFailException(f"rolling restart failed: {exc}") from None


def status(names: Sequence[str] | None, run_id: str = "manual", restart_crashed: bool = True) -> dict:
    """Every chosen app's status and health; as the supervisor, restart crashed apps whose policy
    and crash-loop guard allow it (streamops.supervision). Never fails on an app's health: that
    is `check_health`'s, after this task has recorded every app's figures."""
    # Status and stop never need an app's code: one app's missing artifact must not blind them.
    catalog = load_catalog(check_programs=False)
    kafka = kafka_connection()
    # A restart runs the app's code: it needs the catalog with its programs and settings checked,
    # read once, and only when some app is restarted.
    checked_catalog = cache(load_catalog)

    def restarter(name: str) -> Callable[[str, Mapping[str, object], str | None], Launch]:
        def start(version: str, spark_conf: Mapping[str, object], expected_digest: str | None) -> Launch:
            return AppLauncher.of(checked_catalog(), name, run_id).supervisor_start()(version, spark_conf, expected_digest)
        return start

    statuses: list[AppStatus] = []
    healths: list[Health] = []
    drifts = []
    for name in selected(catalog, names):
        spec = catalog.app(name)
        runtime = AppRuntime(spec.checkpoint_location())
        try:
            current = app_status(spec, kafka)
            health = evaluate(spec, current, runtime)
        except Exception as exc:  # one app's unreadable status must not blind the others'
            log.exception("%s: its status could not be read", name)
            health = unreadable(name, exc)
            statuses.append(health.status or AppStatus(app=name, state="unknown"))
            healths.append(health)
            continue
        try:
            act(spec, health, runtime, run_id=run_id, start=restarter(name), restarts_on=restart_crashed,
                audit=_supervisor_audit(run_id), log=log.info)
            if health.action and health.action.startswith("restarted"):
                current = app_status(spec, kafka)
        except Exception as exc:  # the next apps still get their turn; this one is reported
            log.exception("%s: the supervisor's action failed", name)
            health.action = f"its action failed: {type(exc).__name__}: {str(exc)[:500]}"
        statuses.append(current)
        healths.append(health)
        drifts.append(app_drift(catalog, name, runtime, current, app_principal(name)))
    log.info("Streaming apps:\n%s", status_table(statuses))
    log.info("Declared (catalog) against running (docs/architecture.md \"Desired state and drift\"):\n%s",
             "\n".join(d.line() for d in drifts) or "no apps")
    for drifted in drifts:
        if drifted.fields:  # what runs is not what the catalog says: said where on-call looks
            log.warning("%s", drifted.line())
        if drifted.catalog_edit:
            log.warning("%s runs approved changes the catalog does not say yet; this edit of the catalog makes it agree:\n%s",
                        drifted.app, drifted.catalog_edit)
    if restart_crashed:  # as the supervisor: retention holds whose time is up end (streamops.recovery.extend)
        _end_retention_holds(catalog, kafka, run_id)
    log.info("Health (catalog thresholds per app, docs/operating.md \"Supervision\"):\n%s", health_table(healths))
    for item in statuses:
        if item.lags:
            log.info("%s lag per partition:\n%s", item.app, lag_table(item))
    for health in healths:
        if health.needs_someone:
            log.warning("%s", health.line())
    drift_of = {d.app: d.to_dict() for d in drifts}
    return {item.app: json.loads(json.dumps({**item.to_dict(), "health": health.to_dict(), "drift": drift_of.get(item.app)},
                                            default=str))
            for item, health in zip(statuses, healths, strict=True)}


def _end_retention_holds(catalog: Catalog, kafka, run_id: str) -> None:
    try:
        ended = end_holds(admin_client(), kafka, catalog)
    except Exception:  # the apps' status is this run's job: a hold is looked at again next run
        log.exception("The retention holds could not be looked at")
        return
    for line in ended:
        log.warning("Retention hold: %s", line)
        AuditTrail("app_status", run_id, "supervisor", {}).write("retention hold", "kept" if "kept held" in line else "ended",
                                                                  summary=line)


def check_health(statuses: dict, run_id: str) -> str:
    """Fail (no retries) naming every app whose health needs someone (supervision.NEEDS_SOMEONE),
    with its evidence; on-call hears of each such app once per state (streamops.notifications)."""
    from airflow.sdk.exceptions import AirflowFailException

    healths = [s["health"] for s in statuses.values()]
    message = attention_message(healths)
    try:
        catalog = load_catalog(check_programs=False)
        notify_attention(healths, run_id, {h["app"]: catalog.app(h["app"]).checkpoint_location() for h in healths
                                           if h["app"] in catalog.app_names()})
    except Exception as exc:  # noqa: BLE001 (telling on-call must never hide what this run reports)
        log.warning("On-call was not told (%s: %s); the health above is what it would have heard", type(exc).__name__, exc)
    if message:
        raise AirflowFailException(message)
    summary = ", ".join(f"{app} {s['health']['state']}" for app, s in statuses.items()) or "no apps"
    log.info("Every app is as it should be: %s", summary)
    return summary


def _supervisor_audit(run_id: str):
    def write(app_name: str, outcome: str, **details) -> None:
        step = "crash-loop guard" if outcome == "gave up" else "restart"
        AuditTrail("app_status", run_id, "supervisor", {"app": app_name}).write(step, outcome, **details)

    return write


@refusals_fail
def stop_app(app_name: str, deadline_s: float, run_id: str) -> str:
    """Stop one app on purpose: recorded as its desired state first, so neither the status run
    nor the supervisor takes the stop for a crash."""
    checked_number(deadline_s, "deadline_s", *STOP_DEADLINE_S)
    app = load_catalog(check_programs=False).app(app_name)
    AppRuntime(app.checkpoint_location()).set_desired("stopped", run_id=run_id, by=acting_user())
    outcome = stop(app, checkpoint=app.checkpoint_location(), requested_by=run_id, deadline_s=deadline_s)
    log.info(outcome)
    return outcome
