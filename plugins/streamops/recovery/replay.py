"""Replay dead letters: records that now pass the app's parsing go back to their input topic.

A dead letter keeps the original key and value byte for byte (base64) and the source
coordinates. The replay re-runs the parsing of the version the app runs (its program's declared
`input_fields` and the
catalog's `max_record_bytes`, through `records.parse` on Spark, the code the app runs) over the
chosen range; records that pass are produced to the input topic's original partition with
headers naming where they came from; the rest stay where they are.

A dead letter is read as streamops.dead_letters decodes it (the envelope the driver writes); one
that is not an envelope stays where it is.

The replay ledger (`<checkpoint>/_runtime/replay-ledger.jsonl`, beside the driver's lease on the
shared filesystem) lists every replayed source record (topic/partition/offset of the original),
one ReplayLedgerEntry a line.
A record already in it is never replayed again, whichever dead-letter copy names it, so a
second run over the same range is a no-op. A record is entered once its write is acknowledged:
a crash between the two can replay it once more on the next run (at-least-once, like the apps).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from tabulate import tabulate

from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec, Catalog
from streamops.dead_letters import DeadLetter, fetch_originals, read_dead_letters
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import (
    BACK,
    EARLIEST,
    NOW,
    TIME,
    OffsetSpan,
    parse_moment,
    spans_from_json,
    spans_to_json,
    time_range_spans,
    topic_partitions,
)
from streamops.kafka_records import producer, read_spans
from streamops.plans import JsonPlan
from streamops.programs import program_info, running_version
from streamops.recovery.common import RecoveryRefused, resolve_app
from streamops.recovery.skip import SKIP_REASON
from streamops.runtime_records import ReplayLedgerEntry, checked_lines
from streamops.timestamps import now_iso

HEADER_SOURCE = "streamops.replay.source"
HEADER_DEAD_LETTER = "streamops.replay.dead-letter"
HEADER_RUN = "streamops.replay.run"


@dataclass
class ReplayRequest:
    app: str
    start: str = "earliest"  # earliest, ISO-8601 time with timezone, or a duration back ("6 hours")
    end: str = "now"  # now, or ISO-8601 time with timezone
    reason_contains: str = ""  # case-insensitive part of the dead letter's reason; empty: every reason


@dataclass
class ReplayPlan(JsonPlan):
    app: str
    request: dict
    dead_letter_topic: str
    # The dead-letter topic's offsets, fixed at plan time: spans_to_json's {"0": [start, end]}
    # (offset_spans() reads them back as OffsetSpans).
    spans: dict[str, list[int]]
    by_reason: list[dict]  # reason -> counts per verdict
    totals: dict[str, int]
    still_failing: list[dict] = field(default_factory=list)  # examples: where, old reason, reason now

    def offset_spans(self) -> dict[int, OffsetSpan]:
        return spans_from_json(self.spans, "ReplayPlan.spans")

    def table(self) -> str:
        rows = [
            [r["reason"][:80], r["records"], r["replay"], r["still fails"], r["already replayed"], r["filtered out"], r["other"]]
            for r in self.by_reason
        ]
        head = tabulate(rows, headers=["dead-letter reason", "records", "now pass: replay", "still fail", "already replayed",
                                       "filtered out", "not replayable"])
        span = ", ".join(f"p{p} {s.start}..{s.end}" for p, s in sorted(self.offset_spans().items()))
        t = self.totals
        lines = [f"dead letters of {self.app} in {self.dead_letter_topic} [{span or 'empty'}]:", head,
                 f"will replay {t['replay']} record(s) to their input topic; {t['still fails']} still fail and stay; "
                 f"{t['already replayed']} were replayed before (ledger)"]
        lines += [f"still fails: {e['at']}: {e['now']}" for e in self.still_failing[:5]]
        return "\n".join(lines)

    def summary(self) -> str:
        t = self.totals
        return f"{t['replay']} to replay, {t['still fails']} still fail, {t['already replayed']} replayed before"


def ledger_file(app: AppSpec) -> Path:
    return AppRuntime(app.checkpoint_location()).dir / "replay-ledger.jsonl"


def replayed_sources(app: AppSpec) -> set[str]:
    """The source records replayed before (RuntimeRecordError names a ledger line that is not a
    ReplayLedgerEntry: nothing is replayed while the ledger cannot say what was)."""
    return {entry.source for entry in checked_lines(ReplayLedgerEntry, ledger_file(app))}


def _time(text: str, what: str, now: datetime, allowed: set[str], problems: list[str]) -> datetime | None:
    """The instant `text` names (None: earliest or now, the partitions' ends, or refused in `problems`)."""
    try:
        return parse_moment(text, what, now, allowed=allowed).at
    except ValueError as exc:
        problems.append(str(exc))
        return None


def resolve_spans(
    admin: AdminClient, catalog: Catalog, request: ReplayRequest, now: datetime | None = None
) -> tuple[AppSpec, dict[int, OffsetSpan]]:
    """The app and the dead-letter offsets per partition the request names."""
    now = now or datetime.now(UTC)
    problems: list[str] = []
    app = resolve_app(catalog, request.app, problems)
    start = _time(request.start, "start", now, {EARLIEST, TIME, BACK}, problems)
    # An end may be a duration back too ("until 1 hour ago"); the form offers now or a time.
    end = _time(request.end, "end", now, {NOW, TIME, BACK}, problems)
    if start and end and end <= start:
        problems.append(f"end {request.end} is not after start {request.start}")
    if len(request.reason_contains or "") > 200:
        problems.append("reason_contains is over 200 characters")
    if app is None or problems:
        raise RecoveryRefused(problems)
    topic = app.dead_letter_topic
    parts = topic_partitions(admin, [topic])[topic]
    if parts is None:
        raise RecoveryRefused([f"the dead-letter topic {topic!r} does not exist on the broker"])
    return app, time_range_spans(admin, topic, parts, start, end)


def _reparse(spark, app: AppSpec, letters: list[DeadLetter]) -> dict[int, str | None]:
    """index -> the reason the app's parsing gives now (None: it passes)."""
    from pyspark.sql import functions as F

    from streamops import records

    # The input fields of the version that runs (its artifact's declarations), not the catalog's.
    declared = program_info(app, running_version(app)).input_fields
    verdicts: dict[int, str | None] = {}
    for role, topic in app.inputs.items():
        fields = [records.Field.from_data(f) for f in declared[role]]
        rows = [(i, d.key, d.value, topic, d.source_partition, 0, None) for i, d in enumerate(letters) if d.source_topic == topic]
        if not rows:
            continue
        frame = spark.createDataFrame(
            rows, "idx int, key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
        )
        # (The frame has no Kafka timestamps: a replayed record is written anew, so its time is now.)
        parsed = records.parse_input(frame, app, role, fields)
        verdicts.update({row.idx: row.error for row in parsed.select(F.col("idx"), F.col("error")).collect()})
    return verdicts


def evaluate(
    spark, kafka: KafkaClientConfig, app: AppSpec, spans: dict[str, list[int]], reason_contains: str
) -> list[DeadLetter]:
    """Every dead letter of the spans (as a plan records them, `ReplayPlan.spans`) with its verdict."""
    letters = read_dead_letters(kafka, app.dead_letter_topic, spans_from_json(spans, "the replay's spans"))
    done = replayed_sources(app)
    inputs = set(app.inputs.values())
    wanted = (reason_contains or "").lower()
    candidates: list[DeadLetter] = []
    for letter in letters:
        if letter.verdict:
            continue
        if wanted and wanted not in letter.reason.lower():
            letter.verdict = "filtered out"
        elif letter.source in done:
            letter.verdict = "already replayed"
        elif letter.source_topic not in inputs:
            letter.verdict = f"source {letter.source_topic} is not an input of {app.name}"
        elif letter.reason.startswith(SKIP_REASON) and SKIP_REASON not in wanted:
            # It parsed fine: an operator skipped it because it failed the query. Passing the
            # parser again proves nothing, so it comes back only when asked for by name.
            letter.verdict = f"skipped by an operator: replayed only with reason_contains '{SKIP_REASON}'"
        else:
            candidates.append(letter)
    fetch_originals(kafka, candidates)
    candidates = [d for d in candidates if not d.verdict]
    verdicts = _reparse(spark, app, candidates)
    seen: set[str | None] = set()
    for index, letter in enumerate(candidates):
        reason = verdicts.get(index)
        if reason:
            letter.verdict = f"still fails: {reason}"
        elif letter.source in seen:  # two dead letters of one source record (a re-run batch): once
            letter.verdict = "already replayed"
        else:
            letter.verdict = "replay"
            seen.add(letter.source)
    return letters


def plan_replay(spark, admin: AdminClient, kafka: KafkaClientConfig, catalog: Catalog, request: ReplayRequest) -> ReplayPlan:
    app, resolved = resolve_spans(admin, catalog, request)
    spans = spans_to_json(resolved)
    letters = evaluate(spark, kafka, app, spans, request.reason_contains)
    return _summarise(app, request, spans, letters)


def _summarise(app: AppSpec, request: ReplayRequest, spans: dict[str, list[int]], letters: list[DeadLetter]) -> ReplayPlan:
    table: dict[str, Counter] = {}
    for letter in letters:
        verdict = letter.verdict
        column = ("replay" if verdict == "replay" else "still fails" if verdict.startswith("still fails")
                  else verdict if verdict in ("already replayed", "filtered out") else "other")
        table.setdefault(letter.reason, Counter())[column] += 1
    columns = ("replay", "still fails", "already replayed", "filtered out", "other")
    by_reason: list[dict[str, Any]] = [{"reason": reason, "records": sum(c.values()), **{k: c[k] for k in columns}}
                                       for reason, c in sorted(table.items())]
    totals = {k: sum(r[k] for r in by_reason) for k in ("records", *columns)}
    failing = [{"at": d.at, "was": d.reason, "now": d.verdict.removeprefix("still fails: ")}
               for d in letters if d.verdict.startswith("still fails")][:20]
    return ReplayPlan(app.name, asdict(request), app.dead_letter_topic, spans, by_reason, totals, failing)


def apply_replay(spark, kafka: KafkaClientConfig, catalog: Catalog, plan: ReplayPlan, run_id: str) -> dict:
    """Produce the records that pass now (evaluated again: the ledger may have moved), then
    enter each acknowledged one in the ledger."""
    app = catalog.app(plan.app)
    letters = [d for d in evaluate(spark, kafka, app, plan.spans, plan.request["reason_contains"]) if d.verdict == "replay"]
    delivered: list[ReplayLedgerEntry] = []
    errors: list[str] = []

    def on_delivery(letter: DeadLetter):
        def report(err, msg):
            if err is not None:
                errors.append(f"{letter.at}: {err}")
            else:
                delivered.append(ReplayLedgerEntry(source=str(letter.source), dead_letter=letter.at,
                                                   to=f"{msg.topic()}/{msg.partition()}/{msg.offset()}", run_id=run_id,
                                                   at=now_iso()))
        return report

    # Records as large as the app accepts (its sink's request limit; librdkafka's default is less).
    limit = app.producer.max_request_size
    out = producer(kafka, **{"message.max.bytes": limit, "batch.size": min(limit, 1_000_000)})
    try:
        for letter in letters:
            topic, partition, source = letter.source_topic, letter.source_partition, letter.source
            if topic is None or partition is None or source is None:  # only an envelope is judged "replay"
                errors.append(f"{letter.at}: not a dead-letter envelope")
                continue
            try:
                out.produce(
                    topic, key=letter.key, value=letter.value, partition=partition,
                    headers=[(HEADER_SOURCE, source.encode()), (HEADER_DEAD_LETTER, letter.at.encode()),
                             (HEADER_RUN, run_id.encode())],
                    on_delivery=on_delivery(letter),
                )
            except (BufferError, KafkaException) as exc:  # this record only; the others go on
                errors.append(f"{letter.at}: {exc}")
            out.poll(0)
    finally:
        # Whatever was acknowledged is entered, also when producing stopped half-way: a second
        # run must not replay it again.
        out.flush(60)
        path = ledger_file(app)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as ledger:
            for entry in delivered:
                ledger.write(json.dumps(entry.to_json(), sort_keys=True) + "\n")
    if errors or len(delivered) != len(letters):
        raise RuntimeError(f"{len(delivered)} of {len(letters)} record(s) replayed (those are in the ledger); "
                           f"not acknowledged: {errors[:5] or 'flush timed out'}. Run the DAG again to replay the rest.")
    return {"replayed": [entry.to_json() for entry in delivered], "count": len(delivered),
            "summary": f"replayed {len(delivered)} record(s) of {plan.dead_letter_topic} to "
                       f"{', '.join(sorted({d.source_topic for d in letters if d.source_topic})) or 'no topic'}"}


def verify_replay(kafka: KafkaClientConfig, applied: dict) -> dict:
    """Each replayed record is on its input topic at the acknowledged offset, with its headers."""
    by_topic: dict[str, dict[int, list[int]]] = {}
    for entry in applied["replayed"]:
        topic, partition, offset = entry["to"].rsplit("/", 2)
        by_topic.setdefault(topic, {}).setdefault(int(partition), []).append(int(offset))
    found = 0
    problems = []
    expected = {e["to"]: e for e in applied["replayed"]}
    for topic, parts in by_topic.items():
        spans = {p: OffsetSpan(min(offsets), max(offsets) + 1) for p, offsets in parts.items()}
        for record in read_spans(kafka, topic, spans):
            entry = expected.get(f"{topic}/{record.partition}/{record.offset}")
            if entry is None:
                continue
            headers = {k: v.decode() for k, v in record.headers}
            if headers.get(HEADER_SOURCE) != entry["source"]:
                problems.append(f"{topic}/{record.partition}/{record.offset} is not the replay of {entry['source']}")
            found += 1
    if found != len(expected):
        problems.append(f"{len(expected) - found} replayed record(s) not found at their acknowledged offsets")
    if problems:
        raise RuntimeError("replay verification failed:\n  " + "\n  ".join(problems))
    return {"verified": found, "summary": f"all {found} replayed record(s) are on their input topic with their provenance"}
