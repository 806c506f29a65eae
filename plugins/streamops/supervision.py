"""Supervision: what each app should be doing, whether it needs someone, and the restarts.

The desired state (`AppRuntime.desired`: running after a deploy, roll or restart; stopped after
stop_apps) beside what the app does (`app_status`) and its catalog `supervision` thresholds gives
one health state per app:

    healthy       running, within its thresholds
    stopped       stopped by an operator (who and when are in the evidence)
    not deployed  never started here
    in operation  a DAG run is changing it right now (a roll, a reset ...): left alone
    crashed       should run and does not: died unrecorded (kill -9, lost host), its query
                  failed, it ended on its own, or its start failed
    crash-loop    crashed, and the crash-loop guard's limit of restarts is reached: it stays down
                  until an operator starts or stops it
    held          down after a DAG run failed while changing it (a reset, restore, roll ...): its
                  checkpoint may be half-changed, so nothing restarts it; an operator decides.
                  Also down with a checkpoint written against another Kafka cluster (the
                  evidence names both and the ways forward)
    unreadable    its status could not be read (the error is the evidence)
    stalled       running, records waiting, and no completed batch for several trigger intervals
    lagging       the oldest unprocessed record is older than the app's max_time_lag
    output stopped  running and reading input, but a stateful query's records are all dropped as
                  late (no state row updated over several batches), or its watermark lies ahead
                  of now by more than its inputs' event-time bound allows (one far-future record
                  moved it): its windows will not be written again until it is rebuilt
    degraded      more of the last health window's input went to dead letters than
                  max_dead_letter_rate, judged once the window holds dead_letter_min_records

The supervisor is the app_status DAG, every 2 minutes and at once when a driver ends (an asset
watcher whose trigger, streamops.triggers, only notices: `driver_exits` below). The restart is
the DAG's task, not the trigger's: a spark-submit launch with the app's connection and artifact
checks is task work, not triggerer event-loop work, and every decision is then a task log line
and an audit record in the UI.

Imported by the DAG tasks and the metrics endpoint; no Airflow here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from streamops.app_runtime import AppRuntime, DriverRecord, OperationInProgress
from streamops.app_status import AppStatus, app_status, minute_rates
from streamops.catalog import AppSpec, Catalog, SupervisionSpec
from streamops.effective_spec import Drift, drift
from streamops.kafka_offsets import duration_ms, end_offsets
from streamops.programs import protocol_problem
from streamops.recovery.restart import restart_from_checkpoint
from streamops.retention import lost_evidence, risk_evidence, threshold_s
from streamops.runtime_records import DesiredState, RestartAttempt, RestartEntry
from streamops.spark_history import driver_link, failed_batch_job
from streamops.timestamps import iso_ms, now_iso
from streamops.timestamps import parse_recorded_time as _parse

log = logging.getLogger("streamops.supervision")

NEEDS_SOMEONE = ("unreadable", "held", "crash-loop", "crashed", "stalled", "output stopped", "lagging", "degraded",
                 "retention risk", "input lost")
# The state as a number for Prometheus (streamops_app_state): higher is worse, except that numbers
# once given never change (alert rules match them): "output stopped", added later, is 11.
STATE_NUMBERS = {"healthy": 0, "stopped": 1, "not deployed": 2, "in operation": 3, "degraded": 4, "lagging": 5,
                 "stalled": 6, "crashed": 7, "crash-loop": 8, "held": 9, "unreadable": 10, "output stopped": 11,
                 "retention risk": 12, "input lost": 13}
# Batches with input, each dropping records as late and none updating state, before a query's
# output counts as stopped (one such batch can be a burst of stragglers).
OUTPUT_STOPPED_BATCHES = 2
# Clock skew allowed between producers and the driver when a watermark is compared with now.
WATERMARK_SKEW_S = 60.0
WAY_BACK = ("Way back (docs/architecture.md \"Input contract\", event-time bounds): make sure the inputs' max_future bound "
            "is on, then rebuild the state with recover_rebuild_state (it reprocesses the retained input from earliest on "
            "a new checkpoint, the old one backed up; the bound dead-letters the record that moved the watermark; downstream "
            "readers see every window again), or put back a checkpoint backup from before it with recover_restore_checkpoint.")
RESTARTS = ("started", "failed")  # outcomes in restarts.jsonl of a restart attempt (others: "gave up")
WAY_OUT = ("If a record fails the query, skip it with recover_skip_records, or move past it with recover_reset_offsets "
           "(and, once fixed, re-deliver it with recover_replay_dead_letters); then start the app with "
           "recover_restart_app or deploy_apps, which resets the guard.")


def _words(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds < 2 * 31_557_600:
        return f"{seconds // 86400} days"
    return f"{seconds // 31_557_600} years"


@dataclass(frozen=True)
class RestartDecision:
    action: str  # restart | wait | give up | none
    attempt: int  # the restart this would be, counted within the guard's window
    reason: str
    backoff_s: float = 0.0
    not_before: str | None = None


def restart_decision(policy: SupervisionSpec, restarts: list[RestartEntry], since: str | None, now: datetime) -> RestartDecision:
    """Whether a crashed app is restarted now. `restarts`: the supervisor's earlier restarts (each
    with `at`); only those after `since` (the operator's last deploy/restart/stop) and within the
    window count, so an operator's action resets the guard."""
    if policy.restart == "never":
        return RestartDecision("none", 0, "its restart policy is never: an operator restarts it (recover_restart_app)")
    window_s = duration_ms(policy.restart_window) / 1000
    floor = _parse(since)

    def since_operator(entry: RestartEntry) -> datetime | None:
        moment = _parse(entry.get("at"))
        return moment if moment is not None and (floor is None or moment > floor) else None

    gave_up = [e for e in restarts if e.get("outcome") == "gave up" and since_operator(e)]
    if gave_up:  # the guard tripped: down until an operator acts, however long ago that was
        return RestartDecision("give up", 0, f"crash loop: the guard gave up at {gave_up[-1]['at']} after "
                               f"{gave_up[-1].get('restarts', '?')} restart(s) within {policy.restart_window} (its limit "
                               f"is {policy.max_restarts}): it stays down until an operator acts")
    counted = sorted(
        at for at in (since_operator(r) for r in restarts if r.get("outcome") in RESTARTS) if at is not None
         and (now - at).total_seconds() <= window_s
    )
    if len(counted) >= policy.max_restarts:
        return RestartDecision(
            "give up", len(counted) + 1,
            f"crash loop: restarted {len(counted)} time(s) within {policy.restart_window} (the guard's limit is "
            f"{policy.max_restarts}; the last at {iso_ms(counted[-1])}): it stays down until an operator acts")
    attempt = len(counted) + 1
    if not counted:
        return RestartDecision(
            "restart", attempt, f"restart {attempt} of at most {policy.max_restarts} within {policy.restart_window}"
        )
    backoff_s = min(duration_ms(policy.backoff_initial) / 1000 * 2 ** (attempt - 2), duration_ms(policy.backoff_max) / 1000)
    not_before = counted[-1] + timedelta(seconds=backoff_s)
    if now < not_before:
        return RestartDecision("wait", attempt, f"restart {attempt} waits for its backoff of {backoff_s:g}s: not before "
                               f"{iso_ms(not_before)}", backoff_s, iso_ms(not_before))
    return RestartDecision("restart", attempt, f"restart {attempt} of at most {policy.max_restarts} within "
                           f"{policy.restart_window}, after a backoff of {backoff_s:g}s", backoff_s, iso_ms(not_before))


@dataclass
class Health:
    app: str
    state: str
    evidence: str
    desired: DesiredState | None = None
    restarts_in_window: int = 0
    restarts_total: int = 0
    dead_letter_rate: float | None = None
    decision: RestartDecision | None = None
    action: str | None = None  # what the supervisor did this run
    status: AppStatus | None = field(default=None, repr=False)

    @property
    def needs_someone(self) -> bool:
        return self.state in NEEDS_SOMEONE

    @property
    def state_number(self) -> int:
        return STATE_NUMBERS[self.state]

    def line(self) -> str:
        return health_line(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {"app": self.app, "state": self.state, "evidence": self.evidence,
                "desired": self.desired.to_json() if self.desired else None,
                "restarts_in_window": self.restarts_in_window, "restarts_total": self.restarts_total,
                "dead_letter_rate": self.dead_letter_rate, "action": self.action,
                "decision": asdict(self.decision) if self.decision else None}


@dataclass
class Observation:
    """What the metrics and the apps page read of one app: its runtime folder, status, health and
    the dead letters ever written (its dead-letter topic's end offsets)."""

    runtime: AppRuntime
    status: AppStatus
    health: Health
    dead_letters_total: int
    drift: Any = None  # streamops.effective_spec.Drift (None: not asked for)


def observe(spec: AppSpec, kafka, catalog: Catalog | None = None, principal: str | None = None) -> Observation:
    """Read one app (raises when it cannot be read: callers report it as `unreadable`); with the
    `catalog`, its drift too (declared against running; `principal`: the one it would connect as)."""
    runtime = AppRuntime(spec.checkpoint_location())
    status = app_status(spec, kafka)
    health = evaluate(spec, status, runtime)
    dead_letters = sum(high for _, high in end_offsets(kafka, spec.dead_letter_topic).values())
    return Observation(runtime, status, health, dead_letters,
                       app_drift(catalog, spec.name, runtime, status, principal) if catalog is not None else None)


def app_drift(catalog: Catalog, name: str, runtime: AppRuntime, status: AppStatus, principal: str | None):
    """The app's drift; its own problem reading it is reported as drift "unknown", never raised
    (the app's health and figures still show)."""
    try:
        return drift(catalog, name, runtime, principal=principal, kafka_cluster=status.kafka_cluster)
    except Exception as exc:  # noqa: BLE001 - drift is one more view; it must not hide the others
        log.warning("%s: its drift could not be read: %s", name, exc)
        return Drift(name, "unknown", [], evidence=f"its drift could not be read: {type(exc).__name__}: {str(exc)[:300]}")


def desired_state(runtime: AppRuntime) -> DesiredState | None:
    """The recorded desired state; for an app deployed before it was recorded, inferred from its
    last driver (a recorded graceful stop: stopped; anything else: running)."""
    desired = runtime.desired()
    if desired:
        return desired
    record = runtime.driver()
    if record is None:
        return None
    stopped = record.stopped_at and record.outcome == "stopped"
    # driver.json's values are kept as the file has them: shown as text here.
    return DesiredState(state="stopped" if stopped else "running", by=None, run_id=_text(record.launched_by),
                        at=_text(record.started_at), version=_text(record.version), inferred=True)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _who(desired: DesiredState) -> str:
    if desired.inferred:
        return f"nobody on record: inferred from its last driver (run {desired.run_id or '?'}, started {desired.at or '?'})"
    by = desired.by or "unknown"
    return f"{by} (run {desired.run_id or '?'}) at {desired.at or '?'}"


def evaluate(spec: AppSpec, status: AppStatus, runtime: AppRuntime, now: datetime | None = None) -> Health:
    """The app's health state with its evidence (what an on-call engineer reads first)."""
    now = now or datetime.now(UTC)
    policy = spec.supervision
    desired = desired_state(runtime)
    restarts = runtime.restarts()
    started = [r for r in restarts if r.get("outcome") == "started"]
    health = Health(spec.name, "healthy", "", desired=desired, restarts_total=len(started), status=status)
    operation = runtime.operation()
    if status.state != "running" and operation:
        if operation.failed:
            backups = operation.backups
            health.state = "held"
            health.evidence = (f"{operation.what} (run {operation.run_id}) failed at {operation.failed_at} "
                               f"while changing it: {operation.error}. It is {status.state} now, and its checkpoint may "
                               "be half-changed, so the supervisor does not restart it. Read that run's log; "
                               + (f"it took the checkpoint backup(s) {', '.join(backups)}: recover_restore_checkpoint puts one "
                                  "back; " if backups else "it took no checkpoint backup; ")
                               + "an operator's start (deploy_apps, recover_restart_app), stop (stop_apps) or recovery "
                               "decides what happens next.")
        else:
            health.state = "in operation"
            health.evidence = f"{operation.what} by run {operation.run_id} since {operation.started_at}"
        return health
    if desired is None:
        health.state, health.evidence = "not deployed", "never started here"
        return health
    # Input deleted before it was read: every start would fail on it (failOnDataLoss), so no restart;
    # and input about to be: whether the app runs, crashed or was stopped on purpose.
    lost = lost_evidence(spec.name, status.runways)
    if lost:
        health.state, health.evidence = "input lost", lost
        return health
    risk = _retention_risk(spec, status, runtime, now)
    if status.state != "running":
        if desired.state == "stopped":
            health.state = "retention risk" if risk else "stopped"
            health.evidence = f"stopped on purpose by {_who(desired)}" + (
                f"; NOTE: {status.cluster_problem}" if status.cluster_problem else "") + (f"; {risk}" if risk else "")
            return health
        if status.cluster_problem:
            # A restart would fail the same way every time (or, worse, skip data): an operator decides.
            health.state = "held"
            health.evidence = f"{status.cluster_problem}. The supervisor does not start it."
            return health
        if desired.inferred:
            decision = RestartDecision("none", 0, "its desired state was never recorded (it was started before supervision): "
                                                  "the supervisor restarts it once deploy_apps or recover_restart_app has "
                                                  "started it, or stop it with stop_apps")
        else:
            decision = restart_decision(policy, restarts, desired.at, now)
        health.decision = decision
        health.restarts_in_window = max(decision.attempt - 1, 0)
        if status.state == "never started":
            evidence = (f"should be running (version {desired.version or spec.version}, asked for by {_who(desired)}) "
                        f"but no driver of it ever started: its start failed (see the log of run {desired.run_id}).")
        else:
            ended = status.reason or ("the driver died without recording a stop" if status.state == "crashed" else status.state)
            when = status.stopped_at or (
                f"heartbeat lost {status.heartbeat_age_s:.0f}s ago" if status.heartbeat_age_s else "unrecorded"
            )
            evidence = (f"should be running (version {desired.version or status.version}, asked for by {_who(desired)}) "
                        f"but its driver is {status.state} (pid {status.pid}, ended {when}): {ended}.")
        if status.state != "never started" and (history := driver_link(status.application_id)):
            jobs = [(batch, failed_batch_job(status.application_id, f"{spec.name}.{batch['query']}", number))
                    for batch in (runtime.driver() or DriverRecord()).failed_batches
                    if isinstance(number := batch.get("batch"), int)]
            for batch, job in jobs:
                if job:
                    evidence += f" The failed batch's job (query {batch['query']}, batch {batch['batch']}): {job}"
            evidence += f" Its Spark history (jobs, stages, executors): {history}"
        failed_restarts = [r for r in restarts if r.get("outcome") == "failed"]
        if failed_restarts and failed_restarts[-1] is restarts[-1]:
            last = failed_restarts[-1]
            evidence += f" The supervisor's last restart (run {last.get('run_id')}) failed: {str(last.get('error'))[:300]}."
        if decision.action == "give up":
            health.state = "crash-loop"
            health.evidence = f"{evidence} {decision.reason}. {WAY_OUT}"
        else:
            health.state = "crashed"
            health.evidence = f"{evidence} {decision.reason}."
        if risk:
            health.evidence += f" ALSO: {risk}"
        return health
    problems = ([("retention risk", risk)] if risk else []) + _running_problems(spec, status, now)
    rates = [w.dead_letters / w.input_rows for w in status.recent.values() if w.input_rows]
    if rates:
        health.dead_letter_rate = round(max(rates), 4)
    if problems:
        health.state = problems[0][0]
        health.evidence = " ".join(text for _, text in problems)
    else:
        health.evidence = (f"version {status.version}, last batch {_words(status.progress_age_s)} ago"
                           if status.progress_age_s is not None else f"version {status.version}, no batch yet")
        if desired.state == "stopped":
            health.evidence += f"; NOTE: running although stopped was asked for by {_who(desired)}"
    return health


def _retention_risk(spec: AppSpec, status: AppStatus, runtime: AppRuntime, now: datetime) -> str | None:
    """The retention-risk evidence when an input partition's runway is below the app's threshold."""
    if not any(r.runway_s is not None for r in status.runways):
        return None
    configured = spec.supervision.min_retention_runway
    best = max(minute_rates(runtime.rates(), now), default=0.0) or None
    limit, how = threshold_s(duration_ms(configured) / 1000 if configured else None, status.total_lag, best)
    return risk_evidence(spec.name, status.runways, limit, how)


def _running_problems(spec: AppSpec, status: AppStatus, now: datetime) -> list[tuple[str, str]]:
    policy = spec.supervision
    problems: list[tuple[str, str]] = []
    trigger_s = spec.commit_interval_ms() / 1000  # a real-time app commits every checkpoint interval
    stall_s = max(policy.stall_after_triggers * trigger_s, duration_ms(policy.stall_min) / 1000)
    # Per query: records waiting longer than the stall limit, and no batch of it (nor a report from
    # Spark that it had nothing to read) for that long. Records that arrived after an idle spell are
    # not a stall: they must have waited that long too (when their age could not be read, the
    # driver's last idle report or the query's last batch bounds it).
    stalled = []
    for query in sorted({p.query for p in status.lags}):
        waiting = sum(p.lag for p in status.lags if p.query == query)
        if not waiting:
            continue
        ages = [p.time_lag_s for p in status.lags if p.query == query and p.lag and p.time_lag_s is not None]
        marks = [m for m in (_parse((status.queries.get(query) or {}).get("published_at")), _parse(status.last_idle_at),
                             _parse(status.started_at)) if m is not None]
        if not marks:
            continue
        quiet_s = (now - max(marks)).total_seconds()
        if ages:
            quiet_s = min(quiet_s, max(ages))
        if quiet_s > stall_s:
            stalled.append((query, waiting, quiet_s, bool((status.queries.get(query) or {}).get("published_at"))))
    if stalled:
        beat = (f"; its driver's last heartbeat was {status.heartbeat_age_s:.0f}s ago (lease ttl {status.lease_ttl_s:.0f}s)"
                if status.heartbeat_age_s is not None and status.lease_ttl_s else "")
        batches = ", ".join(f"{q} #{b}" for q, b in sorted(status.batches.items())) or "none"
        which = "; ".join(f"query {q}: {'no completed batch' if had else 'no batch since it started'} for {_words(quiet)} "
                          f"while {waiting} record(s) wait" for q, waiting, quiet, had in stalled)
        interval = spec.real_time_interval() + " (real-time checkpoints)" if spec.real_time else spec.trigger
        problems.append(("stalled", f"{which} (stalled after {_words(stall_s)}: {policy.stall_after_triggers} trigger "
                                    f"intervals of {interval}, at least {policy.stall_min}); last batches {batches}{beat} "
                                    f"(driver pid {status.pid} on {status.driver_host or '?'})."))
    problems += _output_stopped(spec, status, now)
    oldest = status.max_time_lag_s
    limit_s = duration_ms(policy.max_time_lag) / 1000
    if oldest is not None and oldest > limit_s:
        worst = max((p for p in status.lags if p.time_lag_s is not None), key=lambda p: p.time_lag_s or 0)
        problems.append(("lagging", f"the oldest unprocessed record is {_words(oldest)} old (limit {policy.max_time_lag}), "
                                    f"on {worst.topic} partition {worst.partition} at offset {worst.processed_to}; "
                                    f"{status.total_lag} record(s) wait."))
    for query, window in sorted(status.recent.items()):
        rows, letters = window.input_rows, window.dead_letters
        if rows >= policy.dead_letter_min_records and letters / rows > policy.max_dead_letter_rate:
            problems.append(("degraded", f"query {query}: {letters} of the {rows} input record(s) of the last "
                                         f"{policy.health_window} ({window.batches} batch(es)) went to the dead-letter "
                                         f"topic {spec.dead_letter_topic} ({letters / rows:.1%}, "
                                         f"limit {policy.max_dead_letter_rate:.1%}, "
                                         f"judged from {policy.dead_letter_min_records} records)."))
    return problems


def _output_stopped(spec: AppSpec, status: AppStatus, now: datetime) -> list[tuple[str, str]]:
    """Stateful queries whose output stopped while input flows, with the evidence."""
    futures = [spec.contract(role).max_future for role in spec.inputs]
    bound_s = max((duration_ms(f) / 1000 for f in futures if f is not None), default=0.0)
    problems = []
    for query, window in sorted(status.recent.items()):
        if not window.stateful:
            continue
        watermark = _parse(window.watermark)
        ahead_s = (watermark - now).total_seconds() if watermark is not None else None
        # The newest batches with input that updated no state (since the last one that did).
        streak = []
        for batch in reversed([b for b in window.per_batch if b[0] > 0]):
            if batch[1]:
                break
            streak.append(batch)
        late_drops = sum(dropped for _, _, dropped in streak)
        # Every one of them dropped records as late (a batch of only dead letters, or of records
        # that never reach the state, updates nothing either, and is no evidence).
        all_late = len(streak) >= OUTPUT_STOPPED_BATCHES and all(dropped for _, _, dropped in streak)
        hijacked = ahead_s is not None and ahead_s > bound_s + WATERMARK_SKEW_S
        if not (all_late or hijacked):
            continue
        parts = []
        if all_late:
            parts.append(f"its last {len(streak)} batch(es) with input (within {spec.supervision.health_window}) read "
                         f"{sum(b[0] for b in streak)} record(s) and updated no state: all of them dropped as late "
                         f"({late_drops} late drop(s))")
        if ahead_s is not None:
            where = f"{_words(ahead_s)} ahead of now" if ahead_s > 0 else f"{_words(-ahead_s)} behind now"
            parts.append(f"its watermark is {window.watermark}, {where}"
                         + (f" (the inputs' event-time bound allows {_words(bound_s)} ahead, "
                            f"and {WATERMARK_SKEW_S:g}s of clock skew)"
                            if hijacked else ""))
        problems.append(("output stopped", f"query {query}: " + "; ".join(parts) + f": its output stopped. {WAY_BACK}"))
    return problems


def driver_exits(catalog: Catalog) -> dict[str, dict[str, Any]]:
    """Apps whose driver is known to have ended while the app should run: its exit recorded as a
    failure, its process gone from this host, or its heartbeat expired (a driver elsewhere). Per
    app, the driver it was (pid, host, start) and how it ended: what the driver-exit trigger
    fires on (streamops.triggers), a change at a time. Local files only: cheap to poll."""
    exits: dict[str, dict[str, Any]] = {}
    for name in catalog.app_names():
        spec = catalog.app(name)
        if spec.supervision.restart == "never":
            continue
        runtime = AppRuntime(spec.checkpoint_location())
        try:
            state = runtime.state()
            if state not in ("crashed", "failed") or runtime.operation():
                continue
            desired = desired_state(runtime)
            record = runtime.driver()
        except Exception as exc:  # noqa: BLE001 - one app's unreadable files must not blind the watch over the others
            log.debug("driver exits: %s not readable: %s", name, exc)
            continue
        if not desired or desired.state != "running" or desired.inferred or record is None:
            continue
        exits[name] = {"app": name, "state": state, "pid": record.pid, "host": record.driver_host,
                       "lease_epoch": record.lease_epoch, "started_at": record.started_at, "stopped_at": record.stopped_at,
                       "reason": (record.reason or "")[:300]}
    return exits


def unreadable(app: str, error: BaseException) -> Health:
    """The health of an app whose status could not be read: it needs someone, and says why."""
    return Health(app, "unreadable", f"its status could not be read: {type(error).__name__}: {str(error)[:500]}",
                  status=AppStatus(app=app, state="unknown"))


# --- acting ---------------------------------------------------------------------------------------

Start = Callable[[str, dict, "str | None"], Any]  # (version, spark_conf, expected digest) -> Launch


def act(spec: AppSpec, health: Health, runtime: AppRuntime, *, run_id: str, start: Start, restarts_on: bool = True,
        audit: Callable[..., Any] | None = None, log: Callable[[str], None] = print) -> None:
    """The supervisor's part for one app: restart it when it is crashed and its decision says so
    (from its checkpoint, with the version, Spark conf and code it last ran; each attempt is
    recorded, a failed start too, and counts for the guard), or record once that the guard gave
    up. Audits what it did and sets health.action."""
    decision = health.decision
    if decision is None:
        return
    if health.state == "crash-loop":
        if decision.attempt:  # the limit was reached just now: it stays down from here on
            runtime.record_restart({"at": now_iso(), "run_id": run_id, "outcome": "gave up",
                                    "restarts": decision.attempt - 1, "after": health.status.reason if health.status else None})
            health.action = "left it down (crash-loop guard)"
            if audit:
                audit(spec.name, "gave up", summary=decision.reason)
            log(f"{spec.name}: {health.action}: {decision.reason}")
        return
    if health.state != "crashed" or decision.action in ("none", "give up"):
        return
    if not restarts_on:
        health.action = "restarts are off for this run (the run's 'Restart crashed apps' switch)"
        return
    if decision.action == "wait":
        health.action = decision.reason
        return
    record = runtime.driver() or DriverRecord()
    version = record.launched_version or (health.desired.version if health.desired else None) or spec.version
    spark_conf = record.launched_spark_conf
    digest = record.artifact_digest
    if problem := protocol_problem(spec, str(version)):
        # A restart could never start (and each try would take a checkpoint backup): held instead.
        health.state = "held"
        health.evidence = (f"{health.evidence} It is not restarted: {problem} The supervisor does not start it; "
                           "roll_restart_apps to a rebuilt version (there is no rollback from this one), or stop_apps.").strip()
        health.action = "held: its version cannot run on this platform's driver"
        log(f"{spec.name}: {health.action}")
        return
    entry = RestartAttempt(at=now_iso(), run_id=run_id, attempt=decision.attempt, backoff_s=decision.backoff_s,
                           not_before=decision.not_before, version=str(version),
                           after=health.status.reason if health.status else None)
    try:
        runtime.begin_operation(run_id, "supervisor restart")
    except OperationInProgress as exc:  # a DAG run began changing it since the status was read
        health.action = f"not restarted: {exc}"
        return
    try:
        result = restart_from_checkpoint(spec, version, spark_conf, lambda v, c: start(v, c, digest),
                                         label="before-supervisor-restart")
    except BaseException as exc:  # recorded (it counts for the guard), audited, reported
        runtime.record_restart({**entry, "outcome": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]})
        if not isinstance(exc, Exception):  # the task is being ended: recorded, and on its way
            raise
        health.action = f"restart {decision.attempt} failed: {type(exc).__name__}: {str(exc)[:500]}"
        if audit:
            audit(spec.name, "failed", error=health.action, restart=entry)
        log(f"{spec.name}: {health.action}")
        return
    finally:
        runtime.end_operation(run_id)
    runtime.record_restart({**entry, "outcome": "started", "pid": result["pid"], "backup": result.get("backup")})
    health.restarts_total += 1
    health.action = (f"restarted it ({decision.reason}): driver pid {result['pid']}, version {version}"
                     + (f", checkpoint backed up to {result['backup']}" if result.get("backup") else ""))
    if audit:
        audit(spec.name, "done", summary=health.action, restart=entry, result=result)
    log(f"{spec.name}: {health.action}")


def health_line(health: dict[str, Any]) -> str:
    """One app's health in a line (Health.to_dict(), as the status task hands it on)."""
    return f"{health['app']}: {health['state'].upper()}: {health['evidence']}" + (
        f" Supervisor: {health['action']}." if health.get("action") else "")


def attention_message(healths: list[dict[str, Any]]) -> str | None:
    """The status run's failure: the apps that need someone, then one line each (None: none does)."""
    needing = [h for h in healths if h["state"] in NEEDS_SOMEONE]
    if not needing:
        return None
    head = f"{len(needing)} streaming app(s) need attention: " + ", ".join(f"{h['app']} ({h['state']})" for h in needing)
    return "\n".join([head, *(f"- {health_line(h)}" for h in needing)])


def health_table(healths: list[Health]) -> str:
    from tabulate import tabulate

    rows = [[h.app, h.state, h.restarts_total, (h.evidence[:160] + "...") if len(h.evidence) > 160 else h.evidence]
            for h in healths]
    return tabulate(rows, headers=["app", "health", "restarts", "evidence"])
