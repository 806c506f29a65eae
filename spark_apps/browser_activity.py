"""Browser activity and captcha challenges (seed 003).

Input: logback-style JSON log events with "@timestamp", "logger_name" and "browserHash" (the
browser fingerprint). Events of the captcha logger mean the browser passed a captcha; every
other event is an action.

Query `challenge`: actions per fingerprint, left-joined with the captcha-verified table (both
in one per-fingerprint state in RocksDB, as Kafka Streams' KTable-KTable join keeps two stores).
A fingerprint with at least `challenge_threshold` actions that never verified is written to the
compacted challenges topic, updated as its count grows; a verified fingerprint counts as 0, so a
challenge it had is retracted with a tombstone. Dead letters are written here too.

Query `window-count`: actions per fingerprint in `window` windows advancing by `slide`, on
event time with a `watermark`; records later than the watermark are dropped by Spark and counted
in the query's progress (numRowsDroppedByWatermark, once per window the record would have
joined: with 5 s windows every 2 s, a late record counts 2 or 3), not silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from streamops import records
from streamops.catalog import AppSpec, Duration
from streamops.program_contract import OutputQuery, StreamingProgram, WindowCountOutput
from streamops.records import iso_ms


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

OUTPUT_SCHEMA = "key string, value string, topic string"
STATE_SCHEMA = "actions bigint, verified boolean, challenged_at bigint"


def challenge_fingerprint(
    fingerprint: str,
    rows: list[dict],
    state: tuple[int, bool, int],
    *,
    captcha_logger: str,
    threshold: int,
    topic: str,
) -> tuple[list[tuple[str, str | None, str]], tuple[int, bool, int]]:
    """One fingerprint's rows of one micro-batch. state: (actions, verified, count last
    written as a challenge, 0 if none). Returns (outputs, new state)."""
    actions, verified, challenged_at = state
    last = None
    for row in sorted(rows, key=lambda r: (r["time_ms"], r["partition"], r["offset"])):
        if row["logger_name"] == captcha_logger:
            verified = True
        else:
            actions += 1
        last = row
    outputs: list[tuple[str, str | None, str]] = []
    if verified:
        if challenged_at:
            outputs.append((fingerprint, None, topic))  # tombstone: no longer to be challenged
            challenged_at = 0
    elif last is not None and actions >= threshold and actions != challenged_at:  # (no rows: nothing new to say)
        value = {
            "fingerprint": fingerprint,
            "actions": actions,
            "verified": False,
            "threshold": threshold,
            "last_event_id": last["event_id"],
            "last_event_time": iso_ms(last["time_ms"]),
        }
        outputs.append((fingerprint, json.dumps(value), topic))
        challenged_at = actions
    return outputs, (actions, verified, challenged_at)


def _challenge_group(settings: BrowserActivitySettings, topic: str):
    options: dict[str, Any] = dict(captcha_logger=settings.captcha_logger, threshold=settings.challenge_threshold, topic=topic)

    def apply(key: tuple, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        (fingerprint,) = key
        current = tuple(state.get) if state.exists else (0, False, 0)
        current = (int(current[0]), bool(current[1]), int(current[2]))
        rows = [row for frame in frames for row in frame.to_dict("records")]
        outputs, new_state = challenge_fingerprint(fingerprint, rows, current, **options)
        state.update(new_state)
        yield pd.DataFrame(outputs, columns=["key", "value", "topic"])

    return apply


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
    challenges = (
        records.good(parsed)
        .select(
            "fingerprint", "logger_name", F.unix_millis("event_time").alias("time_ms"), "event_id", "partition", "offset"
        )
        .groupBy("fingerprint")
        .applyInPandasWithState(
            _challenge_group(settings, spec.outputs["challenges"]),
            OUTPUT_SCHEMA,
            STATE_SCHEMA,
            "append",
            GroupStateTimeout.NoTimeout,
        )
    )
    dead = records.dead_letters(parsed, spec, version)
    return [
        OutputQuery("challenge", challenges.unionByName(dead)),
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
        "challenge": ("groupBy(fingerprint).applyInPandasWithState: actions and captcha verification per browser",),
        "window-count": ("windowed count per fingerprint with a watermark",),
    }
    window_counts = {"activity_counts": WindowCountOutput("window-count", "fingerprint")}

    def queries(self, app: AppSpec, version: str, source: Callable[[list[str]], DataFrame]) -> list[OutputQuery]:
        return queries(app, version, source)


program = BrowserActivity()
