"""The code behind each DAG's tasks. DAG files only wire these together.

These functions run inside Airflow tasks, so they take what they need (hooks, params) as
arguments and return JSON-friendly dicts for XCom; they never touch the metadata database.

A refusal (streamops.refusals.Refused) becomes a task failure in one place, `task_failure`: a
`RefusalFailure`, Airflow's failure without retries that carries the refusal, its text the one the
operator reads. Whoever later asks whether a failure was a refusal (the step runner's audit, the
app's operation marker: `is_refusal`) asks its type, never its text. (Airflow's exceptions are
imported at the top for that class: every process that imports this package, a DAG file's parse
or a task, has loaded the Airflow SDK already.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from streamops.app_runtime import AppRuntime
from streamops.audit import AuditTrail, acting_as, audit_file
from streamops.catalog import SUPERVISOR_EVERY_S, load_catalog, supervisor_mode
from streamops.checkpoints import list_backups
from streamops.refusals import OneLineRefused, Refused
from streamops.triggers import DRIVER_EXITS_ASSET, DriverExitTrigger

if TYPE_CHECKING:
    from airflow.sdk import Param

T = TypeVar("T")
P = ParamSpec("P")


# Every DAG's tasks: owned by the platform team, their return values not dumped into their logs
# (each step logs its own summary; the value is its XCom), no retries unless a DAG asks for them.
DEFAULT_ARGS: dict[str, Any] = {"owner": "data-platform", "show_return_value_in_logs": False, "retries": 0}


def one_run_at_a_time(**default_args: Any) -> dict[str, Any]:
    """@dag settings of a DAG that changes things: one run at a time (two runs must never change the
    same thing at once), no catch-up of missed intervals, DEFAULT_ARGS with `default_args` over them.
    The DAG file still says its schedule itself."""
    return {"catchup": False, "max_active_runs": 1, "default_args": {**DEFAULT_ARGS, **default_args}}


def supervisor_schedule() -> Any:
    """app_status's schedule ($STREAMOPS_SUPERVISOR, streamops.catalog.supervisor_mode): every 2
    minutes and whenever the driver-exit watcher fires (scheduled), only when it fires (events), or
    none (manual). The watcher's trigger (streamops.triggers) runs in the triggerer."""
    from datetime import timedelta

    from airflow.sdk import Asset, AssetWatcher
    from airflow.timetables.assets import AssetOrTimeSchedule
    from airflow.timetables.trigger import DeltaTriggerTimetable

    mode = supervisor_mode()
    if mode == "manual":
        return None
    exits = Asset(DRIVER_EXITS_ASSET, watchers=[AssetWatcher(name="driver_exits", trigger=DriverExitTrigger())])
    if mode == "events":
        return [exits]
    # (Airflow annotates `assets` with its serialized asset type; the SDK's Asset is what it documents.)
    return AssetOrTimeSchedule(timetable=DeltaTriggerTimetable(timedelta(seconds=SUPERVISOR_EVERY_S)),
                               assets=[exits])  # type: ignore[list-item]


def triggering_apps(context: Mapping[str, Any]) -> list[str]:
    """The apps named by the driver-exit events that started this run (none for a timed or manual run)."""
    apps: list[str] = []
    for asset, events in (context.get("triggering_asset_events") or {}).items():
        if getattr(asset, "name", None) != DRIVER_EXITS_ASSET:
            continue
        for event in events:
            payload = (event.extra or {}).get("payload") or {}
            app = payload.get("app")
            if isinstance(app, str) and app not in apps:
                apps.append(app)
    return apps


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


def apps_param(names: list[str], *, required: bool, description: str) -> Param:
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


def checked_number(value: T, what: str, low: float, high: float, *, whole: bool = True) -> T:
    """`value`, or a task failure without retries naming the param and its bounds."""
    problem = number_problem(value, what, low, high, whole=whole)
    if problem:
        raise task_failure(OneLineRefused(problem))
    return value


def is_dry_run(params: Mapping[str, Any]) -> bool:
    """Fail safe: anything but an explicit False (a form's switch turned off) is a dry run."""
    return params.get("dry_run", True) is not False


def trail(context: Mapping[str, Any]) -> AuditTrail:
    """The audit trail of the running DAG run: its DAG, run, triggering user and params."""
    dag_run = context["dag_run"]
    user = getattr(dag_run, "triggering_user_name", None) or "unknown"
    return AuditTrail(dag_run.dag_id, dag_run.run_id, user, dict(context["params"]))


# --- refusals: the one place one becomes a task failure -----------------------------------------


class RefusalFailure(AirflowFailException):
    """A task failed by a refusal (`refusal`): no retries, since asking again gets the same answer.
    Made by `task_failure` only."""

    def __init__(self, text: str, refusal: Refused):
        super().__init__(text)
        self.refusal = refusal

    def serialize(self) -> tuple[str, tuple[str], dict[str, Any]]:
        """Stored by Airflow (or pickled) as the plain failure it is to Airflow, with the same text:
        the refusal stays in the process that raised it."""
        return f"{AirflowFailException.__module__}.{AirflowFailException.__name__}", (str(self),), {}

    def __reduce__(self) -> tuple[type[AirflowFailException], tuple[str]]:
        return AirflowFailException, (str(self),)


def task_failure(refusal: Refused, dag_id: str | None = None) -> RefusalFailure:
    """The task failure a refusal (streamops.refusals.Refused) becomes: no retries, its text as the
    operator reads it ("refused: ...", or its own heading), after the DAG's id where the step
    runner knows it."""
    return RefusalFailure(f"{dag_id}: {refusal.operator_text()}" if dag_id else refusal.operator_text(), refusal)


@contextmanager
def refusals_fail_the_task() -> Iterator[None]:
    """A block whose refusals fail the task through `task_failure` (other errors pass unchanged)."""
    try:
        yield
    except Refused as exc:
        raise task_failure(exc) from None


def refusals_fail(function: Callable[P, T]) -> Callable[P, T]:
    """`function`, with its refusals failing the task (refusals_fail_the_task): for task code called
    directly by a DAG's task."""
    import functools

    @functools.wraps(function)
    def failing_on_refusal(*args: P.args, **kwargs: P.kwargs) -> T:
        with refusals_fail_the_task():
            return function(*args, **kwargs)

    return failing_on_refusal


def is_refusal(exc: BaseException) -> bool:
    """A refusal (nothing was changed) rather than a failure, by its type: a Refused
    (OperationInProgress among them), or the task failure one became (`task_failure`). Whatever
    its text says ("[Errno 111] Connection refused" is a failure)."""
    return isinstance(exc, (Refused, RefusalFailure))


@contextmanager
def operating_on(app_name: object, run_id: str, what: str, *, hold_on_failure: bool = True) -> Iterator[None]:
    """A block in which the app is marked as being changed by this run (_runtime/operation.json):
    the supervisor leaves it alone, and two runs never change one app at once (the second is
    refused, naming the first: OperationInProgress). An operator's run may take over the marker of
    a run that failed. If the block fails (not a refusal before any snapshot, not a dry run's
    skip) and leaves the app down, the marker stays, marked failed, with the backups the run took:
    the app is "held" until an operator's start, stop or recovery, because the supervisor must not
    restart a half-changed app. Without `hold_on_failure` (a deploy or a stop: a failed one changes
    no checkpoint) it simply ends."""
    checkpoint = _checkpoint_of(app_name)
    if checkpoint is None:
        yield
        return
    runtime = AppRuntime(checkpoint)
    taken_over = runtime.begin_operation(run_id, what, over_failed=True)
    backups_before = set(list_backups(checkpoint))
    try:
        yield
    except AirflowSkipException:
        runtime.end_operation(run_id, restore=taken_over)
        raise
    except BaseException as exc:
        # A refusal changed nothing, unless it came after the run took a snapshot (a start refused
        # after the checkpoint was put back, say): that is a failure of a half-changed app.
        if is_refusal(exc) and not set(list_backups(checkpoint)) - backups_before:
            runtime.end_operation(run_id, restore=taken_over)
        elif runtime.is_running() or not hold_on_failure:  # e.g. a roll that rolled back: the app runs, nothing held
            runtime.end_operation(run_id)
        else:
            runtime.fail_operation(run_id, f"{type(exc).__name__}: {exc}", state_after=runtime.state(),
                                   backups=sorted(str(p) for p in set(list_backups(checkpoint)) - backups_before))
        raise
    runtime.end_operation(run_id)


def _checkpoint_of(app_name: object) -> str | None:
    """The checkpoint of a catalog app (None for anything that is not one: the step refuses it)."""
    catalog = load_catalog(check_programs=False)
    if not isinstance(app_name, str) or app_name not in catalog.app_names():
        return None
    return catalog.app(app_name).checkpoint_location()


def _snapshots(app_name: object) -> set[str]:
    """The app's checkpoint snapshots now (none for a name the catalog does not know)."""
    checkpoint = _checkpoint_of(app_name)
    return {str(p) for p in list_backups(checkpoint)} if checkpoint else set()


def audited_step(context: Mapping[str, Any], step: str, action: Callable[[], T], *, app: str | None = None,
                 operation: bool = False, hold_on_failure: bool = True, plan_outcome: str = "planned",
                 applies_plan: bool = False) -> T:
    """Run one step of a mutating DAG: the one runner every such step goes through.

    Its outcome is written to the audit log whatever it is: planned (`plan_outcome`; on a dry run
    "planned (dry run: nothing changed)"), done (with what changed), skipped (a dry run's apply),
    refused, failed; with the checkpoint snapshots a step that changes the app took. A refusal fails
    the task without retries (`task_failure`); a failure after a snapshot was taken (a refusal then
    too: something may have changed) fails it without retries, naming the snapshot and the DAG that
    puts it back; any other failure goes on unchanged (the task's retries decide). With
    `operation`, the app is marked as being changed meanwhile (operating_on, `hold_on_failure`
    passed on) and its snapshots are watched. `app` defaults to the run's "app" param. A step
    that `applies_plan` passes the approval gate first (release_apply: a dry run is skipped, an
    unapproved plan refused), before the app is marked."""
    from contextlib import AbstractContextManager, nullcontext

    audit = trail(context)
    subject = app if app is not None else audit.params.get("app")
    watched = subject if operation else None  # only a step that changes the app owns its new snapshots
    before: set[str] = set()
    try:
        before = _snapshots(watched)
        if applies_plan:
            from streamops.dag_tasks.approval import release_apply

            release_apply(context)
        marked: AbstractContextManager[None] = (
            operating_on(subject, audit.run_id, f"{audit.dag_id} {step}", hold_on_failure=hold_on_failure)
            if operation else nullcontext())
        with acting_as(audit.user, audit.run_id), marked:
            result = action()
    except AirflowSkipException as exc:
        audit.write(step, "skipped", app=app, summary=str(exc))
        raise
    except Exception as exc:
        taken = sorted(_snapshots(watched) - before)
        if is_refusal(exc) and not taken:
            audit.write(step, "refused", app=app, error=str(exc))
            if isinstance(exc, Refused):
                raise task_failure(exc, audit.dag_id) from None
            raise
        error = str(exc) if isinstance(exc, AirflowFailException) else f"{type(exc).__name__}: {exc}"
        audit.write(step, "failed", app=app, error=error, snapshots_taken=taken)
        if taken:
            raise AirflowFailException(f"{step} failed: {exc}\nThe checkpoint was backed up before the failure: "
                                       f"{', '.join(taken)}; recover_restore_checkpoint puts it back.") from exc
        raise
    dry_plan = step == "plan" and is_dry_run(context["params"])
    outcome = "planned (dry run: nothing changed)" if dry_plan else plan_outcome if step == "plan" else "done"
    summary = _summary_of(result)
    audit.write(step, outcome, app=app, summary=summary, result=result, snapshots_taken=sorted(_snapshots(watched) - before))
    # The task log ends with what happened in a line (return values are not dumped into logs:
    # show_return_value_in_logs is off; the whole value is the task's XCom).
    logging.getLogger("streamops.audit").info("%s %s: %s%s (audit log %s)", audit.dag_id, step, outcome,
                                               f": {summary}" if summary else "", audit_file())
    return result


def _summary_of(result: object) -> str:
    """What changed, in a line: the result's own summary, a text result, or its JSON cut short."""
    import json

    if isinstance(result, str):
        return result
    if isinstance(result, dict) and isinstance(summary := result.get("summary"), str):
        return summary
    text = json.dumps(result, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:297] + "..."
