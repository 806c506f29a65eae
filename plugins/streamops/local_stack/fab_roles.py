"""The suite's roles (streamops.access) and the stack's users in Airflow's FAB auth manager.

`python -m streamops.local_stack.fab_roles <users file>`, run in a stack's Airflow environment
(LocalAirflow.sync_users) after `airflow db migrate`: FAB's own roles are synced first, then each
of the suite's roles gets exactly the permissions streamops.access declares (missing ones added,
others removed: the declaration is the truth), and every user of the users file exists with its
role (created with the file's password; a password changed in the UI later is kept). The file
(mode 600) is written by streamops.stack_secrets: one user per role, each with a generated
password; a user added in the UI is left alone.

FAB has no API for "these permissions and no others" (its bulk_sync_roles only adds): the
removal is written here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from streamops.access import APPROVE, PAGES, ROLES, TRIGGER, Role, dag_permissions

# Permissions beyond FAB's Viewer set that working on the suite's DAGs needs (each also needs the
# DAG-level edit of the DAG it touches: dag_permissions). Never global DAG edit or run creation.
_OPERATOR_EXTRA = {("can_create", "Task Instances"), ("can_edit", "Task Instances"), ("can_edit", "DAG Runs"),
                   ("menu_access", "HITL Detail")}
_APPROVER_EXTRA = {("can_edit", "HITL Detail"), ("menu_access", "HITL Detail")}


def role_permissions(role: Role, viewer_permissions: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Every (action, resource) the suite's `role` has in FAB (not for FAB's own Admin)."""
    granted = set(viewer_permissions) | dag_permissions(role) | {("can_read", page) for page in role.pages}
    if TRIGGER in role.dags:
        granted |= _OPERATOR_EXTRA
    if APPROVE in role.dags:
        granted |= _APPROVER_EXTRA
    return granted


def sync(users_file: Path) -> list[str]:
    """Roles and users as declared; one line per change made."""
    from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

    users = json.loads(users_file.read_text())
    said: list[str] = []
    with get_application_builder() as appbuilder:
        sm = appbuilder.sm
        sm.sync_roles()  # FAB's own roles (Admin, Viewer, ...) and the resources they name
        viewer = set(sm.VIEWER_PERMISSIONS)
        for role in ROLES.values():
            fab_role = sm.find_role(role.name) or sm.add_role(role.name)
            wanted = {("can_read", page) for page in PAGES} if role.fab_builtin else role_permissions(role, viewer)
            have = {(p.action.name, p.resource.name): p for p in fab_role.permissions if p.action and p.resource}
            for action, resource in sorted(wanted - have.keys()):
                sm.add_permission_to_role(fab_role, sm.create_permission(action, resource))
            if not role.fab_builtin:  # FAB keeps its Admin complete itself
                for key in sorted(have.keys() - wanted):
                    sm.remove_permission_from_role(fab_role, have[key])
            if wanted - have.keys() or (not role.fab_builtin and have.keys() - wanted):
                said.append(f"role {role.name}: {len(wanted)} permissions")
        for name, entry in users.items():
            fab_role = sm.find_role(ROLES[entry["role"]].name)
            user = sm.find_user(username=name)
            if user is None:
                sm.add_user(name, name, entry["role"], f"{name}@streamops.invalid", fab_role, entry["password"])
                said.append(f"user {name} ({entry['role']}) created")
                continue
            if fab_role not in user.roles:
                user.roles = [fab_role]
                sm.update_user(user)
                said.append(f"user {name}: role {entry['role']}")
            # A password changed in the UI (an admin rotating it) is kept: the file only seeds it.
    return said


if __name__ == "__main__":
    for line in sync(Path(sys.argv[1])):
        print(line)
