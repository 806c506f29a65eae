"""The code behind each DAG's tasks. DAG files only wire these together.

These functions run inside Airflow tasks, so they take what they need (hooks, params) as
arguments and return JSON-friendly dicts for XCom; they never touch the metadata database.
"""

import logging
from contextlib import contextmanager


def runbook(dag_file: str) -> str:
    """The runbook of the DAG defined in `dag_file` (pass `__file__`), its doc in the Airflow UI
    (doc_md): the markdown file docs/<dag file's name>.md beside it, the one place it is written
    (the README links it). Found next to the DAG file, wherever the DAGs folder is deployed. A
    missing file fails the DAG's import, naming the file."""
    from pathlib import Path

    dag = Path(dag_file).resolve()
    path = dag.parent / "docs" / f"{dag.stem}.md"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"the runbook of DAG {dag.stem!r} is missing: {path} "
                                "(each DAG's doc in the UI is docs/<dag_id>.md beside its DAG file)") from None


def apps_param(names: list[str], *, required: bool, description: str):
    """The "Apps" multi-select of a trigger form, its choices taken from the catalog. A required
    one starts empty: the operator picks the apps (Trigger stays disabled until then); nothing
    is pre-selected for a start, stop or roll."""
    from airflow.sdk import Param

    if required:
        return Param([], type="array", items={"type": "string", "enum": names}, minItems=1,
                     uniqueItems=True, examples=names, title="Apps", description=description)
    return Param([], type=["array", "null"], items={"type": "string", "enum": names}, uniqueItems=True,
                 examples=names, title="Apps", description=description)


def number_problem(value: object, what: str, low: float, high: float, *, whole: bool = True) -> str | None:
    """Why a numeric param is out of its bounds (None: it is within). The form's schema has the
    same bounds; this is the check for callers that bypass the form."""
    import math

    kinds = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or (isinstance(value, float) and math.isnan(value)) \
            or not low <= value <= high:
        return f"{what} must be a {'whole ' if whole else ''}number from {low:g} to {high:g}, got {value!r}"
    return None


def checked_number(value: object, what: str, low: float, high: float, *, whole: bool = True):
    """`value`, or a task failure without retries naming the param and its bounds."""
    from airflow.sdk.exceptions import AirflowFailException

    problem = number_problem(value, what, low, high, whole=whole)
    if problem:
        raise AirflowFailException(f"refused: {problem}")
    return value


def is_dry_run(params: dict) -> bool:
    """Fail safe: anything but an explicit False (a form's switch turned off) is a dry run."""
    return params.get("dry_run", True) is not False


def trail(context):
    """The audit trail of the running DAG run: its DAG, run, triggering user and params."""
    from streamops.audit import AuditTrail

    dag_run = context["dag_run"]
    user = getattr(dag_run, "triggering_user_name", None) or "unknown"
    return AuditTrail(dag_run.dag_id, dag_run.run_id, user, dict(context["params"]))


def is_refusal(exc: BaseException) -> bool:
    """A refusal (nothing was changed) rather than a failure: RecoveryRefused, OperationInProgress,
    or a task failure whose message opens with "... refused:" ("refused: ...", "rolling restart
    refused: ..."). ("[Errno 111] Connection refused" is a failure.)"""
    import re

    from streamops.app_runtime import OperationInProgress
    from streamops.recovery.common import RecoveryRefused

    return isinstance(exc, (RecoveryRefused, OperationInProgress)) or bool(re.match(r"[A-Za-z ]*\brefused\b[A-Za-z ]*:", str(exc)))


@contextmanager
def operating_on(app_name: object, run_id: str, what: str, *, hold_on_failure: bool = True):
    """A block in which the app is marked as being changed by this run (_runtime/operation.json):
    the supervisor leaves it alone, and two runs never change one app at once (the second is
    refused, naming the first). An operator's run may take over the marker of a run that failed.
    If the block fails (not a refusal, not a dry run's skip) and leaves the app down, the marker
    stays, marked failed, with the backups the run took: the app is "held" until an operator's
    start, stop or recovery, because the supervisor must not restart a half-changed app. Without
    `hold_on_failure` (a deploy or a stop: a failed one changes no checkpoint) it simply ends."""
    from airflow.sdk.exceptions import AirflowSkipException

    from streamops.app_runtime import AppRuntime, OperationInProgress
    from streamops.catalog import load_catalog
    from streamops.recovery.common import RecoveryRefused
    from streamops.checkpoints import list_backups

    catalog = load_catalog(check_programs=False)
    if not isinstance(app_name, str) or app_name not in catalog.app_names():
        yield
        return
    checkpoint = catalog.app(app_name).checkpoint_location()
    runtime = AppRuntime(checkpoint)
    try:
        taken_over = runtime.begin_operation(run_id, what, over_failed=True)
    except OperationInProgress as exc:
        raise RecoveryRefused([str(exc)]) from None
    backups_before = set(list_backups(checkpoint))
    try:
        yield
    except AirflowSkipException:
        runtime.end_operation(run_id, restore=taken_over)
        raise
    except BaseException as exc:
        if is_refusal(exc):
            runtime.end_operation(run_id, restore=taken_over)
        elif runtime.is_running() or not hold_on_failure:  # e.g. a roll that rolled back: the app runs, nothing held
            runtime.end_operation(run_id)
        else:
            runtime.fail_operation(run_id, f"{type(exc).__name__}: {exc}", state_after=runtime.state(),
                                   backups=sorted(str(p) for p in set(list_backups(checkpoint)) - backups_before))
        raise
    runtime.end_operation(run_id)


def audited_step(context, step: str, action, *, app: str | None = None, operation: bool = False,
                 hold_on_failure: bool = True):
    """Run one step of a mutating DAG and write its outcome to the audit log, whatever it is:
    planned / done (with what changed), skipped (a dry run's apply), refused, failed. The
    exception goes on unchanged, so the task fails as it would have. With `operation`, the app
    is marked as being changed meanwhile (operating_on, `hold_on_failure` passed on)."""
    from contextlib import nullcontext

    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from streamops.audit import acting_as
    from streamops.recovery.common import RecoveryRefused

    audit = trail(context)
    try:
        marked = (operating_on(app, audit.run_id, f"{audit.dag_id} {step}", hold_on_failure=hold_on_failure) if operation
                  else nullcontext())
        with acting_as(audit.user, audit.run_id), marked:
            result = action()
    except AirflowSkipException as exc:
        audit.write(step, "skipped", app=app, summary=str(exc))
        raise
    except RecoveryRefused as exc:  # another run is changing the app
        audit.write(step, "refused", app=app, error=str(exc))
        raise AirflowFailException(f"{audit.dag_id}: {exc}") from None
    except AirflowFailException as exc:
        audit.write(step, "refused" if is_refusal(exc) else "failed", app=app, error=str(exc))
        raise
    except Exception as exc:
        audit.write(step, "failed", app=app, error=f"{type(exc).__name__}: {exc}")
        raise
    outcome = "planned (dry run: nothing changed)" if step == "plan" and is_dry_run(context["params"]) else \
        "planned" if step == "plan" else "done"
    summary = _summary_of(result)
    audit.write(step, outcome, app=app, summary=summary, result=result)
    # The task log ends with what happened in a line (return values are not dumped into logs:
    # show_return_value_in_logs is off; the whole value is the task's XCom).
    logging.getLogger("streamops.audit").info("%s %s: %s%s", audit.dag_id, step, outcome,
                                               f": {summary}" if summary else "")
    return result


def _summary_of(result) -> str:
    """What changed, in a line: the result's own summary, a text result, or its JSON cut short."""
    import json

    if isinstance(result, str):
        return result
    if isinstance(result, dict) and isinstance(result.get("summary"), str):
        return result["summary"]
    text = json.dumps(result, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:297] + "..."
