"""Benchmarks that print figures (never assertions): `streamops bench router --events N`.

The router benchmark preloads N operation-log events, then drains the same backlog on this
machine: with the Spark router (Trigger.AvailableNow, a fresh checkpoint), with a plain
confluent-kafka Python loop doing the same parsing and routing, and as a reprocessing backfill
from earliest (the reprocess DAG's job, into scratch topics); beside them, the broker's raw
consume rate on the same backlog. Writers use acks=all and idempotent producers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from streamops import settings
from streamops.app_ops import launch
from streamops.app_runtime import AppRuntime
from streamops.artifacts import ArtifactStore, ensure_catalog_artifacts
from streamops.catalog import AppSpec, Catalog, load_catalog
from streamops.checkpoints import committed_offsets, query_dirs
from streamops.driver.options import AVAILABLE_NOW, RunOptions
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import producer, read_all
from streamops.loadgen import LoadSpec
from streamops.loadgen import events as load_events
from streamops.loadgen import run as run_load
from streamops.local_stack.broker import LocalBroker, free_port_pair
from streamops.programs import load_program, program_info
from streamops.provisioning import ensure_topics
from streamops.reprocess import ReprocessRequest, plan_reprocess, run_reprocess
from streamops.runtime_records import DeadLetterEnvelope, DeadLetterSource
from streamops.spark_submit import SparkTarget, submit_spec
from streamops.waiting import poll_until

ROUTER = "oplog-router"
# The version a roll-restart rolls the router to (the same code as its catalog version).
ROLLED_VERSION = "99.0.0"
_HAS_OFFSET = re.compile(r"(Z|z|[+-][0-9]{2}:?[0-9]{2})$")


@dataclass
class Result:
    engine: str
    records_in: int
    records_out: int
    seconds: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.records_in / self.seconds if self.seconds else 0.0


def _fresh_topics(admin: AdminClient, prefix: str) -> Catalog:
    catalog = load_catalog().with_topic_prefix(prefix)
    app = catalog.app(ROUTER)
    ensure_topics(admin, [t for t in catalog.topics if t.name in app.topics()])
    return catalog


def spark_router(app: AppSpec, kafka: KafkaClientConfig, checkpoint: Path, label: str) -> Result:
    """One AvailableNow run of the router over the whole backlog, from a fresh checkpoint."""
    from streamops.driver.queries import observed_totals, start_app
    from streamops.driver.session import build_session

    spark = build_session("streamops-bench", master="local[*]", extra_conf={"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    outputs = [*app.outputs.values(), app.dead_letter_topic]

    def written() -> int:
        return sum(high for topic in outputs for _, high in end_offsets(kafka, topic).values())

    before = written()
    began = time.monotonic()
    queries = start_app(spark, app, load_program(app), RunOptions(kafka, str(checkpoint), trigger=AVAILABLE_NOW))
    seconds = time.monotonic() - began
    totals = observed_totals(queries)
    batches = [p for q in queries for p in q.recentProgress if p.numInputRows]
    busy = sum((p.durationMs or {}).get("triggerExecution", 0) for p in batches) / 1000
    note = f"{len(batches)} batch(es); {totals.get('records_in', 0) / busy:,.0f} records/s inside batches" if busy else ""
    return Result(f"Spark router, {label}", totals.get("records_in", 0), written() - before, seconds, note)


def routes(app: AppSpec) -> dict[str, list[tuple[str, str]]]:
    """op type -> [(category, topic)], from the router app's settings (as the router reads them)."""
    table: dict[str, list[tuple[str, str]]] = {}
    for category, op_types in app.settings["categories"].items():
        for op_type in op_types:
            table.setdefault(op_type, []).append((category, app.outputs[category]))
    return table


def python_router(source: AppSpec, target: AppSpec, kafka: KafkaClientConfig, expected: int) -> Result:
    """The same routing as spark_apps/oplog_router.py in a consume-route-produce loop (its checks
    are the main rules of the input contract, not all of them: json.loads is more lenient)."""
    table = {op: [(category, target.outputs[category]) for category, _ in targets] for op, targets in routes(source).items()}
    topic = source.inputs["operations"]
    consumer = kafka.consumer(f"bench-{uuid.uuid4().hex}")
    out = producer(kafka, **{"linger.ms": 20, "compression.type": "lz4", "queue.buffering.max.messages": 500_000})
    partitions = end_offsets(kafka, topic)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    seen = written = 0
    began = time.monotonic()
    while seen < expected:
        for message in consumer.consume(num_messages=5000, timeout=1.0):
            if message.error():
                raise KafkaException(message.error())
            seen += 1
            event_id = f"{message.topic()}/{message.partition()}/{message.offset()}"
            value = message.value()
            try:
                event = json.loads(value) if value is not None and len(value) <= source.max_record_bytes else None
            except ValueError:
                event = None
            good = (
                isinstance(event, dict)
                and isinstance(event.get("seq"), int)
                and isinstance(event.get("user_id"), str)
                and isinstance(event.get("op_type"), str)
                and isinstance(event.get("event_time"), str)
                and bool(_HAS_OFFSET.search(event["event_time"]))
                and message.key() == event["user_id"].encode()  # the key rule
                and event["op_type"] in table  # an op type in no category is a dead letter too
            )
            if not good or not isinstance(event, dict):  # (good says it is one)
                envelope = DeadLetterEnvelope(app=source.name, reason="invalid", source=DeadLetterSource(
                    topic=message.topic(), partition=message.partition(), offset=message.offset()))
                produce_waiting(out, target.dead_letter_topic, message.key(), envelope.model_dump_json(exclude_none=True))
                written += 1
                continue
            for category, out_topic in table.get(event["op_type"], []):
                routed = {"event_id": event_id, "category": category, "seq": event["seq"], "user_id": event["user_id"],
                          "op_type": event["op_type"], "event_time": event["event_time"], "event": event}
                produce_waiting(out, out_topic, message.key(), json.dumps(routed))
                written += 1
    remaining = out.flush(120)
    seconds = time.monotonic() - began
    consumer.close()
    if remaining:
        raise KafkaException(f"{remaining} records not acknowledged")
    return Result("Python confluent-kafka loop", seen, written, seconds)


def reprocess_backfill(catalog: Catalog, admin: AdminClient, kafka: KafkaClientConfig, workdir: Path) -> Result:
    """The reprocess DAG's job (plan from earliest, scratch targets) over the same backlog."""
    plan = plan_reprocess(admin, kafka, catalog, ReprocessRequest(app=ROUTER, target="scratch", tag="bench"))
    result = run_reprocess(kafka, admin, catalog, plan, workdir, spark=SparkTarget("local[*]"), launched_by="bench")
    written = sum(result.records_out.values()) + result.dead_letters
    return Result("Backfill from earliest (reprocess, its own driver)", result.records_in, written, result.seconds,
                  "targets " + ", ".join(sorted(plan.targets.values()))[:60] + "...")


def raw_consume(kafka: KafkaClientConfig, topic: str, expected: int) -> Result:
    """The broker's raw consume rate on the same backlog: fetch every record, do nothing with it."""
    consumer = kafka.consumer(f"bench-{uuid.uuid4().hex}", **{"fetch.max.bytes": 52_428_800})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in end_offsets(kafka, topic)])
    seen = 0
    began = time.monotonic()
    while seen < expected:
        for message in consumer.consume(num_messages=10_000, timeout=1.0):
            if message.error():
                raise KafkaException(message.error())
            seen += 1
    seconds = time.monotonic() - began
    consumer.close()
    return Result("Raw consume (confluent-kafka, no processing)", seen, 0, seconds, "the ceiling for any reader here")


def produce_waiting(out, topic, key, value) -> None:
    """Produce one record, waiting while the producer's local queue is full."""
    while True:
        try:
            out.produce(topic, key=key, value=value)
            out.poll(0)
            return
        except BufferError:
            out.poll(0.05)


def router_benchmark(events: int, kafka: KafkaClientConfig | None = None, keys: int = 1000) -> list[Result]:
    with workspace(kafka) as (kafka, workdir):
        admin = kafka.admin()
        run_id = f"bench{uuid.uuid4().hex[:8]}"
        spark_catalog = _fresh_topics(admin, f"{run_id}.spark")
        python_catalog = _fresh_topics(admin, f"{run_id}.python")
        app = spark_catalog.app(ROUTER)
        load = run_load(app, LoadSpec(count=events, keys=keys, malformed=0.01, seed=42), kafka)
        preload = Result("preload (loadgen, acks=all, idempotent)", load.produced, load.produced, load.seconds)
        # The first run pays for JVM warm-up and code generation; the second, from its own
        # fresh checkpoint over the same backlog, shows the steady drain rate.
        cold = spark_router(app, kafka, workdir / "checkpoint-cold", "fresh JVM")
        warm = spark_router(app, kafka, workdir / "checkpoint-warm", "warm JVM")
        python_result = python_router(app, python_catalog.app(ROUTER), kafka, load.produced)
        backfill = reprocess_backfill(spark_catalog, admin, kafka, workdir / "reprocess")
        raw = raw_consume(kafka, app.inputs["operations"], load.produced)
        return [preload, cold, warm, python_result, backfill, raw]

def bench_artifacts() -> None:
    """The catalog's artifacts built from the code here into the bench's own store (a version pins
    code: the figures are this checkout's, never an older build's), and the router's catalog
    version again as ROLLED_VERSION, which the roll-restarts roll to."""
    for line in ensure_catalog_artifacts(load_catalog(check_programs=False), built_by="streamops bench"):
        print(line, flush=True)
    router = load_catalog(check_programs=False).app(ROUTER)
    if router.artifact:
        ArtifactStore().relabel(router.artifact, router.version, ROLLED_VERSION)


@contextmanager
def workspace(kafka: KafkaClientConfig | None = None) -> Iterator[tuple[KafkaClientConfig, Path]]:
    """A scratch folder (checkpoints under it) and a broker: `kafka`, or a temporary local one;
    both gone afterwards, $STREAMOPS_CHECKPOINT_ROOT as it was."""
    workdir = Path(tempfile.mkdtemp(prefix="streamops-bench-"))
    broker = None
    previous = {name: os.environ.get(name) for name in (settings.CHECKPOINT_ROOT.name, settings.ARTIFACT_STORE.name)}
    os.environ[settings.CHECKPOINT_ROOT.name] = str(workdir / "checkpoints")
    os.environ[settings.ARTIFACT_STORE.name] = str(workdir / "artifacts")
    try:
        bench_artifacts()
        if kafka is None:
            broker = LocalBroker(state_dir=workdir / "kafka", port=free_port_pair(), heap="1g")
            print(broker.start())
            kafka = broker.client_config
        yield kafka, workdir
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if broker is not None:
            print(broker.stop())
        shutil.rmtree(workdir, ignore_errors=True)


def table(results: list[Result]) -> str:
    from tabulate import tabulate

    rows = [[r.engine, r.records_in, r.records_out, f"{r.seconds:.2f}", f"{r.rate:,.0f}", r.note] for r in results]
    return tabulate(rows, headers=["", "records in", "records out", "seconds", "records/s", "note"], disable_numparse=True)


# The two ways records.parse can take a record: the input contract's JVM pass first (the default),
# or Spark's SQL checks alone (STREAMOPS_CONTRACT_JVM=off, the parse before that pass existed).
PARSE_PATHS = {"on": "JVM pass, then Spark's checks", "off": "Spark's checks alone"}


def parse_benchmark(records_count: int, repeats: int = 10, app_name: str = "oplog-router",
                    paths: tuple[str, ...] = ("on", "off")) -> list[Result]:
    """Parse speed alone: `records.parse` over N loadgen records (1% malformed) held in memory,
    no Kafka, on one Spark session with the app's SQL conf, for each of `paths` (PARSE_PATHS),
    taken in turn within every repeat so that both see the same JIT and the same host. Each pass
    counts good and bad records (a full pass over every field `parse` adds); the best pass is the
    figure. Both paths must decide every record alike: different counts stop the benchmark."""
    from pyspark.sql import functions as F

    from streamops import records
    from streamops.driver.session import apply_app_conf, build_session

    app = load_catalog().app(app_name)
    declared = program_info(app).input_fields
    spark = build_session("streamops-bench", master="local[*]", extra_conf={"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    apply_app_conf(spark, app)
    results: list[Result] = []
    loaded_at = datetime.now(UTC)
    previous = os.environ.get(settings.CONTRACT_JVM.name)
    try:
        for role, described in declared.items():
            fields = [records.Field.from_data(f) for f in described]
            topic = app.inputs[role]
            rows = [
                (key.encode(), value.encode(), topic, 0, offset, loaded_at)
                for offset, (event_topic, key, value, _, _) in enumerate(
                    load_events(app, LoadSpec(count=records_count, keys=1000, malformed=0.01, seed=42))
                )
                if event_topic == topic
            ]
            schema = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
            raw = spark.createDataFrame(rows, schema).repartition(4).cache()
            raw.count()
            best: dict[str, float] = {}
            counts: dict[str, tuple[int, int, int]] = {}
            for _ in range(repeats):
                for path in paths:
                    os.environ[settings.CONTRACT_JVM.name] = path
                    # A new plan each pass: re-running one DataFrame would reuse its shuffle output.
                    parsed = records.parse_input(raw, app, role, fields)
                    totals = parsed.agg(
                        F.count(F.when(F.col("error").isNull(), 1)).alias("good"),
                        F.count(F.col("error")).alias("bad"),
                        # Every field is touched, so none of the parsing is pruned away. (event_json is
                        # left out, as the apps leave it: parse computes it for a query that reads it.)
                        F.sum(F.hash(*[F.col(f.column) for f in fields])).alias("checksum"),
                    )
                    began = time.monotonic()
                    row = totals.collect()[0]
                    seconds = time.monotonic() - began
                    best[path] = min(seconds, best.get(path, seconds))
                    counts[path] = (row["good"], row["bad"], row["checksum"])
            if len(set(counts.values())) > 1:
                raise RuntimeError(f"records.parse decided {app.name}'s {role} records differently by path "
                                   f"(good, bad, checksum): {counts}")
            raw.unpersist()
            for path in paths:
                good, bad, _ = counts[path]
                note = f"{bad} dead letters; best of {repeats}"
                if path != paths[0] and best.get(paths[0]):
                    note += f"; x{best[path] / best[paths[0]]:.2f} the time of the first row"
                results.append(Result(f"records.parse, {app.name} {role}: {PARSE_PATHS[path]}", len(rows), good,
                                      best[path], note))
    finally:
        if previous is None:
            os.environ.pop(settings.CONTRACT_JVM.name, None)
        else:
            os.environ[settings.CONTRACT_JVM.name] = previous
        spark.stop()
    return results


# --- Live apps under a paced load (bench report's latency, roll and stateful parts) ------------------

# The master live apps run on in these benchmarks, in both modes: a real-time run needs a thread per
# input partition (six), and micro-batches get the same threads for a fair comparison.
BENCH_MASTER = "local[6]"
# A fresh driver's first batches with data run cold (code generation, the JIT): the router's first
# took 5-8 s here, and the backlog it leaves was gone 15-20 s after the load began. The latency and
# stateful parts measure a running app's steady figures after this long under load; start-up has
# its own figure (drain: launch to first output).
STEADY_WARMUP_S = 30.0


def bench_catalog(kafka: KafkaClientConfig, prefix: str, apps: tuple[str, ...] = (ROUTER,)) -> Catalog:
    """The project catalog under `prefix`, the topics of `apps` created with LogAppendTime (every
    time a benchmark compares then comes from the broker's one clock)."""
    catalog = load_catalog().with_topic_prefix(prefix)
    touched = {topic for name in apps for topic in catalog.app(name).topics()}
    topics = [t.model_copy(update={"configs": {**t.configs, "message.timestamp.type": "LogAppendTime"}})
              for t in catalog.topics if t.name in touched]
    ensure_topics(kafka.admin(), topics)
    return catalog


def write_catalog(catalog: Catalog, workdir: Path, trigger: str | None = None, app_name: str = ROUTER) -> Path:
    """The catalog as a file for a driver, `app_name`'s trigger replaced when `trigger` is given."""
    if trigger is not None:
        apps = [a.model_copy(update={"trigger": trigger}) if a.name == app_name else a for a in catalog.apps]
        catalog = catalog.model_copy(update={"apps": apps})
    path = workdir / f"catalog-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(catalog.to_yaml())
    return path


def launch_live(catalog: Catalog, kafka: KafkaClientConfig, workdir: Path, trigger: str | None = None,
                version: str | None = None, checkpoint: Path | None = None, master: str = BENCH_MASTER,
                app_name: str = ROUTER) -> Path:
    """Start `app_name` as a long-running app (spark-submit, supervised like a deploy's), on its
    catalog trigger unless `trigger` is given; its checkpoint folder."""
    app = catalog.app(app_name)
    if trigger is not None:
        app = app.model_copy(update={"trigger": trigger})
    version = version or app.version
    checkpoint = checkpoint or workdir / f"live-{uuid.uuid4().hex[:6]}"
    spec = submit_spec(app, kafka=kafka, catalog=write_catalog(catalog, workdir, trigger, app_name),
                       checkpoint=str(checkpoint), version=version)
    launch(app, spec.argv(SparkTarget(master)), checkpoint=str(checkpoint), launched_by="bench", version=version,
           record_desired=False)
    return checkpoint


def wait_until_started(checkpoint: Path, timeout_s: float = 180) -> None:
    """Until the live app's driver has started its queries: a load begun before that measures the
    driver's start-up (its backlog), not the app's steady latency."""
    runtime = AppRuntime(checkpoint)

    def started() -> bool:
        if runtime.state() in ("failed", "crashed"):
            raise RuntimeError(f"the bench app's driver ended before starting its queries ({runtime.state()}): "
                               f"see {checkpoint}")
        record = runtime.driver()
        return record is not None and record.queries_started_at is not None

    poll_until(started, timeout=timeout_s, what="the bench app to start its queries")


def stop_live(checkpoint: Path) -> None:
    runtime = AppRuntime(checkpoint)
    if runtime.is_running():
        runtime.request_stop(by="bench", deadline_s=30)
        poll_until(lambda: not runtime.is_running(), timeout=120, what="the bench app to stop")


def percentile(sorted_values: list[float], share: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * share))]


def paced_load(app: AppSpec, load: LoadSpec, kafka: KafkaClientConfig, slot_s: float = 0.005) -> None:
    """Produce `load` at its rate from records made beforehand (see paced_produce)."""
    paced_produce([(topic, key, value) for topic, key, value, _, _ in load_events(app, load)], load.rate, kafka, slot_s)


def paced_produce(made: list[tuple[str, str, str]], rate: float, kafka: KafkaClientConfig, slot_s: float = 0.005) -> None:
    """Produce records made beforehand at `rate`, one slot's worth (5 ms) at a time: the load
    generator then costs the app's two cores little beyond the producer itself (made and paced
    record by record, at 10,000 events/s it took most of a core, and the router fell behind for
    want of it). The slot's records go out together: up to 5 ms of burst, no more."""
    per_slot = max(1, round(rate * slot_s))
    out = producer(kafka, **{"linger.ms": 1})
    began = time.monotonic()
    for slot, first in enumerate(range(0, len(made), per_slot)):
        # Pacing to the rate, not synchronisation: the producer serves its deliveries meanwhile.
        while (ahead := began + slot * per_slot / rate - time.monotonic()) > 0:
            out.poll(ahead)
        for topic, key, value in made[first:first + per_slot]:
            produce_waiting(out, topic, key, value)
    if out.flush(120):
        raise RuntimeError("the paced load's records were not all acknowledged within 120 s")


def dead_lettered(kafka: KafkaClientConfig, topic: str) -> set[tuple[str, int, int]]:
    """(topic, partition, offset) of every input record the dead-letter topic names."""
    named = set()
    for record in read_all(kafka, topic):
        try:
            source = DeadLetterEnvelope.model_validate_json(record.value or b"").source
        except ValueError:  # not an envelope: it names no input record
            continue
        named.add((source.topic, source.partition, source.offset))
    return named


def committed_everything(checkpoint: Path, kafka: KafkaClientConfig) -> bool:
    """Every query of the app has committed every record of every topic it reads."""
    dirs = query_dirs(checkpoint)
    if not dirs:
        return False
    for folder in dirs:
        committed = committed_offsets(folder)
        if not committed:
            return False
        for topic, parts in committed.items():
            if any(parts.get(p, -1) < high for p, (_, high) in end_offsets(kafka, topic).items()):
                return False
    return True
