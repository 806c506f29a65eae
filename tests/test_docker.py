"""docker/ without a Docker engine: the Dockerfiles pass hadolint, the compose file is a valid
compose-spec file (`docker compose config` where the client has compose, else the compose-spec
JSON schema), it describes the promised cluster, and the images' versions are the project's pins."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from streamops.toolchain import spark_jars_dir
from tests.support import PROJECT_ROOT

DOCKER = PROJECT_ROOT / "docker"
DOCKERFILES = [DOCKER / "airflow" / "Dockerfile", DOCKER / "spark" / "Dockerfile"]
BIN = Path(sys.executable).parent


def pins() -> dict[str, str]:
    found = {}
    for line in (PROJECT_ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            found[name.lower()] = version.strip()
    return found


def pom_property(pom: str, name: str) -> str:
    return re.search(rf"<{name}>([^<]+)</{name}>", (PROJECT_ROOT / "build" / "maven" / pom / "pom.xml").read_text())[1]


def hadolint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "hadolint"), "--no-color", "--failure-threshold", "info", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_dockerfiles_pass_hadolint(tmp_path):
    result = hadolint(*DOCKERFILES)
    assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr
    # The lint is real: a careless Dockerfile fails it, naming the rule and the line.
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n")
    failed = hadolint(careless)
    assert failed.returncode == 1
    assert "DL3007" in failed.stdout and "DL3013" in failed.stdout


def test_the_compose_file_is_valid(tmp_path):
    compose = DOCKER / "compose.yaml"
    docker = shutil.which("docker")
    has_compose = docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    if has_compose:
        result = subprocess.run([docker, "compose", "-f", str(compose), "config", "--quiet"], capture_output=True, text=True)
    else:  # this machine: a Docker client without the compose plugin
        result = subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(compose)],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    # The schema check can fail: a misspelt key is caught.
    if not has_compose:
        broken = tmp_path / "compose.yaml"
        broken.write_text(compose.read_text().replace("healthcheck:", "healthchek:", 1))
        refused = subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken)],
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1 and "healthchek" in refused.stdout


def test_the_compose_cluster_has_every_component_with_health_checks():
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    kafka = {name: s for name, s in services.items() if s.get("image", "").startswith("apache/kafka:")}
    assert sorted(kafka) == ["kafka-1", "kafka-2", "kafka-3"]
    assert {s["environment"]["KAFKA_NODE_ID"] for s in kafka.values()} == {1, 2, 3}
    assert all(s["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false" for s in kafka.values())
    commands = {name: " ".join(s.get("command") or []) for name, s in services.items()}
    assert "org.apache.spark.deploy.master.Master" in commands["spark-master"]
    assert sum("deploy.worker.Worker" in c for c in commands.values()) == 2
    assert "org.apache.spark.deploy.history.HistoryServer" in commands["spark-history"]
    assert "logDirectory=file:///var/lib/streamops/checkpoints/_spark-events" in services["spark-history"]["environment"][
        "SPARK_HISTORY_OPTS"]  # where the drivers write (streamops.spark_history: <checkpoint root>/_spark-events)
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert any(c == f"airflow {component}" for c in commands.values()), component
    assert services["postgres"]["image"].startswith("postgres:")
    long_running = [name for name, s in services.items() if s.get("restart") != "no"]
    assert [name for name in long_running if "healthcheck" not in services[name]] == []
    assert services["airflow-scheduler"]["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD"] == \
        "cat /opt/airflow/auth/sql_alchemy_conn"


def test_the_compose_stack_fixes_no_secret_and_publishes_nothing_beyond_this_host(tmp_path):
    """Secure defaults: every secret generated on first start (secrets-init, streamops.stack_secrets)
    and read from the airflow-auth volume, the FAB auth manager with the suite's roles, and every
    published port on 127.0.0.1 only (the compose cluster is a laptop's)."""
    text = (DOCKER / "compose.yaml").read_text()
    services = yaml.safe_load(text)["services"]
    for literal in ("change-me", "admin:admin", "SIMPLE_AUTH_MANAGER", "POSTGRES_PASSWORD:"):
        assert literal not in text, literal
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            secretish = re.search(r"(PASSWORD|SECRET|SECRET_KEY|FERNET_KEY|TOKEN|SQL_ALCHEMY_CONN)$", key)
            assert not secretish, f"{name}: {key} is set in the file ({value!r}); read it from a generated file"
        for port in service.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), (name, port)
    env = services["airflow-apiserver"]["environment"]
    assert env["AIRFLOW__CORE__AUTH_MANAGER"] == "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
    assert {k: v for k, v in env.items() if k.endswith("_CMD")} == {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": "cat /opt/airflow/auth/sql_alchemy_conn",
        "AIRFLOW__API_AUTH__JWT_SECRET_CMD": "cat /opt/airflow/auth/jwt_secret",
        "AIRFLOW__API__SECRET_KEY_CMD": "cat /opt/airflow/auth/api_secret_key",
        "AIRFLOW__CORE__FERNET_KEY_CMD": "cat /opt/airflow/auth/fernet_key"}
    assert services["secrets-init"]["command"][:2] == ["streamops", "stack-secrets"]
    # The users' passwords only where the roles are made: never where task code runs.
    assert env["STREAMOPS_ENVIRONMENT"] == "cluster"  # no unattended destructive plan on the compose cluster
    with_users = sorted(name for name, service in services.items()
                        if any(str(v).startswith("airflow-users:") for v in service.get("volumes") or []))
    assert with_users == ["airflow-init", "secrets-init"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/opt/airflow/auth/postgres-password"
    assert services["postgres"]["depends_on"]["secrets-init"]["condition"] == "service_completed_successfully"
    init = " ".join(services["airflow-init"]["command"])
    assert "python -m streamops.local_stack.fab_roles /opt/airflow/users/users.json" in init

    # What secrets-init writes, Airflow reads through those options (here, with this checkout's Airflow).
    auth = tmp_path / "auth"
    made = subprocess.run([str(BIN / "streamops"), "stack-secrets", str(auth), "--database-host", "postgres"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    airflow_env = {k: v.replace("/opt/airflow/auth", str(auth)) for k, v in env.items() if k.endswith("_CMD")}
    read = subprocess.run([sys.executable, "-c", "from airflow.configuration import conf; "
                           "print(conf.get('api_auth', 'jwt_secret')); print(conf.get('core', 'fernet_key')); "
                           "print(conf.get('database', 'sql_alchemy_conn'))"], capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
                               "AIRFLOW_HOME": str(tmp_path / "home"), **airflow_env})
    expected = [(auth / name).read_text().strip() for name in ("jwt_secret", "fernet_key", "sql_alchemy_conn")]
    assert read.stdout.split() == expected, read.stderr[-1000:]
    assert (auth / "postgres-password").read_text().strip() in (auth / "sql_alchemy_conn").read_text()


def test_image_versions_are_the_project_pins():
    pinned = pins()
    airflow_file = (DOCKER / "airflow" / "Dockerfile").read_text()
    spark_file = (DOCKER / "spark" / "Dockerfile").read_text()
    python_minor = re.search(r'requires-python = "[^0-9]*(3\.\d+)', (PROJECT_ROOT / "pyproject.toml").read_text())[1]

    (airflow_base,) = re.findall(r"^FROM (apache/airflow:\S+)", airflow_file, re.M)
    assert airflow_base == f"apache/airflow:{pinned['apache-airflow']}-python{python_minor}"
    (spark_base,) = re.findall(r"^FROM (python:\S+)", spark_file, re.M)
    assert re.fullmatch(rf"python:{re.escape(python_minor)}\.\d+-slim-\w+", spark_base), spark_base  # same minor on both sides
    # Both install Python packages under the project's constraints (pyspark, pandas, pyarrow ...).
    assert "-c constraints.txt" in airflow_file and "-c constraints.txt" in spark_file
    assert pinned["pyspark"] == pinned["pyspark-client"] == pom_property("spark-kafka", "spark.version")
    # Connector jars: both images resolve them from the POM bin/setup uses (one pin).
    for text in (airflow_file, spark_file):
        assert "-f build/maven/spark-kafka/pom.xml" in text
    # The input contract's jar: built in both images against the versions pyspark ships (bin/setup
    # compiles it against pyspark's jars themselves).
    shipped = {jar.name for jar in spark_jars_dir().glob("*.jar")}
    for artifact, prop in (("spark-sql-api_2.13", "spark.version"), ("jackson-core", "jackson.version"),
                           ("scala-library", "scala.version")):
        assert f"{artifact}-{pom_property('streamops-contract', prop)}.jar" in shipped, (artifact, sorted(shipped))
    for text in (airflow_file, spark_file):
        assert "-f build/maven/streamops-contract/pom.xml package" in text
    images = {s.get("image") for s in yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"].values()}
    assert f"apache/kafka:{pom_property('kafka-broker', 'kafka.version')}" in images
    # Non-root at run time.
    for text in (airflow_file, spark_file):
        assert re.findall(r"^USER (\S+)", text, re.M)[-1] not in ("0", "root")
