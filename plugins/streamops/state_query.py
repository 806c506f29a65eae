"""What a stateful app holds now, per key (the seeds' Kafka Streams apps answer it with interactive
queries): `streamops state APP [--key K]`, and the apps page's state link.

Read through Spark's own state data sources (Spark 4): `state-metadata` lists each stateful query's
operators and their stores, `statestore` reads a store's rows as of one batch. The batch is the
query's last committed one, named explicitly: its state files are immutable once committed, so
the answer is one consistent snapshot while the live app goes on (nothing is paused, locked or
written in its checkpoint; the reading session keeps its working copies in its own temp folders).
Should the app's maintenance remove that batch's files while the read runs (a hundred batches
later), the read is taken again on the newest committed batch.

Bounded: at most `limit` rows per store and MAX_ROWS in all, filtered in Spark before they are
collected, each value's lists and maps cut at SHOWN_ITEMS entries and long texts cut with their
size; a key filter matches any text field of the state's key (user_id, fingerprint, a
window's key column), so windows of one key come back together.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from streamops.catalog import AppSpec
from streamops.checkpoints import committed_batches, offset_log_entry, query_dirs
from streamops.refusals import Refused
from streamops.timestamps import iso_ms

MAX_ROWS = 1000
DEFAULT_ROWS = 50
SHOWN_VALUE_CHARS = 2000  # a longer text or blob is cut with its size
SHOWN_ITEMS = 200  # entries of a list or map in a state value (a user's history), then a count


class StateRequest(BaseModel):
    """What to read: one app, one of its stateful queries or all, rows whose key has `key`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
    key: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")  # no control characters
    limit: int = Field(DEFAULT_ROWS, ge=1, le=MAX_ROWS)

    @classmethod
    def from_form(cls, form: dict[str, Any]) -> StateRequest:
        """From a page's query string (empty fields absent); a StateRefused naming each bad field."""
        given = {k: v for k, v in form.items() if k in cls.model_fields and v not in (None, "")}
        try:
            return cls.model_validate(given)
        except ValidationError as exc:
            raise StateRefused([f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]) from None


class StateRefused(Refused):
    """The state cannot be read as asked: each reason names what is wrong."""

    heading = "the state was not read:"


@dataclass
class StoreState:
    """One state store of one stateful operator, as of one committed batch."""

    query: str
    operator_id: int
    operator: str  # Spark's operator name (stateStoreSave, flatMapGroupsWithState, ...)
    store: str
    partitions: int
    batch_id: int  # the answer is as of the end of this batch
    batch_time: str | None  # when that batch ran (its offset log's batchTimestampMs)
    watermark: str | None  # the event-time watermark the batch ran with (None: no watermark)
    rows: list[dict[str, Any]] = field(default_factory=list)  # key and value, as JSON
    more: bool = False  # more rows matched than `limit`


@dataclass
class StateAnswer:
    app: str
    checkpoint: str
    request: dict[str, Any]
    stores: list[StoreState] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """The CLI's answer: per store, its batch and its rows, one JSON line each."""
        lines = []
        for store in self.stores:
            watermark = f", watermark {store.watermark}" if store.watermark else ""
            lines.append(f"{self.app} query {store.query}, operator {store.operator_id} {store.operator}, store "
                         f"{store.store}: as of batch {store.batch_id} ({store.batch_time or 'time unknown'}{watermark}), "
                         f"{len(store.rows)} row(s){' (more match: raise --limit or filter by --key)' if store.more else ''}")
            lines += [f"  {json.dumps(row, sort_keys=True, ensure_ascii=False)}" for row in store.rows]
        return "\n".join([*lines, *self.notes])


def read_state(spark: SparkSession, app: AppSpec, request: StateRequest, checkpoint: str | None = None) -> StateAnswer:
    """The app's state per store, each as of its query's last committed batch."""
    location = checkpoint or app.checkpoint_location()
    # Spark 4.2's RocksDB store reports each snapshot it loads to the driver's state store
    # coordinator, which a session creates with its streaming query manager: in a session that
    # never ran a stream (the CLI's), the first load fails without it (CANNOT_LOAD_STATE_STORE).
    spark.streams.active  # noqa: B018 - creates the manager, and so the coordinator
    answer = StateAnswer(app.name, location, request.model_dump())
    stateful = [d for d in query_dirs(location) if (d / "state").is_dir()]
    if request.query and request.query not in {d.name for d in stateful}:
        names = ", ".join(d.name for d in stateful) or "none"
        raise StateRefused([f"query: {app.name} has no state for a query {request.query!r} in {location} (queries with "
                            f"state: {names})"])
    if not stateful:
        raise StateRefused([f"{app.name} has no state in {location}: it has no stateful query, or it has not run yet"])
    for query_dir in stateful:
        if request.query and query_dir.name != request.query:
            continue
        if sum(len(store.rows) for store in answer.stores) >= MAX_ROWS:
            answer.notes.append(f"{query_dir.name} and later queries not read: {MAX_ROWS:,} rows shown in all already "
                                "(ask for one query, or filter by key)")
            break
        committed = committed_batches(query_dir)
        if not committed:
            answer.notes.append(f"{query_dir.name}: no batch committed yet, so no state to read")
            continue
        try:
            answer.stores += _read_query(spark, query_dir, committed[-1], request)
        except PySparkException as exc:
            newest = committed_batches(query_dir)
            if not newest or newest[-1] == committed[-1]:
                raise StateRefused([f"{query_dir.name}: Spark could not read its state as of batch {committed[-1]}: "
                                    f"{_first_line(exc)}"]) from None
            # The app moved on and its maintenance removed the files of that batch: read the newest.
            answer.stores += _read_query(spark, query_dir, newest[-1], request)
    return answer


def _read_query(spark: SparkSession, query_dir: Path, batch: int, request: StateRequest) -> list[StoreState]:
    path = str(query_dir)
    batch_time, watermark = _batch_times(query_dir, batch)
    operators = spark.read.format("state-metadata").load(path).collect()
    stores = []
    for op in sorted(operators, key=lambda r: (r["operatorId"], r["stateStoreName"])):
        frame = (spark.read.format("statestore").option("batchId", batch).option("operatorId", op["operatorId"])
                 .option("storeName", op["stateStoreName"]).load(path))
        if request.key is not None:
            frame = frame.where(_key_matches(frame, request.key))
        rows = [_json_row(r.asDict(recursive=True)) for r in _keyed(frame).limit(request.limit + 1).collect()]
        stores.append(StoreState(query_dir.name, int(op["operatorId"]), str(op["operatorName"]), str(op["stateStoreName"]),
                                 int(op["numPartitions"]), batch, batch_time, watermark, rows[:request.limit],
                                 len(rows) > request.limit))
    return stores


def _keyed(frame: DataFrame) -> DataFrame:
    """Key and value (the partition is Spark's business), in key order: the same rows every time."""
    return frame.select("key", "value").orderBy(F.to_json("key"))


def _key_matches(frame: DataFrame, key: str) -> Column:
    """Any text field of the key equals `key` (a key that is one text: that text)."""
    key_type = frame.schema["key"].dataType
    if isinstance(key_type, StringType):
        return F.col("key") == F.lit(key)
    texts = [f.name for f in key_type.fields if isinstance(f.dataType, StringType)] if isinstance(key_type, StructType) else []
    if not texts:
        return F.lit(False)
    matches = [F.col("key").getField(name) == F.lit(key) for name in texts]
    condition = matches[0]
    for match in matches[1:]:
        condition = condition | match
    return condition


def _batch_times(query_dir: Path, batch: int) -> tuple[str | None, str | None]:
    entry = offset_log_entry(query_dir, batch)
    lines = entry.splitlines() if entry else []
    try:
        metadata = json.loads(lines[1]) if len(lines) > 1 else {}
    except ValueError:
        metadata = {}
    ran, watermark = metadata.get("batchTimestampMs"), metadata.get("batchWatermarkMs")
    return (_iso(ran), _iso(watermark) if watermark else None)


def _iso(ms: object) -> str | None:
    return iso_ms(int(ms)) if isinstance(ms, int | float) else None


def _json_row(value: Any) -> Any:
    """A state row as JSON: times as ISO-8601, bytes as hex, long values cut with their size."""
    if isinstance(value, dict):  # a row, or a map (whose keys may be times or structs)
        shown = {str(k) if isinstance(k, str) else json.dumps(_json_row(k), sort_keys=True): _json_row(v)
                 for k, v in list(value.items())[:SHOWN_ITEMS]}
        if len(value) > SHOWN_ITEMS:
            shown["…"] = f"{len(value) - SHOWN_ITEMS:,} more entries ({len(value):,} in all)"
        return shown
    if isinstance(value, list | tuple):
        items = [_json_row(v) for v in value[:SHOWN_ITEMS]]
        return items + [f"… {len(value) - SHOWN_ITEMS:,} more ({len(value):,} in all)"] if len(value) > SHOWN_ITEMS else items
    if isinstance(value, datetime):
        return iso_ms(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, date):
        return str(value)  # YYYY-MM-DD
    if isinstance(value, bytes | bytearray):
        hexed = bytes(value[:SHOWN_VALUE_CHARS // 2]).hex()
        return hexed if len(value) <= SHOWN_VALUE_CHARS // 2 else f"{hexed}… ({len(value):,} bytes)"
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str) and len(value) > SHOWN_VALUE_CHARS:
        return f"{value[:SHOWN_VALUE_CHARS]}… ({len(value):,} characters)"
    return value


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
