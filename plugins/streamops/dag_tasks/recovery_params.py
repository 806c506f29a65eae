"""Trigger-form fields the recovery DAGs share. The JSON schema checks them in the form and for
API triggers; the recovery code checks them again (a name is never a path or a command)."""

from __future__ import annotations

from streamops.dag_tasks import number_problem
from streamops.dag_tasks.approval import APPROVE_PARAM, approval_param
from streamops.kafka_offsets import BACK, EARLIEST, NOW, TIME, moment_pattern

# Names only: no path separators, no shell metacharacters, no spaces.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"


def app_param(names: list[str]):
    from airflow.sdk import Param

    # A catalog without apps still parses (the plan then refuses: there is nothing to recover).
    extra = {"enum": names} if names else {"pattern": NAME_PATTERN}
    return Param(
        names[0] if names else "",
        type="string",
        title="App",
        description="The streaming app, from the catalog.",
        **extra,
    )


def dry_run_param():
    from airflow.sdk import Param

    return Param(False, type="boolean", title="Dry run",
                 description="Only show the plan (the 'plan' task's log); change nothing. Off: the plan is shown "
                             "for approval, then applied.")


VERIFY_DEADLINE_S = (30, 7200)


def verify_deadline_param(default: int = 300):
    from airflow.sdk import Param

    low, high = VERIFY_DEADLINE_S
    return Param(default, type="integer", minimum=low, maximum=high, title="Verify deadline (s)",
                 description="How long the verify step waits for the app to make progress.")


def recovery_form(app_names: list[str], fields: dict | None = None, *, verify_deadline_s: int | None = 300) -> dict:
    """A recovery DAG's trigger form: the app, dry run and approval first, then the DAG's own
    `fields`, then the verify deadline (None: the DAG has no verify wait)."""
    form = {"app": app_param(app_names), "dry_run": dry_run_param(), APPROVE_PARAM: approval_param(), **(fields or {})}
    if verify_deadline_s is not None:
        form["verify_deadline_s"] = verify_deadline_param(verify_deadline_s)
    return form


def shared_param_problems(params: dict) -> list[str]:
    """The shared fields' bounds checked in code (a plan refuses before anything is changed)."""
    problem = (
        number_problem(params["verify_deadline_s"], "verify_deadline_s", *VERIFY_DEADLINE_S)
        if "verify_deadline_s" in params else None
    )
    return [problem] if problem else []


def range_start_param(description: str):
    """Where a time range starts: earliest, a bounded duration back, or a time from 1970 to 2999."""
    from airflow.sdk import Param

    return Param("earliest", type="string", minLength=1, maxLength=64, pattern=moment_pattern({EARLIEST, BACK, TIME}),
                 title="Start", description=description)


def range_end_param(description: str):
    """Where a time range ends: now, or a time from 1970 to 2999."""
    from airflow.sdk import Param

    return Param("now", type="string", minLength=1, maxLength=64, pattern=moment_pattern({NOW, TIME}),
                 title="End", description=description)
