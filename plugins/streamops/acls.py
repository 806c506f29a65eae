"""Each app's least-privilege Kafka ACLs, derived from the catalog and the programs.

An app reads its inputs (and the outputs its program reads back), writes its outputs and its
dead-letter topic, and uses consumer groups under `streamops.<app>` (Spark's own groups and the
progress group); nothing else, and never Create, Alter or Delete. terraform/main.tf derives the
same set with yamldecode for clusters Terraform manages (tests/test_terraform.py keeps the two
equal); `apply_acls` applies it where the suite manages the cluster itself (`streamops cluster up`).
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from streamops.catalog import AppSpec, Catalog


@dataclass(frozen=True, order=True)
class AppAcl:
    principal: str
    resource_type: str  # Topic | Group
    pattern: str  # Literal | Prefixed
    resource: str
    operation: str  # Read | Write | Describe


def principal_of(app: AppSpec, principals: dict[str, str] | None = None) -> str:
    """The principal an app connects as: `User:<app name>` unless mapped otherwise."""
    return (principals or {}).get(app.name, f"User:{app.name}")


def app_acls(catalog: Catalog, principals: dict[str, str] | None = None) -> set[AppAcl]:
    wanted: set[AppAcl] = set()
    for app in catalog.apps:
        principal = principal_of(app, principals)
        # The catalog's reads_outputs is the program's own declaration (checked when it loads).
        reads_back = [app.outputs[role] for role in app.reads_outputs]
        for topic in {*app.inputs.values(), *reads_back}:
            wanted |= {AppAcl(principal, "Topic", "Literal", topic, op) for op in ("Read", "Describe")}
        for topic in {*app.outputs.values(), app.dead_letter_topic}:
            wanted |= {AppAcl(principal, "Topic", "Literal", topic, op) for op in ("Write", "Describe")}
        wanted.add(AppAcl(principal, "Group", "Prefixed", f"streamops.{app.name}", "Read"))
    return wanted


def _binding(acl: AppAcl) -> AclBinding:
    return AclBinding(
        ResourceType[acl.resource_type.upper()], acl.resource, ResourcePatternType[acl.pattern.upper()],
        acl.principal, "*", AclOperation[acl.operation.upper()], AclPermissionType.ALLOW,
    )


def apply_acls(admin: AdminClient, acls: set[AppAcl], timeout: float = 30.0) -> list[str]:
    """Create the ACLs the broker does not have yet; return what was created (one line each).
    ACLs that are not in the set are left alone (other tools may own them)."""
    existing = set()
    for binding in admin.describe_acls(
        # None matches any name, principal and host (confluent-kafka documents it; its stubs say str).
        AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,  # type: ignore[arg-type]
                         AclOperation.ANY, AclPermissionType.ANY),
        request_timeout=timeout,
    ).result(timeout=timeout):
        existing.add(AppAcl(binding.principal, binding.restype.name.title(), binding.resource_pattern_type.name.title(),
                            binding.name, binding.operation.name.title()))
    missing = sorted(acls - existing)
    if missing:
        for future in admin.create_acls([_binding(acl) for acl in missing], request_timeout=timeout).values():
            future.result(timeout=timeout)
    return [f"allow {a.principal} {a.operation} on {a.resource_type.lower()} {a.resource} ({a.pattern.lower()})" for a in missing]


def grant_app(admin: AdminClient, catalog: Catalog, app_name: str, principal: str, timeout: float = 30.0) -> list[str]:
    """Create the ACLs `app_acls` derives for one app of `catalog` as `principal` that the cluster
    lacks; return them in words (empty: it had them all). For an app started on topics the main
    catalog does not name (a reprocess cutover), before it starts."""
    mapping = {app_name: principal}
    return apply_acls(admin, {acl for acl in app_acls(catalog, mapping) if acl.principal == principal}, timeout)
