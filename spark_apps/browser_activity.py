"""Browser activity and captcha challenges (seed 003).

Input: logback-style JSON log events with "@timestamp", "logger_name" and "browserHash" (the
browser fingerprint). Events of the captcha logger mean the browser passed a captcha; every
other event is an action.

Query `challenge`: actions per fingerprint, left-joined with the captcha-verified table (Kafka
Streams' KTable-KTable join keeps two stores); here one streaming aggregation per fingerprint, Spark's
own in the JVM (RocksDB), in update mode: its actions, whether it verified, its latest action. The
compacted challenges topic is that table's update stream for fingerprints with at least
`challenge_threshold` actions: in each batch in which such a fingerprint has activity, its
challenge (count and latest action) while it has not verified, a tombstone once it has (a
verified fingerprint counts as 0: the challenge it had is retracted, and a reader of the compacted
topic sees none; Kafka Streams' KTable filter forwards such tombstones too). The state follows
from the input alone, and so does the compacted table: a rebuild from the earliest offsets gives
them again (which updates are written on the way depends, as in any micro-batch app, on where the
batches split). Dead letters are written here too.

Query `window-count`: actions per fingerprint in `window` windows advancing by `slide`, on
event time with a `watermark`; records later than the watermark are dropped by Spark and counted
in the query's progress (numRowsDroppedByWatermark, once per window the record would have
joined: with 5 s windows every 2 s, a late record counts 2 or 3), not silently.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, StrictInt
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from streamops import records
from streamops.catalog import AppSpec, Duration
from streamops.program_contract import OutputQuery, StreamingProgram, WindowCountOutput


class BrowserActivitySettings(BaseModel):
    """The captcha logger, the challenge threshold and the windows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    captcha_logger: str = Field(min_length=1)
    challenge_threshold: StrictInt = Field(default=5, gt=0)
    window: Duration = "5 seconds"
    slide: Duration = "2 seconds"
    watermark: Duration = "10 seconds"

FIELDS = [
    records.Field("@timestamp", "timestamp", "event_time"),
    records.Field("logger_name", "string", "logger_name", min_length=1),
    records.Field("browserHash", "string", "fingerprint", min_length=1),
]


def challenges(good: DataFrame, settings: BrowserActivitySettings, topic: str) -> DataFrame:
    """The challenge records of the good input: in each micro-batch, every fingerprint with activity
    and at least the threshold's actions, as its challenge (its count and latest action) when it has
    not verified, as a tombstone when it has."""
    threshold = settings.challenge_threshold
    is_captcha = F.col("logger_name") == settings.captcha_logger
    # The latest action by event time, then Kafka position (a record's place among equal times).
    action_order = F.when(~is_captcha, F.struct(F.unix_millis("event_time"), "partition", "offset"))
    per_browser = good.groupBy("fingerprint").agg(
        F.count_if(~is_captcha).alias("actions"),
        F.bool_or(is_captcha).alias("verified"),
        F.max_by(F.struct("event_id", "event_time"), action_order).alias("last"),
    )
    challenge = F.to_json(F.struct(
        "fingerprint", "actions", F.lit(False).alias("verified"), F.lit(threshold).alias("threshold"),
        F.col("last.event_id").alias("last_event_id"), records.iso_time("last.event_time").alias("last_event_time"),
    ))
    return per_browser.where(F.col("actions") >= threshold).select(
        F.col("fingerprint").alias("key"), F.when(~F.col("verified"), challenge).alias("value"), F.lit(topic).alias("topic"))


def queries(spec: AppSpec, version: str, source: Callable[[list[str]], DataFrame]) -> list[OutputQuery]:
    settings = spec.settings
    assert isinstance(settings, BrowserActivitySettings)
    parsed = records.parse_input(source([spec.inputs["logs"]]), spec, "logs", FIELDS)
    is_captcha = F.col("logger_name") == settings.captcha_logger
    parsed = parsed.observe(
        "browser",
        F.count(F.lit(1)).alias("records_in"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("dead_letters"),
        F.sum(F.when(F.col("error").isNull() & is_captcha, 1).otherwise(0)).alias("captcha_verifications"),
    )
    challenged = challenges(records.good(parsed), settings, spec.outputs["challenges"])
    dead = records.dead_letters(parsed, spec, version)
    return [
        OutputQuery("challenge", challenged.unionByName(dead), "update"),
        OutputQuery("window-count", window_counts(spec, source), "update"),
    ]


def window_counts(spec: AppSpec, source: Callable[[list[str]], DataFrame]) -> DataFrame:
    settings = spec.settings
    assert isinstance(settings, BrowserActivitySettings)
    actions = records.good(
        records.parse_input(source([spec.inputs["logs"]]), spec, "logs", FIELDS)
    ).where(
        F.col("logger_name") != settings.captcha_logger
    )
    return records.windowed_counts(
        actions, "fingerprint", "event_time", settings.window, settings.slide, settings.watermark,
        spec.outputs["activity_counts"],
    )


class BrowserActivity(StreamingProgram):
    """The captcha app of the module doc: `challenge` (per-fingerprint state), `window-count`."""

    name = "browser_activity"
    input_roles = ("logs",)
    output_roles = ("challenges", "activity_counts")
    Settings = BrowserActivitySettings
    input_fields = {"logs": FIELDS}
    query_names = ("challenge", "window-count")
    stateful_operators = {
        "challenge": ("groupBy(fingerprint) aggregation: actions, verified and the latest action per browser",),
        "window-count": ("windowed count per fingerprint with a watermark",),
    }
    # Which windows the state holds (Spark's check sees the same key schema for every length).
    state_settings = {"window-count": ("window", "slide")}
    window_counts = {"activity_counts": WindowCountOutput("window-count", "fingerprint")}

    def queries(self, app: AppSpec, version: str, source: Callable[[list[str]], DataFrame]) -> list[OutputQuery]:
        return queries(app, version, source)


program = BrowserActivity()
