"""Who may do what: the suite's roles, declared once, and which plans need a second person.

Four roles. The stacks create them in Airflow's FAB auth manager (streamops.local_stack.fab_roles
turns each into FAB permissions, the DAG-level ones on each of the suite's DAGs among them:
`dag_permissions`), and the suite's own pages check them (`PAGES`, streamops.ui_auth):

    viewer    the apps page, Data Docs, DAG runs and their task logs; triggers nothing
    operator  triggers every suite DAG (deploy, stop, roll, status, validate, reprocess, the
              recovery plans) and reads the driver logs and metrics; approves nothing
    approver  approves or rejects the plans of others; triggers nothing
    admin     everything, users and connections included (FAB's own Admin role)

Four eyes: a plan that can lose or repeat data (`four_eyes_reason`) is applied only after an
Approve by someone who did not trigger the run, checked by the apply itself
(streamops.dag_tasks.approval.check_approved), whatever the UI allowed. The catalog's
`approvals.unattended_in` may let the `local` environment apply such a plan with no approval at
all ('Wait for approval' off: one person on a laptop, the test runs); never a self-approval.

No Airflow import here: the DAG tasks read the four-eyes rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamops.plans import PlanMismatch
from streamops.provisioning import ProvisioningPlan

# The suite's pages (streamops.ui_auth checks them): FAB resource names, each with can_read.
APPS_PAGE = "StreamOps Apps"  # the apps page and its JSON
DRIVER_LOGS = "StreamOps Driver Logs"  # a driver's log, which quotes records and configs
DATA_DOCS = "StreamOps Data Docs"  # GX's site: sample keys and values of failed expectations
METRICS = "StreamOps Metrics"  # /streamops/metrics (Prometheus reads it with its own token)
MESSAGES = "StreamOps Messages"  # the message browser: records of the catalog's topics
# Not a page: who sees what the catalog marks sensitive (topics[].sensitive_fields, sensitive_key)
# unmasked in the message browser.
SENSITIVE_DATA = "StreamOps Sensitive Data"
PAGES = (APPS_PAGE, DRIVER_LOGS, DATA_DOCS, METRICS, MESSAGES, SENSITIVE_DATA)

# What a role may do with the suite's DAGs.
READ, TRIGGER, APPROVE = "read", "trigger", "approve"


@dataclass(frozen=True)
class Role:
    name: str  # the role's name in the auth manager
    description: str
    pages: frozenset[str]
    dags: frozenset[str]  # READ, TRIGGER, APPROVE
    # FAB's built-in role whose permissions this one has entirely (admin: FAB's Admin itself).
    fab_builtin: str | None = None


VIEWER = Role("viewer", "Sees the apps page, Data Docs, the topics' records (sensitive fields masked), DAG runs and "
              "their logs; triggers nothing.", frozenset({APPS_PAGE, DATA_DOCS, MESSAGES}), frozenset({READ}))
OPERATOR = Role("operator", "Deploys, stops, rolls and recovers apps, runs validations and reprocessing; "
                "cannot approve a plan.", frozenset(PAGES), frozenset({READ, TRIGGER}))
APPROVER = Role("approver", "Approves or rejects the plans others triggered; triggers nothing.",
                frozenset(PAGES), frozenset({READ, APPROVE}))
ADMIN = Role("Admin", "Everything, users and connections included.", frozenset(PAGES),
             frozenset({READ, TRIGGER, APPROVE}), fab_builtin="Admin")
ROLES: dict[str, Role] = {"viewer": VIEWER, "operator": OPERATOR, "approver": APPROVER, "admin": ADMIN}


def roles_allowed(page: str) -> list[str]:
    """The roles that may open `page` (for an error message)."""
    return [key for key, role in ROLES.items() if page in role.pages]


# The suite's DAGs (dags/<id>.py; a test checks the two agree): what READ, TRIGGER and APPROVE
# grant is granted on each of them, DAG by DAG, not on every DAG of the Airflow.
SUITE_DAGS = (
    "app_status", "deploy_apps", "provision_topics", "reconcile_desired_state", "reconcile_stateful_apps",
    "recover_extend_retention", "recover_rebuild_state", "recover_replay_dead_letters", "recover_reset_offsets",
    "recover_restart_app", "recover_restore_checkpoint", "recover_skip_records", "reprocess", "roll_restart_apps",
    "snapshot_checkpoints", "stop_apps", "validate_topic_quality",
)


def dag_permissions(role: Role) -> set[tuple[str, str]]:
    """The role's DAG-level permissions, as FAB names them ((action, "DAG:<id>" or "DAG Run:<id>")):
    read for every role; edit (pause, clear, answer its approvals: Airflow checks it beside the
    approval permission) for those who trigger or approve; creating runs for those who trigger.
    Airflow 3 deprecates a DAG file's own `access_control`: they are the roles', here."""
    granted: set[tuple[str, str]] = set()
    for dag_id in SUITE_DAGS:
        granted |= {("can_read", f"DAG:{dag_id}"), ("can_read", f"DAG Run:{dag_id}")}
        if role.dags & {TRIGGER, APPROVE}:
            granted.add(("can_edit", f"DAG:{dag_id}"))
        if TRIGGER in role.dags:
            granted.add(("can_create", f"DAG Run:{dag_id}"))
    return granted


# --- four eyes ------------------------------------------------------------------------------------

# The DAGs whose apply can lose or repeat data, whatever their params: why, as the refusal says it.
FOUR_EYES_DAGS: dict[str, str] = {
    "recover_reset_offsets": "moving an app's input position skips or repeats records",
    "recover_skip_records": "skipped records are never processed",
    "recover_restore_checkpoint": "a restored checkpoint repeats the output written since the snapshot",
    "recover_rebuild_state": "a rebuilt state re-emits what the app had already emitted",
}


def four_eyes_reason(dag_id: str, params: Mapping[str, Any], plan: Any = None) -> str | None:
    """Why this run's plan needs an approver who is not its requester (None: it does not). `plan`:
    the plan task's XCom (a provisioning plan says itself what it could delete)."""
    if dag_id in FOUR_EYES_DAGS:
        return FOUR_EYES_DAGS[dag_id]
    if dag_id == "reprocess" and params.get("cutover") is True:
        return "a cutover moves the live app to new topics: their readers see the reprocessed records again"
    if dag_id == "provision_topics" and isinstance(plan, Mapping):
        risks = provisioning_risks(plan)
        return "it can delete records sooner: " + "; ".join(risks) if risks else None
    return None


def provisioning_risks(plan: Mapping[str, Any]) -> list[str]:
    """A provisioning plan's data-loss risks, worked out again from its changes (not taken from the
    XCom's own list); a plan that cannot be read counts as risky."""
    try:
        return ProvisioningPlan.from_json(plan).data_loss_risks()
    except PlanMismatch as exc:
        return [f"the plan cannot be read ({exc})"]
