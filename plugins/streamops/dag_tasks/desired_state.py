"""Tasks of the reconcile_desired_state DAG: plan -> roll the auto apps -> approve -> roll the
approved ones -> verify. The planning is streamops.desired_state's; each roll is roll_restart_apps'
(warm standby, plan check, health gate, rollback)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

from streamops.app_runtime import AppRuntime
from streamops.catalog import Catalog, load_catalog
from streamops.dag_tasks import apps as steps
from streamops.dag_tasks import audited_step, is_dry_run
from streamops.dag_tasks.approval import check_approved
from streamops.dag_tasks.apps import selected
from streamops.dag_tasks.connections import kafka_connection
from streamops.dag_tasks.launching import AppLauncher
from streamops.desired_state import SyncItem, SyncPlan, plan_sync, record_roll_outcome
from streamops.effective_spec import drift
from streamops.kafka_client import app_principal
from streamops.refusals import Refused
from streamops.rollout import state_check

log = logging.getLogger(__name__)


def plan(context: Mapping[str, Any]) -> dict:
    """The reconcile plan of every chosen app (all when none is chosen), logged as a table, with the
    catalog edit of every app that runs approved changes the catalog does not say."""
    def make_plan() -> dict:
        catalog = load_catalog()
        names = selected(catalog, context["params"].get("apps") or None)
        on_demand = getattr(context["dag_run"], "run_type", None) == "manual"
        kafka = kafka_connection()
        the_plan = plan_sync(catalog, names, principal_of=app_principal, kafka_cluster=kafka.cluster_id(),
                             state_check_of=partial(_state_check, catalog, context["run_id"]), on_demand=on_demand)
        log.info("%s\n%s", the_plan.summary, the_plan.table)
        for item in the_plan.items:
            if item.catalog_edit:
                log.info("%s runs approved changes the catalog does not say yet; this edit makes the catalog agree:\n%s",
                         item.app, item.catalog_edit)
        return the_plan.to_json()

    return audited_step(context, "plan", make_plan)


def _state_check(catalog: Catalog, run_id: str, app: str, version: str, spark_conf: dict[str, str]) -> list[str] | None:
    """Why the roll's new driver could not restart from the app's checkpoint, as Spark judges it on
    a copy (its --check-state); None: it could not be judged."""
    try:
        return state_check(AppLauncher.of(catalog, app, run_id).command(version, spark_conf))
    except Refused as exc:
        log.warning("%s: version %s with the catalog's values could not be checked against the checkpoint: %s",
                    app, version, exc)
        return None


def apply(context: Mapping[str, Any], planned: dict, policy: str) -> list[dict]:
    """Roll the plan's apps of `policy` one after the other (the next only after this one passed its
    gate); auto runs without an approval, approve only after the run's Approve. Each roll audited."""
    from airflow.sdk.exceptions import AirflowSkipException

    the_plan = SyncPlan.from_json(planned)
    items = the_plan.rolls(policy)
    if not items:
        raise AirflowSkipException(f"No {policy} roll in this plan.")
    if is_dry_run(context["params"]):
        raise AirflowSkipException("Dry run: nothing was changed. The plan is in the 'plan' task's log.")
    if policy == "approve":
        check_approved(context)
    params, run_id = context["params"], context["run_id"]
    catalog = load_catalog(check_programs=False)

    def roll(item: SyncItem) -> dict:
        runtime = AppRuntime(catalog.app(item.app).checkpoint_location())
        try:
            rolled = steps.roll(
                item.app, item.version, item.spark_conf, params["gate_deadline_s"], params["max_dead_letter_rate"], run_id
            )
        except Exception as exc:
            record_roll_outcome(runtime, item, run_id, str(exc))
            raise
        record_roll_outcome(runtime, item, run_id, None)
        return rolled

    return [audited_step(context, "roll", partial(roll, item), app=item.app, operation=True) for item in items]


def verify(context: Mapping[str, Any], planned: dict, rolled_results: list[dict]) -> dict:
    """Every app this run rolled (`rolled_results`: the roll tasks' results) runs what the catalog
    says now (approved changes aside)."""
    from airflow.sdk.exceptions import AirflowFailException

    the_plan = SyncPlan.from_json(planned)
    done = {r.get("app") for r in rolled_results if isinstance(r, dict)}
    rolled: list[SyncItem] = [i for i in the_plan.items if i.applied and i.app in done]
    if is_dry_run(context["params"]) or not rolled:
        return {"summary": "nothing was rolled", "apps": {}}
    catalog, cluster = load_catalog(), kafka_connection().cluster_id()
    outcome, left = {}, []
    for item in rolled:
        now = drift(catalog, item.app, AppRuntime(catalog.app(item.app).checkpoint_location()),
                    principal=app_principal(item.app), kafka_cluster=cluster)
        ours = [f for f in now.fields if f.cause == "catalog"]
        outcome[item.app] = now.to_dict()
        log.info("%s", now.line())
        if ours:
            left.append(f"{item.app}: {now.line()}")
    if left:
        raise AirflowFailException("Not in line with the catalog after the roll:\n" + "\n".join(left))
    return {"summary": "every rolled app runs what the catalog says: " + ", ".join(
        f"{app} {'in sync' if not d['fields'] else 'in sync but for approved changes'}" for app, d in outcome.items()),
        "apps": outcome}
