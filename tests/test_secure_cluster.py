"""The production-shaped cluster profile on this host: three real KRaft nodes (broker+controller
each, on 127.0.0.11-13) with TLS on every listener, SASL/SCRAM-SHA-512 for clients and
replication, a certificate-authenticated controller quorum, and ACLs.

The session's one secured cluster (conftest's `secure_cluster`, on ports chosen free at runtime; the
session's single broker on 127.0.0.1 is not touched). Waits poll with deadlines.
"""

from __future__ import annotations

import json
import socket
import stat
import uuid
from pathlib import Path

import psutil
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from streamops.local_stack.process import AlreadyRunning
from streamops.local_stack.secure_cluster import (
    ADMIN_USER,
    INTER_BROKER_USER,
    NODE_ADDRESSES,
    ClusterError,
    SecureCluster,
    free_cluster_ports,
)
from streamops.waiting import poll_until

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def cluster(secure_cluster) -> SecureCluster:
    """The session's secured cluster (conftest): its stop is checked when it stops, after its last user."""
    return secure_cluster


def _topic(kind: str) -> str:
    return f"secure-{kind}-{uuid.uuid4().hex[:8]}"


def _create_topic(cluster: SecureCluster, name: str, partitions: int = 1) -> None:
    admin = AdminClient(cluster.client_settings(ADMIN_USER))
    topic = NewTopic(name, num_partitions=partitions, replication_factor=3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic], request_timeout=30)[name].result(timeout=60)
    # Every node must know the topic before a client is told to use it.
    cluster.wait_isr_full([name], timeout=60)


def _deliver(settings: dict, topic: str, values: list[str], timeout: float = 60, **extra) -> list:
    """Produce `values` (key = value) and return each record's delivery error (None: delivered)."""
    reports: dict[int, object] = {}
    producer = Producer({**settings, "log_level": 0, **extra})
    for index, value in enumerate(values):
        producer.produce(topic, key=value.encode(), value=value.encode(),
                         on_delivery=lambda err, _msg, index=index: reports.__setitem__(index, err))
    poll_until(lambda: producer.flush(0.5) == 0, timeout=timeout, what=f"delivery reports from {topic}")
    return [reports[i] for i in range(len(values))]


def _consume(settings: dict, topic: str, partitions: int, count: int, timeout: float = 60) -> list[tuple[int, str]]:
    """Read `topic` from the beginning until `count` records arrived: (partition, value) in order."""
    consumer = Consumer({**settings, "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    records: list[tuple[int, str]] = []

    def read() -> bool:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            records.append((message.partition(), message.value().decode()))
        return len(records) >= count

    try:
        poll_until(read, timeout=timeout, interval=0.01, max_interval=0.01, what=f"{count} records from {topic}")
        # Nothing beyond the expected records (no duplicates).
        extra = consumer.poll(1.0)
        assert extra is None or extra.error() is not None, f"unexpected extra record {extra.value()!r}"
    finally:
        consumer.close()
    return records


def test_addresses_are_the_three_loopback_addresses():
    assert dict(NODE_ADDRESSES) == {1: "127.0.0.11", 2: "127.0.0.12", 3: "127.0.0.13"}



@pytest.mark.parametrize("name", [ADMIN_USER, "kafka-interbroker", "kafka-node"])
def test_an_app_named_like_the_clusters_own_users_is_refused_before_the_cluster_is_asked(tmp_path, name):
    with pytest.raises(ClusterError) as refused:
        SecureCluster(tmp_path).ensure_users(["oplog-router", name])
    assert str(refused.value).startswith(f"{name!r}: reserved for the cluster itself")
    assert "rename the app in the catalog" in str(refused.value)

def test_a_port_in_use_is_refused_naming_node_address_and_port(tmp_path):
    ports = free_cluster_ports()
    with socket.socket() as taken:
        taken.bind(("127.0.0.12", ports["controller_port"]))
        taken.listen()
        with pytest.raises(ClusterError) as caught:
            SecureCluster(tmp_path / "busy", **ports).start()
    assert str(caught.value) == (
        f"cannot start node 2 (127.0.0.12: client {ports['client_port']}, controller {ports['controller_port']}, "
        f"internal {ports['internal_port']}): the controller port {ports['controller_port']} on 127.0.0.12 is in "
        "use by another process; choose other ports (SecureCluster(client_port=..., controller_port=..., "
        "internal_port=...))"
    )
    assert not (tmp_path / "busy").exists(), "nothing is written before the ports are checked"


def test_a_node_that_dies_at_start_up_is_named_with_its_log_tail(tmp_path):
    ports = free_cluster_ports()
    broken = SecureCluster(tmp_path / "broken", heap="1k", **ports)  # the JVM refuses this heap
    with pytest.raises(ClusterError) as caught:
        broken.start(timeout=60)
    message = str(caught.value)
    assert message.startswith("the secure Kafka cluster did not start; the started nodes were stopped again.")
    # Every node dies; the report names those seen dead first (at least one), each with its log.
    named = [node for node, address in NODE_ADDRESSES.items()
             if (f"--- node {node} ({address}: client {ports['client_port']}, controller {ports['controller_port']}, "
                 f"internal {ports['internal_port']}) exited during start-up; last log lines "
                 f"({broken.log_file(node)}):") in message]
    assert named, message
    assert "heap" in message.lower()
    assert all(broken.pid(node) is None for node in broken.node_ids)


def test_cluster_is_up_with_three_nodes_and_refuses_a_second_start(cluster):
    status = cluster.status()
    assert status.startswith(f"secure Kafka cluster at {cluster.bootstrap_servers}: 3/3 nodes running, "
                             "3 broker(s) registered [1, 2, 3], active controller: node ")
    assert cluster.active_controller() in (1, 2, 3)
    with pytest.raises(AlreadyRunning):
        cluster.start()


def test_client_settings_are_complete_librdkafka_settings(cluster):
    settings = cluster.client_settings(ADMIN_USER)
    assert settings == {
        "bootstrap.servers": f"127.0.0.11:{cluster.client_port},127.0.0.12:{cluster.client_port},"
                             f"127.0.0.13:{cluster.client_port}",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": ADMIN_USER,
        "sasl.password": cluster.passwords()[ADMIN_USER],
        "ssl.ca.location": str(cluster.ca_file),
    }
    assert cluster.ca_file.read_text().startswith("-----BEGIN CERTIFICATE-----")
    # The suite's client configuration accepts them and never prints the password.
    assert cluster.passwords()[ADMIN_USER] not in repr(cluster.client_config(ADMIN_USER))
    with pytest.raises(ClusterError, match="no SCRAM user 'nobody'"):
        cluster.client_settings("nobody")


def test_admin_over_sasl_ssl_creates_a_replicated_topic_and_records_round_trip(cluster):
    topic = _topic("roundtrip")
    settings = cluster.client_settings(ADMIN_USER)
    _create_topic(cluster, topic, partitions=3)

    admin = AdminClient(settings)
    description = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30)
    assert [sorted(r.id for r in p.replicas) for p in description.partitions] == [[1, 2, 3]] * 3
    config = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    values = next(iter(config.values())).result(timeout=30)
    assert values["min.insync.replicas"].value == "2"

    sent = [f"record-{i:03d}" for i in range(60)]
    assert _deliver(settings, topic, sent, acks="all", **{"enable.idempotence": True}) == [None] * len(sent)
    received = _consume(settings, topic, partitions=3, count=len(sent))
    assert sorted(value for _, value in received) == sent
    # Within a partition the order of production holds (same key -> same partition).
    for partition in range(3):
        in_partition = [value for p, value in received if p == partition]
        assert in_partition == sorted(in_partition)


def _connection_error(settings: dict, codes: tuple[int, ...], saying: tuple[str, ...] = ("",),
                      timeout: float = 30) -> KafkaError:
    """The first error with one of `codes`, its text containing one of `saying`, that a client with
    `settings` reports while trying to connect (other, transient errors may come first on a busy
    host: a connection timeout is not what a test is after)."""
    errors: list[KafkaError] = []
    producer = Producer({**settings, "error_cb": errors.append, "log_level": 0})

    def reported() -> KafkaError | None:
        producer.poll(0.2)  # serves error_cb
        return next((e for e in errors if e.code() in codes and any(t in e.str() for t in saying)), None)

    try:
        return poll_until(reported, timeout=timeout, what=f"the client to report one of the errors {codes}")
    except TimeoutError:
        pytest.fail(f"no error {codes} saying {saying} within {timeout}s; the client reported: "
                    f"{[e.str() for e in errors]}")


def test_wrong_password_is_an_authentication_error_and_plaintext_cannot_connect(cluster):
    settings = cluster.client_settings(ADMIN_USER)

    wrong = _connection_error({**settings, "sasl.password": "not-" + settings["sasl.password"]},
                              (KafkaError._AUTHENTICATION,))
    assert ("SASL authentication error: Authentication failed during authentication due to invalid credentials "
            "with SASL mechanism SCRAM-SHA-512") in wrong.str(), wrong

    # Plaintext against TLS listeners: every connection breaks off; the client never gets in.
    _connection_error({"bootstrap.servers": cluster.bootstrap_servers}, (KafkaError._ALL_BROKERS_DOWN,),
                      saying=("brokers are down",))

    # A client that does not trust the cluster's CA fails the TLS handshake (server verified).
    _connection_error({k: v for k, v in settings.items() if k != "ssl.ca.location"}, (KafkaError._SSL,),
                      saying=("certificate verify failed",))

    # The controller listener wants a client certificate signed by the cluster's CA.
    _connection_error({"bootstrap.servers": f"127.0.0.11:{cluster.controller_port}", "security.protocol": "SSL",
                       "ssl.ca.location": str(cluster.ca_file)},
                      (KafkaError._TRANSPORT, KafkaError._SSL), saying=("bad certificate", "certificate required"))


def test_a_user_without_acls_is_refused_until_granted_write(cluster):
    app = f"app-{uuid.uuid4().hex[:6]}"
    password = cluster.ensure_users([app])[app]
    assert cluster.ensure_users([app]) == {app: password}, "an existing user keeps its password"
    assert cluster.passwords()[app] == password
    assert stat.S_IMODE(cluster.users_file.stat().st_mode) == 0o600

    topic = _topic("acl")
    _create_topic(cluster, topic)
    app_settings = cluster.client_settings(app)

    [refused] = _deliver(app_settings, topic, ["denied"], timeout=30)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused

    admin = AdminClient(cluster.client_settings(ADMIN_USER))
    grant = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{app}", "*",
                       AclOperation.WRITE, AclPermissionType.ALLOW)
    for future in admin.create_acls([grant], request_timeout=30).values():
        future.result(timeout=30)

    # The ACL reaches every node through the metadata log: retry until a produce gets through.
    poll_until(lambda: _deliver(app_settings, topic, ["allowed"], timeout=20) == [None], timeout=60,
               what=f"{app} to be allowed to write to {topic}")
    assert _consume(cluster.client_settings(ADMIN_USER), topic, partitions=1, count=1) == [(0, "allowed")]


def test_killing_a_partition_leader_keeps_acks_all_producing_and_the_node_rejoins(cluster):
    topic = _topic("failover")
    _create_topic(cluster, topic)
    settings = cluster.client_settings(ADMIN_USER)
    assert _deliver(settings, topic, ["before"], acks="all") == [None]

    leader = cluster.leader_of(topic, 0)
    killed_pid = cluster.pid(leader)
    cluster.kill_node(leader)
    assert cluster.pid(leader) is None and not psutil.pid_exists(killed_pid)

    during = [f"during-{i:02d}" for i in range(20)]
    assert _deliver(settings, topic, during, timeout=90, acks="all", **{"enable.idempotence": True}) \
        == [None] * len(during)
    new_leader = cluster.leader_of(topic, 0)
    assert new_leader != leader

    cluster.start_node(leader)
    cluster.wait_isr_full([topic], timeout=90)
    assert cluster.pid(leader) is not None
    received = _consume(settings, topic, partitions=1, count=1 + len(during))
    assert [value for _, value in received] == ["before", *during]


def test_no_password_in_any_log_config_or_command_line(cluster):
    passwords = cluster.passwords()
    assert {ADMIN_USER, INTER_BROKER_USER} <= set(passwords)
    # The files that hold secrets on purpose: the users, the CA's key, and each principal's client
    # settings (`streamops cluster up` writes them for --kafka-config and the Airflow connections).
    private = {cluster.users_file, cluster.ca_key_file, *cluster.state_dir.glob("clients/*.json")}
    for node in cluster.node_ids:
        private |= {cluster.secrets_file(node), cluster.keystore_file(node)}
        properties = cluster.config_file(node).read_text()
        # The inter-broker login is a reference into the 0600 secrets file, resolved by Kafka.
        assert (f"listener.name.internal.scram-sha-512.sasl.jaas.config=${{file:{cluster.secrets_file(node)}:"
                "inter.broker.jaas.config}") in properties
        assert passwords[INTER_BROKER_USER] in cluster.secrets_file(node).read_text()
        assert cluster.log_file(node).stat().st_size > 0
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{path} is readable by others"

    leaks = []
    scanned = 0
    for path in Path(cluster.state_dir).rglob("*"):
        if not path.is_file() or path in private:
            continue
        content = path.read_bytes()
        scanned += 1
        leaks += [f"{path} holds the password of {user}" for user, pw in passwords.items() if pw.encode() in content]
    assert scanned > 20 and leaks == []
    assert not list(Path(cluster.state_dir).rglob(".format.args")), "the format argument file was not removed"

    for node in cluster.node_ids:
        cmdline = " ".join(psutil.Process(cluster.pid(node)).cmdline())
        assert not [user for user, pw in passwords.items() if pw in cmdline], f"password in node {node}'s argv"
    json.loads(cluster.users_file.read_text())  # still a valid users file
