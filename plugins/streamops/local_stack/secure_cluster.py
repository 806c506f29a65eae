"""A production-shaped Kafka cluster on this one machine: three KRaft nodes with TLS, SASL/SCRAM
and ACLs, run from the jars that bin/setup resolved into .cache/jars/kafka-broker.

Shape (everything lives under `state_dir`):

    node 1  127.0.0.11   node 2  127.0.0.12   node 3  127.0.0.13
    each `process.roles=broker,controller`, with three listeners on its own loopback address:
      CLIENT      SASL_SSL, SCRAM-SHA-512   client_port (default 19092)     apps, the suite
      INTERNAL    SASL_SSL, SCRAM-SHA-512   internal_port (default 19094)   replication
      CONTROLLER  SSL, client cert required controller_port (default 19093) KRaft quorum

  tls/ca.pem, tls/ca-key.pem (0600)      the local CA this module generates; clients trust ca.pem
  node-N/keystore.pem (0600)             node N's PKCS#8 key + certificate (its IP as SAN) + CA
  node-N/server.properties               no secret in it
  node-N/secrets.properties (0600)       the inter-broker JAAS line (read through Kafka's
                                         FileConfigProvider, so the password is in no config
                                         Kafka logs and in no command line)
  node-N/data, node-N/node.log, node-N/node.pid
  users.json (0600)                      SCRAM user -> password (admin, inter-broker, apps)

Principals: `User:streamops-admin` (the suite: topics, ACLs, users), `User:kafka-interbroker`
(replication over INTERNAL) and `User:kafka-node` (every node's certificate on the controller
listener, mapped by `ssl.principal.mapping.rules`) are super users; everybody else needs ACLs
(`allow.everyone.if.no.acl.found=false`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from streamops import settings
from streamops.kafka_client import KafkaClientConfig, _jaas_quote
from streamops.local_stack.broker import _LOG4J2, _cluster_id, _require_jars, jvm_options
from streamops.local_stack.process import AlreadyRunning, ServiceError, ServiceProcess, log_tail, ports_from_env
from streamops.paths import KAFKA_BROKER_JARS, RUN_DIR
from streamops.waiting import DeadlineExceeded, poll_until

NODE_ADDRESSES: Mapping[int, str] = {1: "127.0.0.11", 2: "127.0.0.12", 3: "127.0.0.13"}
DEFAULT_CLIENT_PORT = 19092
DEFAULT_CONTROLLER_PORT = 19093
DEFAULT_INTERNAL_PORT = 19094

ADMIN_USER = "streamops-admin"
INTER_BROKER_USER = "kafka-interbroker"
# Every node's certificate subject is CN=kafka-node-<id>,OU=kafka-nodes,O=streamops-local; the
# mapping rule turns all of them into this one principal.
NODE_PRINCIPAL = "kafka-node"
_NODE_SUBJECT_OU = "kafka-nodes"
_NODE_SUBJECT_O = "streamops-local"

SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
# A SCRAM user name the suite accepts: it reaches a JAAS line, an ACL principal and a file.
_USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_CA_DAYS = 3650
_CERT_DAYS = 825
_RENEW_BEFORE = dt.timedelta(days=30)


class ClusterError(ServiceError):
    """The secure cluster (or one of its nodes) is not in the state asked for; says which and why."""


@dataclass
class SecureCluster:
    """Three KRaft nodes (broker+controller each) with TLS, SCRAM-SHA-512 and ACLs."""

    state_dir: Path = RUN_DIR / "kafka-secure"
    client_port: int = DEFAULT_CLIENT_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT
    internal_port: int = DEFAULT_INTERNAL_PORT
    heap: str = "384m"
    addresses: Mapping[int, str] = field(default_factory=lambda: dict(NODE_ADDRESSES))  # node id -> address

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.addresses = dict(self.addresses)
        for node, address in self.addresses.items():
            try:
                valid = isinstance(node, int) and node >= 1 and ipaddress.ip_address(address).version == 4
            except ValueError:
                valid = False
            if not valid:
                raise ClusterError(f"node {node!r} at {address!r}: node ids are integers >= 1, addresses IPv4 addresses")
        if len(set(self.addresses.values())) != len(self.addresses):
            raise ClusterError(f"every node needs its own address, got {self.addresses}")
        if not re.fullmatch(r"[1-9][0-9]*[kKmMgG]", str(self.heap)):
            raise ClusterError(f"heap {self.heap!r} is not a JVM heap size such as 384m or 1g")
        ports = (self.client_port, self.controller_port, self.internal_port)
        if len(set(ports)) != 3 or not all(0 < p < 65536 for p in ports):
            raise ClusterError(
                f"the client, controller and internal ports must be three different TCP ports, got {ports}"
            )
        self.processes = {
            node: ServiceProcess(
                name=f"Kafka node {node} ({address})",
                pid_file=self.node_dir(node) / "node.pid",
                log_file=self.node_dir(node) / "node.log",
            )
            for node, address in self.addresses.items()
        }

    @classmethod
    def from_env(cls) -> SecureCluster:
        """The cluster the CLI manages: $STREAMOPS_CLUSTER_DIR (default <run dir>/kafka-secure) and
        $STREAMOPS_CLUSTER_PORTS ("client,controller,internal", default 19092,19093,19094)."""
        numbers = ports_from_env(settings.CLUSTER_PORTS, ("client_port", "controller_port", "internal_port"), ClusterError)
        return cls(state_dir=Path(settings.CLUSTER_DIR.get() or RUN_DIR / "kafka-secure"), **numbers)

    def is_running(self) -> bool:
        return any(process.pid() is not None for process in self.processes.values())

    def write_client_files(self, users: Iterable[str]) -> dict[str, Path]:
        """Each user's client settings as an Airflow Kafka connection's extra, in a file only this
        user can read (<state dir>/clients/<user>.json): for --kafka-config and the connections."""
        return {user: self.client_config(user).write_private(self.state_dir / "clients" / f"{user}.json", as_extra=True)
                for user in users}

    # --- where things are -----------------------------------------------------------------------

    @property
    def node_ids(self) -> list[int]:
        return sorted(self.addresses)

    def node_dir(self, node: int) -> Path:
        return self.state_dir / f"node-{node}"

    def data_dir(self, node: int) -> Path:
        return self.node_dir(node) / "data"

    def config_file(self, node: int) -> Path:
        return self.node_dir(node) / "server.properties"

    def secrets_file(self, node: int) -> Path:
        return self.node_dir(node) / "secrets.properties"

    def keystore_file(self, node: int) -> Path:
        return self.node_dir(node) / "keystore.pem"

    def log_file(self, node: int) -> Path:
        return self.processes[self._known(node)].log_file

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / "tls"

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM) every client of this cluster trusts."""
        return self.tls_dir / "ca.pem"

    @property
    def ca_key_file(self) -> Path:
        return self.tls_dir / "ca-key.pem"

    @property
    def users_file(self) -> Path:
        return self.state_dir / "users.json"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{self.addresses[n]}:{self.client_port}" for n in self.node_ids)

    def describe_node(self, node: int) -> str:
        address = self.addresses[self._known(node)]
        return (f"node {node} ({address}: client {self.client_port}, controller {self.controller_port}, "
                f"internal {self.internal_port})")

    # --- users and clients ----------------------------------------------------------------------

    def passwords(self) -> dict[str, str]:
        """Every SCRAM user this cluster knows -> password (from the 0600 users file)."""
        if not self.users_file.exists():
            return {}
        try:
            data = json.loads(self.users_file.read_text())
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read the cluster's users file {self.users_file}: {exc}") from None
        users = data.get("users") if isinstance(data, dict) else None
        if not isinstance(users, dict):
            raise ClusterError(f"{self.users_file} is not a users file (no 'users' object)")
        return dict(users)

    def client_settings(self, user: str = ADMIN_USER) -> dict[str, str]:
        """The complete librdkafka settings for connecting as `user` (secret included)."""
        known = self.passwords()
        if user not in known:
            raise ClusterError(
                f"no SCRAM user {user!r} in {self.users_file}: known users are "
                f"{', '.join(sorted(known)) or '(none: the cluster was never started)'}; "
                "add one with ensure_users()"
            )
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": known[user],
            "ssl.ca.location": str(self.ca_file),
        }

    def client_config(self, user: str = ADMIN_USER) -> KafkaClientConfig:
        """The same settings as the suite's client configuration object (redacts itself)."""
        return KafkaClientConfig(self.client_settings(user), source=f"secure cluster {self.state_dir} as {user}")

    def ensure_users(self, names: Iterable[str], timeout: float = 60.0) -> dict[str, str]:
        """Make sure each SCRAM-SHA-512 user exists; return name -> password.

        A user already in the users file keeps its password (and is re-created with it if the
        cluster lost it). A new name gets a random password, saved (0600) before the cluster is
        asked, so a failure half-way never loses a password; should the cluster already know that
        name from elsewhere, its password is reset to the saved one, since the users file is this
        cluster's record of its secrets. Returns once every running node accepts each login."""
        from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        names = list(dict.fromkeys(names))
        bad = [n for n in names if not isinstance(n, str) or not _USER_NAME.fullmatch(n)]
        if bad:
            raise ClusterError(
                f"invalid SCRAM user names {bad!r}: use 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        reserved = [n for n in names if n in (ADMIN_USER, INTER_BROKER_USER, NODE_PRINCIPAL)]
        if reserved:
            # An app of that name would get the suite's, the brokers' or the controllers' rights.
            raise ClusterError(f"{', '.join(map(repr, reserved))}: reserved for the cluster itself "
                               f"({ADMIN_USER}: the suite's super user; {INTER_BROKER_USER}, {NODE_PRINCIPAL}: the nodes); "
                               "rename the app in the catalog")
        if not names:
            return {}
        with self._users_lock():
            known = self.passwords()
            new = {n: _new_password() for n in names if n not in known}
            if new:
                known = {**known, **new}
                self._save_passwords(known)
        admin = self._admin()
        try:
            to_set = set(new)
            saved_before = [n for n in names if n not in new]
            described = admin.describe_user_scram_credentials(saved_before, request_timeout=15) if saved_before else {}
            for name, future in described.items():
                try:
                    info = future.result(timeout=20)
                    if ScramMechanism.SCRAM_SHA_512 not in {c.mechanism for c in info.scram_credential_infos}:
                        to_set.add(name)
                except Exception:  # noqa: BLE001 - RESOURCE_NOT_FOUND: the cluster has no credential
                    to_set.add(name)
            if to_set:
                upserts = [
                    UserScramCredentialUpsertion(
                        name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS), known[name].encode()
                    )
                    for name in sorted(to_set)
                ]
                for name, future in admin.alter_user_scram_credentials(upserts, request_timeout=20).items():
                    try:
                        future.result(timeout=30)
                    except Exception as exc:  # noqa: BLE001
                        raise ClusterError(
                            f"creating SCRAM user {name!r} on the cluster at {self.bootstrap_servers} failed: {exc} "
                            f"(its password is kept in {self.users_file}; calling ensure_users again retries)"
                        ) from None
        finally:
            del admin
        # The credential reaches each node through the metadata log: wait until all accept it.
        for name in names:
            for node in self.node_ids:
                if self.processes[node].pid() is None:
                    continue
                try:
                    poll_until(partial(self._can_login, node, name), timeout=timeout,
                               what=f"user {name} to be able to log in on {self.describe_node(node)}")
                except DeadlineExceeded as exc:
                    raise ClusterError(f"{exc}; log ({self.log_file(node)}):\n{log_tail(self.log_file(node))}") from None
        return {name: known[name] for name in names}

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 150.0) -> str:
        """Start every node that is not running and wait until the cluster has all brokers
        registered and an active controller (asked as the admin over SASL_SSL)."""
        to_start = [n for n in self.node_ids if self.processes[n].pid() is None]
        if not to_start:
            raise AlreadyRunning(
                f"the secure Kafka cluster is already running at {self.bootstrap_servers} "
                f"(pids {', '.join(str(self.processes[n].pid()) for n in self.node_ids)}); state in {self.state_dir}"
            )
        _require_jars()
        self._check_addresses_and_ports(to_start)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        self._ensure_tls()
        passwords = self._ensure_bootstrap_users()
        cluster_id = self._cluster_id()
        for node in self.node_ids:
            self._write_node_files(node, passwords[INTER_BROKER_USER])
        self._format(to_start, cluster_id, passwords)
        try:
            for node in to_start:
                self.processes[node].spawn(self._java(node) + ["kafka.Kafka", str(self.config_file(node))],
                                           env=_env(), cwd=self.node_dir(node))
            self._wait_healthy(timeout, expecting=to_start)
        except BaseException:
            # The nodes run in sessions of their own: a failed or interrupted start must not
            # leave the ones it started running.
            for node in to_start:
                self.processes[node].stop(timeout=15)
            raise
        return (f"secure Kafka cluster up at {self.bootstrap_servers} (SASL_SSL, {SCRAM_MECHANISM}); "
                f"nodes {', '.join(f'{n}: pid {self.processes[n].pid()}' for n in self.node_ids)}; "
                f"CA {self.ca_file}; state in {self.state_dir}")

    def stop(self, timeout: float = 60.0) -> str:
        """Stop every node: SIGTERM to each node's own process group, all at once, SIGKILL past
        the deadline. All at once because each node's controlled shutdown needs the KRaft
        quorum: stopped one by one, the last node waits for a quorum that is gone."""
        from concurrent.futures import ThreadPoolExecutor

        pids = {n: self.processes[n].pid() for n in self.node_ids}
        running = [n for n, pid in pids.items() if pid is not None]
        if not running:
            return "secure Kafka cluster: no node was running"

        def stop_node(node: int) -> str:
            outcome = self.processes[node].stop(timeout=timeout)
            # A JVM's main thread shows as a zombie while its other threads still exit; reap it
            # for good, so no trace of the node is left in the process table.
            pid = pids[node]
            if pid is not None:
                poll_until(lambda: _reaped(pid), timeout=15, what=f"{self.processes[node].name} to be reaped")
            return outcome

        with ThreadPoolExecutor(max_workers=len(running)) as pool:
            outcomes = list(pool.map(stop_node, running))
        still = [self.describe_node(n) for n in self.node_ids if self.processes[n].pid() is not None]
        if still:
            raise ClusterError(f"still running after stop(): {'; '.join(still)}; state in {self.state_dir}")
        return "; ".join(outcomes)

    def kill_node(self, node: int, timeout: float = 30.0) -> str:
        """SIGKILL one node by its own pid (a crash, for fault tests); its data stays."""
        process = self.processes[self._known(node)]
        pid = process.pid()
        if pid is None:
            raise ClusterError(f"cannot kill {self.describe_node(node)}: it is not running")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        poll_until(lambda: _reaped(pid), timeout=timeout, what=f"{process.name} (pid {pid}) to die")
        process.pid()  # drops the stale pid file
        return f"{process.name} killed (pid {pid})"

    def start_node(self, node: int, timeout: float = 120.0) -> str:
        """Start one stopped node with its existing data and wait until it is registered again."""
        process = self.processes[self._known(node)]
        if process.pid() is not None:
            raise AlreadyRunning(f"{self.describe_node(node)} is already running (pid {process.pid()})")
        if not (self.data_dir(node) / "meta.properties").exists() or not self.config_file(node).exists():
            raise ClusterError(
                f"{self.describe_node(node)} has no formatted data in {self.data_dir(node)}: "
                "start the whole cluster with start() first"
            )
        _require_jars()
        self._check_addresses_and_ports([node])
        process.spawn(self._java(node) + ["kafka.Kafka", str(self.config_file(node))],
                      env=_env(), cwd=self.node_dir(node))
        self._wait_healthy(timeout, expecting=[node])
        return f"{process.name} up again (pid {process.pid()})"

    def status(self) -> str:
        lines = []
        running = 0
        for node in self.node_ids:
            pid = self.processes[node].pid()
            running += pid is not None
            state = f"running (pid {pid})" if pid else "stopped"
            lines.append(f"  {self.describe_node(node)}: {state}; log {self.log_file(node)}")
        if running:
            registered = self._registered_nodes()
            controller = self.active_controller()
            health = (f"{len(registered)} broker(s) registered {sorted(registered)}, active controller: "
                      f"{f'node {controller}' if controller is not None else 'NONE'}") if registered \
                else "NOT answering"
        else:
            health = "stopped"
        return (f"secure Kafka cluster at {self.bootstrap_servers}: {running}/{len(self.node_ids)} nodes running, "
                f"{health}\n" + "\n".join(lines))

    def pid(self, node: int) -> int | None:
        return self.processes[self._known(node)].pid()

    # --- topics ---------------------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading `topic`/`partition` now."""
        for part in self._describe_topic(topic).partitions:
            if part.id == partition:
                if part.leader is None or part.leader.id < 0:
                    raise ClusterError(f"{topic}[{partition}] has no leader now (replicas "
                                       f"{[r.id for r in part.replicas]}, in sync {[r.id for r in part.isr]})")
                return part.leader.id
        raise ClusterError(f"topic {topic!r} has no partition {partition}")

    def wait_isr_full(self, topics: Sequence[str], timeout: float = 60.0) -> None:
        """Wait until every partition of `topics` has all its replicas in sync."""
        lagging: list[str] = []

        def full() -> bool:
            lagging.clear()
            for topic in topics:
                try:
                    description = self._describe_topic(topic)
                except ClusterError:
                    lagging.append(f"{topic} (not describable yet)")
                    continue
                for part in description.partitions:
                    replicas, isr = {r.id for r in part.replicas}, {r.id for r in part.isr}
                    if replicas != isr:
                        lagging.append(f"{topic}[{part.id}] in sync {sorted(isr)} of replicas {sorted(replicas)}")
            return not lagging

        try:
            poll_until(full, timeout=timeout, what=f"all replicas of {', '.join(topics)} to be in sync")
        except DeadlineExceeded as exc:
            down = [self.describe_node(n) for n in self.node_ids if self.processes[n].pid() is None]
            raise ClusterError(f"{exc}: {'; '.join(lagging)}"
                               + (f"; not running: {', '.join(down)}" if down else "")) from None

    # --- internals: checks ----------------------------------------------------------------------

    def _known(self, node: int) -> int:
        if node not in self.addresses:
            raise ClusterError(f"no node {node!r} in this cluster (nodes are {self.node_ids})")
        return node

    def _check_addresses_and_ports(self, nodes: Sequence[int]) -> None:
        for node in nodes:
            address = self.addresses[node]
            try:
                with socket.socket() as sock:
                    sock.bind((address, 0))
            except OSError as exc:
                raise ClusterError(
                    f"cannot start {self.describe_node(node)}: this host cannot bind {address} ({exc.strerror}). "
                    f"Linux routes all of 127.0.0.0/8 to the loopback interface; if yours does not, add it "
                    f"with `ip addr add {address}/8 dev lo` (needs root)"
                ) from None
            for what, port in (("client", self.client_port), ("controller", self.controller_port),
                               ("internal", self.internal_port)):
                if _port_in_use(address, port):
                    raise ClusterError(
                        f"cannot start {self.describe_node(node)}: the {what} port {port} on {address} is in use "
                        "by another process; choose other ports (SecureCluster(client_port=..., "
                        "controller_port=..., internal_port=...))"
                    )

    # --- internals: TLS -------------------------------------------------------------------------

    def _ensure_tls(self) -> None:
        """The CA (generated once) and one certificate per node, renewed when missing, close to
        expiry, not from this CA or not for the node's address."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        self.tls_dir.mkdir(parents=True, exist_ok=True)
        if not (self.ca_file.exists() and self.ca_key_file.exists()) or _expiring(self.ca_file):
            ca_key, ca_cert = _make_ca()
            _write_private(self.ca_key_file, _key_pem(ca_key))
            _write_public(self.ca_file, ca_cert.public_bytes(serialization.Encoding.PEM))
        ca_cert = x509.load_pem_x509_certificate(self.ca_file.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key_file.read_bytes(), password=None)
        for node in self.node_ids:
            keystore = self.keystore_file(node)
            if keystore.exists() and _cert_fits(keystore, ca_cert, self.addresses[node]):
                continue
            key, cert = _make_node_cert(ca_key, ca_cert, node, self.addresses[node])
            pem_cert = cert.public_bytes(serialization.Encoding.PEM)
            _write_private(keystore, _key_pem(key) + pem_cert + ca_cert.public_bytes(serialization.Encoding.PEM))
            _write_public(self.node_dir(node) / "cert.pem", pem_cert)

    # --- internals: users and config ------------------------------------------------------------

    @contextmanager
    def _users_lock(self):
        """One writer of the users file at a time (several processes may add app users)."""
        import fcntl

        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "users.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _save_passwords(self, users: Mapping[str, str]) -> None:
        _write_private(self.users_file, json.dumps({"users": dict(users)}, indent=2).encode())

    def _ensure_bootstrap_users(self) -> dict[str, str]:
        with self._users_lock():
            known = self.passwords()
            added = {name: _new_password() for name in (ADMIN_USER, INTER_BROKER_USER) if name not in known}
            if added:
                known = {**known, **added}
                self._save_passwords(known)
        return known

    def _cluster_id(self) -> str:
        path = self.state_dir / "cluster.id"
        if not path.exists():
            path.write_text(_cluster_id() + "\n")
        return path.read_text().strip()

    def server_properties(self, node: int) -> dict[str, str]:
        """Node `node`'s broker config. No secret: the inter-broker JAAS line is a reference
        into its 0600 secrets file, resolved by Kafka's FileConfigProvider."""
        address = self.addresses[self._known(node)]
        voters = ",".join(f"{n}@{self.addresses[n]}:{self.controller_port}" for n in self.node_ids)
        return {
            "process.roles": "broker,controller",
            "node.id": str(node),
            "controller.quorum.voters": voters,
            "listeners": (f"CLIENT://{address}:{self.client_port},INTERNAL://{address}:{self.internal_port},"
                          f"CONTROLLER://{address}:{self.controller_port}"),
            "advertised.listeners": f"CLIENT://{address}:{self.client_port},INTERNAL://{address}:{self.internal_port}",
            "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SASL_SSL,CONTROLLER:SSL",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "INTERNAL",
            # SASL/SCRAM on the client and inter-broker listeners. The server side needs a JAAS
            # entry per listener but no password; the inter-broker one logs in as a user.
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            "listener.name.client.scram-sha-512.sasl.jaas.config": f"{_SCRAM_LOGIN} required;",
            "config.providers": "file",
            "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
            "listener.name.internal.scram-sha-512.sasl.jaas.config":
                f"${{file:{self.secrets_file(node)}:inter.broker.jaas.config}}",
            # TLS everywhere, PEM files. The controller listener (no SASL in KRaft) demands a
            # client certificate; its subject maps to the short super-user principal.
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore_file(node)),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "ssl.endpoint.identification.algorithm": "https",
            "ssl.client.auth": "none",
            "listener.name.controller.ssl.client.auth": "required",
            "ssl.principal.mapping.rules": (f"RULE:^CN=kafka-node-[0-9]+,OU={_NODE_SUBJECT_OU},O={_NODE_SUBJECT_O}$"
                                            f"/{NODE_PRINCIPAL}/,DEFAULT"),
            # Authorization: nothing without an ACL, except the super users.
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN_USER};User:{INTER_BROKER_USER};User:{NODE_PRINCIPAL}",
            "log.dirs": str(self.data_dir(node)),
            # Typos must not become topics: only the catalog creates topics.
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": "3",
            "min.insync.replicas": "2",
            "offsets.topic.replication.factor": "3",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "3",
            "transaction.state.log.min.isr": "2",
            "share.coordinator.state.topic.replication.factor": "3",
            "share.coordinator.state.topic.min.isr": "2",
            "unclean.leader.election.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            # Two cores for three nodes: few threads each.
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.replica.fetchers": "1",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            # Idle, three nodes on one machine woke each other twice a second: the controller's
            # no-op metadata record (Kafka: every 500 ms) and each follower's empty fetch (its long
            # poll, 500 ms). A record that arrives still answers a waiting fetch at once, so acks=all
            # takes no longer; measured here, the idle cluster's CPU fell by about a third.
            "metadata.max.idle.interval.ms": "5000",
            "replica.fetch.wait.max.ms": "2000",
        }

    def _write_node_files(self, node: int, inter_broker_password: str) -> None:
        directory = self.node_dir(node)
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        _write_private(
            self.secrets_file(node),
            ("inter.broker.jaas.config=" + _properties_escape(
                f"{_SCRAM_LOGIN} required username={_jaas_quote(INTER_BROKER_USER)} "
                f"password={_jaas_quote(inter_broker_password)};") + "\n").encode(),
        )
        self.config_file(node).write_text(
            "".join(f"{key}={_properties_escape(value)}\n" for key, value in self.server_properties(node).items())
        )
        (directory / "log4j2.yaml").write_text(_LOG4J2)

    def _format(self, nodes: Sequence[int], cluster_id: str, passwords: Mapping[str, str]) -> None:
        """Format each node's KRaft storage once, with the bootstrap SCRAM users. The passwords
        reach the StorageTool through a 0600 argument file (its argument parser reads `@file`,
        one argument per line), deleted afterwards: never through its command line."""
        pending = [n for n in nodes if not (self.data_dir(n) / "meta.properties").exists()]
        scram_args = [
            f"--add-scram={SCRAM_MECHANISM}=[name={name},iterations={SCRAM_ITERATIONS},password={passwords[name]}]"
            for name in (ADMIN_USER, INTER_BROKER_USER)
        ]
        running: dict[int, tuple[subprocess.Popen, Path]] = {}
        try:
            for node in pending:
                self.data_dir(node).mkdir(parents=True, exist_ok=True)
                argfile = self.node_dir(node) / ".format.args"
                _write_private(argfile, "\n".join(scram_args).encode())
                proc = subprocess.Popen(  # noqa: S603 - argv built here, no shell, no secret
                    [*self._java(node, heap="256m"), "kafka.tools.StorageTool", "format",
                     f"--cluster-id={cluster_id}", "--config", str(self.config_file(node)), "--ignore-formatted",
                     f"@{argfile}"],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), text=True,
                )
                running[node] = (proc, argfile)
            failures = []
            for node, (proc, _) in running.items():
                try:
                    output, _ = proc.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    output, _ = proc.communicate()
                    failures.append(f"{self.describe_node(node)}: formatting timed out after 120s\n{output}")
                    continue
                if proc.returncode != 0:
                    failures.append(f"{self.describe_node(node)}: formatting {self.data_dir(node)} failed:\n"
                                    f"{_scrub(output, passwords.values())}")
            if failures:
                raise ClusterError("\n".join(failures))
        finally:
            for proc, argfile in running.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                argfile.unlink(missing_ok=True)

    def _java(self, node: int, heap: str | None = None) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ClusterError("java is not on PATH: the Kafka nodes need a JDK 17+")
        heap = heap or self.heap
        return [
            java,
            f"-Xmx{heap}",
            f"-Xms{heap}",
            "-XX:+UseG1GC",
            "-XX:ParallelGCThreads=1",
            "-XX:ConcGCThreads=1",
            "-XX:CICompilerCount=2",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.node_dir(node) / 'log4j2.yaml'}",
            "-Dlog4j2.shutdownHookEnabled=false",
            f"-Dkafka.logs.dir={self.node_dir(node)}",
            # Allow-list: the only config provider a node's config may instantiate.
            "-Dorg.apache.kafka.automatic.config.providers="
            "org.apache.kafka.common.config.provider.FileConfigProvider",
            *jvm_options(),
            "-cp",
            f"{KAFKA_BROKER_JARS}/*",
        ]

    # --- internals: asking the cluster ----------------------------------------------------------

    def _admin(self, user: str = ADMIN_USER, servers: str | None = None, quiet: bool = False):
        from confluent_kafka.admin import AdminClient

        config: dict[str, Any] = {**self.client_settings(user), "socket.timeout.ms": 5000}
        if servers:
            config["bootstrap.servers"] = servers
        if quiet:
            # A node still starting refuses connections; while polling that is expected, not news.
            config["log_level"] = 0
        return AdminClient(config)

    def _registered_nodes(self) -> set[int]:
        """The broker ids the cluster reports as registered and unfenced (empty: no answer)."""
        try:
            admin = self._admin(quiet=True)
            cluster = admin.describe_cluster(request_timeout=5).result(timeout=8)
            return {node.id for node in cluster.nodes}
        except Exception:  # noqa: BLE001 - no answer: nothing registered as far as we can tell
            return set()

    def active_controller(self) -> int | None:
        """The node id of the active KRaft controller (the metadata quorum's leader), as the
        running nodes last recorded it in their quorum-state files; None when no running node
        knows a leader that is running. (DescribeCluster's "controller" cannot tell: in KRaft
        it names a random broker.)"""
        best: tuple[int, int] | None = None
        for node in self.node_ids:
            if self.processes[node].pid() is None:
                continue
            try:
                state = json.loads((self.data_dir(node) / "__cluster_metadata-0" / "quorum-state").read_text())
                epoch, leader = int(state["leaderEpoch"]), int(state["leaderId"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if leader >= 0 and (best is None or epoch > best[0]):
                best = (epoch, leader)
        if best is None or best[1] not in self.addresses or self.processes[best[1]].pid() is None:
            return None
        return best[1]

    def _can_login(self, node: int, user: str) -> bool:
        try:
            admin = self._admin(user, servers=f"{self.addresses[node]}:{self.client_port}", quiet=True)
            admin.list_topics(timeout=5)
            return True
        except Exception:  # noqa: BLE001 - authentication not (yet) accepted there
            return False

    def _describe_topic(self, topic: str):
        from confluent_kafka import TopicCollection

        admin = self._admin(quiet=True)
        try:
            return admin.describe_topics(TopicCollection([topic]), request_timeout=10)[topic].result(timeout=15)
        except Exception as exc:  # noqa: BLE001
            raise ClusterError(f"cannot describe topic {topic!r} on {self.bootstrap_servers}: {exc}") from None

    def _wait_healthy(self, timeout: float, expecting: Sequence[int]) -> None:
        dead: list[int] = []

        def ready() -> bool:
            dead[:] = [n for n in expecting if self.processes[n].pid() is None]
            if dead:
                return True  # stop polling: report the node that died
            registered = self._registered_nodes()
            return set(self.node_ids) <= registered and self.active_controller() is not None

        try:
            poll_until(ready, timeout=timeout, interval=0.5,
                       what=f"all {len(self.node_ids)} nodes of the secure Kafka cluster to register")
        except DeadlineExceeded:
            registered = self._registered_nodes()
            missing = [n for n in self.node_ids if n not in registered]
            details = "\n".join(
                f"--- {self.describe_node(n)}, last log lines ({self.log_file(n)}):\n{log_tail(self.log_file(n), 25)}"
                for n in (missing or expecting)
            )
            for node in expecting:
                self.processes[node].stop(timeout=15)
            raise ClusterError(
                f"the secure Kafka cluster did not become healthy within {timeout:g}s: registered brokers "
                f"{sorted(registered) or 'none'}, missing {missing}; the started nodes were stopped again.\n{details}"
            ) from None
        if dead:
            details = "\n".join(
                f"--- {self.describe_node(n)} exited during start-up; last log lines ({self.log_file(n)}):\n"
                f"{log_tail(self.log_file(n))}" for n in dead
            )
            for node in expecting:
                self.processes[node].stop(timeout=15)
            raise ClusterError(f"the secure Kafka cluster did not start; the started nodes were stopped again.\n{details}")


# --- helpers -------------------------------------------------------------------------------------


def free_cluster_ports(addresses: Iterable[str] = NODE_ADDRESSES.values()) -> dict[str, int]:
    """Client, controller and internal ports free right now on every node address (for tests
    and a second cluster): keyword arguments for SecureCluster."""
    addresses = list(addresses)
    chosen: list[int] = []
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind((addresses[0], 0))
            port = sock.getsockname()[1]
        if port not in chosen and not any(_port_in_use(a, port) for a in addresses):
            chosen.append(port)
        if len(chosen) == 3:
            return {"client_port": chosen[0], "controller_port": chosen[1], "internal_port": chosen[2]}
    raise ClusterError(f"no three free ports found on {', '.join(addresses)}")


def _port_in_use(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return True
    return False


def _env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("KAFKA_")}


def _reaped(pid: int) -> bool:
    """True once `pid` is gone; reaps it when it is our own child (a spawned node is)."""
    import psutil

    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        pass  # not our child: gone, or a zombie its own parent reaps
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _new_password() -> str:
    return secrets.token_urlsafe(24)


def _write_private(path: Path, content: bytes) -> None:
    """Write a file only this user can read (0600 from the start, replaced atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "wb") as out:
        out.write(content)
    os.chmod(tmp, stat.S_IRUSR | stat.S_IWUSR)
    os.replace(tmp, path)


def _write_public(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(0o644)


def _scrub(text: str, secret_values: Iterable[str]) -> str:
    for value in secret_values:
        text = text.replace(value, "***")
    return text


def _properties_escape(value: str) -> str:
    # java.util.Properties: backslash escapes; a leading blank would be dropped.
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _key_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    # Kafka's PEM key store reads PKCS#8 ("BEGIN PRIVATE KEY"), not the traditional format.
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _make_ca():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, _NODE_SUBJECT_O),
        x509.NameAttribute(NameOID.COMMON_NAME, "streamops local Kafka CA"),
    ])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_node_cert(ca_key, ca_cert, node: int, address: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, _NODE_SUBJECT_O),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, _NODE_SUBJECT_OU),
        x509.NameAttribute(NameOID.COMMON_NAME, f"kafka-node-{node}"),
    ])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=_CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        # Server on its listeners, client towards the other nodes' controller listeners.
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _expiring(cert_file: Path) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except ValueError:
        return True
    return cert.not_valid_after_utc - dt.datetime.now(dt.UTC) < _RENEW_BEFORE


def _cert_fits(keystore: Path, ca_cert, address: str) -> bool:
    """The node's certificate (first in its keystore) is from this CA, for this address, not expiring."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificates(keystore.read_bytes())[0]
        ips = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.IPAddress)
    except (ValueError, x509.ExtensionNotFound, IndexError):
        return False
    return (cert.issuer == ca_cert.subject
            and ipaddress.ip_address(address) in ips
            and cert.not_valid_after_utc - dt.datetime.now(dt.UTC) >= _RENEW_BEFORE
            and _signed_by(cert, ca_cert))


def _signed_by(cert, ca_cert) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)
        return True
    except Exception:  # noqa: BLE001 - any failure: not ours
        return False
