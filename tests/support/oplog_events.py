"""Oplog events a test places exactly (partition by partition), and a catalog whose output topic
refuses records above a size: the makings of a poison record."""

from __future__ import annotations

import json
from pathlib import Path

from streamops.kafka_records import produce

OP_TYPES = ["ADD_CONTACT", "SEND_MESSAGE", "CREATE_GROUP", "BLOCK_CONTACT", "READ_MESSAGE"]
# Around the poison, records that are not routed to the contacts topic: the poison is then alone in
# its producer batch to that topic, and the broker's refusal fails the write at once. (Once, with
# other contacts records in the same producer batch, the Kafka producer split the refused batch,
# retried, and the micro-batch committed without an error: see the report.)
NOT_CONTACTS = ["SEND_MESSAGE", "CREATE_GROUP", "READ_MESSAGE"]
POISON_PARTITION = 2


def event(seq: int, op_type: str | None = None, op_types: list[str] = OP_TYPES, **extra) -> tuple[str, str]:
    user = f"u{seq % 7}"
    body = {"seq": seq, "user_id": user, "op_type": op_type or op_types[seq % len(op_types)],
            "event_time": "2026-11-22T03:00:00.000Z", **extra}
    return user, json.dumps(body)


def produce_to_partitions(kafka, topic: str, seqs: range, op_types: list[str] = OP_TYPES) -> None:
    """Records spread over partitions 0-3 (explicitly: the test knows where each one is)."""
    for partition in range(4):
        produce(kafka, topic, [event(s, op_types=op_types) for s in seqs if s % 4 == partition], partition=partition)


def with_small_output_topic(app_catalog, admin, catalog_file: Path, topic: str, max_bytes: int):
    """The catalog with `topic`'s broker-side max.message.bytes lowered, applied to the broker."""
    from streamops.provisioning import ensure_topics

    catalog = app_catalog.model_copy(update={"topics": [
        t.model_copy(update={"configs": {**t.configs, "max.message.bytes": max_bytes}}) if t.name == topic else t
        for t in app_catalog.topics]})
    ensure_topics(admin, [catalog.topic(topic)])
    catalog_file.write_text(catalog.to_yaml())
    return catalog
