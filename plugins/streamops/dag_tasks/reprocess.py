"""Tasks of the reprocess DAG: plan -> run -> validate."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from streamops import settings
from streamops.acls import grant_app
from streamops.app_runtime import AppRuntime
from streamops.audit import acting_user
from streamops.catalog import load_catalog
from streamops.dag_tasks import refusals_fail
from streamops.dag_tasks.connections import spark_session
from streamops.dag_tasks.launching import AppLauncher
from streamops.downstream import PlanEffect, impact_or_note
from streamops.effective_spec import approve_topics, drift, effective_catalog
from streamops.kafka_client import KafkaClientConfig, app_connection
from streamops.launch_overrides import LaunchOverrideRefused, checked_version, required_version
from streamops.paths import RUN_DIR
from streamops.plans import PlanMismatch
from streamops.quality.ranges import whole_topics
from streamops.refusals import OneLineRefused
from streamops.reprocess import (
    TAG_PATTERN,
    VERSION_SUFFIX_PATTERN,
    ReprocessFailed,
    ReprocessPlan,
    ReprocessRefused,
    ReprocessRequest,
    ReprocessResult,
    plan_reprocess,
    run_reprocess,
    target_catalog,
    target_topics,
)
from streamops.reprocess import cutover as hand_over
from streamops.spark_submit import SparkTarget

log = logging.getLogger(__name__)


def work_root() -> Path:
    """Reprocessing runs keep their checkpoint, catalog and measured rate here."""
    return Path(settings.REPROCESS_ROOT.get() or RUN_DIR / "reprocess")


def measured_rate(app: str) -> float | None:
    """records/s of the app's last reprocessing run on this deployment, if any."""
    ledger = work_root() / "runs.jsonl"
    if not ledger.exists():
        return None
    rates = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    rates = [r["rate"] for r in rates if r["app"] == app and r.get("rate")]
    return rates[-1] if rates else None


# Tags the suite's own runs use (the nightly reconciliation): not for an operator's run.
RESERVED_TAG_PREFIXES = ("recon-",)


@refusals_fail
def plan(admin, kafka: KafkaClientConfig, params: dict) -> dict:
    request = ReprocessRequest(
        app=params["app"], start=params["start"], end=params["end"], target=params["target"],
        version=params.get("version") or "v2", tag=params.get("tag") or "", cutover=params.get("cutover") is True,
        program_version=checked_version(params.get("program_version"), "program_version") or "",
    )
    the_plan = plan_reprocess(admin, kafka, app_catalog(request.app), request, measured_rate=measured_rate(request.app))
    tag = the_plan.request["tag"]
    problems = []
    if tag.startswith(RESERVED_TAG_PREFIXES):
        problems.append(
            f"tag {tag!r}: tags starting with {', '.join(RESERVED_TAG_PREFIXES)} belong to the nightly reconciliation"
        )
    if (work_root() / the_plan.app / tag).exists():
        # Its checkpoint would be resumed, not started at the planned offsets.
        problems.append(f"a reprocessing run tagged {tag!r} of {the_plan.app} already exists "
                        f"({work_root() / the_plan.app / tag}): choose another tag (or leave it empty for a timestamp)")
    if problems:
        raise ReprocessRefused(problems)
    log.info("Reprocessing plan for %s:\n%s", the_plan.app, the_plan.table())
    result = {**the_plan.to_json(), "summary": the_plan.summary()}
    if request.cutover:  # the readers of the live topics: after it, nothing more arrives there
        catalog = app_catalog(request.app)
        moved = ", ".join(sorted(t for live, t in the_plan.targets.items() if live in catalog.app(request.app).outputs.values()))
        impact = impact_or_note(kafka, admin, catalog, catalog.app(request.app), PlanEffect(moved_to=f"{moved}"))
        log.info("What the readers of %s's outputs see:\n%s", the_plan.app, "\n".join(impact.lines()))
        result["downstream"] = impact.to_json()
        result["summary"] += f"; {impact.summary()}"
    return result


@refusals_fail
def checked_plan(plan_json: dict) -> tuple[ReprocessPlan, Path]:
    """The plan another task handed over (XCom), checked again before it names folders, topics
    and a command: its tag and version by the form's patterns, its targets as they follow from
    its request. Returns it with the run's folder."""
    the_plan = ReprocessPlan.from_json(plan_json)
    request = the_plan.request
    problems = []
    try:
        app = app_catalog(the_plan.app).app(the_plan.app)
    except KeyError as exc:
        raise OneLineRefused(f"the plan names {exc.args[0]}") from None
    if not isinstance(request.get("tag"), str) or not re.fullmatch(TAG_PATTERN, request["tag"]):
        problems.append(f"tag {request.get('tag')!r} is not 1-40 lowercase letters, digits or '-'")
    if request.get("target") not in ("versioned", "scratch"):
        problems.append(f"target {request.get('target')!r} is not versioned or scratch")
    if request.get("target") == "versioned" and not re.fullmatch(VERSION_SUFFIX_PATTERN, str(request.get("version"))):
        problems.append(f"version {request.get('version')!r} does not look like v2")
    try:
        checked_version(the_plan.program_version or None, "program version")
    except LaunchOverrideRefused as exc:
        problems.append(str(exc))
    if the_plan.program_digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", str(the_plan.program_digest)):
        problems.append(f"program digest {the_plan.program_digest!r} is not a sha256 digest")
    if not problems and the_plan.targets != target_topics(app, request["target"], request["version"], request["tag"]):
        problems.append("its targets are not the topics its request names")
    if problems:
        raise PlanMismatch(problems)
    return the_plan, work_root() / the_plan.app / request["tag"]


def run(plan_json: dict, run_id: str, kafka: KafkaClientConfig, admin, spark: SparkTarget) -> dict:
    from airflow.sdk.exceptions import AirflowFailException

    the_plan, work_dir = checked_plan(plan_json)
    if the_plan.records == 0:
        log.warning("The planned range holds no records: the targets are created empty.")
    log.info("Running version %s of %s (%s); driver log %s", the_plan.program_version, the_plan.app,
             the_plan.program_digest or "installed code", work_dir / "driver.log")
    try:
        result = run_reprocess(kafka, admin, app_catalog(the_plan.app), the_plan, work_dir, spark=spark, launched_by=run_id)
    except ReprocessFailed as exc:
        raise AirflowFailException(str(exc)) from None
    log.info("Reprocessed %s", result.summary())
    ledger = work_root() / "runs.jsonl"
    with ledger.open("a") as out:
        out.write(json.dumps({"app": result.app, "run_id": run_id, "records": result.records_in,
                              "seconds": round(result.seconds, 3), "rate": round(result.rate, 1)}) + "\n")
    return {"summary": result.summary(), "records_in": result.records_in, "records_out": result.records_out,
            "dead_letters": result.dead_letters, "seconds": result.seconds, "rate": result.rate,
            "checkpoint": result.checkpoint, "catalog_file": result.catalog_file, "targets": the_plan.targets}


def validate(plan_json: dict, run_id: str, kafka: KafkaClientConfig, admin, spark_master: str) -> list[dict]:
    """The targets, whole, through the validate DAG's code and the live topics' suites."""
    from airflow.sdk.exceptions import AirflowFailException

    from streamops.quality.validate import QualityCheckFailed, raise_on_failures, validate_topics

    the_plan, _ = checked_plan(plan_json)
    catalog = target_catalog(app_catalog(the_plan.app), the_plan.app, the_plan.targets)
    topics = [t for t in the_plan.targets.values() if catalog.topic(t).expectation_suite]
    ranges = whole_topics(admin, topics)
    spark = spark_session("streamops-reprocess", spark_master)
    code = f"sha256 {the_plan.program_digest.removeprefix('sha256:')[:12]}" if the_plan.program_digest else "installed"
    outcomes = validate_topics(spark, kafka, admin, catalog, ranges, run_id,
                               written_by={the_plan.app: f"{the_plan.program_version} {code} (backfill)"})
    try:
        raise_on_failures(outcomes)
    except QualityCheckFailed as exc:
        raise AirflowFailException(str(exc)) from None
    return [o.to_json() for o in outcomes]


def cutover(plan_json: dict, ran: dict, run_id: str, kafka: KafkaClientConfig) -> dict:
    """Hand the live app over to the backfill's targets and checkpoint; say what to change next.
    The new topics become an approved change of the app (streamops.effective_spec): every later
    launch (a supervisor's restart, a roll, a restore) keeps them until the catalog says them."""
    the_plan, work_dir = checked_plan(plan_json)
    launcher = AppLauncher.of(load_catalog(), the_plan.app, run_id)
    catalog = effective_catalog(launcher.catalog, the_plan.app)
    live = catalog.app(the_plan.app)
    runtime = AppRuntime(live.checkpoint_location())
    # The run's folder keeps the catalog the backfill ran with, for review (made again from the
    # reviewed one, never read back: anyone could have edited the copy in the folder).
    catalog_file = work_dir / "catalog.yaml"
    catalog_file.write_text(target_catalog(catalog, the_plan.app, the_plan.targets).to_yaml())
    granted = _grant_new_topics(load_catalog(catalog_file), the_plan.app, kafka)
    # The app goes on as it last ran (version and Spark conf from its launch record, checked like a
    # trigger's), with semantic-version build metadata naming the topics' version (one '+').
    running, spark_conf = launcher.last_launch()
    version = required_version(f"{running}{'.' if '+' in running else '+'}{the_plan.request['version']}")
    # Checked before anything stops: the code that wrote the backfill's checkpoint (the plan refuses
    # a cutover of another version), the launch's conf, the cluster.
    launcher.command(version, spark_conf, expected_digest=the_plan.program_digest)

    def start_on_new_topics():
        # The checkpoint now belongs to the new topics: from here on every launch must run on them.
        approve_topics(runtime, dict(the_plan.targets), run_id=run_id, by=acting_user())
        return launcher.launch(version, spark_conf, expected_digest=the_plan.program_digest)

    result = ReprocessResult(the_plan.app, ran["records_in"], ran["records_out"], ran["dead_letters"], ran["seconds"],
                             str(work_dir / "checkpoint"), str(catalog_file))
    outcome = hand_over(live, result, start_on_new_topics, requested_by=run_id)
    old = list(the_plan.targets)
    pending = drift(launcher.catalog, the_plan.app, runtime, principal=app_connection(the_plan.app).principal,
                    kafka_cluster=kafka.cluster_id(next(iter(live.inputs.values()))))
    edit = pending.catalog_edit or "(none: the catalog already names them)"
    log.info(
        "Cutover done: %s (%s) now runs as version %s (pid %s) from the backfill's checkpoint, writing to %s.\n"
        "The old topics are kept, untouched: %s.\nThe old checkpoint is kept at %s.\n"
        "Every later launch of %s (the supervisor's restarts, rolls, restores) keeps the new topics: they are an approved "
        "change, recorded in %s. Until the catalog names them, drift shows \"the catalog still names ...\".\n"
        "Make the catalog agree with this edit:\n%s",
        the_plan.app, outcome["stopped"], version, outcome["pid"], ", ".join(the_plan.targets.values()), ", ".join(old),
        outcome["backup"], the_plan.app, runtime.dir / "approved.json", edit,
    )
    return {**outcome, "version": version, "catalog_file": str(catalog_file), "old_topics": old,
            "new_topics": list(the_plan.targets.values()), "acls_granted": granted, "catalog_edit": pending.catalog_edit}


def app_catalog(app_name: str):
    """The catalog as `app_name` runs it (its approved topic bindings applied): a reprocess plans,
    runs and validates the live app's current outputs, whatever an earlier cutover moved them to."""
    return effective_catalog(load_catalog(), app_name)


def _grant_new_topics(targeted_catalog, app: str, kafka: KafkaClientConfig) -> list[str]:
    """On a secured cluster the app's driver connects as its own principal, whose ACLs name the
    catalog's topics, not the backfill's: grant it the new ones (the suite's connection does) before
    anything stops. Refused here, nothing has changed; a cluster without an authorizer needs none."""
    from confluent_kafka import KafkaError, KafkaException

    principal = app_connection(app).principal
    if not principal:
        return []
    try:
        granted = grant_app(kafka.admin(), targeted_catalog, app, f"User:{principal}")
    except KafkaException as exc:
        if exc.args and isinstance(exc.args[0], KafkaError) and exc.args[0].code() == KafkaError.SECURITY_DISABLED:
            return []
        raise OneLineRefused(
            f"the cutover would start {app} on its new topics as User:{principal}, and the ACLs it needs there could not be "
            f"created with {kafka.describe()} ({exc}); grant them (terraform/ derives them from the catalog), then run the "
            "cutover again. Nothing was stopped.") from None
    for line in granted:
        log.info("Cutover: %s", line)
    return granted
