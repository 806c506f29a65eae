"""The plan -> apply -> verify runner (streamops.dag_tasks.procedures) and the one step runner
under it (audited_step), on a procedure written here: what is audited, what a refusal, a dry run,
a failure after a snapshot and a tampered plan do. No broker, Spark or Airflow run: the steps are
called with a task's context as Airflow hands it over. Through real DAG runs: tests/test_recovery.py."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from streamops.app_runtime import AppRuntime
from streamops.audit import read_audit
from streamops.catalog import load_catalog
from streamops.checkpoints import backup_checkpoint, list_backups
from streamops.dag_tasks import RefusalFailure, audited_step, is_refusal, refusals_fail, task_failure
from streamops.dag_tasks.procedures import Procedure, apply_step, plan_step, verify_step
from streamops.dag_tasks.recovery import PROCEDURES
from streamops.plans import JsonPlan
from streamops.recovery.common import RecoveryRefused
from streamops.refusals import OneLineRefused

APP = "oplog-router"


@dataclass
class NotePlan(JsonPlan):
    app: str
    note: str
    DERIVED = ("length",)

    @property
    def length(self) -> int:
        return len(self.note)

    def table(self) -> str:
        return f"note\n----\n{self.note}"

    def summary(self) -> str:
        return f"write {self.note!r}"


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A checkpoint root and an audit log of the test's own; the project catalog's apps."""
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("STREAMOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    checkpoint = Path(load_catalog(check_programs=False).app(APP).checkpoint_location())
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text("v1\n{}\n")
    return checkpoint


def context(run_id: str = "manual__1", **params) -> dict:
    params = {"app": APP, "dry_run": False, "approve_in_ui": False, "verify_deadline_s": 300, **params}
    return {"dag_run": SimpleNamespace(dag_id="recover_test", run_id=run_id, triggering_user_name="erin"),
            "params": params, "run_id": run_id}


def procedure(**steps) -> Procedure:
    return Procedure(**{
        "name": "note plan", "plan_type": NotePlan,
        "plan": lambda step: NotePlan(step.params["app"], "hello"),
        "apply": lambda step, plan: {"wrote": plan.note, "summary": f"wrote {plan.note}"},
        "verify": lambda step, plan, applied: {"summary": f"{plan.app} has {applied['wrote']}"},
        **steps})


def outcomes(run_id: str = "manual__1") -> list[tuple[str, str]]:
    return [(e["step"], e["outcome"]) for e in read_audit(run_id=run_id)]


def test_a_plan_is_handed_on_as_json_with_its_summary_then_applied_and_verified_from_that_json(world, caplog):
    caplog.set_level("INFO")
    seen = []
    runner = procedure(apply=lambda step, plan: seen.append((plan, step.handed["summary"])) or {"summary": "done it"},
                       verify=lambda step, plan, applied: {"summary": f"checked {plan.note} after {applied['summary']}"})
    planned = plan_step(runner, context())
    assert planned == {"app": APP, "note": "hello", "length": 5, "summary": "write 'hello'"}
    assert "Note plan for oplog-router:\nnote\n----\nhello" in caplog.text

    applied = apply_step(runner, context(), {**planned, "note": "changed after review"})  # what the JSON says runs
    assert seen == [(NotePlan(APP, "changed after review"), "write 'hello'")]
    assert verify_step(runner, context(), planned, applied) == {"summary": "checked hello after done it"}
    assert outcomes() == [("plan", "done"), ("apply", "done"), ("verify", "done")]
    entry = read_audit(run_id="manual__1")[1]
    assert (entry["user"], entry["app"], entry["summary"], entry["snapshots_taken"]) == ("erin", APP, "done it", [])
    assert "recover_test apply: done: done it (audit log " in caplog.text


def test_a_dry_run_plans_and_the_apply_is_skipped_and_audited_so(world):
    applied = []
    runner = procedure(apply=lambda step, plan: applied.append(plan) or {"summary": "x"})
    planned = plan_step(runner, context(dry_run=True))
    with pytest.raises(AirflowSkipException, match="^Dry run: nothing was changed. The plan is in the 'plan' task's log"):
        apply_step(runner, context(dry_run=True), planned)
    assert applied == [] and AppRuntime(str(world)).operation() is None
    assert outcomes() == [("plan", "planned (dry run: nothing changed)"), ("apply", "skipped")]


def test_an_apply_waiting_for_approval_goes_on_only_with_an_approve_answer(world):
    class NoAnswer:
        def xcom_pull(self, task_ids):
            return None

    runner = procedure()
    planned = plan_step(runner, context())
    with pytest.raises(AirflowFailException, match="Not applied: this run waits for an approval of its plan"):
        apply_step(runner, {**context(approve_in_ui=True), "ti": NoAnswer()}, planned)
    assert outcomes()[-1] == ("apply", "failed")


def test_a_refusal_fails_the_task_without_retries_naming_every_problem_and_is_audited(world):
    def refuse(step):
        raise RecoveryRefused(["app 'x' is not in the catalog", "shift 0 must be non-zero"])

    with pytest.raises(AirflowFailException) as failed:
        plan_step(procedure(plan=refuse), context())
    assert str(failed.value) == ("recover_test: refused before anything was changed:\n  - app 'x' is not in the catalog\n"
                                 "  - shift 0 must be non-zero")
    (entry,) = read_audit(run_id="manual__1")
    assert (entry["step"], entry["outcome"]) == ("plan", "refused")
    assert entry["error"] == str(failed.value).removeprefix("recover_test: ")


def test_the_shared_params_are_checked_in_code_before_the_plan_is_made(world):
    made = []
    with pytest.raises(AirflowFailException, match=r"verify_deadline_s must be a whole number from 30 to 7200, got 1e\+30"):
        plan_step(procedure(plan=lambda step: made.append(1)), context(verify_deadline_s=1e30))
    assert made == [] and outcomes() == [("plan", "refused")]


def test_the_app_is_marked_while_the_apply_changes_it_and_a_second_run_is_refused(world):
    runtime = AppRuntime(str(world))
    during = []

    def apply(step, plan):
        during.append(runtime.operation().what)
        with pytest.raises(AirflowFailException, match=r"^recover_test: refused: oplog-router is being changed by another "
                                                       r"run: recover_test apply \(run manual__1, since "):
            apply_step(procedure(), context("manual__2"), plan_step(procedure(), context("manual__2")))
        return {"summary": "ok"}

    apply_step(procedure(apply=apply), context(), plan_step(procedure(), context()))
    assert during == ["recover_test apply"] and runtime.operation() is None
    assert outcomes("manual__2") == [("plan", "done"), ("apply", "refused")]


def test_a_failure_after_a_snapshot_names_it_and_holds_the_app(world):
    def half_done(step, plan):
        backup_checkpoint(world, "before-test")
        raise OSError("disk full")

    with pytest.raises(AirflowFailException) as failed:
        apply_step(procedure(apply=half_done), context(), plan_step(procedure(), context()))
    (snapshot,) = [str(p) for p in list_backups(world)]
    assert str(failed.value) == (f"apply failed: disk full\nThe checkpoint was backed up before the failure: {snapshot}; "
                                 "recover_restore_checkpoint puts it back.")
    entry = read_audit(run_id="manual__1")[-1]
    assert (entry["outcome"], entry["error"], entry["snapshots_taken"]) == ("failed", "OSError: disk full", [snapshot])
    held = AppRuntime(str(world)).operation()
    assert held.failed_at and held.backups == [snapshot]  # the supervisor leaves a half-changed app alone


def test_a_refusal_after_a_snapshot_is_a_failure_of_a_half_changed_app(world):
    """A start refused after the checkpoint was backed up and changed (an artifact whose digest
    changed, a tampered launch record): not "nothing changed", so the app is held."""
    def start_refused(step, plan):
        backup_checkpoint(world, "before-reset")
        raise OneLineRefused("artifact acme 1.0.0 has digest sha256:bbb, but sha256:aaa ran")

    with pytest.raises(AirflowFailException) as failed:
        apply_step(procedure(apply=start_refused), context(), plan_step(procedure(), context()))
    (snapshot,) = [str(p) for p in list_backups(world)]
    assert str(failed.value).startswith("apply failed: artifact acme 1.0.0 has digest sha256:bbb, but sha256:aaa ran\n"
                                        f"The checkpoint was backed up before the failure: {snapshot}")
    entry = read_audit(run_id="manual__1")[-1]
    assert (entry["outcome"], entry["snapshots_taken"]) == ("failed", [snapshot])
    assert AppRuntime(str(world)).operation().backups == [snapshot]


def test_a_failure_without_a_snapshot_goes_on_unchanged(world):
    def broken(step, plan):
        raise ConnectionError("broker unreachable")

    with pytest.raises(ConnectionError, match="broker unreachable"):
        apply_step(procedure(apply=broken), context(), plan_step(procedure(), context()))
    assert read_audit(run_id="manual__1")[-1]["error"] == "ConnectionError: broker unreachable"


def test_a_tampered_plan_is_refused_before_the_apply_runs(world):
    planned = plan_step(procedure(), context())
    del planned["note"]
    with pytest.raises(AirflowFailException, match="^recover_test: refused: the plan this task received is not one the "
                                                   "plan task makes: NotePlan without note$"):
        apply_step(procedure(apply=lambda step, plan: pytest.fail("applied")), context(), planned)


def test_task_code_raises_refusals_and_the_task_fails_with_the_operators_text(world):
    @refusals_fail
    def deploy():
        raise OneLineRefused("version '1; touch x' must be a semantic version")

    with pytest.raises(AirflowFailException, match=r"^refused: version '1; touch x' must be a semantic version$"):
        deploy()
    assert str(task_failure(RecoveryRefused(["a"]))) == "refused before anything was changed:\n  - a"
    # Outside a procedure the same runner audits a plan as planned, and a step's text result as its summary.
    assert audited_step(context("manual__9"), "plan", lambda: "3 create") == "3 create"
    assert [(e["outcome"], e["summary"]) for e in read_audit(run_id="manual__9")] == [("planned", "3 create")]


def test_a_refusal_raised_in_a_step_becomes_one_failure_known_by_its_type(world):
    refusal = RecoveryRefused(["shift 0 must be non-zero"])

    def refuse():
        raise refusal

    with pytest.raises(RefusalFailure) as failed:
        audited_step(context(), "plan", refuse)
    assert isinstance(failed.value, AirflowFailException) and failed.value.refusal is refusal and is_refusal(failed.value)
    assert str(failed.value) == "recover_test: refused before anything was changed:\n  - shift 0 must be non-zero"
    assert failed.value.__cause__ is None and failed.value.__suppress_context__  # the log shows the operator's text only
    # Stored by Airflow or pickled, it is the plain failure Airflow knows, with the same text.
    assert failed.value.serialize() == ("airflow.sdk.exceptions.AirflowFailException", (str(failed.value),), {})
    stored = pickle.loads(pickle.dumps(failed.value))
    assert (type(stored), str(stored)) == (AirflowFailException, str(failed.value))
    # Task code that failed the task itself (refusals_fail): the runner passes that failure on as it is, audited once.
    already = task_failure(OneLineRefused("a rolling restart needs the new version label"))

    def translated():
        raise already

    with pytest.raises(RefusalFailure) as passed_on:
        audited_step(context("manual__2"), "roll", translated)
    assert passed_on.value is already and str(already) == "refused: a rolling restart needs the new version label"
    assert [(e["outcome"], e["error"]) for e in read_audit(run_id="manual__2")] == [
        ("refused", "refused: a rolling restart needs the new version label")]


def test_a_failure_whose_text_says_refused_is_still_a_failure(world):
    """Only the type makes a refusal: a socket's "Connection refused", or a failure worded like one."""
    def unreachable():
        raise ConnectionRefusedError(111, "Connection refused")

    def worded_like_one():
        raise AirflowFailException("refused: not by a Refused")

    with pytest.raises(ConnectionRefusedError):
        audited_step(context(), "apply", unreachable, operation=True)
    with pytest.raises(AirflowFailException) as failed:
        audited_step(context("manual__2"), "apply", worded_like_one, operation=True)
    assert type(failed.value) is AirflowFailException
    assert [(e["outcome"], e["error"]) for e in read_audit(run_id="manual__1")] == [
        ("failed", "ConnectionRefusedError: [Errno 111] Connection refused")]
    assert [(e["outcome"], e["error"]) for e in read_audit(run_id="manual__2")] == [("failed", "refused: not by a Refused")]
    # Neither was a refusal before any change, so the app stays held for an operator.
    assert AppRuntime(str(world)).operation().run_id == "manual__2"
    assert not is_refusal(ConnectionRefusedError(111, "Connection refused"))
    assert not is_refusal(AirflowFailException("rolling restart refused: oplog-router is stateful"))


def test_every_recovery_dag_is_a_row_of_the_table():
    from streamops.dag_tasks import recovery

    dags = Path(__file__).resolve().parents[4] / "dags"
    assert set(PROCEDURES) == {p.stem for p in dags.glob("recover_*.py")}
    names = {id(value): name for name, value in vars(recovery).items() if isinstance(value, Procedure)}
    for dag_id, row in PROCEDURES.items():
        assert f"plan_apply_verify({names[id(row)]})" in (dags / f"{dag_id}.py").read_text(), dag_id
