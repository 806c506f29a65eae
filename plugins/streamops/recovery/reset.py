"""Reset an app's input position: the Spark counterpart of `kafka-consumer-groups --reset-offsets`.

Spark reads its position from the checkpoint and applies `startingOffsets` only to a new one, so
a reset is: back up the checkpoint, retire its query folders, and start the app on a new
checkpoint at the planned offsets (Spark's JSON of offsets per topic and partition). State lives
in the checkpoint too: a stateful app starts with empty state (the rebuild DAG rebuilds it).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from confluent_kafka.admin import AdminClient
from tabulate import tabulate

from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import backup_checkpoint, batch_marks, initial_offsets, positions, query_dirs, retire_queries
from streamops.kafka_offsets import BACK, MAX_OFFSET, TIME, parse_moment, time_range_spans, topic_partitions, watermarks
from streamops.plans import JsonPlan
from streamops.recovery.common import RecoveryRefused, keeps_state, name_problem, refuse_if_running, resolve_app
from streamops.timestamps import iso_seconds_utc
from streamops.waiting import poll_until

MODES = ("earliest", "latest", "datetime", "duration", "shift", "offsets")


@dataclass
class ResetRequest:
    app: str
    mode: str = "earliest"
    to_datetime: str | None = None  # mode datetime: ISO-8601 with timezone
    duration: str | None = None  # mode duration: "2 hours" back from now
    shift: int | None = None  # mode shift: +N skips N records per partition, -N replays N
    offsets: dict | None = None  # mode offsets: {"topic": {"0": 42, ...}}
    partitions: list[str] = field(default_factory=list)  # "topic" or "topic:N"; empty: every input partition


@dataclass
class PartitionReset:
    topic: str
    partition: int
    current: int | None  # next offset the checkpoint would read (None: never read)
    new: int
    earliest: int
    latest: int
    selected: bool

    def change(self) -> str:
        if self.current is None:
            return f"starts at {self.new} (no position before)"
        if self.new < self.current:
            return f"replays {self.current - self.new}"
        if self.new > self.current:
            return f"skips {self.new - self.current}"
        return "unchanged"


@dataclass
class ResetPlan(JsonPlan):
    DERIVED = ("replayed", "skipped")

    app: str
    request: dict
    rows: list[PartitionReset]
    kept: dict[str, dict[str, int]]  # topics the queries read besides the inputs: position kept
    marks: dict[str, int | None]  # query -> last committed batch when planned
    stateful: bool
    running: bool = False
    warnings: list[str] = field(default_factory=list)
    planned_at: str = ""

    def starting_offsets(self) -> dict[str, dict[str, int]]:
        out = {topic: dict(parts) for topic, parts in self.kept.items()}
        for row in self.rows:
            out.setdefault(row.topic, {})[str(row.partition)] = row.new
        return out

    @property
    def replayed(self) -> int:
        return sum(r.current - r.new for r in self.rows if r.current is not None and r.new < r.current)

    @property
    def skipped(self) -> int:
        return sum(r.new - r.current for r in self.rows if r.current is not None and r.new > r.current)

    def table(self) -> str:
        head = tabulate(
            [[r.topic, r.partition, "-" if r.current is None else r.current, r.new, r.change(),
              f"{r.earliest}..{r.latest}", "yes" if r.selected else "no (kept)"] for r in self.rows],
            headers=["input topic", "partition", "checkpoint offset", "new offset", "records", "retained", "selected"],
        )
        lines = [head, f"in total: {self.replayed} record(s) replayed, {self.skipped} skipped"]
        if self.kept:
            lines.append("other topics the queries read keep their position: " + json.dumps(self.kept, sort_keys=True))
        if self.stateful:
            lines.append(
                f"STATE: {self.app} keeps state in its checkpoint; on the new checkpoint it starts EMPTY, built only from "
                "the records read from the new offsets. To rebuild it from everything retained instead, use rebuild_app_state."
            )
        lines.append("will: back up the checkpoint, retire it, and start the app on a new checkpoint at the new offsets")
        if self.running:
            lines.append(f"NOTE: {self.app} is running: stop it with stop_apps first; applying now is refused")
        return "\n".join(lines + [f"WARNING: {w}" for w in self.warnings])

    def summary(self) -> str:
        return f"{self.replayed} replayed, {self.skipped} skipped"


def _selection(
    app: AppSpec, layout: dict[str, list[int] | None], request: ResetRequest, problems: list[str]
) -> set[tuple[str, int]]:
    """The (topic, partition) pairs the request moves."""
    inputs = sorted(set(app.inputs.values()))
    if request.mode == "offsets":
        if request.partitions:
            problems.append("with mode 'offsets' the offsets name the partitions: leave 'partitions' empty")
        return {(t, int(p)) for t, parts in (request.offsets or {}).items() for p in parts}
    if not request.partitions:
        return {(t, p) for t in inputs for p in layout.get(t) or []}
    chosen: set[tuple[str, int]] = set()
    for item in request.partitions:
        topic, _, partition = str(item).partition(":")
        problem = name_problem(topic, f"partition selector {item!r}: topic")
        if problem:
            problems.append(problem)
        elif topic not in inputs:
            problems.append(f"partition selector {item!r}: {topic!r} is not an input of {app.name} (inputs: {', '.join(inputs)})")
        elif not partition:
            chosen |= {(topic, p) for p in layout.get(topic) or []}
        elif not re.fullmatch(r"[0-9]+", partition):
            problems.append(f"partition selector {item!r}: the partition must be a number, as in {topic}:0")
        elif int(partition) not in (layout.get(topic) or []):
            problems.append(f"partition {partition} of {topic!r} does not exist (it has partitions {_span(layout.get(topic))})")
        else:
            chosen.add((topic, int(partition)))
    return chosen


def _span(parts: list[int] | None) -> str:
    return f"{min(parts)}-{max(parts)}" if parts else "none"


def _check_offsets(app: AppSpec, layout: dict, offsets: object, problems: list[str]) -> None:
    if not isinstance(offsets, dict) or not offsets:
        problems.append('mode \'offsets\' needs offsets such as {"<input topic>": {"0": 42, "1": 17}}')
        return
    for topic, parts in offsets.items():
        problem = name_problem(topic, "offsets: topic")
        if problem:
            problems.append(problem)
            continue
        if topic not in app.inputs.values():
            problems.append(f"offsets: {topic!r} is not an input of {app.name} "
                            f"(inputs: {', '.join(sorted(set(app.inputs.values())))})")
            continue
        if not isinstance(parts, dict) or not parts:
            problems.append(f"offsets: {topic!r} needs a map of partition -> offset, such as {{\"0\": 42}}")
            continue
        for partition, offset in parts.items():
            if not re.fullmatch(r"[0-9]+", str(partition)):
                problems.append(f"offsets: {topic!r} partition {partition!r} must be a number")
            elif int(partition) not in (layout.get(topic) or []):
                problems.append(f"offsets: partition {partition} of {topic!r} does not exist "
                                f"(it has partitions {_span(layout.get(topic))})")
            elif isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
                problems.append(f"offsets: {topic!r} partition {partition}: offset {offset!r} must be a whole number from 0 "
                                f"to {MAX_OFFSET} (Kafka offsets are 64-bit)")


def plan_reset(
    admin: AdminClient, catalog: Catalog, request: ResetRequest, *, now: datetime | None = None, for_apply: bool = False
) -> ResetPlan:
    """Per input partition: where the checkpoint is, where the reset puts it, records replayed or
    skipped. Refuses (naming every problem) before anything is changed."""
    at = now or datetime.now(UTC)
    shift = request.shift
    problems: list[str] = []
    app = resolve_app(catalog, request.app, problems)
    moment: datetime | None = None
    if request.mode not in MODES:
        problems.append(f"mode {request.mode!r} must be one of: {', '.join(MODES)}")
    elif request.mode == "datetime":
        try:
            moment = parse_moment(request.to_datetime or "", "to_datetime", allowed={TIME}).at
        except ValueError as exc:
            problems.append(str(exc))
        else:
            if moment is not None and moment > at:
                problems.append(f"to_datetime {request.to_datetime} is in the future; use mode 'latest' to skip to the end")
    elif request.mode == "duration":
        try:
            moment = parse_moment(request.duration or "", "duration", at, allowed={BACK}).at
        except ValueError as exc:
            problems.append(str(exc))
    elif request.mode == "shift" and (isinstance(shift, bool) or not isinstance(shift, int) or shift == 0):
        problems.append(f"shift {shift!r} must be a non-zero whole number (-N replays N records per partition, +N skips N)")
    elif request.mode == "shift" and shift is not None and abs(shift) > MAX_OFFSET:
        problems.append(f"shift {shift} is beyond Kafka's offsets: it must be from -{MAX_OFFSET} to {MAX_OFFSET}")
    if app is None:
        raise RecoveryRefused(problems)
    if for_apply:
        refuse_if_running(app, "a reset", problems)
    inputs = sorted(set(app.inputs.values()))
    layout = topic_partitions(admin, inputs)
    problems += [f"input topic {t!r} does not exist on the broker" for t, parts in layout.items() if parts is None]
    if request.mode == "offsets":
        _check_offsets(app, layout, request.offsets, problems)
    chosen = _selection(app, layout, request, problems) if not problems else set()
    if problems:
        raise RecoveryRefused(problems)

    checkpoint = app.checkpoint_location()
    current: dict[tuple[str, int], int] = {}
    warnings: list[str] = []
    kept: dict[str, dict[str, int]] = {}
    for query in positions(checkpoint).values():
        for topic, offsets in query.offsets.items():
            for partition, offset in offsets.items():
                if topic not in inputs:
                    kept.setdefault(topic, {})[str(partition)] = min(offset, kept.get(topic, {}).get(str(partition), offset))
                elif (topic, partition) in current and current[(topic, partition)] != offset:
                    warnings.append(f"the queries are at different offsets on {topic} p{partition}; the lower one, "
                                    f"{min(offset, current[(topic, partition)])}, is shown and kept where not selected")
                    current[(topic, partition)] = min(offset, current[(topic, partition)])
                else:
                    current[(topic, partition)] = offset
    rows: list[PartitionReset] = []
    for topic in inputs:
        parts = layout[topic] or []
        marks = watermarks(admin, topic, parts)
        # Where the records written since the moment begin.
        since = time_range_spans(admin, topic, parts, moment, None) if moment else {}
        for p in parts:
            low, high = marks[p]
            now_at = current.get((topic, p))
            selected = (topic, p) in chosen
            new = now_at if now_at is not None else low  # not selected: where it is (a new checkpoint: earliest)
            if selected:
                if request.mode == "earliest":
                    new = low
                elif request.mode == "latest":
                    new = high
                elif request.mode in ("datetime", "duration"):
                    new = since[p].start
                elif request.mode == "shift":
                    if now_at is None or shift is None:  # (a missing shift was refused above)
                        problems.append(f"{topic} p{p} has no position in the checkpoint to shift from; use another mode")
                        continue
                    new = min(max(now_at + shift, low), high)
                    if new != now_at + shift:
                        warnings.append(f"{topic} p{p}: shifting {now_at} by {shift:+d} leaves the retained range "
                                        f"{low}..{high}; set to {new}")
                else:
                    new = int((request.offsets or {})[topic][str(p)])
                    if not low <= new <= high:
                        problems.append(f"offsets: {topic} p{p} offset {new} is outside the retained range {low}..{high}")
            rows.append(PartitionReset(topic, p, now_at, new, low, high, selected))
    if problems:
        raise RecoveryRefused(problems)
    return ResetPlan(
        app=app.name, request=asdict(request), rows=rows, kept=kept, marks=batch_marks(checkpoint),
        stateful=keeps_state(app), running=AppRuntime(checkpoint).is_running(), warnings=warnings, planned_at=iso_seconds_utc(at),
    )


def apply_reset(app: AppSpec, plan: ResetPlan, start) -> dict:
    """Back up and retire the checkpoint, then `start(starting_offsets_json)` on a new one."""
    problems: list[str] = []
    refuse_if_running(app, "a reset", problems)
    checkpoint = app.checkpoint_location()
    if not problems and batch_marks(checkpoint) != plan.marks:
        problems.append(
            f"the checkpoint moved since the plan (batches {plan.marks} -> {batch_marks(checkpoint)}): run the DAG again"
        )
    if problems:
        raise RecoveryRefused(problems)
    backup = str(backup_checkpoint(checkpoint, "before-reset")) if query_dirs(checkpoint) else None
    retire_queries(checkpoint)
    started = start(json.dumps(plan.starting_offsets(), sort_keys=True))
    return {"backup": backup, "pid": started.pid, "driver_log": started.driver_log,
            "starting_offsets": plan.starting_offsets(),
            "summary": f"{app.name} restarted on a new checkpoint ({plan.replayed} replayed, {plan.skipped} skipped); "
                       f"old checkpoint backed up to {backup}"}


def verify_reset(app: AppSpec, plan: ResetPlan, deadline_s: float = 120.0) -> dict:
    """Every query of the new checkpoint started exactly at the planned offsets."""
    wanted = plan.starting_offsets()
    checkpoint = app.checkpoint_location()
    started: dict[str, dict] = {}

    def recorded() -> bool:
        for query in query_dirs(checkpoint):
            offsets = initial_offsets(query)
            if offsets is not None:  # partitions as the plan's JSON names them
                started[query.name] = {t: {str(p): o for p, o in parts.items()} for t, parts in offsets.items()}
        return bool(started) and len(started) == len(query_dirs(checkpoint))

    poll_until(recorded, timeout=deadline_s, what=f"{app.name}'s queries to record their starting offsets", max_interval=1)
    wrong = [
        f"query {q} started {t} p{p} at {o}, planned {wanted.get(t, {}).get(p)}"
        for q, offsets in started.items() for t, parts in offsets.items() for p, o in parts.items()
        # A topic the plan does not name (a query reading the app's own output on a first start)
        # starts where Spark's default puts it; only planned positions are checked.
        if t in wanted and wanted[t].get(p) != o
    ]
    if wrong:
        raise RuntimeError("the app did not start at the planned offsets:\n  " + "\n  ".join(wrong))
    return {"started_at_offsets": started,
            "summary": f"every query ({', '.join(sorted(started))}) started exactly at the planned offsets"}
