"""Trigger-form fields the recovery DAGs share. The JSON schema checks them in the form and for
API triggers; the recovery code checks them again (a name is never a path or a command)."""

from __future__ import annotations

# Names only: no path separators, no shell metacharacters, no spaces.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"


def app_param(names: list[str]):
    from airflow.sdk import Param

    # A catalog without apps still parses (the plan then refuses: there is nothing to recover).
    extra = {"enum": names} if names else {"pattern": NAME_PATTERN}
    return Param(names[0] if names else "", type="string", title="App", description="The streaming app, from the catalog.", **extra)


def dry_run_param():
    from airflow.sdk import Param

    return Param(True, type="boolean", title="Dry run",
                 description="Only show the plan (the 'plan' task's log). Turn off to apply it.")


def verify_deadline_param(default: int = 300):
    from airflow.sdk import Param

    return Param(default, type="integer", minimum=30, maximum=7200, title="Verify deadline (s)",
                 description="How long the verify step waits for the app to make progress.")
