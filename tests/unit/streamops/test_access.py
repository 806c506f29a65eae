"""The roles, declared once (streamops.access): what each grants in FAB's terms, and that they
cover exactly the suite's DAGs."""

from __future__ import annotations

from streamops.access import ADMIN, APPROVER, OPERATOR, ROLES, SUITE_DAGS, VIEWER, dag_permissions, roles_allowed
from streamops.local_stack.fab_roles import role_permissions
from tests.support import PROJECT_ROOT


def test_the_declared_dags_are_the_suites_dags():
    assert sorted(SUITE_DAGS) == sorted(path.stem for path in (PROJECT_ROOT / "dags").glob("*.py"))


def test_only_the_operator_creates_runs_and_only_the_approver_answers_approvals():
    viewer, operator, approver = (role_permissions(role, set()) for role in (VIEWER, OPERATOR, APPROVER))
    runs = {resource for action, resource in operator if action == "can_create" and resource.startswith("DAG Run:")}
    assert runs == {f"DAG Run:{dag_id}" for dag_id in SUITE_DAGS}
    assert not any(action == "can_create" and resource.startswith("DAG Run") for action, resource in viewer | approver)
    assert ("can_edit", "HITL Detail") in approver
    assert ("can_edit", "HITL Detail") not in operator | viewer
    # Never a global grant: a role works on the suite's DAGs, not on every DAG of the Airflow.
    assert not {("can_edit", "DAGs"), ("can_create", "DAG Runs")} & (viewer | operator | approver)
    assert not any(action == "can_edit" and resource.startswith("DAG:") for action, resource in viewer)


def test_each_page_names_the_roles_that_may_read_it():
    assert roles_allowed("StreamOps Apps") == ["viewer", "operator", "approver", "admin"]
    assert roles_allowed("StreamOps Driver Logs") == ["operator", "approver", "admin"]
    assert roles_allowed("StreamOps Metrics") == ["operator", "approver", "admin"]
    assert ("can_read", "StreamOps Data Docs") in role_permissions(VIEWER, set())
    assert ("can_read", "StreamOps Metrics") not in role_permissions(VIEWER, set())


def test_fabs_viewer_set_is_the_floor_and_admin_is_fabs_own():
    floor = {("can_read", "DAGs"), ("can_read", "Task Logs")}
    assert all(floor <= role_permissions(role, floor) for role in (VIEWER, OPERATOR, APPROVER))
    assert ADMIN.fab_builtin == "Admin" and ROLES["admin"] is ADMIN
    assert dag_permissions(VIEWER) == {perm for dag_id in SUITE_DAGS
                                       for perm in (("can_read", f"DAG:{dag_id}"), ("can_read", f"DAG Run:{dag_id}"))}
