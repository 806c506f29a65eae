"""Presence notifier (seed 001, "Not looking at Facebook").

Query `notify` reads Open/Close presence events and ticks, both keyed by user:
  (a) every Close produces the notification;
  (b) every tick produces it when the user's latest presence event at or before the tick's
      event time is a Close (no presence yet: nothing, as a KStream-KTable left join gives);
  and it writes the latest presence per user to a compacted changelog topic (the KTable).
The per-user presence history lives in Spark state (RocksDB), kept for `watermark` behind the
newest presence event plus the last event before that, so ticks up to that late still see the
state that held at their time. That per-user step runs in the JVM (streamops.apps.PresenceNotify,
build/maven/streamops-contract): `notify_user` below is its reference, rule for rule, which a test
compares it with on generated input. (Version 1.x ran `notify_user` itself in Python workers,
applyInPandasWithState, and fell behind at 10,000 events/s on two cores.)

Query `count` reads the notifications and counts them per user in `count_window` windows
hopping every `count_slide`, on event time with a watermark, emitted as updates. It counts each
notification once by its id: the notify query writes at least once, and a task retried after a
lost executor writes its notifications again (3.0.0; 2.x counted every copy).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from streamops import jvm_functions, records
from streamops.catalog import AppSpec, Duration
from streamops.input_contract import InputContract
from streamops.kafka_offsets import duration_ms
from streamops.program_contract import OutputQuery, StreamingProgram, WindowCountOutput
from streamops.records import iso_ms


class PresenceSettings(BaseModel):
    """The notification text, the count windows and how late data may be."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    message: str = Field(default="You are not currently viewing Facebook.", min_length=1)
    count_window: Duration = "10 minutes"
    count_slide: Duration = "1 minute"
    # How far behind the newest event time data may arrive and still be counted.
    watermark: Duration = "1 minute"

EVENT_FIELDS = [
    records.Field("seq", "bigint", "seq"),
    records.Field("user_id", "string", "user_id", min_length=1),
    records.Field("action", "string", "action", allowed=("Open", "Close")),
    records.Field("event_time", "timestamp", "event_time"),
]
TICK_FIELDS = [
    records.Field("seq", "bigint", "seq"),
    records.Field("user_id", "string", "user_id", min_length=1),
    records.Field("event_time", "timestamp", "event_time"),
]

# The JVM side of the notify query, and the version of its rules this code was written for.
NOTIFY_CLASS = "streamops.apps.PresenceNotify"
NOTIFY_LOGIC_VERSION = "1"
_PRESENCE, _TICK = 0, 1  # at equal event times a presence event applies before a tick


def notify_user(
    user_id: str,
    rows: list[dict],
    history: list[tuple[int, str, str]],
    *,
    message: str,
    horizon_ms: int,
    notifications_topic: str,
    latest_state_topic: str,
) -> tuple[list[tuple[str, str, str]], list[tuple[int, str, str]]]:
    """One user's rows of one micro-batch, in event-time order, against their presence history.

    rows: dicts with kind (0 presence, 1 tick), time_ms, action, event_id, partition, offset.
    history: (time_ms, action, event_id) sorted by time. Returns (outputs, new history).
    """
    history = sorted(history)
    latest_before = history[-1][0] if history else None
    outputs: list[tuple[str, str, str]] = []

    def notification(source_id: str, cause: str, time_ms: int, presence_id: str) -> None:
        value = {
            "notification_id": source_id,
            "user_id": user_id,
            "message": message,
            "cause": cause,
            "event_time": iso_ms(time_ms),
            "source_event_id": source_id,
            "presence_event_id": presence_id,
        }
        outputs.append((user_id, json.dumps(value), notifications_topic))

    for row in sorted(rows, key=lambda r: (r["time_ms"], r["kind"], r["partition"], r["offset"])):
        if row["kind"] == _PRESENCE:
            history.append((row["time_ms"], row["action"], row["event_id"]))
            history.sort()
            if row["action"] == "Close":
                notification(row["event_id"], "close", row["time_ms"], row["event_id"])
        else:
            current = [entry for entry in history if entry[0] <= row["time_ms"]]
            if current and current[-1][1] == "Close":
                notification(row["event_id"], "tick", row["time_ms"], current[-1][2])

    if history and (latest_before is None or history[-1][0] > latest_before):
        time_ms, action, event_id = history[-1]
        state = {"user_id": user_id, "action": action, "event_time": iso_ms(time_ms), "event_id": event_id}
        outputs.append((user_id, json.dumps(state), latest_state_topic))

    if history:
        cutoff = history[-1][0] - horizon_ms
        older = [entry for entry in history if entry[0] < cutoff]
        history = older[-1:] + [entry for entry in history if entry[0] >= cutoff]
    return outputs, history


def queries(spec: AppSpec, version: str, source: Callable[[list[str]], DataFrame]) -> list[OutputQuery]:
    settings = spec.settings
    assert isinstance(settings, PresenceSettings)
    def parsed(role: str, fields: list[records.Field]) -> DataFrame:
        return records.parse_input(source([spec.inputs[role]]), spec, role, fields)

    events = counted(parsed("events", EVENT_FIELDS), "presence_events")
    ticks = counted(parsed("ticks", TICK_FIELDS), "ticks")

    def shaped(parsed: DataFrame, kind: int) -> DataFrame:
        return records.good(parsed).select(
            "user_id",
            F.lit(kind).alias("kind"),
            F.unix_millis("event_time").alias("time_ms"),
            (F.col("action") if kind == _PRESENCE else F.lit(None).cast("string")).alias("action"),
            "event_id",
            "partition",
            "offset",
        )

    inputs = shaped(events, _PRESENCE).unionByName(shaped(ticks, _TICK))
    jvm_functions.require_version(inputs.sparkSession, NOTIFY_CLASS, NOTIFY_LOGIC_VERSION)
    notified = jvm_functions.call(
        inputs, NOTIFY_CLASS, "apply", settings.message, duration_ms(settings.watermark),
        spec.outputs["notifications"], spec.outputs["latest_state"],
    )
    dead = records.dead_letters(events, spec, version).unionByName(
        records.dead_letters(ticks, spec, version)
    )
    return [
        OutputQuery("notify", notified.unionByName(dead)),
        OutputQuery("count", counts(spec, source), "update"),
    ]


def counted(parsed: DataFrame, name: str) -> DataFrame:
    """Observed metrics `records_in` and `dead_letters` of one input, per micro-batch."""
    return parsed.observe(
        name,
        F.count(F.lit(1)).alias("records_in"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("dead_letters"),
    )


def counts(spec: AppSpec, source: Callable[[list[str]], DataFrame]) -> DataFrame:
    """Notifications per user in hopping event-time windows, as updates; each notification once,
    however often it was delivered (its notification_id)."""
    settings = spec.settings
    assert isinstance(settings, PresenceSettings)
    notifications = source([spec.outputs["notifications"]]).select(
        F.from_json(F.col("value").cast("string"), "notification_id string, user_id string, event_time string").alias("n"),
        "timestamp",
    )
    timed = notifications.select(
        F.col("n.notification_id").alias("notification_id"), F.col("n.user_id").alias("user_id"),
        F.to_timestamp("n.event_time").alias("event_time"), "timestamp",
    ).where(F.col("notification_id").isNotNull() & F.col("user_id").isNotNull() & F.col("event_time").isNotNull())
    # The notifications carry event times the inputs' bounds let through; a record some other
    # writer put on the topic must not move this query's watermark either.
    bounds = [spec.contract(role) for role in spec.inputs]  # the loosest of the inputs' bounds
    loosest = (
        max(bounds, key=lambda c: c.max_future_ms() or 0)
        if all(c.max_future for c in bounds)
        else InputContract(max_future=None)
    )
    timed = records.within_future_bound(timed, "event_time", loosest).drop("timestamp")
    return records.windowed_counts(
        timed, "user_id", "event_time", settings.count_window, settings.count_slide, settings.watermark,
        spec.outputs["notification_counts"], distinct_by="notification_id",
    )


class PresenceNotifier(StreamingProgram):
    """The notifier of the module doc: `notify` (per-user state) and `count` (windows)."""

    name = "presence_notifier"
    input_roles = ("events", "ticks")
    output_roles = ("notifications", "latest_state", "notification_counts")
    Settings = PresenceSettings
    input_fields = {"events": EVENT_FIELDS, "ticks": TICK_FIELDS}
    # The count query counts the notifications the app wrote.
    reads_outputs = ("notifications",)
    query_names = ("notify", "count")
    stateful_operators = {
        "notify": (f"groupBy(user_id).flatMapGroupsWithState ({NOTIFY_CLASS} rules {NOTIFY_LOGIC_VERSION}): each "
                   "user's presence history",),
        "count": ("notification ids within the watermark (each notification counted once)",
                  "windowed count per user_id with a watermark"),
    }
    # A window's length and slide shape which windows the state holds; its key schema is the same
    # for every length, so Spark's own check cannot see a change.
    state_settings = {"count": ("count_window", "count_slide")}
    window_counts = {"notification_counts": WindowCountOutput("count", "user_id")}

    def queries(self, app: AppSpec, version: str, source: Callable[[list[str]], DataFrame]) -> list[OutputQuery]:
        return queries(app, version, source)


program = PresenceNotifier()
