"""How an app is handed to spark-submit: one description used by the CLI and by the DAGs
(through the Spark provider's SparkSubmitHook), so both launch an app the same way."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from streamops.app_runtime import AppRuntime
from streamops.catalog import REAL_TIME, AppSpec, catalog_path, load_catalog
from streamops.driver.arguments import DriverArgs
from streamops.kafka_client import KafkaClientConfig
from streamops.toolchain import connector_jars

DEFAULT_MASTER = "local[*]"
# The driver's connection file, secrets included (mode 600), in the runtime folder of its checkpoint.
KAFKA_CLIENT_FILE = "kafka-client.json"
# spark-submit's primary file for every app (alone in its folder: Python puts the folder first on the path).
DRIVER_ENTRYPOINT = Path(__file__).resolve().parent / "entrypoints" / "driver.py"


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

    def argv(self, master: str = DEFAULT_MASTER, spark_submit: str | None = None) -> list[str]:
        binary = spark_submit or str(Path(sys.executable).parent / "spark-submit")
        master = with_task_slots(master, self.min_task_slots)
        argv = [binary, "--master", master, "--name", self.name, "--jars", ",".join(self.jars)]
        if self.py_files:
            argv += ["--py-files", ",".join(self.py_files)]
        for key, value in sorted(self.conf.items()):
            argv += ["--conf", f"{key}={value}"]
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
    variables hold other principals' credentials; the driver uses none of Airflow), plus Spark's."""
    kept = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    return {**kept, **spark_env(), **extra}


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
    extra_args: list[str] | None = None,
) -> SubmitSpec:
    """The spark-submit of an app at `version` (default: the catalog's). An artifact app ships
    that version's artifact, its digest checked (and equal to `expected_digest` when given: a
    rollback restarts exactly the code that ran). `settings_file`: the driver reads the connection
    from this existing file (mode 600; a command printed for a person to run later)."""
    from streamops.artifacts import driver_protocol_problem
    from streamops.programs import ProgramError, ran_digest, resolve_artifact

    version = version or app.version
    artifact = None
    if app.artifact:
        artifact = resolve_artifact(app, version, expected_digest or ran_digest(app, version))
        if problem := driver_protocol_problem(artifact):
            raise ProgramError(f"{app.name}: {problem}")
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
    ).to_argv() + (extra_args or [])
    python = sys.executable
    conf = {
        # Driver and executors run this environment's Python (pandas, pyarrow, streamops).
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        # Python workers put their working folder first on the path, where a copy of a package
        # would hide the artifact's: not with this (Python 3.11+).
        "spark.executorEnv.PYTHONSAFEPATH": "1",
        **{key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in app.spark_conf.items()},
    }
    return SubmitSpec(
        name=f"streamops-{app.name}",
        application=str(DRIVER_ENTRYPOINT),
        application_args=args,
        jars=[str(jar) for jar in connector_jars()],
        conf=conf,
        py_files=[str(artifact.path)] if artifact is not None else [],
        version=version,
        digest=artifact.digest if artifact is not None else None,
        min_task_slots=real_time_task_slots(app, catalog, trigger),
    )
