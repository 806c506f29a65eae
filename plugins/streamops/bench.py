"""Benchmarks that print figures (never assertions): `streamops bench router --events N`.

The router benchmark preloads N operation-log events, then drains the same backlog twice on
this machine: with the Spark router (Trigger.AvailableNow, a fresh checkpoint) and with a plain
confluent-kafka Python loop doing the same parsing and routing. Both write their outputs with
acks=all and idempotent producers.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from streamops.catalog import AppSpec, Catalog, load_catalog
from streamops.kafka_records import end_offsets, producer
from streamops.loadgen import LoadSpec
from streamops.loadgen import run as run_load
from streamops.provisioning import ensure_topics

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
    app = catalog.app("oplog-router")
    ensure_topics(admin, [t for t in catalog.topics if t.name in app.topics()])
    return catalog


def spark_router(app: AppSpec, bootstrap: str, checkpoint: Path, label: str) -> Result:
    """One AvailableNow run of the router over the whole backlog, from a fresh checkpoint."""
    from spark_apps import oplog_router
    from spark_apps.common.runner import AVAILABLE_NOW, RunOptions, observed_totals, start_app
    from spark_apps.common.session import build_session

    spark = build_session("streamops-bench", master="local[*]", extra_conf={"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    outputs = [*app.outputs.values(), app.dead_letter_topic]

    def written() -> int:
        return sum(high for topic in outputs for _, high in end_offsets(bootstrap, topic).values())

    before = written()
    began = time.monotonic()
    queries = start_app(spark, app, oplog_router, RunOptions(bootstrap, str(checkpoint), trigger=AVAILABLE_NOW))
    seconds = time.monotonic() - began
    totals = observed_totals(queries)
    batches = [p for q in queries for p in q.recentProgress if p.numInputRows]
    busy = sum((p.durationMs or {}).get("triggerExecution", 0) for p in batches) / 1000
    note = f"{len(batches)} batch(es); {totals.get('records_in', 0) / busy:,.0f} records/s inside batches" if busy else ""
    return Result(f"Spark router, {label}", totals.get("records_in", 0), written() - before, seconds, note)


def python_router(source: AppSpec, target: AppSpec, bootstrap: str, expected: int) -> Result:
    """The same routing as spark_apps/oplog_router.py in a consume-route-produce loop."""
    from spark_apps.oplog_router import routes

    table = {op: [(category, target.outputs[category]) for category, _ in targets] for op, targets in routes(source).items()}
    topic = source.inputs["operations"]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}", "enable.auto.commit": False})
    out = producer(bootstrap, **{"linger.ms": 20, "compression.type": "lz4", "queue.buffering.max.messages": 500_000})
    partitions = end_offsets(bootstrap, topic)
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
            )
            if not good:
                envelope = {"app": source.name, "reason": "invalid", "source": {"topic": message.topic(), "partition": message.partition(), "offset": message.offset()}}
                _produce(out, target.dead_letter_topic, message.key(), json.dumps(envelope))
                written += 1
                continue
            for category, out_topic in table.get(event["op_type"], []):
                routed = {"event_id": event_id, "category": category, "seq": event["seq"], "user_id": event["user_id"],
                          "op_type": event["op_type"], "event_time": event["event_time"], "event": event}
                _produce(out, out_topic, message.key(), json.dumps(routed))
                written += 1
    remaining = out.flush(120)
    seconds = time.monotonic() - began
    consumer.close()
    if remaining:
        raise KafkaException(f"{remaining} records not acknowledged")
    return Result("Python confluent-kafka loop", seen, written, seconds)


def _produce(out, topic, key, value) -> None:
    while True:
        try:
            out.produce(topic, key=key, value=value)
            out.poll(0)
            return
        except BufferError:
            out.poll(0.05)


def router_benchmark(events: int, bootstrap: str | None = None, keys: int = 1000) -> list[Result]:
    workdir = Path(tempfile.mkdtemp(prefix="streamops-bench-"))
    broker = None
    try:
        if bootstrap is None:
            from streamops.local_stack.broker import LocalBroker, free_port_pair

            broker = LocalBroker(state_dir=workdir / "kafka", port=free_port_pair(), heap="1g")
            print(broker.start())
            bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        run_id = f"bench{uuid.uuid4().hex[:8]}"
        spark_catalog = _fresh_topics(admin, f"{run_id}.spark")
        python_catalog = _fresh_topics(admin, f"{run_id}.python")
        app = spark_catalog.app("oplog-router")
        load = run_load(app, LoadSpec(count=events, keys=keys, malformed=0.01, seed=42), bootstrap)
        preload = Result("preload (loadgen, acks=all, idempotent)", load.produced, load.produced, load.seconds)
        # The first run pays for JVM warm-up and code generation; the second, from its own
        # fresh checkpoint over the same backlog, shows the steady drain rate.
        cold = spark_router(app, bootstrap, workdir / "checkpoint-cold", "fresh JVM")
        warm = spark_router(app, bootstrap, workdir / "checkpoint-warm", "warm JVM")
        python_result = python_router(app, python_catalog.app("oplog-router"), bootstrap, load.produced)
        return [preload, cold, warm, python_result]
    finally:
        if broker is not None:
            print(broker.stop())
        shutil.rmtree(workdir, ignore_errors=True)


def table(results: list[Result]) -> str:
    from tabulate import tabulate

    rows = [[r.engine, r.records_in, r.records_out, f"{r.seconds:.2f}", f"{r.rate:,.0f}", r.note] for r in results]
    return tabulate(rows, headers=["", "records in", "records out", "seconds", "records/s", "note"], disable_numparse=True)
