"""How a task starts and stops an app: `AppLauncher`, the one object every launch of a task goes
through (deploy, roll and its rollback, the warm standby, the cutover, every recovery that starts
the app, the supervisor's restarts).

A task reads the catalog once and hands the launcher the app it resolved there (`AppLauncher.of`);
nothing below re-reads the catalog by name. What a launch runs is bound when it is built, not
when the launcher is made: the app's approved changes (a cutover's topics, in
`_runtime/approved.json`) are read at `command()` time, so a launcher made before a cutover
launches the new topics after it (streamops.effective_spec).

Every launch passes `command()`, so a version and Spark conf are checked there whatever asked for
them (a trigger, a launch record on disk, a plan handed between tasks), and every launch runs the
app's one effective spec against the Kafka cluster its checkpoint belongs to, on spark_default's
target (`connections.spark_target`, built by `SubmitSpec.argv`, the one launch builder).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from streamops.app_ops import Launch, LaunchCommand, launch, stop
from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.catalog import AppSpec, Catalog
from streamops.dag_tasks.connections import spark_target
from streamops.effective_spec import bind_app, installed_code, launch_cluster
from streamops.kafka_client import app_connection
from streamops.launch_overrides import LaunchOverrideRefused, checked_spark_conf, checked_version
from streamops.recovery.common import RecoveryRefused
from streamops.spark_submit import submit_spec


@dataclass(frozen=True)
class AppLauncher:
    """One app of one catalog (read once by the task), launched and stopped on behalf of `run_id`."""

    catalog: Catalog
    app: AppSpec
    run_id: str

    @classmethod
    def of(cls, catalog: Catalog, app_name: str, run_id: str) -> AppLauncher:
        """The launcher of `app_name` in `catalog` (CatalogError naming the apps if it has none)."""
        return cls(catalog, catalog.app(app_name), run_id)

    @property
    def checkpoint(self) -> str:
        return self.app.checkpoint_location()

    def command(self, version: str | None, spark_conf: Mapping[str, object] | None, starting_offsets: str | None = None,
                expected_digest: str | None = None) -> LaunchCommand:
        """The spark-submit command for the app at a version with extra Spark conf (`starting_offsets`:
        where a new checkpoint starts; an existing one ignores it), and the effective spec it runs.
        The version and conf are checked here (LaunchOverrideRefused); an artifact app runs that
        version's artifact (ProgramError if there is none, or if its digest is not
        `expected_digest`, or not the one this version ran with before); a checkpoint of another
        Kafka cluster is refused (SpecRefused)."""
        version = checked_version(version)
        overrides = checked_spark_conf(spark_conf)
        bound = bind_app(self.catalog, self.app.name)  # the approved changes as they are now
        app = bound.app
        # The driver connects as the app's own principal (kafka_app_<app>, else kafka_default).
        kafka = app_connection(app.name)
        cluster = launch_cluster(app, kafka)
        # The checkpoint is passed explicitly so the driver and the DAGs agree on it.
        spec = submit_spec(app, kafka=kafka, catalog=bound.catalog_file, version=version, checkpoint=self.checkpoint,
                           starting_offsets=starting_offsets, expected_digest=expected_digest)
        spec = replace(spec, conf={**spec.conf, **overrides})
        effective = bound.spec(version=spec.version, spark_conf=overrides, code=spec.digest or installed_code(app.program),
                               principal=kafka.principal, kafka_cluster=cluster)
        return LaunchCommand(spec.argv(spark_target()), effective.to_record())

    def trusted(self, version: object, spark_conf: object) -> tuple[str, dict[str, str]]:
        """A version and Spark conf read back from a launch record (or a plan made from one), checked
        like a trigger's: a file on disk may have been edited, so it is not trusted. RecoveryRefused."""
        try:
            return (checked_version(version) or self.app.version), checked_spark_conf(spark_conf)
        except LaunchOverrideRefused as exc:
            raise RecoveryRefused([f"{self.app.name}'s last launch record (_runtime/driver.json) cannot be started again: "
                                   f"{exc}"]) from None

    def last_launch(self) -> tuple[str, dict[str, str]]:
        """The version and Spark conf the app last ran with (the catalog's version if never run)."""
        driver = AppRuntime(self.checkpoint).driver() or DriverRecord()
        return self.trusted(driver.launched_version or self.app.version, driver.launched_spark_conf)

    def launch(self, version: str | None, spark_conf: Mapping[str, object], starting_offsets: str | None = None,
               expected_digest: str | None = None, record_desired: bool = True) -> Launch:
        """Start the app detached at `version` (the catalog's if None) with `spark_conf`, from its checkpoint."""
        version, checked_conf = self.trusted(version, spark_conf)
        command = self.command(version, checked_conf, starting_offsets, expected_digest=expected_digest)
        return launch(self.app, command, checkpoint=self.checkpoint, launched_by=self.run_id, version=version,
                      spark_conf=checked_conf, record_desired=record_desired)

    def start_version(self) -> Callable[..., Launch]:
        """start(version, spark_conf, expected_digest=None): launch the app detached from its checkpoint."""
        return lambda version, spark_conf, expected_digest=None: self.launch(version, spark_conf,
                                                                             expected_digest=expected_digest)

    def start_on_new_checkpoint(self) -> Callable[[str], Launch]:
        """start(starting_offsets): launch the version it last ran with on a new checkpoint at those offsets."""
        return lambda starting_offsets: self.launch(*self.last_launch(), starting_offsets)

    def supervisor_start(self) -> Callable[[str, Mapping[str, object], str | None], Launch]:
        """start(version, spark_conf, expected digest) for the supervisor's restarts: exactly the code
        the app last ran, launched like a restart by recover_restart_app, except that it leaves the
        desired state alone (the restarts count against the crash-loop guard)."""
        return lambda version, spark_conf, expected_digest: self.launch(version, spark_conf, expected_digest=expected_digest,
                                                                        record_desired=False)

    def stopper(self, deadline_s: float = 60.0) -> Callable[[], str]:
        """stop(): stop the app gracefully (escalating after `deadline_s`), recorded as asked by `run_id`."""
        return lambda: stop(self.app, checkpoint=self.checkpoint, requested_by=self.run_id, deadline_s=deadline_s)
