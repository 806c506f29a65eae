"""Skip exactly the input records an operator names: the way past a poison record.

A record that fails the query (not the parser: those are dead-lettered already) fails every
restart, because a restart runs the same micro-batch again. Moving the input position
(recover_reset_offsets) skips whole partitions' worth of valid records with it. This skips only
the records named, as `topic:partition:offset` or `topic:partition:first-last`:

  * they are added to the app's skip list, `<checkpoint>/_runtime/skip-records.json` (each entry
    with the reason, run, user, time and note); the driver reads it at start and `records.parse`
    makes the operator's reason the error of exactly those records, so they go to the app's
    dead-letter topic with reason "skipped by operator ..." and their source coordinates;
  * the checkpoint is not touched (backed up all the same): every other record is processed
    exactly as before, from the same position.

The list stays (a reset or rebuild that reads those records again skips them again).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient
from tabulate import tabulate

from streamops.app_ops import driver_log_tail
from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import batch_marks, positions, query_dirs, uncommitted_batch
from streamops.failures import describe_failed_batches
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import MAX_OFFSET, MAX_PARTITION, OffsetSpan, end_offsets, topic_partitions, watermarks
from streamops.kafka_records import held_offsets, read_spans
from streamops.plans import JsonPlan
from streamops.recovery.common import RecoveryRefused, refuse_if_running, resolve_app
from streamops.recovery.lifecycle import NotResumed
from streamops.recovery.restart import restart_from_checkpoint
from streamops.runtime_records import DeadLetterEnvelope, FailedBatch, SkipEntry
from streamops.timestamps import now_iso
from streamops.waiting import DeadlineExceeded, poll_until

SKIP_REASON = "skipped by operator"
MAX_SPECS = 100  # items per run
MAX_RECORDS = 10_000  # offsets per run: more is a reset (recover_reset_offsets), not a skip
MAX_NOTE = 500
MAX_REASON = 1000  # the operator's reason in a dead letter: user, run id and note
SHOWN_PER_SPEC = 20  # records shown in the plan per item
# The form's pattern (the code checks the bounds exactly): offsets below 2^63 have at most 19 digits.
RECORD_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,248}:(0|[1-9][0-9]{0,9}):(0|[1-9][0-9]{0,18})(-(0|[1-9][0-9]{0,18}))?$"
# Digits bounded so int() never meets a huge string; the bounds themselves are checked in words.
_SPEC = re.compile(r"^(?P<topic>[A-Za-z0-9][A-Za-z0-9._-]{0,248}):(?P<partition>[0-9]{1,30}):(?P<first>[0-9]{1,30})"
                   r"(?:-(?P<last>[0-9]{1,30}))?$")


@dataclass(frozen=True)
class SkipSpec:
    text: str
    topic: str
    partition: int
    first: int
    last: int  # inclusive

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def parse_specs(items: object, problems: list[str]) -> list[SkipSpec]:
    """The named records, or problems appended (every item checked, each named)."""
    if not isinstance(items, list) or not items:
        problems.append("records must be a non-empty list of 'topic:partition:offset' or 'topic:partition:first-last' "
                        f"items, got {items!r}")
        return []
    if len(items) > MAX_SPECS:
        problems.append(f"records names {len(items)} items; at most {MAX_SPECS} per run")
        return []
    specs = []
    for item in items:
        found = _SPEC.fullmatch(item) if isinstance(item, str) else None
        if found is None:
            problems.append(f"record {item!r} is not 'topic:partition:offset' or 'topic:partition:first-last' "
                            "(e.g. 'oplog.operations:3:1200' or 'oplog.operations:3:1200-1210')")
            continue
        partition, first = int(found["partition"]), int(found["first"])
        last = int(found["last"]) if found["last"] is not None else first
        if partition > MAX_PARTITION:
            problems.append(f"record {item!r}: partition {partition} is out of range (at most {MAX_PARTITION})")
        elif max(first, last) > MAX_OFFSET:
            problems.append(f"record {item!r}: offset {max(first, last)} is out of range (Kafka offsets are at most "
                            f"{MAX_OFFSET})")
        elif last < first:
            problems.append(f"record {item!r}: the range ends before it starts ({first}-{last})")
        else:
            specs.append(SkipSpec(item, found["topic"], partition, first, last))
    total = sum(s.count for s in specs)
    if total > MAX_RECORDS:
        problems.append(f"records name {total} offsets; a skip takes at most {MAX_RECORDS}: to move past more, use "
                        "recover_reset_offsets")
    for i, one in enumerate(specs):
        for other in specs[i + 1:]:
            if (
                (one.topic, one.partition) == (other.topic, other.partition)
                and one.first <= other.last
                and other.first <= one.last
            ):
                problems.append(f"records {one.text!r} and {other.text!r} overlap: name each record once")
    return specs


def note_problem(note: object) -> str | None:
    if note is None:
        return None
    if not isinstance(note, str):
        return f"note must be text, got {note!r}"
    if len(note) > MAX_NOTE:
        return f"note is {len(note)} characters; at most {MAX_NOTE}"
    # Control, format (e.g. a right-to-left override) and line/paragraph separator characters
    # would let a note rewrite how a log line or a reason reads.
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in note):
        return "note contains a line break, control or formatting character: keep it to one line of plain text"
    return None


def skip_reason(user: str, run_id: str, note: str | None) -> str:
    """What the dead letters of the skipped records say (the envelope's `reason`)."""
    return f"{SKIP_REASON} {user} (run {run_id})" + (f": {note}" if note else "")


@dataclass
class SkipPlan(JsonPlan):
    DERIVED = ("records",)

    app: str
    state: str  # stopped | failed | crashed
    entries: list[dict]  # topic, partition, first, last, reason, run_id, user, at, note, offsets (present records)
    shown: list[dict]  # per record: topic, partition, offset, timestamp, size, key, preview, batch
    marks: dict[str, int | None]  # query -> last committed batch when planned
    version: str
    spark_conf: dict
    dead_letter_topic: str
    reason: str
    failed_batches: list[FailedBatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(len(e["offsets"]) for e in self.entries)

    def table(self) -> str:
        rows = [[r["topic"], r["partition"], r["offset"], r["timestamp"], r["size"], r["key"], r["preview"], r["batch"]]
                for r in self.shown]
        lines = [
            f"{self.app} is {self.state.upper()}"
            + (f"; its last driver: {describe_failed_batches(self.failed_batches)}" if self.failed_batches else ""),
            tabulate(rows, headers=["topic", "partition", "offset", "timestamp (UTC)", "bytes", "key", "value (start)", "batch"]),
        ]
        for e in self.entries:
            if len(e["offsets"]) > SHOWN_PER_SPEC:
                lines.append(f"... {e['topic']} partition {e['partition']} {e['first']}-{e['last']}: "
                             f"{len(e['offsets']) - SHOWN_PER_SPEC} more record(s) not shown")
        lines += [
            f"{self.records} record(s) will go to {self.dead_letter_topic} with reason '{self.reason}'; every other "
            "record is processed as before, from the same checkpoint position",
            f"will: back up the checkpoint, add the records to the skip list ({self.app}'s _runtime/skip-records.json), "
            f"start version {self.version}" + (f" with conf {self.spark_conf}" if self.spark_conf else "")
            + " from its checkpoint, and wait until the records are dead-lettered and the app has read past them",
        ]
        return "\n".join(lines + [f"NOTE: {n}" for n in self.notes])

    def summary(self) -> str:
        named = ", ".join(f"{e['topic']}:{e['partition']}:{e['first']}" + (f"-{e['last']}" if e["last"] != e["first"] else "")
                          for e in self.entries)
        return f"skip {self.records} record(s) of {self.app} ({named})"


def _preview(data: bytes | None, limit: int) -> str:
    if data is None:
        return "(null)"
    text = data[: limit * 4].decode("utf-8", errors="replace")
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stamp(epoch_ms: int) -> str:
    from streamops.records import iso_ms

    return iso_ms(epoch_ms) if epoch_ms and epoch_ms > 0 else "-"


def plan_skip(admin: AdminClient, kafka: KafkaClientConfig, catalog: Catalog, app_name: object, records: object,
              note: object, *, user: str, run_id: str) -> SkipPlan:
    problems: list[str] = []
    app = resolve_app(catalog, app_name, problems)
    specs = parse_specs(records, problems)
    problem = note_problem(note)
    if problem:
        problems.append(problem)
    if app is None or problems:
        raise RecoveryRefused(problems)
    note_text = note if isinstance(note, str) else None  # checked above: one line of text, or none
    refuse_if_running(app, "a skip", problems)
    runtime = AppRuntime(app.checkpoint_location())
    state = runtime.state()
    if state == "never started":
        problems.append(f"{app.name} has never been started here: there is nothing to skip past; deploy it with deploy_apps")
    inputs = sorted(set(app.inputs.values()))
    layout = topic_partitions(admin, inputs)
    marks: dict[tuple[str, int], tuple[int, int]] = {}
    for spec in specs:
        parts = layout.get(spec.topic)
        if spec.topic not in inputs:
            problems.append(f"record {spec.text!r}: topic {spec.topic!r} is not an input of {app.name} "
                            f"(inputs: {', '.join(inputs)})")
        elif parts is None:
            problems.append(f"record {spec.text!r}: topic {spec.topic!r} does not exist on the broker")
        elif spec.partition not in parts:
            problems.append(f"record {spec.text!r}: partition {spec.partition} of {spec.topic!r} does not exist "
                            f"(it has partitions 0-{max(parts)})")
        else:
            key = (spec.topic, spec.partition)
            if key not in marks:
                marks[key] = watermarks(admin, spec.topic, [spec.partition])[spec.partition]
            low, high = marks[key]
            held = held_offsets(low, high)
            if spec.last >= high:
                problems.append(f"record {spec.text!r}: offset {spec.last} is past the end of {spec.topic} partition "
                                f"{spec.partition} ({held})")
            elif spec.first < low:
                problems.append(f"record {spec.text!r}: offset {spec.first} of {spec.topic} partition {spec.partition} "
                                f"was deleted by retention ({held})")
    checkpoint = app.checkpoint_location()
    where = positions(checkpoint)
    for spec in specs:
        readers = {q: pos.offsets[spec.topic].get(spec.partition, 0) for q, pos in where.items() if spec.topic in pos.offsets}
        if readers and spec.first < min(readers.values()):
            at = ", ".join(f"query {q} is at offset {o}" for q, o in sorted(readers.items()))
            problems.append(f"record {spec.text!r} was already processed ({at} of {spec.topic} partition {spec.partition}): "
                            "skipping it now changes nothing; to process records again use recover_reset_offsets")
    for entry in runtime.skip_records():
        for spec in specs:
            if (
                (entry.topic, entry.partition) == (spec.topic, spec.partition)
                and spec.first <= entry.last
                and entry.first <= spec.last
            ):
                problems.append(f"record {spec.text!r} is already in the skip list (offsets {entry.first}-{entry.last}, "
                                f"run {entry.run_id} by {entry.user} at {entry.at})")
    if problems:
        raise RecoveryRefused(problems)

    reason = skip_reason(user, run_id, note_text)
    if len(reason) > MAX_REASON:
        raise RecoveryRefused([f"the dead letters' reason would be {len(reason)} characters (user, run id and note); at most "
                               f"{MAX_REASON}: shorten the note"])
    at = now_iso()
    driver = runtime.driver() or DriverRecord()
    failed = driver.failed_batches
    pending = {d.name: uncommitted_batch(d) for d in query_dirs(checkpoint)}
    notes: list[str] = []
    entries, shown = [], []
    for spec in specs:
        found = read_spans(kafka, spec.topic, {spec.partition: OffsetSpan(spec.first, spec.last + 1)})
        offsets = [r.offset for r in found]
        if len(offsets) < spec.count:
            notes.append(f"{spec.text}: {spec.count - len(offsets)} offset(s) hold no record (compaction or transaction "
                         "markers): nothing to skip there")
        entries.append({"topic": spec.topic, "partition": spec.partition, "first": spec.first, "last": spec.last,
                        "reason": reason, "run_id": run_id, "user": user, "at": at, "note": note_text, "offsets": offsets})
        for record in found[:SHOWN_PER_SPEC]:
            shown.append({"topic": record.topic, "partition": record.partition, "offset": record.offset,
                          "timestamp": _stamp(record.timestamp_ms), "size": len(record.value or b""),
                          "key": _preview(record.key, 24), "preview": _preview(record.value, 60),
                          "batch": _batch_of(record.topic, record.partition, record.offset, where, pending)})
        read_past = {
            q for q, pos in where.items()
            if spec.topic in pos.offsets and pos.offsets[spec.topic].get(spec.partition, 0) > spec.first
        }
        if read_past:
            notes.append(f"{spec.text}: query {', '.join(sorted(read_past))} already read past it (its output stays); the skip "
                         "applies to the queries that have not")
    in_failed = [s.text for s in specs if any(_covers(f, s) for f in failed)]
    if failed and len(in_failed) < len(specs):
        outside = [s.text for s in specs if s.text not in in_failed]
        notes.append(f"{', '.join(outside)} not in the batch the last driver failed on ({describe_failed_batches(failed)}): "
                     "check the offsets")
    return SkipPlan(
        app=app.name, state=state, entries=entries, shown=shown, marks=batch_marks(checkpoint),
        version=driver.launched_version or app.version, spark_conf=driver.launched_spark_conf,
        dead_letter_topic=app.dead_letter_topic, reason=reason, failed_batches=failed, notes=notes,
    )


def _covers(failed: FailedBatch, spec: SkipSpec) -> bool:
    return any(
        r["topic"] == spec.topic and r["partition"] == spec.partition and r["first"] <= spec.first and spec.last <= r["last"]
        for r in failed.get("ranges") or []
    )


def _batch_of(topic: str, partition: int, offset: int, where: dict, pending: dict) -> str:
    """Which micro-batch of each query reading the topic holds the record."""
    said = []
    for query, pos in sorted(where.items()):
        batch = pending.get(query)
        if batch and any(r["topic"] == topic and r["partition"] == partition and r["first"] <= offset <= r["last"]
                         for r in batch["ranges"]):
            said.append(f"{query}: batch {batch['batch']} (planned, not committed)")
        elif topic in pos.offsets:
            said.append(f"{query}: a later batch (at {pos.offsets[topic].get(partition, 0)})")
    return "; ".join(said) or "not read yet"


def entry_problems(app: AppSpec, entries: object) -> list[str]:
    """Skip-list entries handed over by another task (XCom), checked before they reach the
    driver: input topics of the app, offsets within Kafka's range, an operator's reason."""
    if not isinstance(entries, list) or not entries:
        return [f"entries must be a non-empty list, got {entries!r}"]
    problems = []
    for entry in entries:
        numbers = [entry.get(k) for k in ("partition", "first", "last")] if isinstance(entry, dict) else []
        if (not isinstance(entry, dict) or entry.get("topic") not in app.inputs.values()
                or any(isinstance(n, bool) or not isinstance(n, int) for n in numbers)
                or not (0 <= entry["partition"] <= MAX_PARTITION and 0 <= entry["first"] <= entry["last"] <= MAX_OFFSET)
                or not isinstance(entry.get("reason"), str) or not entry["reason"].startswith(SKIP_REASON)
                or len(entry["reason"]) > MAX_REASON):
            problems.append(f"entry {str(entry)[:200]} is not an input record range of {app.name} with an operator's reason")
    return problems


def apply_skip(app: AppSpec, plan: SkipPlan, start, kafka: KafkaClientConfig) -> dict:
    """Check nothing moved since the plan, back up, add the entries to the skip list, start the
    app via `start(version, spark_conf)` (the restart's own code)."""
    checkpoint = app.checkpoint_location()
    runtime = AppRuntime(checkpoint)
    problems = entry_problems(app, plan.entries)
    if problems:
        raise RecoveryRefused(["the plan this task received is not one the plan task makes:", *problems])
    if runtime.is_running():
        raise RecoveryRefused([f"{app.name} was started by someone else since the plan ({runtime.refusal(app.name)})"])
    if batch_marks(checkpoint) != plan.marks:
        raise RecoveryRefused(
            [f"the checkpoint moved since the plan ({plan.marks} -> {batch_marks(checkpoint)}): run the DAG again"]
        )
    # Verify reads the dead letters written from here on.
    dead_letters_from = {p: high for p, (_, high) in end_offsets(kafka, app.dead_letter_topic).items()}

    def add_entries() -> None:
        runtime.add_skip_records([SkipEntry.model_validate({k: v for k, v in e.items() if k != "offsets"}) for e in plan.entries])

    result = restart_from_checkpoint(app, plan.version, plan.spark_conf, start, label="before-skip", before_start=add_entries)
    return {**result, "skip_list": str(runtime.skip_file), "dead_letters_from": dead_letters_from,
            "summary": f"{plan.records} record(s) added to {app.name}'s skip list; " + result["summary"]}


def verify_skip(app: AppSpec, plan: SkipPlan, applied: dict, kafka: KafkaClientConfig, deadline_s: float) -> dict:
    """Wait until every skipped record is in the dead-letter topic with the plan's reason and its
    source coordinates, and every query reading it has committed a batch past it."""
    checkpoint = app.checkpoint_location()
    runtime = AppRuntime(checkpoint)
    wanted = {(e["topic"], e["partition"], o) for e in plan.entries for o in e["offsets"]}
    start = {int(p): int(o) for p, o in applied["dead_letters_from"].items()}
    seen: dict = {"dead_lettered": set(), "behind": []}

    def done() -> bool:
        if not runtime.is_running():
            record = runtime.driver() or DriverRecord()
            failed = record.failed_batches
            raise NotResumed(f"{app.name} is {runtime.state()} again: "
                             + (describe_failed_batches(failed) + ": " if failed else "")
                             + f"{record.reason or 'the driver died'}; last lines of its log:\n{driver_log_tail(checkpoint)}")
        ends = {p: high for p, (_, high) in end_offsets(kafka, app.dead_letter_topic).items()}
        # min(): a topic made anew may end before where the last look ended (nothing to read there).
        spans = {p: OffsetSpan(min(start.get(p, 0), high), high) for p, high in ends.items()}
        for letter in read_spans(kafka, app.dead_letter_topic, spans):
            try:
                envelope = DeadLetterEnvelope.model_validate_json(letter.value or b"")
            except ValueError:  # not a dead-letter envelope: none of the skipped records
                continue
            source = envelope.source
            # (A dead letter keeping the original by reference says so after the reason.)
            if envelope.reason.startswith(plan.reason):
                seen["dead_lettered"].add((source.topic, source.partition, source.offset))
        start.update(ends)
        where = positions(checkpoint)
        seen["behind"] = [
            f"query {q} at {pos.offsets[e['topic']].get(e['partition'], 0)} of {e['topic']} partition {e['partition']}"
            for e in plan.entries for q, pos in sorted(where.items())
            if e["topic"] in pos.offsets and pos.offsets[e["topic"]].get(e["partition"], 0) <= e["last"]
        ]
        return wanted <= seen["dead_lettered"] and not seen["behind"]

    try:
        poll_until(done, timeout=deadline_s, what=f"{app.name} to dead-letter the skipped records", max_interval=2)
    except DeadlineExceeded:
        missing = sorted(wanted - seen["dead_lettered"])
        raise NotResumed(f"within {deadline_s:g}s: {len(missing)} of {len(wanted)} skipped record(s) not in "
                         f"{app.dead_letter_topic} (e.g. {missing[:5]}); not read past yet: {seen['behind'] or 'none'}; "
                         f"{app.name} is still running, see app_status") from None
    batches = batch_marks(checkpoint)
    return {"dead_lettered": len(wanted), "batches": batches,
            "summary": f"{len(wanted)} skipped record(s) are in {app.dead_letter_topic} with reason '{plan.reason}'; "
                       f"{app.name} committed batches past them ({batches})"}
