"""Realistic input for each app: sequence-numbered events with keys, skew, late and malformed
records, produced idempotently with acks from all in-sync replicas.

    streamops loadgen oplog-router --count 100000 --keys 1000 --malformed 0.01 --late 0.02
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from confluent_kafka import KafkaException

from streamops.catalog import AppSpec
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_records import producer
from streamops.programs import program_info, settings_dict
from streamops.timestamps import iso_ms

UNKNOWN_OP_TYPES = ["LOGIN", "LOGOUT", "UPDATE_PROFILE"]
ACTION_LOGGERS = ["com.example.web.CheckoutController", "com.example.web.SearchController", "com.example.web.CartController"]


@dataclass
class LoadSpec:
    count: int
    keys: int = 100
    rate: float = 0.0  # records/s; 0 = as fast as the broker takes them
    malformed: float = 0.0  # fraction of records that are not valid input
    late: float = 0.0  # fraction of records whose event time is `late_by` in the past
    late_by: timedelta = timedelta(minutes=5)
    skew: timedelta = timedelta(seconds=0)  # event times jitter by up to this, either way
    start_seq: int = 1
    start_time: datetime | None = None  # event time of the first record (default: now)
    # Event time between consecutive records (default: 1/rate, or 1 ms unpaced): spread a
    # backlog over hours of event time so windows close.
    event_spacing: timedelta | None = None
    seed: int | None = None


@dataclass
class LoadReport:
    produced: int = 0
    malformed: int = 0
    late: int = 0
    by_topic: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    first_seq: int = 0
    last_seq: int = 0

    @property
    def rate(self) -> float:
        return self.produced / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        topics = ", ".join(f"{topic}: {n}" for topic, n in sorted(self.by_topic.items()))
        return (
            f"produced {self.produced} records (seq {self.first_seq}..{self.last_seq}; {self.malformed} malformed, "
            f"{self.late} late) in {self.seconds:.2f} s = {self.rate:,.0f} records/s [{topics}]"
        )


def _malformed(rng: random.Random, good: dict) -> str:
    kind = rng.choice(["not-json", "missing", "wrong-type", "no-timezone"])
    if kind == "not-json":
        return json.dumps(good)[:-3]  # truncated: not valid JSON
    broken = dict(good)
    if kind == "missing":
        broken.pop(next(k for k in broken if k != "seq"))
    elif kind == "wrong-type":
        broken["seq"] = str(broken["seq"])
    else:
        time_key = "@timestamp" if "@timestamp" in broken else "event_time"
        broken[time_key] = broken[time_key].rstrip("Z")
    return json.dumps(broken)


def events(app: AppSpec, load: LoadSpec) -> Iterator[tuple[str, str, str, bool, bool]]:
    """(topic, key, value, malformed, late) for `load.count` records of the app's inputs."""
    rng = random.Random(load.seed)
    start = load.start_time or datetime.now(UTC)
    spacing = load.event_spacing or (timedelta(seconds=1 / load.rate) if load.rate else timedelta(milliseconds=1))
    # Test data for the shipped programs, told apart by the name each program declares.
    kind = program_info(app).name
    if kind not in ("oplog_router", "presence_notifier", "browser_activity"):
        raise ValueError(f"{app.name}: the load generator makes records for the shipped programs only, not {app.program}")
    settings = settings_dict(app)
    categories = settings.get("categories", {}) if kind == "oplog_router" else {}
    op_types = sorted({op for ops in categories.values() for op in ops})
    presence_state: dict[str, str] = {}
    for i in range(load.count):
        seq = load.start_seq + i
        key_index = rng.randrange(load.keys)
        moment = start + i * spacing
        if load.skew:
            moment += timedelta(seconds=rng.uniform(-1, 1) * load.skew.total_seconds())
        late = rng.random() < load.late
        if late:
            moment -= load.late_by
        stamp = iso_ms(moment)
        if kind == "oplog_router":
            user = f"user-{key_index}"
            op_type = rng.choice(UNKNOWN_OP_TYPES) if rng.random() < 0.02 else rng.choice(op_types)
            topic, key = app.inputs["operations"], user
            value = {"seq": seq, "user_id": user, "op_type": op_type, "event_time": stamp, "client": "loadgen"}
        elif kind == "presence_notifier":
            user = f"user-{key_index}"
            if rng.random() < 0.3:
                action = "Open" if presence_state.get(user) == "Close" else "Close"
                presence_state[user] = action
                topic, value = app.inputs["events"], {"seq": seq, "user_id": user, "action": action, "event_time": stamp}
            else:
                topic, value = app.inputs["ticks"], {"seq": seq, "user_id": user, "event_time": stamp}
            key = user
        else:
            browser = f"browser-{key_index:05d}"
            logger = settings["captcha_logger"] if rng.random() < 0.03 else rng.choice(ACTION_LOGGERS)
            topic, key = app.inputs["logs"], f"http-nio-{rng.randrange(8)}"
            value = {"seq": seq, "@timestamp": stamp, "level": "INFO", "logger_name": logger,
                     "thread_name": key, "message": "request handled", "browserHash": browser}
        bad = rng.random() < load.malformed
        yield topic, key, (_malformed(rng, value) if bad else json.dumps(value)), bad, late


def run(app: AppSpec, load: LoadSpec, kafka: KafkaClientConfig, stop: threading.Event | None = None) -> LoadReport:
    """Produce the load, paced to `load.rate` if set, and wait for every acknowledgement.
    Setting `stop` ends it early (what was produced is still flushed and reported)."""
    report = LoadReport(first_seq=load.start_seq, last_seq=load.start_seq + load.count - 1)
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    out = producer(kafka)
    began = time.monotonic()
    for index, (topic, key, value, bad, late) in enumerate(events(app, load)):
        if stop is not None and stop.is_set():
            break
        if load.rate:
            # Pacing to the requested rate, not synchronisation: wait for the record's slot.
            ahead = began + index / load.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        while True:
            try:
                out.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                out.poll(0.05)  # local queue full: let deliveries drain
        out.poll(0)
        report.produced += 1
        report.malformed += bad
        report.late += late
        report.by_topic[topic] += 1
    remaining = out.flush(120)
    report.seconds = time.monotonic() - began
    report.last_seq = report.first_seq + report.produced - 1
    if remaining or errors:
        raise KafkaException(f"{remaining} record(s) not acknowledged; first errors: {errors[:3]}")
    return report


@contextmanager
def background_load(app: AppSpec, load: LoadSpec, kafka: KafkaClientConfig) -> Iterator[threading.Thread]:
    """Produce `load` from a background thread while the block runs; stop and flush it on exit.
    The thread is yielded so callers can ask whether it was still producing."""
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(app, load, kafka, stop), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=120)
