"""The runner of every plan -> approve -> apply -> verify DAG: a DAG is a row (a `Procedure`) that
says what its three steps do; this module does the rest, the same way for each.

    plan     check the shared params, make the plan, log it as a table, hand it on as JSON (XCom)
             with its one-line summary; a dry run ends here
    approve  the plan shown for approval (PlanApproval), unless the run asked for none
    apply    the gate (release_apply: a dry run is skipped, an unapproved plan refused), then the
             plan read back from that JSON (Plan.from_json: what runs is what was shown), applied
             with the app marked as being changed (operating_on)
    verify   wait for the outcome the apply promised

Every step runs through `audited_step`: audited whatever its outcome, a refusal failing the task
without retries in that one place. The procedures themselves (the recoveries) are in
streamops.dag_tasks.recovery; their logic in streamops.recovery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from streamops.catalog import Catalog, load_catalog
from streamops.dag_tasks import audited_step, trail
from streamops.dag_tasks.approval import PlanApproval
from streamops.dag_tasks.connections import admin_client, kafka_connection, spark_session, spark_target
from streamops.dag_tasks.launching import AppLauncher
from streamops.dag_tasks.recovery_params import shared_param_problems
from streamops.downstream import DownstreamImpact, PlanEffect, impact_or_note
from streamops.kafka_client import KafkaClientConfig
from streamops.plans import AppPlan
from streamops.recovery.common import RecoveryRefused
from streamops.spark_submit import SparkTarget

log = logging.getLogger(__name__)

Result = dict[str, Any]


class Step:
    """What a procedure's step works with: the run's params and id, who triggered it, the plan
    task's XCom (`handed`: the plan's JSON and what the plan task added), and the clients of the
    Airflow connections, each made when first asked for."""

    def __init__(self, context: Mapping[str, Any], handed: Mapping[str, Any] | None = None):
        self.context = context
        self.params: Mapping[str, Any] = context["params"]
        self.run_id: str = context["run_id"]
        self.user: str = trail(context).user
        self.handed: Mapping[str, Any] = handed or {}

    @cached_property
    def catalog(self) -> Catalog:
        """The catalog, read once per step: what the step calls is handed it, or the app resolved in it."""
        return load_catalog()

    def app(self, app_name: str) -> AppLauncher:
        """The app `app_name` of this step's catalog, launched and stopped on behalf of this run."""
        return AppLauncher.of(self.catalog, app_name, self.run_id)

    @property
    def verify_deadline_s(self) -> float:
        return float(self.params["verify_deadline_s"])

    @cached_property
    def kafka(self) -> KafkaClientConfig:
        return kafka_connection()

    @cached_property
    def admin(self) -> Any:
        return admin_client()

    @cached_property
    def spark_target(self) -> SparkTarget:
        return spark_target()

    @property
    def spark_master(self) -> str:
        return self.spark_target.master

    @cached_property
    def spark(self) -> Any:
        return spark_session("streamops-recovery", self.spark_master)


@dataclass(frozen=True)
class Procedure:
    """One plan -> approve -> apply -> verify DAG as a row of a table."""

    name: str  # the plan as the approval page and the log call it: "restart plan"
    plan_type: type[AppPlan]  # the Plan the apply and verify read back from the plan task's JSON
    plan: Callable[[Step], AppPlan]
    apply: Callable[[Step, Any], Result]  # (step, plan) -> what changed, with a "summary"
    verify: Callable[[Step, Any, Result], Result]  # (step, plan, what the apply returned) -> outcome, with a "summary"
    # More the plan task hands on beside the plan (e.g. a rebuild's reprocessing plan).
    handed_on: Callable[[Step, Any], Result] | None = None
    # What the plan does to the app's input (streamops.downstream.PlanEffect): what the readers of
    # the app's outputs see is worked out from it and shown with the plan.
    effect: Callable[[Any], PlanEffect] | None = None


def downstream_of(step: Step, app: str, effect: PlanEffect) -> DownstreamImpact:
    """The plan's impact on the consumer groups reading the app's outputs. A cluster that cannot
    say (a group listing refused, a broker away) is said in the impact, never a failed plan: the
    recovery still has to happen."""
    return impact_or_note(step.kafka, step.admin, step.catalog, step.catalog.app(app), effect)


def plan_step(procedure: Procedure, context: Mapping[str, Any]) -> Result:
    step = Step(context)

    def make_plan() -> Result:
        problems = shared_param_problems(dict(step.params))
        if problems:
            raise RecoveryRefused(problems)
        plan = procedure.plan(step)
        log.info("%s for %s:\n%s", procedure.name[0].upper() + procedure.name[1:], plan.app, plan.table())
        result = {**plan.to_json(), "summary": plan.summary(),
                  **(procedure.handed_on(step, plan) if procedure.handed_on else {})}
        if procedure.effect is not None:
            impact = downstream_of(step, plan.app, procedure.effect(plan))
            log.info("What the readers of %s's outputs see:\n%s", plan.app, "\n".join(impact.lines()))
            result["downstream"] = impact.to_json()
            result["summary"] += f"; {impact.summary()}"
        return result

    # The recovery DAGs have always audited a plan that was made as "done".
    return audited_step(context, "plan", make_plan, plan_outcome="done")


def apply_step(procedure: Procedure, context: Mapping[str, Any], planned: Result) -> Result:
    step = Step(context, planned)

    def apply_plan() -> Result:
        result = procedure.apply(step, procedure.plan_type.from_json(planned))
        log.info("%s", result["summary"])
        return result

    return audited_step(context, "apply", apply_plan, operation=True, applies_plan=True)


def verify_step(procedure: Procedure, context: Mapping[str, Any], planned: Result, applied: Result) -> Result:
    step = Step(context, planned)

    def verify_outcome() -> Result:
        result = procedure.verify(step, procedure.plan_type.from_json(planned), applied)
        log.info("%s", result["summary"])
        return result

    return audited_step(context, "verify", verify_outcome)


def plan_apply_verify(procedure: Procedure) -> None:
    """The tasks of a procedure's DAG, called inside its @dag function: plan >> approve >> apply,
    then verify. Task ids: plan, approve, apply, verify."""
    from airflow.sdk import get_current_context, task

    # The tasks take their upstream XComs (the plan's JSON, the apply's result): Any here, since
    # wiring passes them as XComArgs.
    @task(task_id="plan")
    def plan() -> Result:
        return plan_step(procedure, get_current_context())

    # none_failed: runs after an approval that was not needed (skipped); a Reject skips it directly.
    @task(task_id="apply", trigger_rule="none_failed")
    def apply(planned: Any) -> Result:
        return apply_step(procedure, get_current_context(), planned)

    @task(task_id="verify")
    def verify(planned: Any, applied: Any) -> Result:
        return verify_step(procedure, get_current_context(), planned, applied)

    planned = plan()
    applied = apply(planned)
    planned >> PlanApproval(what=procedure.name) >> applied
    verify(planned, applied)
