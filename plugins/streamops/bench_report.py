"""`streamops bench report`: the router's figures on this machine, side by side, as JSON and plots.

One broker (a temporary local one unless given), topics with LogAppendTime so every timestamp
compared comes from the broker's one clock, the catalog's artifacts built from this checkout into
a store of the run's own (bench.workspace). Parts (`--parts`):
- drain: a 200,000-record backlog drained by the router run the project's way (a fresh
  spark-submit, available-now): launch to first output, first to last output; beside it a Kafka
  Streams app doing the same routing (build/maven/kafka-streams-router, built with Maven), the plain
  confluent-kafka Python loop and the broker's raw consume rate; each row's ratio to Kafka Streams;
- warm: a long-running router, warmed up, given 1,000,000 records at once: records/s until routed;
- cores: the router on one and on two task threads, local and on a standalone cluster of the bench's
  own (an executor on one worker host, then on two): a fresh drain and a warm long-running run each,
  the speed-up, each warm run's fixed cost per batch and writing rate from Spark's batch durations,
  and the model of docs/performance.md checked against them;
- parse: the input contract's parse alone (no Kafka, one warm session) with its JVM pass and with
  Spark's checks alone, the rate before and after that pass, and the same decision on every record;
- latency: event-to-output p50/p99/max under a steady load (2,000 and 10,000 events/s, made
  beforehand and paced in 5 ms slots) for the live router on a micro-batch trigger and in
  real-time mode, and whether its backlog grew;
- roll: the largest gap in the output, records lost (must be 0) and duplicates, for a roll-restart
  under load in each mode;
- stateful: the presence notifier and browser-activity at rising steady rates: latency, whether
  each rate is sustained, exact windows, state size (streamops.bench_stateful).
Figures are printed with their goals (GOALS), written to <out>/figures.json and drawn to <out>/*.png
(matplotlib). Nothing here asserts a goal: docs/performance.md says what was reached and what limits it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from confluent_kafka import TopicPartition

from streamops import rollout
from streamops.app_runtime import AppRuntime
from streamops.bench import (
    BENCH_MASTER,
    ROLLED_VERSION,
    ROUTER,
    STEADY_WARMUP_S,
    bench_catalog,
    committed_everything,
    dead_lettered,
    launch_live,
    paced_load,
    parse_benchmark,
    percentile,
    produce_waiting,
    python_router,
    raw_consume,
    routes,
    stop_live,
    wait_until_started,
    workspace,
    write_catalog,
)
from streamops.bench_probes import batch_costs, cpu_seconds, cpu_used, driver_log_text, logged_batches, predicted_rate
from streamops.bench_stateful import STATEFUL_APPS, STATEFUL_RATES, stateful_figures
from streamops.catalog import DEFAULT_REAL_TIME_CHECKPOINT_INTERVAL, AppSpec, Catalog
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import producer, read_all
from streamops.loadgen import LoadSpec, background_load
from streamops.loadgen import events as load_events
from streamops.loadgen import run as run_load
from streamops.local_stack.spark_cluster import SparkStandalone, free_spark_ports
from streamops.paths import CACHE_DIR, PROJECT_ROOT
from streamops.spark_submit import SparkTarget, driver_env, submit_spec
from streamops.timestamps import iso_seconds_utc, utc_now
from streamops.waiting import DeadlineExceeded, poll_until


@dataclass
class DrainFigure:
    engine: str
    records_in: int
    records_out: int
    seconds: float  # first to last output (the processing itself)
    launch_to_first_s: float | None = None  # start-up: launch to the first output record
    launch_to_last_s: float | None = None
    # A long-running run's batches with input (from the driver's per-batch log lines), the records/s
    # inside them, a batch's time outside its writing (F) and the writing's records/s (R): batch_costs.
    batches: int | None = None
    inside_batches_rate: float | None = None
    fixed_cost_s: float | None = None
    writing_rate: float | None = None
    mean_batch: float | None = None
    cpu_s: dict[str, float] | None = None  # CPU seconds per process role over the measured window (cpu_used)

    @property
    def rate(self) -> float:
        return self.records_in / self.seconds if self.seconds else 0.0


@dataclass
class LatencyFigure:
    mode: str  # "micro-batch (2 seconds)" or "real-time (checkpoint every 10 seconds)"
    target_rate: int
    produced_rate: float  # what the load generator reached (measured records / their time span)
    records: int  # records measured (after the warm-up)
    p50_ms: float
    p99_ms: float
    max_ms: float
    # After the last input record, until the last output (None: not all routed within the limit).
    caught_up_s: float | None
    unrouted: int = 0  # measured records not routed within the limit (not in the percentiles)


@dataclass
class RollFigure:
    mode: str
    rate: float
    downtime_s: float
    largest_gap_s: float
    expected: int
    lost: int
    duplicates: int


def _output_times(kafka: KafkaClientConfig, catalog: Catalog) -> list[tuple[str, str, int]]:
    """(event_id, category, broker timestamp ms) of every routed output record."""
    app = catalog.app(ROUTER)
    return [(r.json()["event_id"], r.json()["category"], r.timestamp_ms)
            for topic in app.outputs.values() for r in read_all(kafka, topic)]


def _written(kafka: KafkaClientConfig, catalog: Catalog) -> int:
    app = catalog.app(ROUTER)
    return sum(high for topic in [*app.outputs.values(), app.dead_letter_topic] for _, high in end_offsets(kafka, topic).values())


def drain_by_spark_submit(catalog: Catalog, kafka: KafkaClientConfig, workdir: Path, records_in: int,
                          target: SparkTarget | None = None) -> DrainFigure:
    """The router as an operator runs it: `spark-submit ... --trigger available-now`, fresh JVM and checkpoint."""
    app = catalog.app(ROUTER)
    checkpoint = workdir / f"drain-{uuid.uuid4().hex[:6]}"
    spec = submit_spec(app, kafka=kafka, catalog=write_catalog(catalog, workdir), trigger="available-now",
                       checkpoint=str(checkpoint))
    launched_ms = time.time() * 1000
    with open(workdir / "drain-driver.log", "wb") as log:
        argv = spec.argv(target or SparkTarget("local[*]"))
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=driver_env(), cwd=workdir,  # noqa: S603
                              check=False).returncode
    finished_ms = time.time() * 1000
    if code != 0:
        tail = (workdir / "drain-driver.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the router's drain run failed ({code}); its log ends:\n{tail}")
    return _drained("Spark router (spark-submit, available-now)", catalog, kafka, records_in, launched_ms, finished_ms)


def _drained(engine: str, catalog: Catalog, kafka: KafkaClientConfig, records_in: int, launched_ms: float,
             finished_ms: float) -> DrainFigure:
    """A drain's figure from its outputs' broker times: first to last output, launch to each."""
    stamps = sorted(t for _, _, t in _output_times(kafka, catalog))
    first, last = stamps[0], stamps[-1]
    return DrainFigure(engine, records_in, _written(kafka, catalog), (last - first) / 1000, (first - launched_ms) / 1000,
                       (finished_ms - launched_ms) / 1000)


KAFKA_STREAMS_PROJECT = PROJECT_ROOT / "build" / "maven" / "kafka-streams-router"


def kafka_streams_jar() -> Path:
    """The Kafka Streams reference (build/maven/kafka-streams-router), built with Maven from
    Maven Central into its target/ when its sources changed (about 20 s once)."""
    jar = KAFKA_STREAMS_PROJECT / "target" / "kafka-streams-router-1.0.0.jar"
    sources = [KAFKA_STREAMS_PROJECT / "pom.xml", *(KAFKA_STREAMS_PROJECT / "src").rglob("*.java")]
    if jar.is_file() and jar.stat().st_mtime >= max(f.stat().st_mtime for f in sources):
        return jar
    print("building the Kafka Streams reference with Maven ...", flush=True)
    done = subprocess.run(  # noqa: S603
        ["mvn", "-q", "-B", "-Dstyle.color=never", "-s", str(PROJECT_ROOT / "build" / "maven" / "settings.xml"),
         f"-Dmaven.repo.local={CACHE_DIR / 'm2'}", "-f", str(KAFKA_STREAMS_PROJECT / "pom.xml"), "package"],
        capture_output=True, text=True, check=False)
    if done.returncode != 0 or not jar.is_file():
        raise RuntimeError(f"Maven could not build the Kafka Streams reference ({KAFKA_STREAMS_PROJECT}):\n"
                           + (done.stdout + done.stderr)[-3000:])
    return jar


def drain_by_kafka_streams(catalog: Catalog, source_app: AppSpec, kafka: KafkaClientConfig, workdir: Path, records_in: int,
                           timeout_s: float = 600) -> DrainFigure:
    """The same backlog drained by a Kafka Streams app doing the router's routing (one stream
    thread, Jackson, at-least-once): launch to first output, first to last output (broker time).
    Reads `source_app`'s input, writes `catalog`'s outputs. Done when its consumer group has
    committed the input's end offsets."""
    app = catalog.app(ROUTER)
    source = source_app.inputs["operations"]
    client = workdir / f"kstreams-{uuid.uuid4().hex[:6]}.properties"
    client.write_text("".join(f"{key}={value}\n" for key, value in kafka.java_settings().items()))
    client.chmod(0o600)
    application_id = f"bench-kstreams-{uuid.uuid4().hex[:8]}"
    route_args = [f"{op}={category}:{topic}" for op, targets in sorted(routes(app).items()) for category, topic in targets]
    argv = ["java", "-jar", str(kafka_streams_jar()), str(client), application_id, source, app.dead_letter_topic, app.name,
            str(app.max_record_bytes), str(workdir / application_id), *route_args]
    ends = {p: high for p, (_, high) in end_offsets(kafka, source).items()}
    launched_ms = time.time() * 1000
    with open(workdir / "kstreams.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)  # noqa: S603
    # Reads the group's committed offsets only (it never subscribes, so it never joins the group).
    group = kafka.consumer(application_id)
    try:
        def drained() -> bool:
            if process.poll() is not None:
                tail = (workdir / "kstreams.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the Kafka Streams reference exited ({process.returncode}); its output ends:\n{tail}")
            committed = group.committed([TopicPartition(source, p) for p in ends], timeout=10)
            return all(tp.offset >= ends[tp.partition] for tp in committed)

        poll_until(drained, timeout=timeout_s, what="the Kafka Streams reference to drain the backlog", interval=1)
        finished_ms = time.time() * 1000
    finally:
        group.close()
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return _drained(KAFKA_STREAMS_ENGINE, catalog, kafka, records_in, launched_ms, finished_ms)


# Records a warm run gives a JVM first: its JIT needs about that many before a rate stops rising.
WARM_UP_RECORDS = 600_000


def warm_run(catalog: Catalog, kafka: KafkaClientConfig, workdir: Path, events: int, warmup: int = WARM_UP_RECORDS,
             timeout_s: float = 900, master: str = "local[*]") -> DrainFigure:
    """A long-running router (micro-batch, on `master`: the machine's cores unless given, warmed up on
    `warmup` records first: its JIT needs about that many) given `events` more at once: records/s
    from the first of them written until the router has committed the last (it runs batches back to
    back while behind), and what its batches say (batch_costs). The records are made before the
    clock starts and written by a plain producer (about 250,000/s), so the load generator's Python
    does not share the cores with the router meanwhile."""
    app = catalog.app(ROUTER)
    source = app.inputs["operations"]
    checkpoint = launch_live(catalog, kafka, workdir, app.trigger or "2 seconds", master=master)
    runtime = AppRuntime(checkpoint)

    def caught_up() -> bool:
        return committed_everything(checkpoint, kafka)

    try:
        # Event times a microsecond apart: at the load generator's default of 1 ms for an unpaced load,
        # 1,000,000 records would span 17 minutes of event time, and those more than the contract's
        # max_future (5 minutes) ahead of their Kafka timestamp are dead letters: the run measured
        # mostly the dead-letter path (1,023,102 records out of 1,000,000 in: about 690,000 dead letters).
        spacing = timedelta(microseconds=1)
        warm_up = run_load(app, LoadSpec(count=warmup, keys=1000, malformed=0.01, seed=5, event_spacing=spacing), kafka)
        poll_until(caught_up, timeout=timeout_s, what="the router to route its warm-up records", interval=0.5)
        # The progress listener logs a batch just after its commit: the warm-up's batches end where their rows do.
        logged_warm_up = _logged_within(runtime, warm_up.produced, -1, "its warm-up batches")
        last_warm_up_batch = logged_warm_up[-1][0] if logged_warm_up else -1
        batch = [(key, value) for _, key, value, _, _ in
                 load_events(app, LoadSpec(count=events, keys=1000, malformed=0.01, seed=6, start_seq=warmup + 1,
                                           event_spacing=spacing))]
        before = _written(kafka, catalog)
        out = producer(kafka, **{"linger.ms": 20, "batch.size": 1_048_576, "compression.type": "lz4"})
        cpu_before = cpu_seconds()
        began = time.monotonic()
        for key, value in batch:
            produce_waiting(out, source, key, value)
        if out.flush(120):
            raise RuntimeError("the warm run's records were not all acknowledged within 120 s")
        written_s = time.monotonic() - began
        poll_until(caught_up, timeout=timeout_s, what="the router to route every record", interval=0.2)
        seconds = time.monotonic() - began
        cpu = cpu_used(cpu_before, cpu_seconds())
        logged = _logged_within(runtime, len(batch), last_warm_up_batch, "its batches of the measured records")
        costs = batch_costs(logged if sum(b[1] for b in logged) >= len(batch) else [])
    finally:
        stop_live(checkpoint)
    print(f"  (the producer wrote {len(batch):,} records in {written_s:.1f} s)", flush=True)
    return DrainFigure(f"Spark router, long-running, warm ({app.trigger or '2 seconds'} trigger)", len(batch),
                       _written(kafka, catalog) - before, seconds, **costs, cpu_s=cpu)

def _logged_within(runtime: AppRuntime, rows: int, after_batch: int, what: str,
                   timeout_s: float = 60) -> list[tuple[int, int, int, int]]:
    """The driver's logged batches after `after_batch`, once they hold `rows` rows (or as they are
    when `timeout_s` passes: the run's figure stays, its batch figures are left out, with a warning)."""
    try:
        poll_until(lambda: sum(b[1] for b in logged_batches(driver_log_text(runtime), after_batch)) >= rows,
                   timeout=timeout_s, what=f"the driver to log {what}", interval=0.2)
    except DeadlineExceeded as exc:
        print(f"  warning: {exc}; this run's batch figures are left out", flush=True)
    return logged_batches(driver_log_text(runtime), after_batch)


def latency_run(catalog: Catalog, kafka: KafkaClientConfig, workdir: Path, trigger: str, rate: int,
                seconds: float = 30, warmup_s: float = STEADY_WARMUP_S, catch_up_limit_s: float = 120) -> LatencyFigure:
    """The live router under `rate` events/s for warm-up + `seconds`, the load begun once its
    queries run; latency of the records produced after the warm-up: output's broker time minus
    input's broker time."""
    app = catalog.app(ROUTER)
    source = app.inputs["operations"]
    checkpoint = launch_live(catalog, kafka, workdir, trigger)
    try:
        wait_until_started(checkpoint)
        started = time.time()
        total = int(rate * (warmup_s + seconds))
        paced_load(app, LoadSpec(count=total, keys=1000, rate=rate, seed=int(started)), kafka)
        measured_from_ms = (started + warmup_s) * 1000
        inputs = {f"{r.topic}/{r.partition}/{r.offset}": r.timestamp_ms for r in read_all(kafka, source)
                  if r.timestamp_ms >= measured_from_ms}
        routed: dict[str, int] = {}

        def all_routed() -> bool:
            routed.clear()
            for event_id, _, stamp in _output_times(kafka, catalog):
                if event_id in inputs:
                    routed[event_id] = max(stamp, routed.get(event_id, 0))
            # Dead letters (about 1% here) are not in the outputs: compare against the routable share.
            return len(routed) >= len(inputs) - _dead_lettered(kafka, catalog, inputs)

        try:
            poll_until(all_routed, timeout=catch_up_limit_s, what="the router to catch up", interval=2, max_interval=5)
            caught_up: float | None = (max(routed.values()) - max(inputs.values())) / 1000
        except DeadlineExceeded:
            caught_up = None
        latencies = sorted(float(t - inputs[e]) for e, _, t in _output_times(kafka, catalog) if e in inputs)
    finally:
        stop_live(checkpoint)
    mode = (f"real-time (checkpoint every {app.checkpoint_interval or DEFAULT_REAL_TIME_CHECKPOINT_INTERVAL})"
            if trigger == "real-time" else f"micro-batch ({trigger})")
    span_s = (max(inputs.values()) - min(inputs.values())) / 1000 if inputs else 0
    produced = round(len(inputs) / span_s) if span_s else 0
    unrouted = len(inputs) - len(routed) - _dead_lettered(kafka, catalog, inputs)
    if not latencies:
        return LatencyFigure(mode, rate, produced, 0, 0, 0, 0, caught_up, unrouted)
    return LatencyFigure(mode, rate, produced, len(latencies), percentile(latencies, 0.5), percentile(latencies, 0.99),
                         latencies[-1], None if caught_up is None else round(caught_up, 1), max(unrouted, 0))


def _dead_lettered(kafka: KafkaClientConfig, catalog: Catalog, inputs: dict[str, int]) -> int:
    """Measured input records that went to the dead-letter topic (malformed, or an unknown op type)."""
    sources = dead_lettered(kafka, catalog.app(ROUTER).dead_letter_topic)
    named = {f"{topic}/{partition}/{offset}" for topic, partition, offset in sources}
    return len(named & set(inputs))


def roll_run(catalog: Catalog, kafka: KafkaClientConfig, workdir: Path, trigger: str, rate: float) -> RollFigure:
    """Roll the live router to a new version under load; reconcile input against output."""
    app = catalog.app(ROUTER)
    catalog_file = write_catalog(catalog, workdir, trigger)
    checkpoint = workdir / f"roll-{uuid.uuid4().hex[:6]}"
    app_here = app.model_copy(update={"checkpoint": str(checkpoint), "trigger": trigger})

    def command(version: str) -> list[str]:
        spec = submit_spec(app_here, kafka=kafka, catalog=catalog_file, checkpoint=str(checkpoint), version=version)
        return spec.argv(SparkTarget(BENCH_MASTER))

    before = {(e, c) for e, c, _ in _output_times(kafka, catalog)}
    launch_live(catalog, kafka, workdir, trigger, checkpoint=checkpoint)
    runtime = AppRuntime(checkpoint)
    first_offset = {p: high for p, (_, high) in end_offsets(kafka, app.inputs["operations"]).items()}
    try:
        with background_load(app, LoadSpec(count=10_000_000, keys=100, rate=rate, seed=7), kafka):
            poll_until(lambda: (progress := runtime.progress().get("route")) is not None and progress.input_rows > 0, timeout=120,
                       what="the router to see load")
            summary = rollout.roll_restart(app_here, new_command=command(ROLLED_VERSION),
                                           previous_command=lambda _: command(app.version), new_version=ROLLED_VERSION,
                                           kafka=kafka, run_id="bench", log=lambda line: None)
            # Some load after the roll too, so the gap is measured between records on both sides.
            settle = time.monotonic() + 5
            poll_until(lambda: time.monotonic() > settle, timeout=10, what="load after the roll")
        table = routes(app)
        expected = set()
        for record in read_all(kafka, app.inputs["operations"]):
            if record.offset < first_offset.get(record.partition, 0):
                continue
            for category, _ in table.get(record.json()["op_type"], []):
                expected.add((f"{record.topic}/{record.partition}/{record.offset}", category))
        got: list = []

        def complete() -> bool:
            got[:] = [x for x in _output_times(kafka, catalog) if (x[0], x[1]) not in before]
            return expected <= {(e, c) for e, c, _ in got}

        try:
            poll_until(complete, timeout=300, what="every record routed", max_interval=2)
        except DeadlineExceeded:
            pass
    finally:
        stop_live(checkpoint)
    stamps = sorted(t for _, _, t in got)
    gap = max((b - a for a, b in zip(stamps, stamps[1:], strict=False)), default=0) / 1000
    counts = Counter((e, c) for e, c, _ in got)
    return RollFigure(trigger, rate, summary["downtime_s"], round(gap, 2), len(expected),
                      len(expected - set(counts)), sum(n - 1 for n in counts.values()))


def machine() -> dict:
    import pyspark

    return {"cpus": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(), "spark": pyspark.__version__,
            "at": iso_seconds_utc(utc_now())}


PARTS = ("drain", "warm", "cores", "parse", "latency", "roll", "stateful")
KAFKA_STREAMS_ENGINE = "Kafka Streams app (one thread, Jackson, at-least-once)"
# The goals of issue 38, printed beside the figures (nothing asserts them: benchmarks print).
GOALS = {
    "drain": "the Spark router's records/s at least the Kafka Streams app's (ratio >= 1.00); first output within 10 s "
             "of launch",
    "warm": "a long-running router's records/s at least the Kafka Streams app's drain rate",
    "cores": "the router's records/s grows with its cores (speed-up from 1 to 2; docs/performance.md models more hosts)",
    "parse": "the strict parse faster with the JVM pass than with Spark's checks alone, every record decided alike",
    "latency": "real-time p99 < 250 ms at 2,000 events/s and < 1 s at 10,000; micro-batch p99 < trigger + 1 s at 10,000",
    "roll": "no record lost; the largest output gap a few seconds",
    "stateful": "each stateful app sustains 10,000 events/s on 2 cores with exact windows (its p99 and state size printed)",
}


def run_report(out: Path, events: int = 200_000, rates: tuple[int, ...] = (2_000, 10_000), seconds: float = 30,
               micro_batch: str = "2 seconds", roll_rate: float = 1_000, kafka: KafkaClientConfig | None = None,
               parts: tuple[str, ...] = PARTS, warm_events: int = 1_000_000,
               stateful_rates: tuple[int, ...] = STATEFUL_RATES,
               stateful_apps: tuple[str, ...] | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    with workspace(kafka) as (kafka, workdir):
        run_id = f"bench{uuid.uuid4().hex[:8]}"
        figures: dict = {"machine": machine(), "settings": {"events": events, "rates": list(rates), "seconds": seconds,
                                                            "micro_batch": micro_batch, "roll_rate": roll_rate,
                                                            "warm_events": warm_events,
                                                            "stateful_rates": list(stateful_rates),
                                                            "stateful_apps": list(stateful_apps or
                                                                                  [a.name for a in STATEFUL_APPS])},
                         "goals": {part: GOALS[part] for part in parts}}
        if "drain" in parts:
            figures["drain"] = drain_figures(kafka, workdir, run_id, events)
        if "warm" in parts:
            print(f"warm: a long-running router given {warm_events:,} records ...", flush=True)
            warm = warm_run(bench_catalog(kafka, f"{run_id}.warm"), kafka, workdir, warm_events)
            print(f"  {warm}", flush=True)
            figures["warm"] = [{**asdict(warm), "rate": round(warm.rate)}]
        if "cores" in parts:
            figures["cores"] = core_figures(kafka, workdir, run_id, events, warm_events)
        if "parse" in parts:
            print(f"parse: {events:,} records, with the JVM pass and with Spark's checks alone ...", flush=True)
            figures["parse"] = [{**asdict(r), "rate": round(r.rate)} for r in parse_benchmark(events, repeats=6)]
        if "latency" in parts:
            latency: list[LatencyFigure] = []
            for trigger in (micro_batch, "real-time"):
                for rate in rates:
                    catalog = bench_catalog(kafka, f"{run_id}.lat{len(latency)}")
                    print(f"latency: {trigger} at {rate} events/s ...", flush=True)
                    figure = latency_run(catalog, kafka, workdir, trigger, rate, seconds)
                    print(f"  {figure}", flush=True)
                    latency.append(figure)
            figures["latency"] = [asdict(f) for f in latency]
        if "roll" in parts:
            rolls: list[RollFigure] = []
            for trigger in (micro_batch, "real-time"):
                print(f"roll-restart: {trigger} under {roll_rate:g} events/s ...", flush=True)
                roll_figure = roll_run(bench_catalog(kafka, f"{run_id}.roll{len(rolls)}"), kafka, workdir, trigger, roll_rate)
                print(f"  {roll_figure}", flush=True)
                rolls.append(roll_figure)
            figures["roll"] = [asdict(r) for r in rolls]
        if "stateful" in parts:
            figures["stateful"] = stateful_figures(kafka, workdir, run_id, stateful_rates, seconds, stateful_apps)
        (out / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
        draw(figures, out)
        return figures


def with_router_conf(catalog: Catalog, conf: dict[str, str]) -> Catalog:
    """The catalog with `conf` merged into the router's spark_conf (a cluster's executor settings)."""
    apps = [a.model_copy(update={"spark_conf": {**a.spark_conf, **conf}}) if a.name == ROUTER else a for a in catalog.apps]
    return catalog.model_copy(update={"apps": apps})


def bench_cluster(workdir: Path):
    """A Spark standalone cluster of the bench's own (streamops.local_stack.spark_cluster: a master and
    two 1-core workers, each on a loopback address of its own), on ports free now, so a running
    cluster profile's ports are not taken (its processes' CPU is counted, though: cpu_seconds)."""
    ports = free_spark_ports()
    return SparkStandalone(state_dir=workdir / "spark-standalone", master_port=ports["master_port"],
                           master_ui_port=ports["master_ui_port"], worker_port=ports["worker_port"],
                           worker_ui_port=ports["worker_ui_port"])


CORE_PLACES = ("local", "standalone")


def core_figures(kafka: KafkaClientConfig, workdir: Path, run_id: str, events: int, warm_events: int,
                 places: tuple[str, ...] = CORE_PLACES) -> list[dict]:
    """The router with one and with two task threads, in local mode (local[1], local[2]) and on a
    Spark standalone cluster of the bench's own (one 1-core executor on one worker host, then one on
    each of two), each from topics of its own: a fresh driver's drain of `events` (spark-submit,
    available-now) and a warm long-running router given `warm_events` (warm_run, with its batches'
    fixed cost, writing rate and CPU per process role; each executor JVM warmed on WARM_UP_RECORDS);
    each row's speed-up over one core in the same place and run."""
    rows: list[dict] = []

    def measure(place: str, cores: int, master: str, conf: dict[str, str], where: str, jvms: int = 1) -> None:
        for run in ("drain", "warm"):
            catalog = with_router_conf(bench_catalog(kafka, f"{run_id}.{place}{cores}{run}"), conf)
            print(f"cores: {where}, {run} ...", flush=True)
            if run == "drain":
                preload = run_load(catalog.app(ROUTER), LoadSpec(count=events, keys=1000, malformed=0.01, seed=43), kafka)
                figure = drain_by_spark_submit(catalog, kafka, workdir, preload.produced, SparkTarget(master))
            else:
                # Each executor is a JVM of its own, whose JIT warms on the records its tasks get.
                figure = warm_run(catalog, kafka, workdir, warm_events, warmup=WARM_UP_RECORDS * jvms, master=master)
            figure.engine = where
            print(f"  {figure}", flush=True)
            rows.append({**asdict(figure), "place": place, "cores": cores, "run": run, "rate": round(figure.rate)})

    if "local" in places:
        for cores in (1, 2):
            measure("local", cores, f"local[{cores}]", {}, f"local[{cores}]")
    if "standalone" in places:
        cluster = bench_cluster(workdir)
        print(cluster.start(), flush=True)
        try:
            for executors in (1, 2):
                hosts = "one worker host" if executors == 1 else "two worker hosts"
                measure("standalone", executors, cluster.master_url, cluster.app_conf(cores=executors),
                        f"standalone, {executors} executor{'s' if executors > 1 else ''} of 1 core on {hosts}",
                        jvms=executors)
        finally:
            print(cluster.stop(), flush=True)
    for row in rows:
        one = next(r for r in rows if r["place"] == row["place"] and r["run"] == row["run"] and r["cores"] == 1)
        row["speed_up"] = round(row["rate"] / one["rate"], 2) if one["rate"] else None
    return rows


def model_check(rows: list[dict]) -> list[str]:
    """The model of docs/performance.md checked against the cores figures: per place, F and R from
    the warm one-core run's batches (batch_costs), the two-core run predicted with R doubled (k = 2) at its own mean
    batch size, beside what it did inside its batches, and the k that measured figure implies."""
    said = []
    for place in CORE_PLACES:
        one = next((r for r in rows if r.get("place") == place and r.get("run") == "warm" and r.get("cores") == 1), None)
        two = next((r for r in rows if r.get("place") == place and r.get("run") == "warm" and r.get("cores") == 2), None)
        if (not one or not two or one.get("writing_rate") is None or one.get("fixed_cost_s") is None
                or not two.get("mean_batch") or not two.get("inside_batches_rate")):
            continue
        fixed, rate = max(one["fixed_cost_s"], 0.0), one["writing_rate"]
        predicted = predicted_rate(two["mean_batch"], fixed, 2 * rate)
        measured = two["inside_batches_rate"]
        # k from measured = B / (F + B / (k R))  =>  k = B / (R (B / measured - F))
        spent = two["mean_batch"] / measured - fixed if measured else 0
        implied = two["mean_batch"] / (rate * spent) if spent > 0 else None
        said.append(f"model, {place}: one core F = {fixed:.2f} s per batch, R = {rate:,.0f} records/s; two cores at "
                    f"{two['mean_batch']:,.0f} records per batch: predicted {predicted:,.0f} records/s (k = 2), measured "
                    f"{measured:,.0f} inside batches" + (f" (k = {implied:.2f})" if implied else ""))
    return said


def cpu_lines(rows: list[dict]) -> list[str]:
    """Where each warm run's CPU went: seconds per process role over its measured window and the
    cores busy on average (CPU seconds / wall seconds)."""
    said = []
    for row in rows:
        if row.get("cpu_s"):
            busy = sum(row["cpu_s"].values()) / row["seconds"] if row["seconds"] else 0
            said.append(f"CPU of the machine, {row['engine']}, {row['run']} ({row['seconds']:.1f} s, {busy:.2f} cores busy): "
                        + ", ".join(f"{role} {seconds:.1f} s" for role, seconds in row["cpu_s"].items()))
    return ["\n".join(said)] if said else []


def stateful_profile_lines(rows: list[dict]) -> list[str]:
    """Per stateful run, where its paced load's time went: CPU seconds per process role, and per
    query its batches with input, mean rows, mean ms and mean ms outside the writing."""
    said = []
    for row in rows:
        parts = []
        if row.get("cpu_s"):
            parts.append("CPU " + ", ".join(f"{role} {seconds:.1f} s" for role, seconds in row["cpu_s"].items()))
        for query, b in (row.get("batches") or {}).items():
            parts.append(f"{query}: {b['batches']} batches of {b['mean_rows']:,} rows, {b['mean_ms']:,} ms "
                         f"({b['mean_outside_writing_ms']:,} outside the writing)")
        if parts:
            said.append(f"{row['app']} at {row['target_rate']:,} events/s, over the paced load (warm-up and measured): "
                        + "; ".join(parts))
    return ["\n".join(said)] if said else []


def drain_figures(kafka: KafkaClientConfig, workdir: Path, run_id: str, events: int) -> list[dict]:
    """One backlog, drained by each system in turn into topics of its own; each row with its
    ratio to the Kafka Streams reference."""
    drain_catalog = bench_catalog(kafka, f"{run_id}.drain")
    app = drain_catalog.app(ROUTER)
    print(f"preloading {events} events ...", flush=True)
    preload = run_load(app, LoadSpec(count=events, keys=1000, malformed=0.01, seed=42), kafka)
    drain = [drain_by_spark_submit(drain_catalog, kafka, workdir, preload.produced)]
    print(f"  {drain[-1]}", flush=True)
    drain.append(drain_by_kafka_streams(bench_catalog(kafka, f"{run_id}.kstreams"), drain_catalog.app(ROUTER), kafka,
                                        workdir, preload.produced))
    print(f"  {drain[-1]}", flush=True)
    loop = python_router(app, bench_catalog(kafka, f"{run_id}.python").app(ROUTER), kafka, preload.produced)
    drain.append(DrainFigure(loop.engine, loop.records_in, loop.records_out, loop.seconds))
    raw = raw_consume(kafka, app.inputs["operations"], preload.produced)
    drain.append(DrainFigure(raw.engine, raw.records_in, 0, raw.seconds))
    reference = next(d.rate for d in drain if d.engine == KAFKA_STREAMS_ENGINE)
    return [{**asdict(d), "rate": round(d.rate), "vs_kafka_streams": round(d.rate / reference, 2) if reference else None}
            for d in drain]

def roll_restart(trigger: str, rate: float, kafka: KafkaClientConfig | None = None) -> RollFigure:
    """`streamops bench roll-restart`: one roll of the router under load (see roll_run)."""
    with workspace(kafka) as (kafka, workdir):
        return roll_run(bench_catalog(kafka, f"bench{uuid.uuid4().hex[:8]}.roll"), kafka, workdir, trigger, rate)


def tables(figures: dict) -> str:
    """The figures as text: one table per part measured, each under its goal."""
    from tabulate import tabulate

    m = figures["machine"]
    said = [f"{m['cpus']} cores, {m['memory_gib']} GiB, {m['platform']}, Python {m['python']}, Spark {m['spark']}, {m['at']}"]
    if "drain" in figures:
        said.append(tabulate(
            [[d["engine"], d["records_in"], d["records_out"], f"{d['seconds']:.1f}", f"{d['rate']:,}",
              "" if d.get("vs_kafka_streams") is None else f"{d['vs_kafka_streams']:.2f}",
              "" if d["launch_to_first_s"] is None else f"{d['launch_to_first_s']:.1f}",
              "" if d["launch_to_last_s"] is None else f"{d['launch_to_last_s']:.1f}"] for d in figures["drain"]],
            headers=["drain", "records in", "records out", "first to last output, s", "records/s", "x Kafka Streams",
                     "launch to first, s", "launch to last, s"], disable_numparse=True))
    if "warm" in figures:
        reference = next((d["rate"] for d in figures.get("drain", []) if d["engine"] == KAFKA_STREAMS_ENGINE), None)
        said.append(tabulate(
            [[w["engine"], w["records_in"], w["records_out"], f"{w['seconds']:.1f}", f"{w['rate']:,}",
              f"{w['rate'] / reference:.2f}" if reference else ""] for w in figures["warm"]],
            headers=["warm", "records in", "records out", "load start to all routed, s", "records/s",
                     "x Kafka Streams drain"], disable_numparse=True))
    if "cores" in figures:
        said.append(tabulate(
            [[c["engine"], c.get("run", "drain"), c["records_in"], f"{c['seconds']:.1f}", f"{c['rate']:,}",
              "" if c.get("speed_up") is None else f"{c['speed_up']:.2f}", _figure(c.get("batches"), "{:,}"),
              _figure(c.get("inside_batches_rate"), "{:,.0f}"), _figure(c.get("fixed_cost_s"), "{:.2f}"),
              _figure(c.get("writing_rate"), "{:,.0f}"), _figure(c.get("launch_to_first_s"), "{:.1f}")]
             for c in figures["cores"]],
            headers=["cores", "run", "records in", "seconds", "records/s", "speed-up", "batches",
                     "records/s inside batches", "outside writing per batch, s", "writing records/s",
                     "launch to first, s"], disable_numparse=True))
        said.extend(model_check(figures["cores"]))
        said.extend(cpu_lines(figures["cores"]))
    if "parse" in figures:
        said.append(tabulate(
            [[p["engine"], p["records_in"], p["records_out"], f"{p['seconds']:.2f}", f"{p['rate']:,}", p["note"]]
             for p in figures["parse"]],
            headers=["parse (in memory, warm)", "records in", "good", "seconds", "records/s", "note"], disable_numparse=True))
    if "latency" in figures:
        said.append(tabulate(
            [[f["mode"], f"{f['target_rate']:,}", f"{f['produced_rate']:,.0f}", f["records"], f"{f['p50_ms']:,.0f}",
              f"{f['p99_ms']:,.0f}", f"{f['max_ms']:,.0f}",
              "no (backlog grew)" if f["caught_up_s"] is None else f"{f['caught_up_s']} s"]
             for f in figures["latency"]],
            headers=["latency", "target events/s", "produced/s", "records", "p50 ms", "p99 ms", "max ms",
                     "caught up after load"], disable_numparse=True))
    if "roll" in figures:
        said.append(tabulate(
            [[r["mode"], f"{r['rate']:g}", r["downtime_s"], r["largest_gap_s"], r["expected"], r["lost"], r["duplicates"]]
             for r in figures["roll"]],
            headers=["roll-restart", "events/s", "downtime s", "largest output gap s", "routed records", "lost",
                     "duplicates"], disable_numparse=True))
    if "stateful" in figures:
        said.append(tabulate(
            [[f["app"], f"{f['target_rate']:,}", f"{f['produced_rate']:,.0f}", f["records"], f"{f['p50_ms']:,.0f}",
              f"{f['p99_ms']:,.0f}", f"{f['max_ms']:,.0f}",
              ("yes" if f["sustained"] else "no") + f" (lag {f['lag_first_half']:,} -> {f['lag_second_half']:,})"
              + ("" if f["caught_up_s"] is not None else ", never caught up"),
              "not compared" if f["windows_wrong"] is None else f"{f['windows'] - f['windows_wrong']:,} of {f['windows']:,}",
              f["dropped_by_watermark"], f"{f['state_rows']:,}", _mib(f["state_memory_bytes"]), _mib(f["state_files_bytes"]),
              f"{f['dead_letters']:,}"]
             for f in figures["stateful"]],
            headers=["stateful", "target events/s", "produced/s", "records", "p50 ms", "p99 ms", "max ms",
                     "sustained (largest lag, 1st -> 2nd half)",
                     "exact windows", "dropped late", "state rows", "state memory MiB", "state files MiB",
                     "dead letters"], disable_numparse=True))
        said.extend(stateful_profile_lines(figures["stateful"]))
        for app, best in highest_sustained(figures["stateful"]).items():
            said.append(f"{app}: highest rate sustained with exact windows: "
                        + (f"{best:,} events/s" if best else "none of those tried"))
    said.append("goals:\n" + "\n".join(f"  {part}: {goal}" for part, goal in figures.get("goals", {}).items()))
    return "\n\n".join(said)


def _figure(value, form: str) -> str:
    return "" if value is None else form.format(value)


def _mib(count: int) -> str:
    return f"{count / 2**20:,.1f}"


def highest_sustained(rows: list[dict]) -> dict[str, int | None]:
    """Per stateful app, the highest rate it sustained with every window exact."""
    best: dict[str, int | None] = {}
    for row in rows:
        best.setdefault(row["app"], None)
        if row["sustained"] and row["windows_wrong"] == 0:
            best[row["app"]] = max(best[row["app"]] or 0, row["target_rate"])
    return best


def draw(figures: dict, out: Path) -> list[Path]:
    """drain.png (records/s per engine), latency.png (p50/p99/max per mode and rate, log scale)
    and roll.png (largest output gap per mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if "drain" in figures:
        written.append(_draw_drain(plt, figures, out))
    if "cores" in figures:
        written.append(_draw_cores(plt, figures, out))
    if "latency" in figures:
        written.append(_draw_latency(plt, figures, out))
    if "roll" in figures:
        written.append(_draw_roll(plt, figures, out))
    if "stateful" in figures:
        written.append(_draw_stateful(plt, figures, out))
    return written


def _saved(plt, fig, out: Path, name: str) -> Path:
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return out / name


def _annotated_bars(plt, names: list[str], rates: list[float], notes: list[str], colors, size: tuple[float, float],
                    xlabel: str, title: str):
    """Horizontal bars of records/s, the first on top, each with its note at its end."""
    fig, ax = plt.subplots(figsize=size)
    ax.barh(names, rates, color=colors)
    for y, (rate, note) in enumerate(zip(rates, notes, strict=True)):
        if note:
            ax.annotate(f" {note}", (rate, y), va="center", fontsize=8)
    ax.set_xlim(0, max(rates) * 1.15)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.invert_yaxis()
    return fig


def _draw_drain(plt, figures: dict, out: Path) -> Path:
    """Records/s of every drain row and the warm long-running router, each with its ratio to the
    Kafka Streams app."""
    reference = next((d["rate"] for d in figures["drain"] if d["engine"] == KAFKA_STREAMS_ENGINE), None)
    rows = [*figures["drain"], *figures.get("warm", [])]
    colors = ["#d62728" if d["engine"].startswith("Spark") else "#2ca02c" if d["engine"] == KAFKA_STREAMS_ENGINE
              else "#7f7f7f" for d in rows]
    warm = f", warm router {figures['warm'][0]['records_in']:,}" if figures.get("warm") else ""
    fig = _annotated_bars(
        plt, [d["engine"] for d in rows], [d["rate"] for d in rows],
        [f"x{d['rate'] / reference:.2f}" if reference else "" for d in rows], colors, (10, 3.4 + 0.3 * (len(rows) - 4)),
        "records/s (x: ratio to the Kafka Streams app)", f"Records/s: drain of {figures['settings']['events']:,} records{warm}")
    return _saved(plt, fig, out, "drain.png")


def _draw_cores(plt, figures: dict, out: Path) -> Path:
    rows = figures["cores"]
    fig = _annotated_bars(
        plt, [f"{c['engine']}, {'warm' if c.get('run') == 'warm' else 'fresh drain'}" for c in rows],
        [c["rate"] for c in rows], [f"x{c['speed_up']:.2f}" if c.get("speed_up") else "" for c in rows],
        ["#d62728" if c.get("run") == "warm" else "#ff9896" for c in rows], (10, 1.2 + 0.4 * len(rows)),
        "records/s (x: speed-up over 1 core, same place and run)",
        "Router on 1 and 2 cores (broker on the same 2)")
    return _saved(plt, fig, out, "cores.png")


def _draw_latency(plt, figures: dict, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [f"{f['mode'].split(' (')[0]}\n{f['target_rate']:,}/s" for f in figures["latency"]]
    x = range(len(labels))
    width = 0.27
    for offset, key, color in ((-width, "p50_ms", "#2ca02c"), (0, "p99_ms", "#ff7f0e"), (width, "max_ms", "#d62728")):
        ax.bar(
            [i + offset for i in x],
            [max(f[key], 1) for f in figures["latency"]],
            width,
            label=key.replace("_ms", ""),
            color=color,
        )
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("event to output, ms (log)")
    ax.axhline(250, color="#555", linestyle=":", linewidth=1)
    ax.axhline(1000, color="#555", linestyle="--", linewidth=1)
    ax.legend()
    ax.set_title("Router latency under steady load (broker clock)")
    return _saved(plt, fig, out, "latency.png")


def _draw_roll(plt, figures: dict, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.barh([r["mode"] for r in figures["roll"]], [r["largest_gap_s"] for r in figures["roll"]], color="#9467bd")
    ax.axvline(3, color="#555", linestyle=":", linewidth=1)
    ax.set_xlabel("largest gap in the output during a roll, s")
    ax.set_title("Roll-restart under load (lost: " + ", ".join(str(r["lost"]) for r in figures["roll"]) + ")")
    return _saved(plt, fig, out, "roll.png")


def _draw_stateful(plt, figures: dict, out: Path) -> Path:
    """p99 latency against the input rate per stateful app; a rate not sustained (or with a wrong
    window) drawn hollow."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for app, color in zip(sorted({f["app"] for f in figures["stateful"]}), ("#1f77b4", "#ff7f0e"), strict=False):
        rows = [f for f in figures["stateful"] if f["app"] == app]
        ax.plot([f["target_rate"] for f in rows], [max(f["p99_ms"], 1) for f in rows], color=color, label=app)
        for f in rows:
            good = f["sustained"] and f["windows_wrong"] == 0
            ax.scatter([f["target_rate"]], [max(f["p99_ms"], 1)], color=color, facecolors=color if good else "none", zorder=3)
    ax.set_yscale("log")
    ax.set_xlabel("input events/s (hollow: not sustained or a window wrong)")
    ax.set_ylabel("p99, record to its batch's commit, ms (log)")
    ax.axvline(10_000, color="#555", linestyle=":", linewidth=1)
    ax.legend()
    ax.set_title("Stateful apps under steady load")
    return _saved(plt, fig, out, "stateful.png")
