"""Golden runs, and what a test compares with them, beside a live run that lost a machine, rolled
or ran on a cluster:

- `golden_run`: the app's own queries once over everything its inputs hold, undisturbed, in the
  test's local Spark session, into copies of its output topics (`<topic>.golden`). Exact for an
  app whose outputs follow from its input alone (browser-activity).
- `presence_replay`: the presence notifier's reference rules (`notify_user`, the code its JVM step
  is tested against) replayed over the micro-batches the live run committed, as its checkpoint's
  offset log records them, and its count windows over those notifications. A tick is judged against
  the presence events read by its batch (docs/architecture.md, known limits), so which ticks
  notify depends on where the batches split: one batch over everything can differ from a live run
  in a few ticks whose user's presence changed around them; a replay of the live batches cannot.

`kafka` is a client config (`broker.client_config`, a cluster's admin config)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

# The shipped programs from this checkout, as the run's artifacts were built from it: a process may
# then load any of their artifacts (streamops.programs.load_program), not only the first it meets.
from spark_apps.presence_notifier import PresenceSettings, notify_user
from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import batch_offsets, committed_batches, query_dir
from streamops.kafka_offsets import duration_ms, end_offsets
from streamops.kafka_records import read_all
from streamops.provisioning import ensure_topics
from streamops.records import iso_ms
from streamops.reprocess import target_catalog
from tests.support.apps import run_available_now

GOLDEN = "golden"


def golden_run(spark, catalog: Catalog, app_name: str, kafka, checkpoint: Path) -> AppSpec:
    """Run `app_name` over its inputs as they are now into `<output>.golden` topics (created here,
    as the catalog declares the live ones); return the app as that run saw it."""
    spec = catalog.app(app_name)
    golden = target_catalog(catalog, app_name, {t: f"{t}.{GOLDEN}" for t in [*spec.outputs.values(), spec.dead_letter_topic]})
    app = golden.app(app_name)
    ensure_topics(kafka.admin(), [golden.topic(t) for t in [*app.outputs.values(), app.dead_letter_topic]])
    run_available_now(spark, golden, app_name, SimpleNamespace(client_config=kafka), checkpoint)
    return app


def latest_per_key(kafka, topic: str) -> dict[str | None, object]:
    """Each key's last value (JSON; None for a tombstone): the table a compacted topic holds, or
    the final count of each window an update-mode query wrote. A key's records are on one
    partition, in the order they were written."""
    latest: dict[str | None, object] = {}
    for record in sorted(read_all(kafka, topic), key=lambda r: (r.partition, r.offset)):
        latest[record.key_text] = record.json() if record.value is not None else None
    return latest


def caught_up(runtime: AppRuntime, kafka, reads: Sequence[tuple[str, Sequence[str]]]) -> bool:
    """Has each query committed a batch that read to the end of its topics? `reads`: (query, its
    topics) in the order the data flows (a query that reads another's output after it): once a
    query has read all its input, its output is written, so the next one's end is final."""
    for query, topics in reads:
        progress = runtime.progress().get(query)
        if progress is None:
            return False
        for topic in topics:
            read_to = progress.end_offsets.get(topic, {})
            if any(read_to.get(str(partition), 0) < high for partition, (_, high) in end_offsets(kafka, topic).items()):
                return False
    return True


@dataclass
class PresenceReplay:
    """What the notifier's rules give for the live run's batches: each notification (JSON, once),
    the latest-state table, each count window's final value (keyed as the app keys them), each
    user's presence history [(time_ms, action, event_id)] as the notify state holds it."""

    notifications: set[str] = field(default_factory=set)
    latest_state: dict[str, dict] = field(default_factory=dict)
    windows: dict[str, dict] = field(default_factory=dict)
    history: dict[str, list[tuple[int, str, str]]] = field(default_factory=dict)
    batches: int = 0


def presence_replay(kafka, spec: AppSpec, checkpoint: Path) -> PresenceReplay:
    """Replay the notify query's committed batches (every one since batch 0 must still be in the
    offset log: launch with spark.sql.streaming.minBatchesToRetain above the run's batches)."""
    settings = PresenceSettings.model_validate(spec.settings or {})
    rows = [_presence_row(r, 0) for r in read_all(kafka, spec.inputs["events"])]
    rows += [_presence_row(r, 1) for r in read_all(kafka, spec.inputs["ticks"])]
    notify = query_dir(checkpoint, "notify")
    batches = committed_batches(notify)
    assert batches and batches[0] == 0, f"the offset log of {notify} no longer starts at batch 0: {batches[:3]}"
    replay = PresenceReplay(batches=len(batches))
    read_to: dict[str, dict[int, int]] = {}
    for batch in batches:
        ends = batch_offsets(notify, batch) or {}
        users: dict[str, list[dict]] = defaultdict(list)
        for row in rows:
            if read_to.get(row["topic"], {}).get(row["partition"], 0) <= row["offset"] < ends[row["topic"]][row["partition"]]:
                users[row["user_id"]].append(row)
        read_to = ends
        for user, batch_rows in users.items():
            outputs, replay.history[user] = notify_user(
                user, batch_rows, replay.history.get(user, []), message=settings.message,
                horizon_ms=duration_ms(settings.watermark), notifications_topic="notifications", latest_state_topic="latest")
            for _, value, topic in outputs:
                if topic == "notifications":
                    replay.notifications.add(_canonical(value))
                else:
                    replay.latest_state[user] = json.loads(value)
    replay.windows = _window_counts([json.loads(n) for n in replay.notifications], settings)
    return replay


def _presence_row(record, kind: int) -> dict:
    value = record.json()
    return {"kind": kind, "time_ms": _ms(value["event_time"]), "action": value.get("action"),
            "event_id": f"{record.topic}/{record.partition}/{record.offset}", "partition": record.partition,
            "offset": record.offset, "topic": record.topic, "user_id": value["user_id"]}


def _window_counts(notifications: list[dict], settings: PresenceSettings) -> dict[str, dict]:
    """Notifications per user in the count query's hopping windows (Spark's windows: aligned to
    the epoch, each `count_slide` apart), as its update records' final values, by key."""
    size, slide = duration_ms(settings.count_window), duration_ms(settings.count_slide)
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for note in notifications:
        at = _ms(note["event_time"])
        newest = at - at % slide
        for start in range(newest, at - size, -slide):
            counts[note["user_id"], start] += 1
    return {f"{user}|{iso_ms(start)}": {"user_id": user, "window_start": iso_ms(start), "window_end": iso_ms(start + size),
                                        "count": count}
            for (user, start), count in counts.items()}


def canonical_values(records) -> set[str]:
    """Each record's JSON value once, with its keys sorted (the JVM and Python write the same
    fields in their own order and spacing)."""
    return {_canonical(r.value) for r in records}


def _canonical(value: str | bytes) -> str:
    return json.dumps(json.loads(value), sort_keys=True)


def _ms(iso: str) -> int:
    return round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)
