"""How a task starts and stops an app: the spark-submit command of an app at a version (through
the Spark provider's hook and spark_default), what a launch record read back may start again, and
the start/stop callables handed to the recoveries, the cutover and the supervisor.

Every launch passes `command_for`, so a version and Spark conf are checked there whatever asked
for them (a trigger, a launch record on disk, a plan handed between tasks), and every launch runs
the app's one effective spec (streamops.effective_spec): the catalog plus the approved changes
(a cutover's topics), against the Kafka cluster its checkpoint belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from streamops.app_ops import Launch, LaunchCommand, launch, stop
from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.catalog import load_catalog
from streamops.dag_tasks.connections import spark_target
from streamops.effective_spec import bind_app, installed_code, launch_cluster
from streamops.kafka_client import app_connection
from streamops.launch_overrides import LaunchOverrideRefused, checked_spark_conf, checked_version
from streamops.recovery.common import RecoveryRefused
from streamops.spark_submit import submit_spec


def command_for(app_name: str, version: str | None, spark_conf: Mapping[str, object] | None, starting_offsets: str | None = None,
                expected_digest: str | None = None) -> LaunchCommand:
    """The spark-submit command for an app at a version with extra Spark conf, on spark_default's target
    (`starting_offsets`: where a new checkpoint starts; an existing one ignores it), and the
    effective spec it runs. Every launch passes here, so the version and conf are checked here too
    (LaunchOverrideRefused); an artifact app runs that version's artifact (ProgramError if there is
    none, or if its digest is not `expected_digest`, or not the one this version ran with before);
    a checkpoint of another Kafka cluster is refused (SpecRefused)."""
    version = checked_version(version)
    overrides = checked_spark_conf(spark_conf)
    bound = bind_app(load_catalog(), app_name)
    app, checkpoint = bound.app, bound.app.checkpoint_location()
    # The driver connects as the app's own principal (kafka_app_<app>, else kafka_default).
    kafka = app_connection(app.name)
    cluster = launch_cluster(app, kafka)
    # The checkpoint is passed explicitly so the driver and the DAGs agree on it.
    spec = submit_spec(app, kafka=kafka, catalog=bound.catalog_file, version=version, checkpoint=checkpoint,
                       starting_offsets=starting_offsets, expected_digest=expected_digest)
    spec = replace(spec, conf={**spec.conf, **overrides})
    effective = bound.spec(version=spec.version, spark_conf=overrides, code=spec.digest or installed_code(app.program),
                           principal=kafka.principal, kafka_cluster=cluster)
    return LaunchCommand(spec.argv(spark_target()), effective.to_record())


def trusted_launch(app_name: str, version: object, spark_conf: object) -> tuple[str, dict[str, str]]:
    """A version and Spark conf read back from a launch record (or a plan made from one), checked
    like a trigger's: a file on disk may have been edited, so it is not trusted. RecoveryRefused."""
    try:
        return (checked_version(version) or load_catalog().app(app_name).version), checked_spark_conf(spark_conf)
    except LaunchOverrideRefused as exc:
        raise RecoveryRefused([f"{app_name}'s last launch record (_runtime/driver.json) cannot be started again: {exc}"]) from None


def last_launch(app_name: str) -> tuple[str, dict[str, str]]:
    """The version and Spark conf the app last ran with (the catalog's version if never run)."""
    app = load_catalog().app(app_name)
    driver = AppRuntime(app.checkpoint_location()).driver() or DriverRecord()
    return trusted_launch(app_name, driver.launched_version or app.version, driver.launched_spark_conf)


def launch_app(app_name: str, run_id: str, version: str, spark_conf: Mapping[str, object], starting_offsets: str | None = None,
               expected_digest: str | None = None, record_desired: bool = True) -> Launch:
    """Start the app detached at `version` with `spark_conf` (both checked again), from its checkpoint."""
    version, spark_conf = trusted_launch(app_name, version, spark_conf)
    app = load_catalog().app(app_name)
    command = command_for(app_name, version, spark_conf, starting_offsets, expected_digest=expected_digest)
    return launch(app, command, checkpoint=app.checkpoint_location(),
                  launched_by=run_id, version=version, spark_conf=spark_conf, record_desired=record_desired)


def start_version(app_name: str, run_id: str) -> Callable[..., Launch]:
    """start(version, spark_conf, expected_digest=None): launch the app detached from its checkpoint."""
    return lambda version, spark_conf, expected_digest=None: launch_app(app_name, run_id, version, spark_conf,
                                                                        expected_digest=expected_digest)


def start_on_new_checkpoint(app_name: str, run_id: str) -> Callable[[str], Launch]:
    """start(starting_offsets): launch the version it last ran with on a new checkpoint at those offsets."""
    return lambda starting_offsets: launch_app(app_name, run_id, *last_launch(app_name), starting_offsets)


def supervisor_start(app_name: str, run_id: str) -> Callable[[str, Mapping[str, object], str | None], Launch]:
    """start(version, spark_conf, expected digest) for the supervisor's restarts: exactly the code
    the app last ran, launched like a restart by recover_restart_app, except that it leaves the
    desired state alone (the restarts count against the crash-loop guard)."""
    return lambda version, spark_conf, expected_digest: launch_app(app_name, run_id, version, spark_conf,
                                                                   expected_digest=expected_digest, record_desired=False)


def stopper(app_name: str, run_id: str, deadline_s: float = 60.0) -> Callable[[], str]:
    """stop(): stop the app gracefully (escalating after `deadline_s`), recorded as asked by `run_id`."""
    app = load_catalog().app(app_name)
    return lambda: stop(app, checkpoint=app.checkpoint_location(), requested_by=run_id, deadline_s=deadline_s)
