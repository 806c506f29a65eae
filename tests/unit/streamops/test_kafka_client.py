"""The one client seam: an Airflow connection's librdkafka settings -> every client, the Java
options of Spark's Kafka source and sink, and no secret in anything printed."""

from __future__ import annotations

import json
import os
import stat

import pytest

from streamops.kafka_client import KafkaClientConfig, KafkaConfigError, app_conn_id, redact

PASSWORD = 'p"a\\ss wörd'


@pytest.fixture
def ca_file(tmp_path):
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\nnot checked here\n-----END CERTIFICATE-----\n")
    return path


def scram(ca_file, **extra) -> KafkaClientConfig:
    return KafkaClientConfig({
        "bootstrap.servers": "127.0.0.11:19092,127.0.0.12:19092", "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "oplog-router", "sasl.password": PASSWORD,
        "ssl.ca.location": str(ca_file), **extra,
    }, source="connection kafka_app_oplog_router")


def test_sasl_ssl_maps_to_the_java_clients_jaas_config_and_a_pem_truststore(ca_file):
    options = scram(ca_file).spark_options()
    assert options == {
        "kafka.bootstrap.servers": "127.0.0.11:19092,127.0.0.12:19092",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        # Quotes and backslashes escaped as Kafka's JAAS parser reads them.
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="oplog-router" password="p\\"a\\\\ss wörd";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(ca_file),
    }


def test_lower_case_names_are_made_the_upper_case_both_clients_accept(ca_file):
    config = scram(ca_file, **{"sasl.mechanism": "scram-sha-512"})
    assert (config.settings["security.protocol"], config.settings["sasl.mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    plain = KafkaClientConfig({"bootstrap.servers": "127.0.0.1:1", "security.protocol": "sasl_plaintext",
                               "sasl.mechanism": "scram-sha-512", "sasl.username": "u", "sasl.password": "p"})
    plain.producer(**{"log_level": 0})  # librdkafka refuses "scram-sha-512": this would raise


def test_the_java_names_of_secrets_are_masked_too(ca_file):
    assert redact({"kafka.ssl.keystore.key": "-----BEGIN PRIVATE KEY-----", "ssl.keystore.key": "k",
                   "kafka.sasl.jaas.config": "x password=y"}) == {
        "kafka.ssl.keystore.key": "***", "ssl.keystore.key": "***", "kafka.sasl.jaas.config": "***"}


def test_a_driver_inherits_no_airflow_setting(monkeypatch):
    from streamops.spark_submit import driver_env

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", '{"extra": {"sasl.password": "admin-secret"}}')
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "k")
    env = driver_env(STREAMOPS_LAUNCHED_BY="t")
    assert not [k for k in env if k.startswith("AIRFLOW")] and env["STREAMOPS_LAUNCHED_BY"] == "t"


def test_plain_mechanism_and_no_hostname_check_map_too(ca_file):
    options = scram(ca_file, **{"sasl.mechanism": "PLAIN", "ssl.endpoint.identification.algorithm": "none"}).spark_options()
    assert options["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule required ")
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""


def test_plaintext_maps_to_bootstrap_only():
    assert KafkaClientConfig.plaintext("127.0.0.1:9092").spark_options() == {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_nothing_printed_carries_the_password(ca_file):
    config = scram(ca_file)
    printed = [repr(config), str(config), config.describe(), json.dumps(config.redacted()), repr(redact(config.spark_options()))]
    assert not [text for text in printed if PASSWORD in text or "p\\\"a" in text]
    assert config.describe() == ("127.0.0.11:19092,127.0.0.12:19092 over SASL_SSL as oplog-router (SCRAM-SHA-512) "
                                 "(from connection kafka_app_oplog_router)")
    assert config.redacted()["sasl.password"] == "***"
    assert config.secrets() == [PASSWORD]


def test_a_client_gets_the_connection_and_its_own_settings_but_cannot_change_how_it_connects(ca_file):
    config = scram(ca_file)
    settings = config.client_settings(**{"group.id": "g", "socket.timeout.ms": 1000})
    assert settings["sasl.password"] == PASSWORD and settings["group.id"] == "g"
    with pytest.raises(KafkaConfigError, match="may not override the connection's sasl.username, security.protocol"):
        config.client_settings(**{"security.protocol": "PLAINTEXT", "sasl.username": "admin"})


@pytest.mark.parametrize(("settings", "message"), [
    ({}, "'bootstrap.servers' is missing"),
    ({"bootstrap.servers": "kafka-1"}, "'bootstrap.servers' 'kafka-1' is not a comma-separated list of host:port"),
    ({"bootstrap.servers": "h:9092", "security.protocol": "TLS"}, "'security.protocol' 'TLS' is not one of PLAINTEXT, SSL"),
    ({"bootstrap.servers": "h:9092", "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI",
      "sasl.username": "u", "sasl.password": "p"}, "'sasl.mechanism' GSSAPI is not supported for SASL_SSL"),
    ({"bootstrap.servers": "h:9092", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u"},
     "'sasl.password' is missing (SASL_SSL needs a user and a password)"),
    ({"bootstrap.servers": "h:9092", "sasl.username": "u"}, "SASL settings are given but 'security.protocol' is PLAINTEXT"),
    ({"bootstrap.servers": "h:9092", "security.protocol": "SSL", "ssl.ca.location": "/nowhere/ca.pem"},
     "'ssl.ca.location' /nowhere/ca.pem is not a readable file on this host"),
])
def test_a_connection_that_cannot_make_a_client_is_refused_naming_the_setting_and_where(settings, message):
    with pytest.raises(KafkaConfigError) as refused:
        KafkaClientConfig(settings, source="connection kafka_default")
    assert str(refused.value).startswith("Kafka connection connection kafka_default: ")
    assert message in str(refused.value)


def test_the_drivers_file_is_readable_by_its_user_only_and_a_readable_one_is_refused(ca_file, tmp_path):
    config = scram(ca_file)
    path = config.write_private(tmp_path / "run" / "kafka-client.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert KafkaClientConfig.read_file(path, private=True) == config
    os.chmod(path, 0o644)
    with pytest.raises(KafkaConfigError, match=r"readable by other users \(mode 644\); make it 600"):
        KafkaClientConfig.read_file(path, private=True)


def test_an_operators_settings_file_is_read_like_a_connection_extra(ca_file, tmp_path):
    path = tmp_path / "kafka.json"
    path.write_text(json.dumps({**scram(ca_file).settings, "group.id": "not a connection setting"}))
    config = KafkaClientConfig.read_file(path)
    assert config.principal == "oplog-router" and "group.id" not in config.settings


def test_connection_extras_drop_callbacks_and_per_client_settings(ca_file):
    extra = {**scram(ca_file).settings, "error_cb": "module.func", "group.id": "x"}
    assert dict(KafkaClientConfig.from_extra(extra, "connection c").settings) == dict(scram(ca_file).settings)


def test_each_app_has_a_connection_named_after_it():
    assert app_conn_id("oplog-router") == "kafka_app_oplog_router"
    assert app_conn_id("presence.notifier") == "kafka_app_presence_notifier"


def test_mutual_tls_takes_certificate_and_key_as_files_or_inline_pem_in_any_mix(ca_file, tmp_path):
    key_file = tmp_path / "client.key"
    key_file.write_text("-----BEGIN PRIVATE KEY-----\nkey\n-----END PRIVATE KEY-----\n")
    chain = "-----BEGIN CERTIFICATE-----\nclient\n-----END CERTIFICATE-----\n"
    config = KafkaClientConfig({"bootstrap.servers": "h:9093", "security.protocol": "SSL", "ssl.ca.location": str(ca_file),
                                "ssl.certificate.pem": chain, "ssl.key.location": str(key_file)}, source="c")
    java = config.java_settings()
    assert (java["ssl.keystore.type"], java["ssl.keystore.certificate.chain"], java["ssl.keystore.key"]) == \
        ("PEM", chain, key_file.read_text())
    inline_key = KafkaClientConfig({**{k: v for k, v in config.settings.items() if k != "ssl.key.location"},
                                    "ssl.key.pem": "SECRET KEY"}, source="c")
    assert "SECRET KEY" not in repr(inline_key)


def test_a_pkcs12_keystore_maps_to_the_java_clients_pkcs12_keystore(ca_file, tmp_path):
    keystore = tmp_path / "client.p12"
    keystore.write_bytes(b"\x30\x82")
    config = KafkaClientConfig({"bootstrap.servers": "h:9093", "security.protocol": "SSL", "ssl.ca.location": str(ca_file),
                                "ssl.keystore.location": str(keystore), "ssl.keystore.password": PASSWORD}, source="c")
    java = config.java_settings()
    assert {k: v for k, v in java.items() if k.startswith("ssl.keystore")} == {
        "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(keystore), "ssl.keystore.password": PASSWORD}
    assert PASSWORD not in repr(config) and PASSWORD not in config.describe()


@pytest.mark.parametrize(("settings", "message"), [
    ({"ssl.certificate.location": "CA"},
     "mutual TLS: 'ssl.certificate.location' is given without a key ('ssl.key.location' or 'ssl.key.pem')"),
    ({"ssl.key.pem": "k"},
     "mutual TLS: 'ssl.key.pem' is given without a certificate ('ssl.certificate.location' or 'ssl.certificate.pem')"),
    ({"ssl.certificate.pem": "c", "ssl.key.pem": "k", "ssl.keystore.location": "CA"},
     "give either a certificate and key or 'ssl.keystore.location' (PKCS#12), not both"),
])
def test_half_a_client_certificate_is_refused(ca_file, settings, message):
    settings = {k: str(ca_file) if v == "CA" else v for k, v in settings.items()}
    with pytest.raises(KafkaConfigError) as refused:
        KafkaClientConfig({"bootstrap.servers": "h:9093", "security.protocol": "SSL", **settings}, source="connection c")
    assert message in str(refused.value)


def test_an_app_without_its_own_connection_falls_back_to_kafka_default_and_says_whose_rights_it_has(
        ca_file, monkeypatch, caplog):
    from streamops.kafka_client import app_connection

    admin = {**scram(ca_file).settings, "sasl.username": "streamops-admin"}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": admin}))
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_APP_OPLOG_ROUTER", raising=False)
    with caplog.at_level("WARNING", logger="streamops.kafka_client"):
        config = app_connection("oplog-router")
    assert config.principal == "streamops-admin" and config.source == "connection kafka_default"
    assert ("oplog-router has no Airflow connection kafka_app_oplog_router: it connects as streamops-admin from "
            "kafka_default, not as its own principal User:oplog-router") in caplog.text
    assert PASSWORD not in caplog.text

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_APP_OPLOG_ROUTER",
                       json.dumps({"conn_type": "kafka", "extra": scram(ca_file).settings}))
    caplog.clear()
    assert app_connection("oplog-router").principal == "oplog-router" and caplog.text == ""


def test_a_pkcs12_keystore_needs_its_password_and_the_java_client_gets_no_key_password(ca_file, tmp_path):
    keystore = tmp_path / "client.p12"
    keystore.write_bytes(b"\x30\x82")
    base = {"bootstrap.servers": "h:9093", "security.protocol": "SSL", "ssl.keystore.location": str(keystore)}
    with pytest.raises(KafkaConfigError, match=r"'ssl.keystore.password' is missing \('ssl.keystore.location' is a PKCS#12"):
        KafkaClientConfig(base, source="c")
    java = KafkaClientConfig({**base, "ssl.keystore.password": "k", "ssl.key.password": "other"}, source="c").java_settings()
    assert "ssl.key.password" not in java and java["ssl.keystore.password"] == "k"


@pytest.mark.parametrize(("key", "password", "message"), [
    ("-----BEGIN RSA PRIVATE KEY-----\nx\n-----END RSA PRIVATE KEY-----\n", None,
     "is a traditional (PKCS#1/SEC1) key, which Spark's Java client cannot read; convert it: openssl pkcs8 -topk8"),
    ("-----BEGIN ENCRYPTED PRIVATE KEY-----\nx\n-----END ENCRYPTED PRIVATE KEY-----\n", None,
     "is encrypted but 'ssl.key.password' is missing"),
    ("-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n", "pw", "is not encrypted but 'ssl.key.password' is set"),
])
def test_a_key_spark_cannot_read_is_refused_before_a_driver_starts(tmp_path, key, password, message):
    key_file = tmp_path / "client.key"
    key_file.write_text(key)
    settings = {"bootstrap.servers": "h:9093", "security.protocol": "SSL", "ssl.certificate.pem": "c",
                "ssl.key.location": str(key_file), **({"ssl.key.password": password} if password else {})}
    with pytest.raises(KafkaConfigError) as refused:
        KafkaClientConfig(settings, source="connection c")
    assert f"'ssl.key.location' {key_file} {message}" in str(refused.value)


def test_empty_settings_are_not_set_for_the_java_client_either():
    config = KafkaClientConfig({"bootstrap.servers": "h:9092", "ssl.certificate.location": "", "ssl.key.location": ""},
                               source="c")
    assert config.java_settings() == {"bootstrap.servers": "h:9092"}


def test_an_app_falling_back_to_a_certificate_authenticated_default_is_warned_about_too(ca_file, tmp_path, monkeypatch, caplog):
    from streamops.kafka_client import app_connection

    key_file = tmp_path / "client.key"
    key_file.write_text("-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n")
    extra = {"bootstrap.servers": "h:9093", "security.protocol": "SSL", "ssl.ca.location": str(ca_file),
             "ssl.certificate.location": str(ca_file), "ssl.key.location": str(key_file)}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": extra}))
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_APP_OPLOG_ROUTER", raising=False)
    with caplog.at_level("WARNING", logger="streamops.kafka_client"):
        app_connection("oplog-router")
    assert "it connects as the client certificate from kafka_default, not as its own principal User:oplog-router" in caplog.text
