"""Tasks of the provision_topics DAG: plan -> apply -> verify."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka.admin import AdminClient
from tabulate import tabulate

from streamops.catalog import load_catalog
from streamops.provisioning import (
    ProvisioningError,
    ProvisioningPlan,
    apply_plan,
    describe_broker,
    plan_topics,
    select_topics,
    verify,
)

log = logging.getLogger(__name__)

def plan(admin: AdminClient, topics: Sequence[str] | None) -> dict:
    """Compare the catalog with the broker; log the plan as a table and return it for XCom."""
    catalog = load_catalog()
    specs = select_topics(catalog, topics)
    snapshot = describe_broker(admin, [spec.name for spec in specs])
    result = plan_topics(specs, snapshot, report_unmanaged=not topics)
    scope = f"{len(specs)} selected topic(s)" if topics else f"all {len(specs)} catalog topics"
    log.info("Provisioning plan for %s (%s):\n%s", scope, result.summary(), result.table())
    for refused in result.refused:
        log.warning("REFUSED %s: %s", refused.topic, "; ".join(refused.refusals))
    risks = result.data_loss_risks()
    for risk in risks:
        log.warning("Can delete records sooner (an approver other than the requester must approve): %s", risk)
    return {"summary": result.summary(), "table": result.table(), "data_loss_risks": risks, **result.to_json()}


def apply(admin: AdminClient, plan_xcom: dict) -> dict:
    """Apply the changes of a plan returned by `plan`; raise if any topic failed."""
    the_plan = ProvisioningPlan.from_json(plan_xcom)
    if not the_plan.to_change:
        log.info("Nothing to apply: every selected topic already matches the catalog.")
    results = apply_plan(admin, the_plan)
    rows = [[r.topic, ", ".join(r.applied) or "-", r.error or "ok"] for r in results]
    rows += [[p.topic, "untouched", "refused: " + "; ".join(p.refusals)] for p in the_plan.refused]
    if rows:
        log.info("Apply results:\n%s", tabulate(rows, headers=["topic", "applied", "outcome"]))
    failed = [r for r in results if r.error]
    if failed:
        raise ProvisioningError(
            f"{len(failed)} topic(s) could not be changed (the others were applied):\n"
            + "\n".join(f"  - {r.topic}: {r.error}" for r in failed)
        )
    return {
        "applied": {r.topic: r.applied for r in results},
        "refused": {p.topic: p.refusals for p in the_plan.refused},
    }


def check(admin: AdminClient, topics: Sequence[str] | None) -> dict:
    """Describe the topics again and fail unless the broker matches the catalog."""
    specs = select_topics(load_catalog(), topics)
    snapshot = verify(admin, specs)
    rows = [
        [t.name, t.partitions, t.replication_factor, ", ".join(f"{k}={t.configs[k]}" for k in sorted(t.overridden))]
        for t in (snapshot.topics[spec.name] for spec in specs)
    ]
    log.info(
        "The broker matches the catalog for %d topic(s):\n%s",
        len(specs),
        tabulate(rows, headers=["topic", "partitions", "replication", "topic configs"]),
    )
    return {
        t.name: {"partitions": t.partitions, "replication_factor": t.replication_factor}
        for t in snapshot.topics.values()
    }
