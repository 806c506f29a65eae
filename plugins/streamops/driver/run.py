"""The driver of every app: spark-submit runs `streamops/entrypoints/driver.py`, which checks the
artifact and calls `main` here.

One run: parse the arguments (`driver.arguments`), load the app's catalog entry and check its
program against it, build the run's options, (as a standby: prepare, rehearse, wait for the
word), take the app's lease with the driver record, start the queries, wait for a stop, stop
gracefully, release the lease with the outcome. The exit code is an `ExitCode`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

from pyspark.sql.streaming import StreamingQuery

from streamops import settings
from streamops.app_runtime import AlreadyRunningError, AppRuntime
from streamops.artifacts import file_digest
from streamops.catalog import REAL_TIME, AppSpec, Catalog, catalog_path, load_catalog
from streamops.driver.arguments import STATE_CHECK_LINE, DriverArgs, parse_args
from streamops.driver.exit_codes import ExitCode
from streamops.driver.options import AVAILABLE_NOW, RunOptions
from streamops.driver.outputs import build_outputs
from streamops.driver.preparation import Prepared, prepare
from streamops.driver.queries import observed_totals, start_app
from streamops.driver.session import build_session
from streamops.driver.state_check import StateCheck, check_state
from streamops.driver.stopping import StopSignals, ended_by, graceful_stop, not_a_stop_refusal, record_failed_batches
from streamops.driver.warm_standby import await_go, warm_up, without_executor
from streamops.failures import error_gist
from streamops.kafka_client import KafkaClientConfig, KafkaConfigError
from streamops.program_contract import StreamingProgram, describe
from streamops.programs import ProgramError, ProgramInfo, import_program
from streamops.runtime_records import CodeRecord, DriverRecord, LaunchRecord
from streamops.standby import StandbySlot
from streamops.timestamps import now_iso
from streamops.waiting import poll_until

log = logging.getLogger("streamops.app")


def code_record(program: StreamingProgram, args: DriverArgs) -> CodeRecord:
    """Which code runs: the artifact (path, digest) or the installed module (its file's digest)."""
    if args.artifact:
        return CodeRecord(artifact=args.artifact, digest=args.artifact_digest)
    module_file = sys.modules[type(program).__module__].__file__
    if module_file is None:  # a program is a module with a file (program_contract); never a bare namespace
        raise ProgramError(f"program {type(program).__module__} has no file to pin its code by")
    return CodeRecord(installed=module_file, digest=file_digest(module_file))


def app_problems(spec: AppSpec, program: StreamingProgram) -> list[str]:
    """How the catalog's app does not fit this version of its program (roles, settings, checks):
    the catalog checked another version, or the installed code, when it loaded."""
    from pydantic import ValidationError

    info = ProgramInfo.from_description(spec.program, describe(program))
    problems = [f"{field}: {message}" for field, message in
                info.role_problems(set(spec.inputs), set(spec.outputs), set(spec.reads_outputs), spec.settings)]
    try:
        bound = program.bind(spec)
    except ValidationError as exc:
        return problems + [f"settings.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return problems + program.check(bound)


def load_app(args: DriverArgs) -> tuple[Catalog, AppSpec, StreamingProgram]:
    """The app's catalog entry and its program, checked against each other; SystemExit names what
    does not fit. Only this app's program is checked (against the code that runs): another app's
    missing artifact is no reason not to start this one."""
    catalog = load_catalog(args.catalog, check_programs=False)
    spec = catalog.app(args.app)
    if spec.program != args.program:
        raise SystemExit(f"app {spec.name!r} runs program {spec.program}, not {args.program}")
    try:
        program = import_program(args.program)
    except ProgramError as exc:
        raise SystemExit(f"cannot run {spec.name}: {exc}") from None
    problems = app_problems(spec, program)
    if (args.trigger or spec.trigger) == REAL_TIME and program.stateful_operators:
        problems.append(f"trigger real-time: the program keeps state ({', '.join(sorted(program.stateful_operators))}) "
                        "and real-time mode runs stateless queries only; use a micro-batch interval")
    if problems:
        raise SystemExit(f"cannot run {spec.name} with this version of {spec.program}: " + "; ".join(problems))
    return catalog, spec, program


def run_options(args: DriverArgs, spec: AppSpec) -> RunOptions:
    try:
        kafka = (KafkaClientConfig.read_file(args.kafka_config, private=True) if args.kafka_config
                 else KafkaClientConfig.plaintext(args.bootstrap_servers or "", source="--bootstrap-servers"))
    except KafkaConfigError as exc:
        raise SystemExit(f"cannot connect {spec.name} to Kafka: {exc}") from None
    return RunOptions(
        kafka=kafka,
        checkpoint=args.checkpoint or spec.checkpoint_location(),
        trigger=args.trigger or spec.trigger,
        checkpoint_interval=spec.real_time_interval(),
        starting_offsets=args.starting_offsets,
        version=args.version,
        max_offsets_per_trigger=args.max_offsets_per_trigger or spec.max_offsets_per_trigger,
        ending_offsets=args.ending_offsets,
        skip_records=AppRuntime(args.skip_records_of).skip_records() if args.skip_records_of else None,
    )


@dataclass
class DriverRun:
    """One run of one app, from the lease to its release."""

    args: DriverArgs
    catalog: Catalog
    spec: AppSpec
    program: StreamingProgram
    options: RunOptions
    runtime: AppRuntime
    stops: StopSignals
    # Under spark-submit the Python driver is a child of the Spark JVM it talks to.
    jvm_pid: int | None = field(default_factory=lambda: os.getppid() if "PYSPARK_GATEWAY_PORT" in os.environ else None)
    stopping: threading.Event = field(default_factory=threading.Event)  # set by the graceful stop
    prepared: Prepared | None = None
    queries: list[StreamingQuery] = field(default_factory=list)
    running: bool = False  # queries started (an available-now run is running while start_app works)
    outcome: str = "failed"
    reason: str = "driver exited during start-up"

    @property
    def group_id(self) -> str | None:
        return f"streamops.{self.spec.name}" if self.args.consumer_group else None

    @property
    def real_time(self) -> bool:
        return self.options.trigger == REAL_TIME

    def driver_record(self) -> DriverRecord:
        """What driver.json says about this run from the start (AppRuntime.acquire adds the
        process and its lease)."""
        options = self.options
        return DriverRecord(
            app=self.spec.name,
            program=self.spec.program,
            version=options.version or self.spec.version,
            code=code_record(self.program, self.args),
            trigger=options.trigger,
            checkpoint_interval=options.checkpoint_interval if self.real_time else None,
            spark_conf={k: str(v) for k, v in self.spec.spark_conf.items()},
            catalog=str(catalog_path(self.args.catalog)),
            kafka=options.kafka.describe(),
            environment=self.catalog.environment,
            launched_by=settings.LAUNCHED_BY.get() or "command line",
            # The launcher's record (LaunchRecord.to_env), read as a LaunchRecord (keys it does not know are dropped).
            launch=LaunchRecord.from_json(json.loads(settings.LAUNCH.get() or "{}")),
            # spark-submit and its JVM share it: a recovery can find what a dead driver left.
            process_group=os.getpgrp(),
            jvm_pid=self.jvm_pid,
            driver_log=settings.DRIVER_LOG.get(),
        )

    def stand_by(self, token: str) -> bool:
        """As a warm standby: prepare, rehearse, let Spark judge a restart from the running
        version's checkpoint (or, with no executor to run it on, leave that to the rollout), wait
        for the rollout's word. True: go."""
        self.prepared = prepare(self.spec, self.program, self.options, self.runtime, group_id=self.group_id)
        no_executor = without_executor(self.prepared.spark)
        log.info("warm standby %s: %s", token,
                 warm_up(self.prepared.spark, self.spec, self.program, self.options,
                         interrupted=lambda: bool(self.stops.received), no_executor=no_executor))
        if no_executor:
            log.info("warm standby %s: state check left to the rollout: %s", token, no_executor)
            state = StateCheck(deferred=no_executor)
        else:
            state = check_state(self.prepared.spark, self.spec, self.program, self.prepared.outputs,
                                self.options.checkpoint)
        return await_go(StandbySlot(self.runtime.dir, token), self.prepared, self.args.standby_timeout_s, self.stops,
                        state)

    def start(self) -> None:
        """Prepare (unless a standby did), record where it runs, start the queries."""
        if self.prepared is None:
            self.prepared = prepare(self.spec, self.program, self.options, self.runtime, group_id=self.group_id)
        spark = self.prepared.spark
        context = spark.sparkContext
        # Where it runs: the driver's host, its master and its UI (status lists executors from it).
        self.runtime.update(application_id=context.applicationId, spark_master=context.master, spark_ui=context.uiWebUrl,
                            driver_host=context.getConf().get("spark.driver.host", None) or socket.gethostname(),
                            stateful_operators=self.prepared.stateful_operators)
        self.running = self.options.trigger == AVAILABLE_NOW
        self.queries = start_app(spark, self.spec, self.program, self.options, self.prepared.outputs,
                                 still_held=self.runtime.lease.still_held, sources_read=self.prepared.sources_read,
                                 stopping=self.stopping)
        self.running = True
        self.stops.watch(self.queries)
        # Launchers wait for this: an idle query reports no progress, but it has started.
        self.runtime.update(queries_started=[q.name.rsplit(".", 1)[-1] for q in self.queries], queries_started_at=now_iso())

    def until_stopped(self) -> ExitCode:
        """Run until a stop request, a signal, a lost lease or a failed query; stop; say why."""
        runtime, queries = self.runtime, self.queries
        poll_until(
            lambda: self.stops.received or runtime.fenced or runtime.stop_requested() or any(not q.isActive for q in queries),
            timeout=10 * 365 * 86400,
            what="a stop request",
            # Often: a rolling restart's output gap starts when the old driver notices its stop.
            interval=0.1,
            max_interval=0.2,
        )
        if runtime.fenced:
            graceful_stop(queries, deadline_s=0)
            self.outcome, self.reason = "fenced", runtime.lease.lost_reason()
            return ExitCode.FENCED
        failed = [q for q in queries if not q.isActive and q.exception()]
        if failed:
            record_failed_batches(runtime, failed)
            # The whole exception (with Spark's logical plan) is in the driver log; the record
            # keeps the line that says what went wrong.
            self.reason = "; ".join(f"query {q.name} failed: {error_gist(str(q.exception()))}" for q in failed)
            log.error("%s", "; ".join(f"query {q.name} failed: {q.exception()}" for q in failed))
            log.error("in short: %s", self.reason)
            graceful_stop(queries, deadline_s=30, real_time=self.real_time, stopping=self.stopping)
            self._publish_last()
            return ExitCode.FAILED
        request = runtime.stop_request()
        why = self.stops.describe() or f"stop requested by {request.by or 'an operator'}"
        deadline = request.deadline_s or float(settings.STOP_DEADLINE.get() or 60)
        stopped = graceful_stop(queries, deadline_s=float(deadline), real_time=self.real_time, stopping=self.stopping)
        self.reason = f"{why}; {stopped}"
        self._publish_last()
        self.outcome = "stopped"
        return ExitCode.OK

    def _publish_last(self) -> None:
        if self.prepared is not None:
            self.prepared.publisher.publish_last(self.queries)

    def run(self) -> ExitCode:
        """From the lease taken to its release with the outcome (driver.json)."""
        # A driver that finds another has taken its lease over stops its queries at once: the batch
        # in flight is not committed (the sink checks too) and the new driver runs it.
        self.runtime.lease.on_lost(lambda _taker: self.stops.stop_now("lease lost"))
        began = time.monotonic()
        try:
            self.start()
            if self.options.trigger == AVAILABLE_NOW:
                self._publish_last()
                log.info("available-now run finished; totals %s", json.dumps(observed_totals(self.queries)))
                self.outcome, self.reason = "stopped", "available-now run finished"
                return ExitCode.OK
            return self.until_stopped()
        except BaseException as exc:
            if self.runtime.fenced:
                self.outcome, self.reason = "fenced", self.runtime.lease.lost_reason()
                log.error("%s", self.reason)
                return ExitCode.FENCED
            self.outcome, self.reason = ended_by(exc, self.running, time.monotonic() - began, self.stops, self.jvm_pid)
            log.error("%s", self.reason)
            raise
        finally:
            if self.prepared is not None:
                self.prepared.release()
            self.runtime.release(self.outcome, self.reason)


def print_state_check(spec: AppSpec, program: StreamingProgram, options: RunOptions) -> ExitCode:
    """Spark's verdict on this version restarting from the app's checkpoint (`--check-state`):
    its queries for one empty batch on a copy, writing nowhere; no lease is taken, the running
    app is not touched. The reconcile judges a stateful app's roll by it."""
    spark = build_session(f"streamops-{spec.name}-plan")
    spark.sparkContext.setLogLevel("ERROR")
    verdict = check_state(spark, spec, program, build_outputs(spark, spec, program, options), options.checkpoint)
    print(STATE_CHECK_LINE + json.dumps(verdict.to_json(), sort_keys=True), flush=True)
    return ExitCode.OK


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j.clientserver").addFilter(not_a_stop_refusal)
    args = parse_args(argv)
    catalog, spec, program = load_app(args)
    options = run_options(args, spec)
    log.info("app %s (%s %s) from %s: %s",
             spec.name, spec.program, options.version or spec.version, catalog_path(args.catalog), options)
    if args.check_state:
        return print_state_check(spec, program, options)
    run = DriverRun(args, catalog, spec, program, options, AppRuntime(options.checkpoint), StopSignals())
    if args.standby and not run.stand_by(args.standby):
        return ExitCode.OK
    try:
        run.runtime.acquire(run.driver_record().to_json())
    except AlreadyRunningError as exc:
        log.error("refused: %s", exc)
        return ExitCode.ALREADY_RUNNING
    return run.run()
