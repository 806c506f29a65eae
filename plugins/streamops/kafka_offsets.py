"""Kafka offsets: the one place the suite asks a broker where a topic's partitions begin and end.

    topic_partitions(admin, topics)        topic -> its partitions (None: no such topic)
    watermarks(admin, topic, partitions)   partition -> (earliest, latest) offsets now
    offsets_for_time(admin, ..., epoch_ms) partition -> first offset written at or after a time
    end_offsets(kafka, topic)              every partition's (earliest, latest), as a committed reader sees it

No other module asks the broker for offsets (AdminClient.list_offsets, a consumer's watermarks
or offsets_for_times): they call these.

The duration grammar ("10 minutes", "1 day") is both the catalog's Spark interval grammar and
how a form says "this long back from now" (`DURATION_PATTERN`, `duration_ms`): written here once.

This module imports no other streamops module at import time but `kafka_client`'s retry helper
(the catalog imports the duration grammar from here), and confluent-kafka only when it talks to
a broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from streamops.kafka_client import while_transient

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from streamops.kafka_client import KafkaClientConfig

# Bounds of every offset and partition an operator may name: the forms' schemas use them and the
# parsing code checks them again (an API trigger or a direct call bypasses a form).
MAX_OFFSET = 2**63 - 1  # Kafka offsets are signed 64-bit
MAX_PARTITION = 2**31 - 1  # Kafka partitions are signed 32-bit

# ---------------------------------------------------------------------------------------------
# The duration grammar: Spark interval strings ("10 minutes", "2 seconds"), used by the catalog for
# triggers, windows and watermarks, and by the forms for a time back from now.

DURATION_UNITS_MS = {"millisecond": 1, "second": 1_000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
_UNITS = "|".join(DURATION_UNITS_MS)
# Any amount: the catalog's durations and the code's check of a time back (which bounds it in words).
DURATION_PATTERN = rf"^[1-9][0-9]* ({_UNITS})s?$"
# The forms' pattern: at most 12 digits, so the schema never lets a number through that the code
# could only refuse as absurd.
DURATION_FORM_PATTERN = rf"^[1-9][0-9]{{0,11}} ({_UNITS})s?$"


def duration_ms(value: str) -> int:
    """'10 minutes' -> 600000 (a text DURATION_PATTERN matches)."""
    amount, unit = value.split()
    return int(amount) * DURATION_UNITS_MS[unit.rstrip("s")]


# ---------------------------------------------------------------------------------------------
# The broker

_TIMEOUT_S = 15


def topic_partitions(admin: AdminClient, topics: Sequence[str]) -> dict[str, list[int] | None]:
    """topic -> its partitions on the broker (None: the topic does not exist)."""
    metadata = admin.list_topics(timeout=_TIMEOUT_S)
    return {
        t: sorted(metadata.topics[t].partitions) if t in metadata.topics and metadata.topics[t].error is None else None
        for t in topics
    }


def watermarks(admin: AdminClient, topic: str, partitions: Sequence[int], *, committed: bool = False) -> dict[int, tuple[int, int]]:
    """partition -> (earliest, latest) offsets now. `committed`: the latest as a read_committed
    reader sees it (the last stable offset, before any open transaction), else the high watermark."""
    from confluent_kafka.admin import OffsetSpec

    low = _list_offsets(admin, topic, {p: OffsetSpec.earliest() for p in partitions}, committed)
    high = _list_offsets(admin, topic, {p: OffsetSpec.latest() for p in partitions}, committed)
    return {p: (low[p], high[p]) for p in partitions}


def offsets_for_time(admin: AdminClient, topic: str, partitions: Sequence[int], epoch_ms: int) -> dict[int, int]:
    """partition -> the first offset whose timestamp is at or after `epoch_ms` (the end if none)."""
    from confluent_kafka.admin import OffsetSpec

    found = _list_offsets(admin, topic, {p: OffsetSpec.for_timestamp(epoch_ms) for p in partitions})
    latest = _list_offsets(admin, topic, {p: OffsetSpec.latest() for p in partitions})
    return {p: latest[p] if found[p] < 0 else found[p] for p in partitions}


def end_offsets(kafka: KafkaClientConfig, topic: str) -> dict[int, tuple[int, int]]:
    """Every partition of `topic` -> its (earliest, latest) offsets, latest as a read_committed
    reader sees it (`read_spans` reads up to it). A topic the broker does not have (or does not
    let this connection see) raises its KafkaException."""
    from confluent_kafka import KafkaException

    # A client of its own (callers hold a connection, not a client). Asking for one topic's
    # metadata may create it where the broker allows auto-creation: this client never asks to.
    admin = kafka.admin(**{"allow.auto.create.topics": False})

    def ask() -> dict[int, tuple[int, int]]:
        metadata = admin.list_topics(topic, timeout=_TIMEOUT_S)
        if metadata.topics[topic].error is not None:
            raise KafkaException(metadata.topics[topic].error)
        return watermarks(admin, topic, sorted(metadata.topics[topic].partitions), committed=True)

    # A broker restarting or a leader being elected answers for a moment with an error.
    return while_transient(ask)


def _list_offsets(admin: AdminClient, topic: str, specs: dict[int, OffsetSpec], committed: bool = False) -> dict[int, int]:
    """Offsets per partition. A partition without a leader for a moment (a topic just created, a
    leader election after a broker restart) answers with a retriable error: asked again until
    the deadline, then the error is raised."""
    from confluent_kafka import IsolationLevel, TopicPartition

    isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED

    def ask() -> dict[int, int]:
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p, spec in specs.items()},
                                     isolation_level=isolation, request_timeout=_TIMEOUT_S)
        return {tp.partition: future.result().offset for tp, future in futures.items()}

    return while_transient(ask, timeout=_TIMEOUT_S)
