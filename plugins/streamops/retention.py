"""Retention runway: per app and input partition, the time until Kafka's retention deletes the
oldest record the app has not processed yet, and what is lost once it has.

Kafka deletes a log segment once its newest record is older than `retention.ms`, so the oldest
unprocessed record lives at least until its own timestamp plus `retention.ms`. By size, Kafka
deletes the oldest segments while what stays is still over `retention.bytes` (per partition), so
the oldest unprocessed record lives at least until the records after it reach `retention.bytes`:
the size runway is the time the partition's input needs to write the difference, at the rate it
wrote the unread records (their bytes over the oldest one's age; Kafka has no partition size
through librdkafka's admin API, so the bytes are estimated from a sample of the unread records,
uncompressed, which errs early). The runway is the shorter of the two. An app that is stopped, crashed or slow
loses input it has not read when the runway reaches zero, and with failOnDataLoss Spark then
fails every start: the supervisor pages before (`retention risk`) and says it after (`input lost`),
instead of restarting it into a crash loop.

The page's threshold is the catalog's `supervision.min_retention_runway`, or by default
CATCH_UP_MULTIPLE times the time the app needs to read its backlog at the best rate it showed in
the last hour (at least RUNWAY_FLOOR_S): enough to act and to catch up.
"""

from __future__ import annotations

import fcntl
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from streamops.catalog import checkpoint_root
from streamops.runtime_files import write_json_atomic
from streamops.timestamps import parse_recorded_time

CATCH_UP_MULTIPLE = 3
RUNWAY_FLOOR_S = 30 * 60.0
ADMIN_TIMEOUT_S = 30
# Records read from an app's position to estimate its unread bytes (only on topics with retention.bytes).
SIZE_SAMPLE_RECORDS = 500
# Per record on disk beyond key, value and headers: record format v2's lengths, deltas and
# attributes (about 20 bytes), plus a batch header (61 bytes) as if each record were a batch of its
# own: never fewer bytes than the log holds uncompressed, so the runway errs early.
RECORD_OVERHEAD_BYTES = 20 + 61


@dataclass(frozen=True)
class TopicRetention:
    retention_ms: int | None  # None: unlimited (-1), or not a deleting topic
    retention_bytes: int | None  # per partition; None: unlimited


@dataclass(frozen=True)
class Runway:
    """One input partition of one query."""

    topic: str
    partition: int
    position: int  # the next offset the app reads
    earliest: int  # the partition's first offset on the broker
    oldest_age_s: float | None  # age of the oldest unprocessed record (None: caught up)
    retention_ms: int | None
    retention_bytes: int | None = None
    unread_bytes: int | None = None  # estimated (record_bytes); None: not measured (no retention.bytes)
    unread_records: int = 0

    @property
    def lost(self) -> int:
        """Records retention deleted before the app read them."""
        return max(self.earliest - self.position, 0)

    @property
    def time_runway_s(self) -> float | None:
        """Seconds until retention.ms may delete the oldest unprocessed record (None: no limit or nothing waits)."""
        if self.retention_ms is None or self.oldest_age_s is None:
            return None
        return round(self.retention_ms / 1000 - self.oldest_age_s, 1)

    @property
    def size_runway_s(self) -> float | None:
        """Seconds until retention.bytes may delete it, at the rate the unread records were written
        (None: no size limit, not measured, or nothing waits)."""
        if self.retention_bytes is None or self.unread_bytes is None or self.oldest_age_s is None:
            return None
        if self.unread_bytes >= self.retention_bytes:
            return 0.0
        bytes_per_s = self.unread_bytes / max(self.oldest_age_s, 1.0)
        return round((self.retention_bytes - self.unread_bytes) / bytes_per_s, 1) if bytes_per_s else None

    @property
    def runway_s(self) -> float | None:
        """Seconds until the oldest unprocessed record may be deleted, by time or by size, whichever comes first."""
        known = [r for r in (self.time_runway_s, self.size_runway_s) if r is not None]
        return min(known) if known else None

    @property
    def limited_by(self) -> str | None:
        """The config that deletes first: "retention.ms" or "retention.bytes" (None: neither)."""
        size, time = self.size_runway_s, self.time_runway_s
        if size is not None and (time is None or size < time):
            return "retention.bytes"
        return "retention.ms" if time is not None else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "runway_s": self.runway_s, "limited_by": self.limited_by}


def record_bytes(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    """A record's bytes in the log, uncompressed (RECORD_OVERHEAD_BYTES)."""
    return (RECORD_OVERHEAD_BYTES + len(key or b"") + len(value or b"")
            + sum(len(name.encode()) + len(data or b"") for name, data in headers or ()))


def topic_retentions(admin: Any, topics: Iterable[str]) -> dict[str, TopicRetention]:
    """The broker's retention configs of `topics` (what the broker does, not what the catalog says:
    an extension or an override counts)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    names = sorted(set(topics))
    if not names:
        return {}
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names],
                                     request_timeout=ADMIN_TIMEOUT_S)
    found = {}
    for resource, future in futures.items():
        entries = future.result(ADMIN_TIMEOUT_S)
        policy = (entries["cleanup.policy"].value or "") if "cleanup.policy" in entries else "delete"
        deletes = "delete" in policy
        found[resource.name] = TopicRetention(
            _limit(entries.get("retention.ms")) if deletes else None,
            _limit(entries.get("retention.bytes")) if deletes else None)
    return found


def _limit(entry: Any) -> int | None:
    try:
        value = int(entry.value)
    except (AttributeError, TypeError, ValueError):
        return None
    return value if value >= 0 else None


def catch_up_s(lag: int, best_rate: float | None) -> float | None:
    """Seconds to read `lag` records at `best_rate` records/s (None: no rate measured)."""
    if not lag:
        return 0.0
    return lag / best_rate if best_rate else None


def threshold_s(configured_s: float | None, lag: int, best_rate: float | None) -> tuple[float, str]:
    """The runway below which the app needs someone, and how it was chosen (for the evidence)."""
    if configured_s is not None:
        return configured_s, "the catalog's supervision.min_retention_runway"
    needed = catch_up_s(lag, best_rate)
    if needed is None:
        return RUNWAY_FLOOR_S, f"no rate measured in the last hour: the floor of {_words(RUNWAY_FLOOR_S)}"
    chosen = max(RUNWAY_FLOOR_S, CATCH_UP_MULTIPLE * needed)
    return chosen, (f"{CATCH_UP_MULTIPLE}x the {_words(needed)} it needs to read its {lag:,} waiting records at "
                    f"{best_rate:,.0f}/s (its best rate of the last hour), at least {_words(RUNWAY_FLOOR_S)}")


def lost_evidence(app: str, runways: Sequence[Runway]) -> str | None:
    lost = [r for r in runways if r.lost]
    if not lost:
        return None
    parts = "; ".join(f"{r.topic} partition {r.partition} offsets {r.position}-{r.earliest - 1} ({r.lost:,} records)"
                      for r in lost)
    return (f"retention deleted input {app} had not processed: {parts}. Spark (failOnDataLoss) fails every start on it, "
            "so the supervisor does not restart it. Choices: accept the loss and go on from the earliest records still "
            "there (recover_reset_offsets, mode earliest: the outputs miss those records); or, if a copy of the lost "
            "records exists, produce them again into the input first; then start it (recover_restart_app or "
            "deploy_apps). If it will not catch up in time, raise the inputs' retention.ms in the catalog and apply it with "
            "provision_topics first.")


def risk_evidence(app: str, runways: Sequence[Runway], limit_s: float, how: str) -> str | None:
    """The partitions whose runway is below `limit_s`, the shortest first, or None."""
    short = sorted((r for r in runways if r.runway_s is not None and r.runway_s < limit_s), key=lambda r: r.runway_s or 0)
    if not short:
        return None
    first = short[0]
    runway = first.runway_s or 0.0
    when = f"in about {_words(runway)}" if runway > 0 else "from now on (it may already be gone at the next segment check)"
    more = f" and {len(short) - 1} more partition(s)" if len(short) > 1 else ""
    if first.limited_by == "retention.bytes":
        why = (f"its {first.unread_records:,} unread record(s), about {_size(first.unread_bytes or 0)} written over "
               f"{_words(first.oldest_age_s or 0)}, against retention.bytes {first.retention_bytes:,} per partition")
        config = "retention.bytes"
    else:
        why = f"written {_words(first.oldest_age_s or 0)} ago, retention.ms {first.retention_ms:,}"
        config = "retention.ms"
    return (f"retention deletes input {app} has not processed {when}: {first.topic} partition {first.partition}, offset "
            f"{first.position} ({why}){more}; it pages below {_words(limit_s)} ({how}). Start or speed up the app, or "
            f"extend the inputs' retention with recover_extend_retention (approval required; {config} is the limit "
            "here) until it has caught up.")


def _size(count: float) -> str:
    if count < 1024:
        return f"{count:,.0f} bytes"
    units = ("KiB", "MiB", "GiB")
    power = min(int(math.log(count, 1024)), len(units))
    return f"{count / 1024 ** power:,.1f} {units[power - 1]}"


def _words(seconds: float) -> str:
    seconds = max(round(seconds), 0)
    if seconds < 600:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


# ---------------------------------------------------------------------------------------------
# Holds: a retention extended for a stated time (recover_extend_retention), then reverted


@dataclass(frozen=True)
class RetentionHold:
    """One input topic's retention held above the catalog's until `until` (ISO-8601 UTC): its
    retention.ms, and its retention.bytes where a size limit deletes too (None: not held)."""

    topic: str
    retention_ms: int | None  # what the broker keeps meanwhile
    declared_ms: int | None  # what the catalog declared when the hold began (None: the broker default)
    until: str
    run_id: str
    by: str
    retention_bytes: int | None = None
    declared_bytes: int | None = None

    def active(self, now: datetime) -> bool:
        ends = parse_recorded_time(self.until)
        return ends is not None and now < ends

    def held(self) -> dict[str, int]:
        """The configs held: name -> value."""
        return {name: value for name, value in (("retention.ms", self.retention_ms),
                                                ("retention.bytes", self.retention_bytes)) if value is not None}


def holds_file() -> Path:
    return checkpoint_root() / "_retention" / "holds.json"


class HoldsUnreadable(ValueError):
    """The holds file is not what recover_extend_retention writes: provisioning stops rather than
    revert a retention someone extended."""


def read_holds() -> dict[str, RetentionHold]:
    """Every hold on record, active or ended but kept (removed only when reverted): topic -> hold."""
    path = holds_file()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise HoldsUnreadable(f"{path} is not JSON ({exc}): fix or remove it; it records retention extensions "
                              "(recover_extend_retention) that provision_topics must keep") from None
    try:
        return {str(topic): RetentionHold(**entry) for topic, entry in data.items()}
    except (AttributeError, TypeError) as exc:
        raise HoldsUnreadable(f"{path} holds an entry that is not a retention hold ({exc}): fix or remove it") from None


@contextmanager
def holds_changed() -> Iterator[dict[str, RetentionHold]]:
    """The holds to change, under a lock (an extension and the supervisor's revert never lose each
    other's write); written back when the block ends."""
    path = holds_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        holds = read_holds()
        yield holds
        write_json_atomic(path, {topic: asdict(hold) for topic, hold in sorted(holds.items())}, indent=2)


def held_configs(topic: str, configs: dict[str, Any], holds: dict[str, RetentionHold]) -> dict[str, Any]:
    """A topic's declared configs with a hold's retention.ms and retention.bytes where they keep
    records longer than the catalog's: what provisioning keeps the broker at (provision_topics neither
    reverts nor reports a hold). A hold counts until the supervisor reverts it (an ended one it kept too)."""
    hold = holds.get(topic)
    if hold is None:
        return configs
    kept = dict(configs)
    for name, value in hold.held().items():
        declared = configs.get(name)
        if not (isinstance(declared, int) and (declared < 0 or declared >= value)):
            kept[name] = value
    return kept
