"""terraform/ with OpenTofu and the Mongey/kafka provider (both built by bin/setup from the Go
module proxy): fmt and validate, an apply against the session broker that creates the catalog's
topics as the catalog says, a second plan with no changes, the destroy protection, and the
per-app least-privilege ACLs the plan would create."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from streamops.catalog import load_catalog
from tests.support import PROJECT_ROOT

TOFU = PROJECT_ROOT / ".cache" / "tools" / "tofu"
TOFURC = PROJECT_ROOT / ".cache" / "terraform" / "tofurc"


def tofu(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    assert TOFU.exists(), f"{TOFU} is missing: bin/setup builds it"
    result = subprocess.run(
        [str(TOFU), args[0], "-no-color", *args[1:]], cwd=workdir, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TF_CLI_CONFIG_FILE": str(TOFURC), "TF_IN_AUTOMATION": "1", "NO_COLOR": "1",
             "CHECKPOINT_DISABLE": "1"},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"tofu {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


@pytest.fixture(scope="module")
def initialised(tmp_path_factory) -> Path:
    """A copy of terraform/ with `tofu init` done (the provider from the local mirror)."""
    workdir = tmp_path_factory.mktemp("terraform")
    for source in (PROJECT_ROOT / "terraform").glob("*.tf"):
        shutil.copy(source, workdir / source.name)
    tofu(workdir, "init", "-input=false")
    return workdir


def variables(catalog_file: Path, bootstrap: str, **extra) -> list[str]:
    values = {"catalog_path": str(catalog_file), "bootstrap_servers": [bootstrap], **extra}
    out = []
    for key, value in values.items():
        out += ["-var", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    return out


def test_fmt_and_validate(initialised):
    assert tofu(PROJECT_ROOT / "terraform", "fmt", "-check", "-diff", "-recursive", check=False).returncode == 0
    assert "Success! The configuration is valid." in tofu(initialised, "validate").stdout


def test_apply_creates_the_catalog_topics_and_a_second_plan_has_no_changes(initialised, admin, broker, prefix, tmp_path):
    from streamops.provisioning import describe_broker, plan_topics

    catalog = load_catalog().with_topic_prefix(prefix)
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    args = variables(catalog_file, broker.bootstrap_servers, manage_acls=False)

    applied = tofu(initialised, "apply", "-input=false", "-auto-approve", f"-state={tmp_path / 'tf.state'}", *args)
    assert f"Apply complete! Resources: {len(catalog.topics)} added, 0 changed, 0 destroyed." in applied.stdout

    # The broker now holds exactly what the catalog says: the provision_topics plan sees no change.
    snapshot = describe_broker(admin, catalog.topic_names())
    plan = plan_topics(catalog.topics, snapshot, report_unmanaged=False)
    assert {t.topic: [a.value for a in t.actions] for t in plan.topics} == {t: ["no change"] for t in catalog.topic_names()}
    operations = snapshot.topics[f"{prefix}.oplog.operations"]
    assert (operations.partitions, operations.configs["retention.ms"]) == (6, "604800000")

    again = tofu(initialised, "plan", "-input=false", "-detailed-exitcode", f"-state={tmp_path / 'tf.state'}", *args, check=False)
    assert again.returncode == 0, again.stdout + again.stderr  # 0: no changes (2 would be changes)
    assert "No changes." in again.stdout

    # A topic dropped from the catalog is protected: the plan stops instead of deleting it.
    data = yaml.safe_load(catalog_file.read_text())
    data["topics"] = [t for t in data["topics"] if t["name"] != f"{prefix}.oplog.operations"]
    data["apps"] = [a for a in data["apps"] if a["name"] != "oplog-router"]
    shrunk = tmp_path / "shrunk.yaml"
    shrunk.write_text(yaml.safe_dump(data))
    refused = tofu(initialised, "plan", "-input=false", f"-state={tmp_path / 'tf.state'}",
                   *variables(shrunk, broker.bootstrap_servers, manage_acls=False), check=False)
    assert refused.returncode == 1
    assert "Instance cannot be destroyed" in refused.stderr
    assert f'kafka_topic.catalog["{prefix}.oplog.operations"]' in refused.stderr
    assert f"{prefix}.oplog.operations" in describe_broker(admin, [f"{prefix}.oplog.operations"]).topics


def expected_acls(catalog) -> set[tuple[str, str, str, str, str]]:
    """(principal, resource type, pattern, resource, operation) as the suite derives them (acls.py)."""
    from dataclasses import astuple

    from streamops.acls import app_acls

    return {astuple(acl) for acl in app_acls(catalog)}


def planned_acls(initialised: Path, tmp_path: Path, catalog_file: Path, bootstrap: str, **extra) -> tuple[set[tuple], dict]:
    """(principal, resource type, pattern, resource, operation) of every ACL the plan creates, and the plan."""
    plan_file = tmp_path / "acls.plan"
    tofu(initialised, "plan", "-input=false", f"-state={tmp_path / 'none.state'}", f"-out={plan_file}",
         *variables(catalog_file, bootstrap, **extra))
    shown = json.loads(tofu(initialised, "show", "-json", str(plan_file)).stdout)
    acl_changes = [c["change"]["after"] for c in shown["resource_changes"] if c["type"] == "kafka_acl"]
    acls = {
        (a["acl_principal"], a["resource_type"], a["resource_pattern_type_filter"], a["resource_name"], a["acl_operation"])
        for a in acl_changes
    }
    return acls, shown


def test_the_plan_grants_each_app_least_privilege_acls(initialised, broker, tmp_path):
    catalog_file = PROJECT_ROOT / "catalog" / "pipelines.yaml"
    acls, shown = planned_acls(initialised, tmp_path, catalog_file, broker.bootstrap_servers,
                               app_principals={"oplog-router": "User:router-svc"})
    expected = {(("User:router-svc" if p == "User:oplog-router" else p), *rest)
                for p, *rest in expected_acls(load_catalog(catalog_file))}
    assert acls == expected
    assert not any(op in ("Create", "All", "Alter", "Delete") for *_, op in acls)
    assert all(c["change"]["after"]["acl_permission_type"] == "Allow"
               for c in shown["resource_changes"] if c["type"] == "kafka_acl")


def test_an_app_the_suite_never_saw_gets_its_acls_from_the_catalog_alone(initialised, broker, tmp_path, monkeypatch):
    """A program from outside spark_apps (tests/fixtures/byo_apps): Terraform grants what the
    suite derives from the catalog and the program, with no edit to terraform/."""
    from streamops.artifacts import ArtifactStore, build

    fixture = Path(__file__).parent / "fixtures" / "byo_apps"
    monkeypatch.setenv("STREAMOPS_ARTIFACT_STORE", str(tmp_path / "artifacts"))
    build("acme-dedup", "1.0.0", "acme_pipelines.dedup", source=fixture, store=ArtifactStore())
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text((fixture / "catalog.yaml").read_text().replace("expectations/", f"{fixture}/expectations/"))
    acls, _ = planned_acls(initialised, tmp_path, catalog_file, broker.bootstrap_servers)
    assert acls == expected_acls(load_catalog(catalog_file))
    assert ("User:acme-dedup", "Topic", "Literal", "acme.payments", "Read") in acls
    assert ("User:acme-dedup", "Topic", "Literal", "acme.unique-payments", "Write") in acls
    assert ("User:acme-dedup", "Topic", "Literal", "acme.unique-payments", "Read") not in acls  # it reads back nothing


@pytest.mark.parametrize("environment", ["local", "cluster"])
def test_the_plan_resolves_an_environment_exactly_as_the_suite_does(initialised, broker, tmp_path, environment):
    catalog_file = PROJECT_ROOT / "catalog" / "pipelines.yaml"
    plan_file = tmp_path / "topics.plan"
    tofu(initialised, "plan", "-input=false", f"-state={tmp_path / 'none.state'}", f"-out={plan_file}",
         *variables(catalog_file, broker.bootstrap_servers, manage_acls=False, environment=environment))
    shown = json.loads(tofu(initialised, "show", "-json", str(plan_file)).stdout)
    planned = {c["change"]["after"]["name"]: (c["change"]["after"]["partitions"], c["change"]["after"]["replication_factor"],
                                              c["change"]["after"]["config"])
               for c in shown["resource_changes"] if c["type"] == "kafka_topic"}
    catalog = load_catalog(catalog_file, environment=environment)
    assert planned == {t.name: (t.partitions, t.replication_factor, t.kafka_configs()) for t in catalog.topics}
    assert {rf for _, rf, _ in planned.values()} == {1 if environment == "local" else 3}


def test_an_environment_the_catalog_does_not_define_stops_the_plan(initialised, broker, tmp_path):
    result = tofu(initialised, "plan", "-input=false", f"-state={tmp_path / 'none.state'}",
                  *variables(PROJECT_ROOT / "catalog" / "pipelines.yaml", broker.bootstrap_servers, manage_acls=False,
                             environment="staging"), check=False)
    assert result.returncode != 0
    assert 'The catalog has no environment "staging" under environments' in result.stderr



@pytest.mark.parametrize(("override", "message"), [
    ({"replication_factor": 4},
     "Topic oplog.operations: replication_factor 4 is more than the 3 broker(s) of environment cluster."),
    ({"configs": {"min.insync.replicas": 3}},
     "Topic oplog.operations: environment cluster must tolerate a broker loss, "
     "but min.insync.replicas 3 is not below replication_factor 3."),
])
def test_an_environment_asking_more_than_its_brokers_give_stops_the_plan(initialised, broker, tmp_path, override, message):
    """The suite refuses such a catalog itself (test_catalog); a hand-edited one meets the same rule here."""
    raw = yaml.safe_load((PROJECT_ROOT / "catalog" / "pipelines.yaml").read_text())
    raw["environments"]["cluster"]["topics"] = {"oplog.operations": override}
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(yaml.safe_dump(raw))
    result = tofu(initialised, "plan", "-input=false", f"-state={tmp_path / 'none.state'}",
                  *variables(catalog_file, broker.bootstrap_servers, manage_acls=False, environment="cluster"), check=False)
    assert result.returncode != 0
    assert message in " ".join(result.stderr.replace("│", " ").split()), result.stderr

class SecuredBroker:
    """A one-node KRaft broker with SASL/PLAIN and the StandardAuthorizer: ACLs are enforced.
    `admin` is a super user (Terraform connects as it); each app has a user of its own name."""

    PASSWORDS = {"admin": "admin-secret", "oplog-router": "router-secret", "presence-notifier": "presence-secret"}

    @staticmethod
    def start(state_dir: Path):
        from streamops.local_stack.broker import LocalBroker
        from tests.support.ports import free_port_pair

        passwords = SecuredBroker.PASSWORDS

        class _Broker(LocalBroker):
            def server_properties(self) -> dict[str, str]:
                users = " ".join(f'user_{name}="{secret}"' for name, secret in passwords.items())
                return {
                    **super().server_properties(),
                    "listeners": f"SASL_PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{self.port}",
                    "inter.broker.listener.name": "SASL_PLAINTEXT",
                    "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "sasl.enabled.mechanisms": "PLAIN",
                    "sasl.mechanism.inter.broker.protocol": "PLAIN",
                    "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                        'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
                        f'password="{passwords["admin"]}" {users};',
                    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                    # The controller listener (this node talking to itself) is not SASL.
                    "super.users": "User:admin;User:ANONYMOUS",
                }

            def healthy(self) -> bool:
                from confluent_kafka.admin import AdminClient

                if self.pid() is None:
                    return False
                try:
                    admin = AdminClient({**client_conf(self.bootstrap_servers, "admin"), "socket.timeout.ms": 2000,
                                         "log_level": 0})
                    return admin.describe_cluster(request_timeout=3).result(timeout=5).controller is not None
                except Exception:  # not healthy yet
                    return False

        broker = _Broker(state_dir=state_dir, port=free_port_pair())
        broker.start()
        return broker


def client_conf(bootstrap: str, user: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": SecuredBroker.PASSWORDS[user]}


def test_acls_on_a_broker_with_an_authorizer_let_each_app_do_its_job_and_nothing_else(initialised, prefix, tmp_path):
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        NewTopic,
        ResourcePatternType,
        ResourceType,
    )

    broker = SecuredBroker.start(tmp_path / "secured-kafka")
    try:
        catalog = load_catalog().with_topic_prefix(prefix)
        catalog_file = tmp_path / "catalog.yaml"
        catalog_file.write_text(catalog.to_yaml())
        args = [*variables(catalog_file, broker.bootstrap_servers, manage_acls=True), "-var", "sasl_username=admin",
                "-var", f"sasl_password={SecuredBroker.PASSWORDS['admin']}"]
        applied = tofu(initialised, "apply", "-input=false", "-auto-approve", f"-state={tmp_path / 'tf.state'}", *args)
        wanted = expected_acls(catalog)
        assert f"Apply complete! Resources: {len(catalog.topics) + len(wanted)} added" in applied.stdout

        admin = AdminClient(client_conf(broker.bootstrap_servers, "admin"))
        bindings = admin.describe_acls(AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                                        AclOperation.ANY, AclPermissionType.ANY)).result(timeout=30)
        found = {(b.principal, b.restype.name.title(), b.resource_pattern_type.name.title(), b.name, b.operation.name.title())
                 for b in bindings}
        assert found == wanted

        router = catalog.app("oplog-router")
        as_router = client_conf(broker.bootstrap_servers, "oplog-router")

        def produce(topic: str) -> str | None:
            errors = []
            producer = Producer({**as_router, "enable.idempotence": True})
            producer.produce(topic, b"x", on_delivery=lambda err, _m: errors.append(err))
            producer.flush(30)
            return errors[0].name() if errors and errors[0] else None

        assert produce(router.outputs["contacts"]) is None
        assert produce(router.dead_letter_topic) is None
        assert produce(router.inputs["operations"]) == "TOPIC_AUTHORIZATION_FAILED"  # its input: read only
        assert produce(catalog.app("presence-notifier").outputs["notifications"]) == "TOPIC_AUTHORIZATION_FAILED"

        def consume_error(group: str, topic: str) -> str | None:
            consumer = Consumer({**as_router, "group.id": group, "auto.offset.reset": "earliest"})
            try:
                consumer.subscribe([topic])
                for _ in range(20):
                    message = consumer.poll(1)
                    if message is not None and message.error():
                        return message.error().name()
                    if message is not None or consumer.assignment():
                        return None
                return "NO_ASSIGNMENT"
            finally:
                consumer.close()

        assert consume_error("streamops.oplog-router.test", router.inputs["operations"]) is None
        assert consume_error("someone-else", router.inputs["operations"]) == "GROUP_AUTHORIZATION_FAILED"
        creator = AdminClient(as_router)  # kept: a collected client cancels its pending requests
        created = creator.create_topics([NewTopic(f"{prefix}.not-in-the-catalog", 1, 1)])
        with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED|CLUSTER_AUTHORIZATION_FAILED"):
            created[f"{prefix}.not-in-the-catalog"].result(timeout=30)

        again = tofu(initialised, "plan", "-input=false", "-detailed-exitcode", f"-state={tmp_path / 'tf.state'}", *args,
                     check=False)
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        admin = creator = None  # closed before the broker goes, or they retry it, logging, until they are
        broker.stop()
