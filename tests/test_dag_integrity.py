"""Every DAG file imports cleanly and carries what operators rely on in the UI."""

from __future__ import annotations

from pathlib import Path

import pytest

DAGS_DIR = Path(__file__).resolve().parents[1] / "dags"


@pytest.fixture(scope="module")
def dag_bag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_DIR))


def test_every_dag_file_imports_without_errors(dag_bag):
    assert dag_bag.import_errors == {}
    files = {Path(dag.fileloc).name for dag in dag_bag.dags.values()}
    assert files == {path.name for path in DAGS_DIR.glob("*.py")}


def test_every_dag_has_an_owner_tags_retries_and_a_doc(dag_bag):
    assert dag_bag.dags, "no DAGs were found"
    for dag_id, dag in dag_bag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md and len(dag.doc_md) > 100, f"{dag_id} has no doc for the UI"
        assert "retries" in dag.default_args, f"{dag_id} does not set retries"
        # Task logs end with the step's own summary, not the return value dumped on one line.
        assert dag.default_args.get("show_return_value_in_logs") is False, f"{dag_id} dumps return values into logs"
        for task in dag.tasks:
            assert task.owner not in (None, "", "airflow"), f"{dag_id}.{task.task_id} has no owner"


def test_provision_topics_form_offers_the_catalog_topics_and_waits_for_approval_by_default(dag_bag):
    from streamops.catalog import load_catalog

    params = dag_bag.get_dag("provision_topics").params
    assert (params["dry_run"], params["approve_in_ui"]) == (False, True)
    schema = params.get_param("topics").schema
    assert schema["items"]["enum"] == load_catalog().topic_names()
    assert schema["type"] == ["array", "null"]  # optional in the form: empty means all


def test_every_form_field_has_help_text_and_an_empty_optional_field_is_accepted(dag_bag):
    """The UI's trigger form sends null for an empty field and treats a field whose schema refuses
    null as required (its Trigger button stays disabled): every optional field is ["null", T]."""
    for dag_id, dag in dag_bag.dags.items():
        for name, param in dag.params.items():
            schema = param.schema
            assert param.description or schema.get("description"), f"{dag_id}: the form field {name!r} has no help text"
            optional = param.value in (None, "", [], {}) and not schema.get("minItems") and not schema.get("minLength")
            if optional:
                assert "null" in schema["type"], f"{dag_id}: {name!r} is optional (default {param.value!r}) but refuses null"


def test_starting_stopping_or_rolling_apps_needs_an_explicit_choice(dag_bag):
    from airflow.sdk.definitions.param import ParamValidationError

    from streamops.catalog import load_catalog
    from streamops.dag_tasks.apps import suggested_version

    for dag_id in ("deploy_apps", "stop_apps", "roll_restart_apps"):
        params = dag_bag.get_dag(dag_id).params
        apps = params.get_param("apps")
        assert apps.value == [] and apps.schema["minItems"] == 1, f"{dag_id} pre-selects {apps.value}"
        with pytest.raises(ParamValidationError, match="apps"):
            params.validate()  # its defaults as they stand: no app chosen, no run
    roll = dag_bag.get_dag("roll_restart_apps").params.get_param("version")
    assert roll.value == suggested_version(load_catalog()) == "3.0.1"  # presence-notifier is at 3.0.0
    assert roll.description.startswith("Suggested: the next patch after the catalog's newest version.")
    # The recovery forms put the dry-run switch right after the app, above the mode's fields.
    for dag_id in ("recover_reset_offsets", "recover_replay_dead_letters", "recover_rebuild_state", "recover_skip_records",
                   "recover_restore_checkpoint", "recover_restart_app", "recover_extend_retention"):
        assert list(dag_bag.get_dag(dag_id).params)[:3] == ["app", "dry_run", "approve_in_ui"], dag_id


MUTATING = {"provision_topics": ("plan", "apply"), "roll_restart_apps": ("ordered_apps", "roll"), "reprocess": ("plan", "run"),
            "reconcile_desired_state": ("plan", "roll_approved"),
            **{f"recover_{name}": ("plan", "apply") for name in
               ("reset_offsets", "replay_dead_letters", "rebuild_state", "skip_records", "restore_checkpoint", "restart_app",
                "extend_retention")}}


def test_every_mutating_dag_waits_for_approval_of_its_plan_before_it_applies(dag_bag):
    """plan -> approve -> apply, in one run: the apply follows the approval (a Reject skips it) and
    still runs when no approval was needed (the approval task skipped: dry run or approval off)."""
    from streamops.dag_tasks.approval import PlanApproval

    assert {d for d, dag in dag_bag.dags.items() if "approve" in dag.task_dict} == set(MUTATING)
    for dag_id, (plan_task, apply_task) in MUTATING.items():
        dag = dag_bag.get_dag(dag_id)
        approve, apply = dag.get_task("approve"), dag.get_task(apply_task)
        assert isinstance(approve, PlanApproval) and approve.plan_task_id == plan_task, dag_id
        # Reconcile rolls its `auto` apps (no approval needed) before it asks for one.
        after = {"reconcile_desired_state": "roll_auto"}.get(dag_id, plan_task)
        assert approve.upstream_task_ids == {after} and "approve" in apply.upstream_task_ids, dag_id
        assert apply.trigger_rule == "none_failed", dag_id
        assert approve.defaults == ["Reject"] and approve.response_timeout is not None, dag_id  # no answer: nothing changes
        assert dag.params["approve_in_ui"] is True and dag.params.get("dry_run", False) is False, dag_id


def test_the_approval_shows_the_plan_and_is_skipped_when_nothing_is_applied():
    from streamops.dag_tasks.approval import approval_skip_reason, plan_body

    assert approval_skip_reason({"dry_run": False, "approve_in_ui": True}) is None
    assert approval_skip_reason({"apps": ["a"], "approve_in_ui": True}) is None  # the roll has no dry run
    assert approval_skip_reason({"dry_run": True, "approve_in_ui": True}).startswith("Dry run: nothing will be applied")
    assert "applied as planned" in approval_skip_reason({"dry_run": False, "approve_in_ui": False})
    table = "topic     action\n--------  ---------------\norders    create\naudit     alter configs: retention.ms 1 -> 2"
    body = plan_body({"summary": "1 create, 1 alter", "table": table, "creates": ["orders"]},
                     {"topics": [], "dry_run": False, "approve_in_ui": True})
    assert body.startswith("**1 create, 1 alter**")
    # A Markdown table (the page folds a code block's lines into one), the long last cell whole.
    assert ("| ` topic ` | ` action ` |\n| --- | --- |\n| ` orders ` | ` create ` |\n"
            "| ` audit ` | ` alter configs: retention.ms 1 -> 2 ` |") in body
    assert "- ` topics `: ` [] `" in body and "approve_in_ui" not in body
    # No table: the plan's fields as the apply reads them.
    assert '- ` app `: ` "r" `' in plan_body({"summary": "s", "app": "r"})
    # What came from Kafka cannot turn into Markdown on the approver's page, and a cut says so.
    hostile = plan_body({"summary": "**all fine** ![x](http://evil/x.png)", "key": "a`b ``c`` **bold**", "long": "x" * 700})
    assert hostile.startswith(r"**\*\*all fine\*\* \!\[x\]\(http://evil/x.png\)**")
    assert '- ` key `: ``` "a`b ``c`` **bold**" ```' in hostile  # a fence longer than any run inside
    assert "(cut at 600 characters; the whole field is in the 'plan' task's XCom)" in hostile


def test_a_rejection_and_a_timeout_are_audited_before_the_apply_is_skipped(dag_bag, monkeypatch, tmp_path):
    """The provider skips the apply on Reject by raising: the decision is written first."""
    from types import SimpleNamespace

    from airflow.providers.standard.operators.hitl import ApprovalOperator

    from streamops.audit import read_audit

    monkeypatch.setenv("STREAMOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))

    def skips_downstream(self, context, event):
        raise RuntimeError("downstream skipped")

    monkeypatch.setattr(ApprovalOperator, "execute_complete", skips_downstream)
    approve = dag_bag.get_dag("provision_topics").get_task("approve")
    context = {"dag_run": SimpleNamespace(dag_id="provision_topics", run_id="r1", triggering_user_name="ops"),
               "params": {"dry_run": False, "approve_in_ui": True, "topics": []}}
    for event in ({"chosen_options": ["Reject"], "responded_by_user": {"id": "7", "name": "lead"}},
                  {"chosen_options": ["Reject"], "responded_by_user": None, "timedout": True}):
        with pytest.raises(RuntimeError, match="downstream skipped"):
            approve.execute_complete(context, event)
    assert [(e["step"], e["outcome"], e["approved_by"]) for e in read_audit()] == [
        ("approve", "rejected (nothing changed)", "lead"),
        ("approve", "rejected: no answer within 1:00:00 (nothing changed)", "nobody")]


def test_broken_catalog_shows_as_an_import_error_naming_the_problem(airflow_db, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ntopics:\n  - name: a.b\n    partitions: 0\n    replication_factor: 1\n"
                   "    owner: o\n    description: d\n")
    monkeypatch.setenv("STREAMOPS_CATALOG", str(bad))
    bag = DagBag(dag_folder=str(DAGS_DIR / "provision_topics.py"))
    (error,) = bag.import_errors.values()
    assert "topics[0] 'a.b' (line 4), field 'partitions': must be a positive integer (got 0)" in error


def test_every_dag_imports_with_a_catalog_of_topics_only(airflow_db, tmp_path, monkeypatch):
    """A catalog without apps or suites (a first catalog, or the provisioning tests') must not
    break the DAGs that offer apps and suites in their forms."""
    from airflow.dag_processing.dagbag import DagBag

    plain = tmp_path / "plain.yaml"
    plain.write_text("version: 1\ntopics:\n  - name: a.b\n    partitions: 1\n    replication_factor: 1\n"
                     "    owner: o\n    description: d\n")
    monkeypatch.setenv("STREAMOPS_CATALOG", str(plain))
    bag = DagBag(dag_folder=str(DAGS_DIR))
    assert bag.import_errors == {}
    assert len(bag.dags) == len(list(DAGS_DIR.glob("*.py")))
