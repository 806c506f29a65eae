"""How an app is handed to spark-submit: one builder for every launch (a live app, its standby, a
cutover, a backfill, the CLI, the bench): `SubmitSpec` (what runs) + `SparkTarget` (where: the master
and what the `spark_default` connection adds) -> `SubmitSpec.argv`.

The Spark provider's SparkSubmitHook builds its command only inside submit(), which runs the driver
in the foreground (holding a worker slot for the app's life); our drivers run detached. So the
connection is read here, with the provider's rules for its fields (master from host/port/type;
extras deploy-mode, queue, spark-binary, namespace), and an extra we do not carry out is refused
by name rather than dropped."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from streamops.app_runtime import AppRuntime
from streamops.artifacts import driver_protocol_problem
from streamops.catalog import REAL_TIME, AppSpec, catalog_path, load_catalog
from streamops.class_archive import driver_jvm_options
from streamops.driver.arguments import DriverArgs
from streamops.kafka_client import KafkaClientConfig
from streamops.programs import DriverProtocolRefused, ran_digest, resolve_artifact
from streamops.spark_history import event_log_conf
from streamops.toolchain import driver_jars

DEFAULT_MASTER = "local[*]"
# The driver's connection file, secrets included (mode 600), in the runtime folder of its checkpoint.
KAFKA_CLIENT_FILE = "kafka-client.json"
# spark-submit's primary file for every app (alone in its folder: Python puts the folder first on the path).
DRIVER_ENTRYPOINT = Path(__file__).resolve().parent / "entrypoints" / "driver.py"


# The provider's allowed spark-binary values (SparkSubmitHook): a name on the PATH, never a path.
ALLOWED_SPARK_BINARIES = ("spark-submit", "spark2-submit", "spark3-submit")
# Extras the provider knows that a detached launch does not carry out: Kerberos logins and the
# standalone REST status endpoint (status here is the driver's own files, not the master's).
UNSUPPORTED_EXTRAS = ("principal", "keytab", "spark-home", "rest-scheme", "rest-port")


class SparkTargetError(ValueError):
    """A Spark connection this suite cannot launch through; the message names the field."""


@dataclass(frozen=True)
class SparkTarget:
    """Where spark-submit sends an app: the master, and what the Spark connection adds to it."""

    master: str = DEFAULT_MASTER
    deploy_mode: str | None = None  # client | cluster (spark-submit's default: client)
    queue: str | None = None  # YARN
    namespace: str | None = None  # Kubernetes
    spark_binary: str = "spark-submit"

    @classmethod
    def from_connection(cls, conn_type: str | None, host: str | None, port: int | None, extra: dict[str, object],
                        conn_id: str = "spark_default") -> SparkTarget:
        """The provider's reading of a Spark connection: a UI-made `spark` connection whose host is a
        whole master URL (or a local master) is used as it is; otherwise `<type>://<host>`; `:port` appended."""
        named = sorted(key for key in UNSUPPORTED_EXTRAS if extra.get(key) not in (None, ""))
        if named:
            raise SparkTargetError(f"connection {conn_id}: extra {', '.join(named)} is not supported by the suite's launches "
                                   "(drivers run detached under spark-submit; no Kerberos login, no REST status); remove it")
        binary = str(extra.get("spark-binary") or "spark-submit")
        if binary not in ALLOWED_SPARK_BINARIES:
            raise SparkTargetError(
                f"connection {conn_id}: spark-binary {binary!r} is not one of {', '.join(ALLOWED_SPARK_BINARIES)}"
            )
        deploy_mode = extra.get("deploy-mode") or None
        if deploy_mode not in (None, "client", "cluster"):
            raise SparkTargetError(f"connection {conn_id}: deploy-mode {deploy_mode!r} is not client or cluster")
        if not host:
            master = DEFAULT_MASTER
        elif conn_type == "spark" and ("://" in host or not port):
            master = host
        else:
            master = f"{conn_type}://{host}"
        if host and port:
            master = f"{master}:{port}"
        return cls(master=master, deploy_mode=deploy_mode, queue=str(extra["queue"]) if extra.get("queue") else None,
                   namespace=str(extra["namespace"]) if extra.get("namespace") else None, spark_binary=binary)

    def binary_path(self) -> str:
        """This environment's copy of the binary (bin/setup installs spark-submit beside Python), else its name on the PATH."""
        here = Path(sys.executable).parent / self.spark_binary
        return str(here) if here.exists() else self.spark_binary


@dataclass(frozen=True)
class SubmitSpec:
    name: str
    application: str  # the driver's entry point (entrypoints/driver.py)
    application_args: list[str]
    jars: list[str]
    conf: dict[str, str] = field(default_factory=dict)
    # The program's artifact (one zip), shipped to the driver and the executors; none: installed code.
    py_files: list[str] = field(default_factory=list)
    version: str = ""  # the version that runs
    digest: str | None = None  # the artifact's digest (None: installed code)
    # Task slots the app needs at once (a real-time app: one per input partition); a local master
    # is given at least this many threads (see with_task_slots).
    min_task_slots: int = 0

    def argv(self, target: SparkTarget | None = None) -> list[str]:
        """The spark-submit command: the one builder of every launch's argv."""
        target = target or SparkTarget()
        argv = [target.binary_path(), "--master", with_task_slots(target.master, self.min_task_slots), "--name", self.name]
        if target.deploy_mode:
            argv += ["--deploy-mode", target.deploy_mode]
        if target.queue:
            argv += ["--queue", target.queue]
        conf = dict(self.conf)
        if target.namespace and target.master.startswith("k8s://"):
            conf.setdefault("spark.kubernetes.namespace", target.namespace)
        for key, value in sorted(conf.items()):
            argv += ["--conf", f"{key}={value}"]
        argv += ["--jars", ",".join(self.jars)]
        if self.py_files:
            argv += ["--py-files", ",".join(self.py_files)]
        return [*argv, self.application, *self.application_args]


LOCAL_MASTER = re.compile(r"^local(\[(?P<threads>\*|[0-9]+)(?P<failures>,[0-9]+)?\])?$")


def with_task_slots(master: str, slots: int) -> str:
    """A local master with at least `slots` threads (local[*] is this machine's cores, often
    fewer than a real-time app's input partitions: the partitions left over would never be
    read). Cluster masters are left as they are: the driver checks their slots when it starts."""
    match = LOCAL_MASTER.match(master.strip())
    if not match or slots <= 0:
        return master
    threads = match["threads"]
    have = (os.cpu_count() or 1) if threads == "*" else 1 if threads is None else int(threads)
    return master if have >= slots else f"local[{slots}{match['failures'] or ''}]"


def real_time_task_slots(app: AppSpec, catalog: str | os.PathLike[str] | None, trigger: str | None) -> int:
    """Task slots a real-time run of `app` holds at once: one per partition of every topic it
    reads (the catalog's partition counts); 0 for a micro-batch run."""
    if (trigger or app.trigger) != REAL_TIME:
        return 0
    partitions = {topic.name: topic.partitions for topic in load_catalog(catalog, check_programs=False).topics}
    read = [*app.inputs.values(), *(app.outputs[role] for role in app.reads_outputs)]
    return sum(partitions.get(topic, 1) for topic in read)


def spark_env() -> dict[str, str]:
    """Environment for spark-submit: the pip-installed Spark of this environment, its Python."""
    import pyspark

    venv_bin = str(Path(sys.executable).parent)
    return {
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "PYSPARK_PYTHON": sys.executable,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def driver_env(**extra: str) -> dict[str, str]:
    """Environment for a driver: this process's, without Airflow's settings (connections and
    variables hold other principals' credentials; the driver uses none of Airflow), plus Spark's,
    and the JVM options that map this host's class archive (streamops.class_archive)."""
    kept = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    java_options = driver_jvm_options(kept.get("SPARK_SUBMIT_OPTS", ""))
    return {**kept, **spark_env(), **({"SPARK_SUBMIT_OPTS": java_options} if java_options else {}), **extra}


def submit_spec(
    app: AppSpec,
    *,
    kafka: KafkaClientConfig,
    catalog: str | os.PathLike[str] | None = None,
    trigger: str | None = None,
    checkpoint: str | None = None,
    version: str | None = None,
    starting_offsets: str | None = None,
    settings_file: str | os.PathLike[str] | None = None,
    expected_digest: str | None = None,
    ending_offsets: dict[str, dict[str, int]] | None = None,
    skip_records_of: str | None = None,
    consumer_group: bool = True,
    label: str | None = None,
) -> SubmitSpec:
    """The spark-submit of an app at `version` (default: the catalog's). An artifact app ships
    that version's artifact, its digest checked (and equal to `expected_digest` when given: a
    rollback restarts exactly the code that ran). `settings_file`: the driver reads the connection
    from this existing file (mode 600; a command printed for a person to run later)."""
    version = version or app.version
    artifact = None
    if app.artifact:
        artifact = resolve_artifact(app, version, expected_digest or ran_digest(app, version))
        if problem := driver_protocol_problem(artifact):
            raise DriverProtocolRefused(f"{app.name}: {problem}")
    if settings_file is not None:
        connection = str(Path(settings_file).resolve())
    else:
        # The connection (with its secrets) goes to the driver in a file only this user can read,
        # beside the checkpoint it runs on; the command line names the file, never a secret.
        connection = str(kafka.write_private(AppRuntime(checkpoint or app.checkpoint_location()).dir / KAFKA_CLIENT_FILE))
    args = DriverArgs(
        app=app.name, program=app.program, catalog=str(catalog_path(catalog)), kafka_config=connection,
        artifact=str(artifact.path) if artifact is not None else None,
        artifact_digest=artifact.digest if artifact is not None else None,
        trigger=trigger or None, checkpoint=checkpoint or None, version=version, starting_offsets=starting_offsets or "earliest",
        ending_offsets=ending_offsets, skip_records_of=skip_records_of, consumer_group=consumer_group,
    ).to_argv()
    python = sys.executable
    conf = {
        # Driver and executors run this environment's Python (pandas, pyarrow, streamops).
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        # Python workers put their working folder first on the path, where a copy of a package
        # would hide the artifact's: not with this (Python 3.11+).
        "spark.executorEnv.PYTHONSAFEPATH": "1",
        # Every driver's history (streamops.spark_history): the History Server shows it after the driver is gone.
        **event_log_conf(),
        **{key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in app.spark_conf.items()},
    }
    return SubmitSpec(
        # A backfill is named apart (`label`): the History Server lists it beside the app's drivers.
        name=f"streamops-{app.name}" + (f"-{label}" if label else ""),
        application=str(DRIVER_ENTRYPOINT),
        application_args=args,
        jars=[str(jar) for jar in driver_jars()],
        conf=conf,
        py_files=[str(artifact.path)] if artifact is not None else [],
        version=version,
        digest=artifact.digest if artifact is not None else None,
        min_task_slots=real_time_task_slots(app, catalog, trigger),
    )
