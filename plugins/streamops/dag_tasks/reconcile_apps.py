"""Tasks of the reconcile_stateful_apps DAG: per app, recompute into scratch topics, compare the
closed windows with the live output, delete the scratch topics."""

from __future__ import annotations

import logging

from streamops.catalog import Catalog, load_catalog
from streamops.dag_tasks import checked_number, refusals_fail
from streamops.dag_tasks.connections import spark_session
from streamops.dag_tasks.reprocess import work_root
from streamops.effective_spec import effective_catalog
from streamops.kafka_client import KafkaClientConfig
from streamops.launch_overrides import checked_version
from streamops.reconciliation import compare_windows, delete_scratch_topics, window_outputs
from streamops.reprocess import ReprocessRequest, plan_reprocess, run_reprocess, target_catalog
from streamops.spark_submit import SparkTarget
from streamops.timestamps import run_tag, utc_now

log = logging.getLogger(__name__)


def stateful_app_names(catalog: Catalog) -> list[str]:
    names: list[str] = []
    for app, _role in window_outputs(catalog):
        if app.name not in names:
            names.append(app.name)
    return names


@refusals_fail
def reconcile_app(app_name: str, run_id: str, kafka: KafkaClientConfig, admin, spark: SparkTarget, max_mismatch_ratio: float,
                  program_version: str | None = None) -> dict:
    """Recompute from earliest into scratch topics, compare, clean up; fail above the threshold."""
    from airflow.sdk.exceptions import AirflowFailException

    checked_number(max_mismatch_ratio, "max_mismatch_ratio", 0, 1, whole=False)
    program_version = checked_version(program_version, "program_version")
    # The live app's outputs as it runs them (a cutover's approved topics included).
    catalog = effective_catalog(load_catalog(), app_name)
    app = catalog.app(app_name)
    tag = "recon-" + run_tag(utc_now())
    # The version running live is recomputed (ReprocessRequest's default): its output is compared.
    plan = plan_reprocess(admin, kafka, catalog, ReprocessRequest(app=app_name, target="scratch", tag=tag,
                                                                  program_version=program_version or ""))
    log.info("Recomputing %s from the earliest offsets into scratch topics:\n%s", app_name, plan.table())
    comparisons = []
    try:
        # The backfill's driver first: a session held here would hold cores it may need.
        result = run_reprocess(kafka, admin, catalog, plan, work_root() / app_name / tag, spark=spark,
                               launched_by=run_id)
        log.info("Recomputed %s", result.summary())
        session = spark_session("streamops-reconcile", spark.master)
        scratch = target_catalog(catalog, app_name, plan.targets)
        for _app, role in [(a, r) for a, r in window_outputs(catalog) if a.name == app_name]:
            comparison = compare_windows(session, kafka, admin, catalog, app, role, plan.targets[app.outputs[role]], scratch)
            log.info("%s%s", comparison.summary(), "".join(f"\n    {e}" for e in comparison.examples))
            comparisons.append(comparison)
    finally:
        deleted = delete_scratch_topics(admin, list(plan.targets.values()))
        log.info("Deleted the scratch topics of this run: %s", ", ".join(deleted) or "none")
    over = [c for c in comparisons if c.mismatch_ratio > max_mismatch_ratio]
    if over:
        lines = [f"{c.summary()}: {c.mismatch_ratio:.2%} mismatched, over the {max_mismatch_ratio:.2%} threshold"
                 + "".join(f"\n    {e}" for e in c.examples) for c in over]
        raise AirflowFailException("Live output does not match the recomputation:\n" + "\n".join(lines))
    return {"app": app_name, "comparisons": [c.to_json() for c in comparisons]}
