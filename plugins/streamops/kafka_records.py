"""Read a topic from its beginning to its current end, and produce records reliably.

Small helpers over confluent-kafka used by the load generator, the tests and validation of
bounded ranges. Reading assigns partitions directly (no consumer group, nothing committed).
Where a topic begins and ends, and the spans of offsets `read_spans` takes (`OffsetSpan`):
`streamops.kafka_offsets`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaException, Producer, TopicPartition

from streamops.kafka_client import KafkaClientConfig, transient
from streamops.kafka_offsets import OffsetSpan, end_offsets
from streamops.waiting import poll_until


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: list[tuple[str, bytes]] = field(default_factory=list, compare=False)

    def json(self):
        return None if self.value is None else json.loads(self.value)

    @property
    def key_text(self) -> str | None:
        return None if self.key is None else self.key.decode("utf-8", errors="replace")


def held_offsets(low: int, high: int) -> str:
    """What a partition with watermarks [low, high) holds, in words."""
    return f"it holds offsets {low}-{high - 1}" if high > low else f"it is empty (next offset {high})"


def read_all(kafka: KafkaClientConfig, topic: str, timeout: float = 60.0) -> list[Record]:
    """Every record now in `topic`, in partition then offset order."""
    return read_spans(kafka, topic, {p: OffsetSpan(low, high) for p, (low, high) in end_offsets(kafka, topic).items()}, timeout)


def read_spans(kafka: KafkaClientConfig, topic: str, spans: Mapping[int, OffsetSpan], timeout: float = 60.0) -> list[Record]:
    """The records of `topic` in each partition's span, in partition then offset order."""
    wanted = {p: (span.start, span.end) for p, span in spans.items() if not span.empty}
    if not wanted:
        return []
    # Skip records of aborted transactions, as any downstream reader would.
    consumer = kafka.consumer("streamops-reader", **{"isolation.level": "read_committed"})
    out: list[Record] = []
    try:
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in wanted.items()])
        done: set[int] = set()

        def drained() -> bool:
            # A short wait: consume() waits for all 1000 messages or the timeout, and the end of a
            # range is found by position below, not by waiting (0.5 s made every read of a small
            # topic take 0.5 s).
            for message in consumer.consume(num_messages=1000, timeout=0.05):
                if message.error():
                    if transient(KafkaException(message.error())):
                        continue  # a broker went away or a leader moved: the consumer carries on
                    raise KafkaException(message.error())
                p = message.partition()
                if p in done or message.offset() >= wanted[p][1]:
                    continue
                out.append(Record(topic, p, message.offset(), message.key(), message.value(), message.timestamp()[1],
                                  message.headers() or []))
                if message.offset() >= wanted[p][1] - 1:
                    done.add(p)
            # Compacted or transactional topics have offset gaps: position tells the truth.
            for tp in consumer.position([TopicPartition(topic, p) for p in wanted]):
                if tp.offset >= wanted[tp.partition][1]:
                    done.add(tp.partition)
            return len(done) == len(wanted)

        poll_until(drained, timeout=timeout, what=f"reading {topic}", interval=0.01, max_interval=0.05)
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


def producer(kafka: KafkaClientConfig, **extra) -> Producer:
    """A producer that waits for all in-sync replicas and never duplicates on retry."""
    return kafka.producer(**{"acks": "all", "enable.idempotence": True, "linger.ms": 5, **extra})


def produce(
    kafka: KafkaClientConfig,
    topic: str,
    records: Iterable[tuple[str | bytes | None, str | bytes | None]],
    partition: int | None = None,
) -> int:
    """Produce (key, value) pairs in order and wait until every one is acknowledged.
    Without `partition`, the key chooses it (the default partitioner)."""
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    out = producer(kafka)
    count = 0
    for key, value in records:
        if partition is None:
            out.produce(topic, key=key, value=value, on_delivery=on_delivery)
        else:
            out.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
        out.poll(0)
        count += 1
    remaining = out.flush(60)
    if remaining or errors:
        raise KafkaException(f"{remaining} record(s) not acknowledged, errors: {errors[:5]}")
    return count
