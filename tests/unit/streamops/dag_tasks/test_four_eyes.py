"""Four eyes in the apply itself (check_approved): a plan that can lose or repeat data needs an
Approve by someone who did not trigger the run, and runs with no approval only where the catalog
lets the environment do so. The Airflow parts are a task's context as Airflow hands it over."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streamops.dag_tasks.approval import SecondPersonRequired, check_approved
from streamops.refusals import Refused
from tests.support import PROJECT_ROOT


class TaskInstance:
    """The XComs a task pulls: the plan task's and the approve task's."""

    def __init__(self, plan=None, answer=None):
        self.xcoms = {"plan": plan if plan is not None else {"app": "oplog-router"}, "approve": answer}

    def xcom_pull(self, task_ids: str):
        return self.xcoms[task_ids]


def context(dag_id: str, requester: str, *, answer=None, plan=None, **params) -> dict:
    params = {"app": "oplog-router", "dry_run": False, "approve_in_ui": True, **params}
    return {"dag_run": SimpleNamespace(dag_id=dag_id, run_id="manual__1", triggering_user_name=requester),
            "params": params, "ti": TaskInstance(plan, answer), "run_id": "manual__1"}


def approved_by(name: str) -> dict:
    return {"chosen_options": ["Approve"], "responded_by_user": {"id": "7", "name": name}}


@pytest.fixture(autouse=True)
def project_catalog(monkeypatch):
    monkeypatch.setenv("STREAMOPS_CATALOG", str(PROJECT_ROOT / "catalog" / "pipelines.yaml"))
    monkeypatch.delenv("STREAMOPS_ENVIRONMENT", raising=False)


def test_a_reset_approved_by_a_second_person_is_applied():
    check_approved(context("recover_reset_offsets", "olga", answer=approved_by("anna")))


def test_a_reset_approved_by_its_own_requester_is_refused_with_who_and_why():
    with pytest.raises(SecondPersonRequired) as refused:
        check_approved(context("recover_reset_offsets", "olga", answer=approved_by("olga")))
    assert isinstance(refused.value, Refused)  # audited as refused, failed without retries
    assert str(refused.value) == (
        "Apply refused: olga approved a plan they triggered themselves, and this one needs a second person (moving an "
        "app's input position skips or repeats records). Nothing was changed. Trigger it again and have an approver "
        "other than olga approve it.")


@pytest.mark.parametrize("dag_id, params", [
    ("recover_restart_app", {}), ("recover_replay_dead_letters", {}), ("reprocess", {"cutover": False}),
    ("provision_topics", {}),
])
def test_a_plan_that_loses_and_repeats_nothing_may_be_approved_by_its_requester(dag_id, params):
    check_approved(context(dag_id, "olga", answer=approved_by("olga"), **params))


def test_a_cutover_and_a_retention_cut_need_a_second_person():
    with pytest.raises(SecondPersonRequired, match="a cutover moves the live app to new topics"):
        check_approved(context("reprocess", "olga", answer=approved_by("olga"), cutover=True))
    risky = {"data_loss_risks": ["t.a: retention.ms '604800000' -> '3600000'"]}
    with pytest.raises(SecondPersonRequired, match=r"it can delete records sooner: t.a: retention.ms '604800000' -> '3600000'"):
        check_approved(context("provision_topics", "olga", answer=approved_by("olga"), plan=risky))


def test_approval_off_applies_a_reset_only_where_the_catalog_allows_it_unattended(monkeypatch):
    check_approved(context("recover_reset_offsets", "dag_test", approve_in_ui=False))  # local: unattended_in
    monkeypatch.setenv("STREAMOPS_ENVIRONMENT", "cluster")
    with pytest.raises(SecondPersonRequired) as refused:
        check_approved(context("recover_reset_offsets", "olga", approve_in_ui=False))
    assert "it ran with 'Wait for approval' off, which the catalog allows only in the environments of its " \
           "approvals.unattended_in (this run's: cluster)" in str(refused.value)
    check_approved(context("recover_restart_app", "olga", approve_in_ui=False))  # nothing to lose: unattended anywhere
    check_approved(context("recover_reset_offsets", "olga", approve_in_ui=False, dry_run=True))  # changes nothing


def test_no_approve_answer_is_no_approval_for_anyone():
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match="has no Approve answer"):
        check_approved(context("recover_reset_offsets", "olga", answer={"chosen_options": ["Reject"]}))
