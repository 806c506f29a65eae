"""Four eyes in the apply itself (check_approved): a plan that can lose or repeat data needs an
Approve by someone who did not trigger the run, and runs with no approval only where the catalog
lets the environment do so. The Airflow parts are a task's context as Airflow hands it over."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streamops.catalog import TopicSpec
from streamops.dag_tasks.approval import SecondPersonRequired, check_approved, plan_digest
from streamops.provisioning import BrokerSnapshot, BrokerTopic, plan_topics
from streamops.refusals import Refused
from tests.support import PROJECT_ROOT


class TaskInstance:
    """The XComs a task pulls: the plan task's, the approve task's answer and the digest of the plan
    it showed (`shown`: that plan, by default the plan itself)."""

    def __init__(self, plan=None, answer=None, shown=None):
        plan = plan if plan is not None else {"app": "oplog-router"}
        self.xcoms = {("plan", "return_value"): plan, ("approve", "return_value"): answer,
                      ("approve", "plan_digest"): {"task": "plan", "digest": plan_digest(shown if shown is not None else plan)}}

    def xcom_pull(self, task_ids: str, key: str = "return_value"):
        return self.xcoms[(task_ids, key)]


def context(dag_id: str, requester: str | None, *, answer=None, plan=None, shown=None, **params) -> dict:
    params = {"app": "oplog-router", "dry_run": False, "approve_in_ui": True, **params}
    return {"dag_run": SimpleNamespace(dag_id=dag_id, run_id="manual__1", triggering_user_name=requester),
            "params": params, "ti": TaskInstance(plan, answer, shown), "run_id": "manual__1"}


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


def provisioning_plan(retention_ms: int) -> dict:
    """A real provisioning plan's XCom: topic t.a, now at 7 days of retention, to `retention_ms`."""
    current = BrokerTopic(name="t.a", partitions=1, replication_factor=1, configs={"retention.ms": "604800000"},
                          overridden=frozenset({"retention.ms"}))
    spec = TopicSpec(name="t.a", partitions=1, replication_factor=1, owner="o", description="d",
                     configs={"retention.ms": retention_ms})
    planned = plan_topics([spec], BrokerSnapshot(broker_count=1, topics={"t.a": current}, all_topic_names=frozenset({"t.a"})),
                          report_unmanaged=False)
    # The XCom's own list says nothing: the apply works the risks out again from the changes.
    return {**planned.to_json(), "data_loss_risks": []}


@pytest.mark.parametrize("dag_id, params, plan", [
    ("recover_restart_app", {}, None), ("recover_replay_dead_letters", {}, None), ("reprocess", {"cutover": False}, None),
    ("provision_topics", {}, provisioning_plan(1_209_600_000)),  # a longer retention
])
def test_a_plan_that_loses_and_repeats_nothing_may_be_approved_by_its_requester(dag_id, params, plan):
    check_approved(context(dag_id, "olga", answer=approved_by("olga"), plan=plan, **params))


def test_a_cutover_and_a_retention_cut_need_a_second_person():
    with pytest.raises(SecondPersonRequired, match="a cutover moves the live app to new topics"):
        check_approved(context("reprocess", "olga", answer=approved_by("olga"), cutover=True))
    with pytest.raises(SecondPersonRequired, match=r"it can delete records sooner: t.a: retention.ms '604800000' -> '3600000'"):
        check_approved(context("provision_topics", "olga", answer=approved_by("olga"), plan=provisioning_plan(3_600_000)))
    with pytest.raises(SecondPersonRequired, match=r"it can delete records sooner: the plan cannot be read"):
        check_approved(context("provision_topics", "olga", answer=approved_by("olga"), plan={"topics": "?"}))


def test_approval_off_applies_a_reset_only_where_the_catalog_allows_it_unattended(monkeypatch):
    check_approved(context("recover_reset_offsets", "dag_test", approve_in_ui=False))  # local: unattended_in
    monkeypatch.setenv("STREAMOPS_ENVIRONMENT", "cluster")
    with pytest.raises(SecondPersonRequired) as refused:
        check_approved(context("recover_reset_offsets", "olga", approve_in_ui=False))
    assert "it ran with 'Wait for approval' off, which the catalog allows only in the environments of its " \
           "approvals.unattended_in (this run's: cluster)" in str(refused.value)
    check_approved(context("recover_restart_app", "olga", approve_in_ui=False))  # nothing to lose: unattended anywhere
    check_approved(context("recover_reset_offsets", "olga", approve_in_ui=False, dry_run=True))  # changes nothing


@pytest.mark.parametrize("answer", [None, {}, {"chosen_options": ["Reject"]}])
def test_no_approve_answer_is_no_approval_for_anyone(answer):
    """An approve task marked success or skipped by hand in the UI releases the apply (its trigger
    rule is none_failed): the apply checks for the answer itself."""
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match="Not applied: this run waits for an approval of its plan and the "
                                                   "'approve' task has no Approve answer"):
        check_approved(context("recover_restart_app", "olga", answer=answer))


def test_a_plan_in_which_nothing_waits_for_an_approval_needs_no_answer():
    """reconcile's auto rolls say so in the plan; a plan's other fields never stand in for an answer."""
    from airflow.sdk.exceptions import AirflowFailException

    check_approved(context("reconcile", "olga", plan={"approval_not_needed": "Nothing in this plan needs an approval."}))
    with pytest.raises(AirflowFailException, match="Not applied"):
        check_approved(context("reconcile", "olga", plan={"approval_not_needed": None, "summary": "x"}))


def test_a_plan_made_again_after_its_approval_is_not_the_approved_one():
    """An operator who clears the plan task after the approval gets a new plan nobody approved."""
    shown, replanned = {"app": "oplog-router", "replayed": 10}, {"app": "oplog-router", "replayed": 99_000}
    with pytest.raises(SecondPersonRequired, match="the plan is not the one that was approved"):
        check_approved(context("recover_restart_app", "olga", answer=approved_by("anna"), plan=replanned, shown=shown))
    check_approved(context("recover_restart_app", "olga", answer=approved_by("anna"), plan=shown, shown=shown))


@pytest.mark.parametrize("requester, answer", [
    (None, approved_by("anna")),  # a run without a requester (a schedule): nobody can be its second person
    ("olga", {"chosen_options": ["Approve"], "responded_by_user": {"id": "7", "name": ""}}),  # an id is not a name
])
def test_an_unknown_requester_or_approver_is_no_second_person(requester, answer):
    with pytest.raises(SecondPersonRequired, match="whose requester or approver is unknown"):
        check_approved(context("recover_skip_records", requester, answer=answer))


def test_the_approved_plan_is_read_from_the_task_the_approval_showed():
    """roll_restart_apps approves its `ordered_apps` task's plan, not a `plan` task's."""
    ordered = {"apps": ["oplog-router"], "summary": "roll 1 app"}
    ctx = context("roll_restart_apps", "olga", answer=approved_by("anna"))
    ctx["ti"].xcoms[("ordered_apps", "return_value")] = ordered
    ctx["ti"].xcoms[("approve", "plan_digest")] = {"task": "ordered_apps", "digest": plan_digest(ordered)}
    check_approved(ctx)
    ctx["ti"].xcoms[("ordered_apps", "return_value")] = {**ordered, "apps": ["oplog-router", "presence-notifier"]}
    with pytest.raises(SecondPersonRequired, match="the plan is not the one that was approved"):
        check_approved(ctx)
