"""Kafka client configuration: the one place a connection becomes a client.

Every Kafka client of the suite (admin, consumers, producers, the Spark apps' sources and sinks,
backfills, quality reads, lag, replay, the load generator, benchmarks) is built from a
`KafkaClientConfig`: librdkafka settings as the Airflow Kafka provider's connection keeps them
in its extra (`bootstrap.servers`, `security.protocol`, `sasl.mechanism`, `sasl.username`,
`sasl.password`, `ssl.ca.location`, ...). `spark_options()` maps the same settings to the Java
client's `kafka.*` options (a PEM CA as a PEM truststore, SASL as a JAAS config).

Secrets (`sasl.password`, key passwords, inline keys) never leave this object as text except to
a client: `repr()`, `redacted()` and `describe()` mask them, and a driver gets them through a
file only its user can read (`write_private`), never its command line.

Which connection: an app connects as its own principal through the Airflow connection
`kafka_app_<app name, '-' and '.' as '_'>` when it exists (e.g. `kafka_app_oplog_router`), else
`kafka_default`; the suite's own tasks (provisioning, status, quality, recovery) use
`kafka_default`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONN_ID = "kafka_default"

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# SASL mechanisms that map to a Java JAAS login module here. GSSAPI and OAUTHBEARER need settings
# of their own on both sides; they are refused by name rather than half-mapped.
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# Values that are secrets in librdkafka's settings (and in the Java options they map to).
SECRET_KEYS = frozenset({
    "sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config", "sasl.jaas.config",
    # The Java names of the same secrets (spark_options()).
    "ssl.keystore.key", "ssl.truststore.password",
})
_SECRET_NAME = re.compile(r"(?i)password|secret|jaas|\.key\.pem$|keystore\.key$|oauthbearer\.config$|token")
MASK = "***"

# Settings a suite client chooses itself per use (a consumer's group, an admin's timeouts):
# a connection carries where and how to connect, not these.
_PER_CLIENT = frozenset({"group.id", "enable.auto.commit", "auto.offset.reset", "isolation.level", "client.id",
                         "transactional.id", "enable.partition.eof"})
# Librdkafka settings with a Java client equivalent under the same name.
_SAME_IN_JAVA = ("bootstrap.servers", "security.protocol", "client.dns.lookup", "ssl.key.password")


class KafkaConfigError(ValueError):
    """A connection's settings cannot make a client; the message names the setting and the source."""


def _is_secret(key: str) -> bool:
    return key in SECRET_KEYS or bool(_SECRET_NAME.search(key))


def redact(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings with every secret value masked (for logs, plans, XCom, files anyone reads)."""
    return {key: (MASK if _is_secret(key) and value not in (None, "") else value) for key, value in settings.items()}


def _jaas_quote(text: str) -> str:
    # Kafka reads JAAS options with a StreamTokenizer: a double-quoted string, backslash escapes.
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class KafkaClientConfig:
    """A complete, validated client configuration and where it came from (for messages)."""

    settings: Mapping[str, str]
    source: str = "settings"
    # Settings every client built from this gets on top (e.g. tests' short timeouts); not secrets.
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = _problems(self.settings)
        if problems:
            raise KafkaConfigError(f"Kafka connection {self.source}: " + "; ".join(problems))
        settings = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in self.settings.items()}
        # librdkafka accepts only the upper-case names; Java too.
        for key in ("security.protocol", "sasl.mechanism", "sasl.mechanisms"):
            if key in settings:
                settings[key] = settings[key].upper()
        object.__setattr__(self, "settings", settings)

    # --- construction ---------------------------------------------------------------------------

    @classmethod
    def plaintext(cls, bootstrap_servers: str, source: str = "local broker") -> KafkaClientConfig:
        return cls({"bootstrap.servers": bootstrap_servers}, source=source)

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], source: str) -> KafkaClientConfig:
        """From a Kafka provider connection's extra: its librdkafka settings. Callback entries
        (`error_cb`, ...) and per-client settings (`group.id`, ...) are not connection settings."""
        from airflow.providers.apache.kafka.hooks.base import CALLBACK_CONFIG_KEYS

        kept = {k: v for k, v in extra.items() if k not in CALLBACK_CONFIG_KEYS and k not in _PER_CLIENT}
        return cls(kept, source=source)

    @classmethod
    def read_file(cls, path: str | os.PathLike[str], private: bool = False) -> KafkaClientConfig:
        """The settings a launcher wrote with `write_private` (a driver reads its connection here).
        `private`: refuse a file that other users may read (it holds the connection's secrets)."""
        path = Path(path)
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise KafkaConfigError(f"cannot read the Kafka client settings file {path}: {exc}") from None
        if private and mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KafkaConfigError(f"{path} holds Kafka credentials but is readable by other users (mode "
                                   f"{stat.S_IMODE(mode):o}); make it 600")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise KafkaConfigError(f"cannot read the Kafka client settings file {path}: {exc}") from None
        if isinstance(data, dict) and isinstance(data.get("settings"), dict):  # as write_private wrote it
            return cls(data["settings"], source=str(data.get("source") or path))
        if isinstance(data, dict):  # a connection extra's object of settings, as an operator writes it
            return cls({k: v for k, v in data.items() if k not in _PER_CLIENT}, source=str(path))
        raise KafkaConfigError(f"{path} is not an object of Kafka client settings")

    def write_private(self, path: str | os.PathLike[str], as_extra: bool = False) -> Path:
        """Write the settings, secrets included, to a file only this user can read (mode 0600,
        created so from the start, never through a planted link). `as_extra`: the plain object
        an Airflow connection's extra holds; else with its source, for a driver."""
        import secrets

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w") as out:
            json.dump(dict(self.settings) if as_extra else {"source": self.source, "settings": dict(self.settings)}, out)
        os.chmod(tmp, stat.S_IRUSR | stat.S_IWUSR)
        os.replace(tmp, path)
        return path

    # --- what it says ---------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return self.settings["bootstrap.servers"]

    @property
    def secured(self) -> bool:
        return self.settings.get("security.protocol", "PLAINTEXT").upper() != "PLAINTEXT"

    @property
    def principal(self) -> str | None:
        """The SASL user this connects as (None without SASL)."""
        return self.settings.get("sasl.username")

    def secrets(self) -> list[str]:
        """The secret values (a test greps files for them; nothing prints them)."""
        return [v for k, v in self.settings.items() if _is_secret(k) and v]

    def redacted(self) -> dict[str, str]:
        return redact(self.settings)

    def describe(self) -> str:
        """One line for logs and plans: where, how and as whom (no secret)."""
        how = self.settings.get("security.protocol", "PLAINTEXT").upper()
        who = f" as {self.principal} ({self.settings.get('sasl.mechanism') or self.settings.get('sasl.mechanisms')})" \
            if self.principal else ""
        return f"{self.bootstrap_servers} over {how}{who} (from {self.source})"

    def __repr__(self) -> str:
        return f"KafkaClientConfig({self.redacted()!r}, source={self.source!r})"

    __str__ = describe

    # --- clients ----------------------------------------------------------------------------------

    def client_settings(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings for one client: the connection's, then per-client `extra`
        (a group id, timeouts). `extra` cannot change where or how to connect."""
        clash = sorted(k for k in extra if k in ("bootstrap.servers", "security.protocol") or k.startswith(("sasl.", "ssl.")))
        if clash:
            raise KafkaConfigError(f"a client may not override the connection's {', '.join(clash)}")
        return {**self.defaults, **self.settings, **extra}

    def admin(self, **extra: Any):
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client_settings(**extra))

    def cluster_id(self, topic: str | None = None, timeout: float = 15.0) -> str | None:
        """The id of the Kafka cluster this connects to (one metadata request; `topic` keeps it to
        one topic, which a principal with rights on that topic alone may describe)."""
        return while_transient(lambda: self.admin().list_topics(topic=topic, timeout=timeout).cluster_id, timeout=timeout * 2)

    def consumer(self, group_id: str, **extra: Any):
        from confluent_kafka import Consumer

        return Consumer(self.client_settings(**{"group.id": group_id, "enable.auto.commit": False, **extra}))

    def producer(self, **extra: Any):
        from confluent_kafka import Producer

        return Producer(self.client_settings(**extra))

    def with_defaults(self, **defaults: Any) -> KafkaClientConfig:
        return KafkaClientConfig(self.settings, source=self.source, defaults={**self.defaults, **defaults})

    # --- the Java client (Spark's Kafka source and sink) ---------------------------------------

    def java_settings(self) -> dict[str, str]:
        """The Java client's settings for the same connection (without the `kafka.` prefix)."""
        s = {key: value for key, value in self.settings.items() if value != ""}  # empty: not set (as librdkafka)
        out = {key: s[key] for key in _SAME_IN_JAVA if key in s}
        # A supported mechanism for SASL was checked when the settings were made (_problems).
        mechanism = str(s.get("sasl.mechanism") or s.get("sasl.mechanisms") or "").upper()
        if s.get("security.protocol", "").upper().startswith("SASL"):
            out["security.protocol"] = s["security.protocol"].upper()
            out["sasl.mechanism"] = mechanism
            out["sasl.jaas.config"] = (f"{_LOGIN_MODULES[mechanism]} required "
                                       f"username={_jaas_quote(s['sasl.username'])} password={_jaas_quote(s['sasl.password'])};")
        if "security.protocol" in out:
            out["security.protocol"] = out["security.protocol"].upper()
        if "ssl.ca.location" in s:
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.location"] = s["ssl.ca.location"]
        elif "ssl.ca.pem" in s:
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.certificates"] = s["ssl.ca.pem"]
        if "ssl.certificate.location" in s or "ssl.certificate.pem" in s:
            # Mutual TLS: the Java client takes the PEM key and chain inline.
            chain = s.get("ssl.certificate.pem") or Path(s["ssl.certificate.location"]).read_text()
            key = s.get("ssl.key.pem") or Path(s["ssl.key.location"]).read_text()
            out.update({"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": chain, "ssl.keystore.key": key})
        elif "ssl.keystore.location" in s:
            # Mutual TLS from a PKCS#12 file: the same file and password for the Java client
            # (which would take ssl.key.password, ignored by librdkafka here, as the key's own).
            out.pop("ssl.key.password", None)
            out.update({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": s["ssl.keystore.location"],
                        "ssl.keystore.password": s["ssl.keystore.password"]})
        algorithm = s.get("ssl.endpoint.identification.algorithm")
        if algorithm is not None:
            out["ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" else algorithm
        return out

    def spark_options(self) -> dict[str, str]:
        """Options for Spark's Kafka source and sink (`kafka.` + the Java client's settings)."""
        return {f"kafka.{key}": value for key, value in self.java_settings().items()}


def _problems(settings: Mapping[str, Any]) -> list[str]:
    problems = []
    if not isinstance(settings, Mapping):
        return [f"the settings are a {type(settings).__name__}, not an object of librdkafka settings"]
    bad_values = sorted(k for k, v in settings.items() if not isinstance(k, str) or not isinstance(v, (str, int, float, bool)))
    if bad_values:
        problems.append(f"settings {', '.join(map(str, bad_values))} are not text, numbers or booleans")
    servers = str(settings.get("bootstrap.servers") or "").strip()
    if not servers:
        problems.append("'bootstrap.servers' is missing (host:port[,host:port...])")
    elif not all(re.fullmatch(r"[A-Za-z0-9._\-\[\]:]+:\d{1,5}", part.strip()) for part in servers.split(",")):
        problems.append(f"'bootstrap.servers' {servers!r} is not a comma-separated list of host:port")
    protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
    if protocol not in PROTOCOLS:
        problems.append(f"'security.protocol' {settings.get('security.protocol')!r} is not one of {', '.join(PROTOCOLS)}")
    if protocol.startswith("SASL"):
        mechanism = str(settings.get("sasl.mechanism") or settings.get("sasl.mechanisms") or "").upper()
        if mechanism not in _LOGIN_MODULES:
            problems.append(f"'sasl.mechanism' {mechanism or '(missing)'} is not supported for {protocol}; "
                            f"use one of {', '.join(_LOGIN_MODULES)}")
        for needed in ("sasl.username", "sasl.password"):
            if not settings.get(needed):
                problems.append(f"'{needed}' is missing ({protocol} needs a user and a password)")
    elif any(str(k).startswith("sasl.") for k in settings):
        problems.append(f"SASL settings are given but 'security.protocol' is {protocol}: use SASL_SSL (or SASL_PLAINTEXT)")
    for location in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.keystore.location"):
        value = settings.get(location)
        if value and not Path(str(value)).is_file():
            problems.append(f"'{location}' {value} is not a readable file on this host")
    # Mutual TLS: a certificate and its key, each as a file or inline PEM (in any mix), or a PKCS#12 keystore.
    certificate = [k for k in ("ssl.certificate.location", "ssl.certificate.pem") if settings.get(k)]
    key = [k for k in ("ssl.key.location", "ssl.key.pem") if settings.get(k)]
    if bool(certificate) != bool(key):
        given, wanted = (certificate, "a key ('ssl.key.location' or 'ssl.key.pem')") if certificate else \
            (key, "a certificate ('ssl.certificate.location' or 'ssl.certificate.pem')")
        problems.append(f"mutual TLS: '{given[0]}' is given without {wanted}")
    if (certificate or key) and settings.get("ssl.keystore.location"):
        problems.append("mutual TLS: give either a certificate and key or 'ssl.keystore.location' (PKCS#12), not both")
    if settings.get("ssl.keystore.location") and not settings.get("ssl.keystore.password"):
        problems.append("'ssl.keystore.password' is missing ('ssl.keystore.location' is a PKCS#12 file; Spark's Java "
                        "client cannot open one without its password)")
    if key and not any(p.startswith("'ssl.key.location'") for p in problems):
        problems += _key_format_problems(str(settings.get("ssl.key.pem") or ""), settings.get("ssl.key.location"),
                                         bool(settings.get("ssl.key.password")))
    return problems


def _key_format_problems(pem: str, location: Any, encrypted: bool) -> list[str]:
    """Spark's Java client reads only PKCS#8 keys ("PRIVATE KEY", or "ENCRYPTED PRIVATE KEY" with
    ssl.key.password); librdkafka also reads the older RSA/EC formats, which would pass here and
    then fail only inside the Spark query."""
    where = "'ssl.key.pem'" if pem else f"'ssl.key.location' {location}"
    if not pem:
        try:
            pem = Path(str(location)).read_text(errors="replace")
        except OSError:
            return []  # reported as unreadable above
    fix = "convert it: openssl pkcs8 -topk8 -in old.key -out new.key" + ("" if encrypted else " -nocrypt")
    if re.search(r"-----BEGIN (RSA|EC|DSA) PRIVATE KEY-----", pem) or "Proc-Type: 4,ENCRYPTED" in pem:
        return [f"{where} is a traditional (PKCS#1/SEC1) key, which Spark's Java client cannot read; {fix}"]
    if "-----BEGIN ENCRYPTED PRIVATE KEY-----" in pem and not encrypted:
        return [f"{where} is encrypted but 'ssl.key.password' is missing"]
    if "-----BEGIN PRIVATE KEY-----" in pem and encrypted:
        return [f"{where} is not encrypted but 'ssl.key.password' is set; remove the password or encrypt the key ({fix})"]
    return []


def transient(exc: BaseException) -> bool:
    """A Kafka error that lasts only until the cluster settles: flagged retriable, a leader being
    elected (not flagged by librdkafka), or a connection to a broker that just went away."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException) or not exc.args or not isinstance(exc.args[0], KafkaError):
        return False
    error = exc.args[0]
    return error.retriable() or error.code() in {
        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.OFFSET_NOT_AVAILABLE,
        # librdkafka's local error codes: confluent-kafka names them with a leading underscore.
        KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT, KafkaError._TIMED_OUT,  # noqa: SLF001
    }


def while_transient(call, timeout: float = 60.0):
    """`call()`, asked again while it fails with a transient Kafka error (a broker restarting, a
    leader election), until `timeout`; then, or on any other error, the error is raised."""
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

    return Retrying(stop=stop_after_delay(timeout), wait=wait_exponential(multiplier=0.1, max=1),
                    retry=retry_if_exception(transient), reraise=True)(call)


def app_conn_id(app_name: str) -> str:
    """The Airflow connection an app's driver connects through (its own principal)."""
    return "kafka_app_" + re.sub(r"[^A-Za-z0-9_]", "_", app_name)


def airflow_connection(conn_id: str = DEFAULT_CONN_ID) -> KafkaClientConfig:
    """The client configuration of an Airflow Kafka connection (its extra)."""
    from airflow.sdk import BaseHook

    return KafkaClientConfig.from_extra(BaseHook.get_connection(conn_id).extra_dejson, source=f"connection {conn_id}")


def app_principal(app_name: str) -> str | None:
    """The principal the app's next launch connects as (app_connection's, without its warning:
    drift asks this on every status run and scrape); None when no connection says one here."""
    from airflow.exceptions import AirflowNotFoundException

    try:
        try:
            return airflow_connection(app_conn_id(app_name)).principal
        except AirflowNotFoundException:
            return airflow_connection(DEFAULT_CONN_ID).principal
    except Exception:  # noqa: BLE001 - no connection here: drift then compares no principal
        return None


def app_connection(app_name: str) -> KafkaClientConfig:
    """The connection an app's driver uses: `kafka_app_<app>` when it exists, else kafka_default."""
    from airflow.exceptions import AirflowNotFoundException

    try:
        return airflow_connection(app_conn_id(app_name))
    except AirflowNotFoundException:
        fallback = airflow_connection(DEFAULT_CONN_ID)
    if fallback.secured and fallback.principal != app_name:
        # Allowed (one principal for everything is a valid setup), but never silently: the app then
        # has the suite's rights, not the ones the catalog's ACLs give User:<app>.
        logging.getLogger(__name__).warning(
            "%s has no Airflow connection %s: it connects as %s from %s, not as its own principal User:%s, "
            "so the ACLs the catalog derives for it do not limit it. "
            "Add the connection %s (docs/clusters.md, 'Connecting the suite to a secured multi-broker cluster').",
            app_name, app_conn_id(app_name), fallback.principal or "the client certificate", DEFAULT_CONN_ID, app_name,
            app_conn_id(app_name))
    return fallback
