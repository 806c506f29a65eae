"""The stateful apps under a steady load: `bench report`'s `stateful` part.

For the presence notifier and browser-activity in turn, at rising input rates (made beforehand
and paced like the router's latency load, 1% malformed), each app runs live on its catalog
trigger: once its queries run, a priming load (PRIME_S at the rate, every record committed: the
first batches run cold), then 30 s of warm-up, the measured seconds, and until it has committed
every record (an app that cannot commit its priming load is not sustained, and is not measured
further). Per rate (the dead letters and windows count the priming load too):
- latency: each measured input record to the commit of the micro-batch of the app's per-record
  query (notify, challenge) that read it (the batch's offsets and commit files of the checkpoint;
  its outputs are written before that commit, so this is what a reader waits at most);
- sustained: the app kept pace: its lag (records written, not yet committed) no larger in the
  measured window's second half than in its first, give or take one trigger's input, and every
  record committed in the end (an app that falls behind a rate grows its lag);
- exact windows: every window count the app emitted, its last update (update mode), against
  the count recomputed here from what the window query reads (browser-activity: its action
  records less those its dead-letter topic names; the notifier: the notifications it wrote); every window
  either side has is compared, so one dropped as late or counted twice shows;
- state: rows, memory and RocksDB's SST bytes of the stateful operators, the largest their
  progress showed.
The rates stop rising after the first one an app does not sustain. Nothing is asserted here.
"""

from __future__ import annotations

import time
import uuid
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from streamops.app_runtime import AppRuntime
from streamops.bench import (
    STEADY_WARMUP_S,
    bench_catalog,
    committed_everything,
    dead_lettered,
    launch_live,
    paced_produce,
    percentile,
    stop_live,
    wait_until_started,
)
from streamops.bench_probes import batches_by_query, cpu_seconds, cpu_used, driver_log_text
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import batch_offsets, committed_batches, query_dir
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import duration_ms, end_offsets
from streamops.kafka_records import Record, read_all
from streamops.loadgen import LoadSpec
from streamops.loadgen import events as load_events
from streamops.programs import settings_dict
from streamops.timestamps import epoch_ms, parse_recorded_time
from streamops.waiting import DeadlineExceeded, poll_until

STATEFUL_RATES = (1_000, 2_500, 5_000, 10_000)


@dataclass(frozen=True)
class StatefulApp:
    """What the bench needs to know of one stateful app: its per-record query, its window query's
    output and the settings naming the windows."""

    name: str
    record_query: str
    counts_output: str  # output role of the window counts
    key_field: str  # the counts' key, in their value
    window_setting: str
    slide_setting: str


STATEFUL_APPS = (
    StatefulApp("presence-notifier", "notify", "notification_counts", "user_id", "count_window", "count_slide"),
    StatefulApp("browser-activity", "challenge", "activity_counts", "fingerprint", "window", "slide"),
)


@dataclass
class StatefulFigure:
    app: str
    target_rate: int
    produced_rate: float
    records: int  # input records measured (written after the warm-up)
    p50_ms: float
    p99_ms: float
    max_ms: float
    caught_up_s: float | None  # last record written to its batch committed (None: not within the limit)
    sustained: bool
    lag_first_half: int  # the largest lag (records written, not committed) in the measured window's first half
    lag_second_half: int  # ... and in its second half: larger by more than a trigger's input = falling behind
    windows: int  # windows compared (either side has them)
    windows_wrong: int | None  # differing, missing or extra (None: not compared, the app did not catch up)
    dropped_by_watermark: int
    state_rows: int
    state_memory_bytes: int
    state_files_bytes: int
    dead_letters: int  # of the whole run (about 1% of the records are made malformed)
    trigger: str
    # Over the paced load (warm-up and measured window): CPU seconds per process role, and per query
    # its batches with input, mean rows, mean ms and mean ms outside the writing (bench_probes).
    cpu_s: dict[str, float] | None = None
    batches: dict[str, dict[str, float]] | None = None


def window_counts_of(events: Iterable[tuple[str, int]], window_ms: int, slide_ms: int) -> Counter:
    """(key, window start ms) -> count, for Spark's sliding event-time windows: each event at t
    counts in every window [s, s + window) with s a multiple of the slide and s <= t < s + window."""
    counts: Counter = Counter()
    for key, t in events:
        start = t - t % slide_ms
        while start > t - window_ms:
            counts[(key, start)] += 1
            start -= slide_ms
    return counts


def emitted_counts(records: Iterable[Record], key_field: str) -> Counter:
    """(key, window start ms) -> the window's last count the app wrote (update mode: the latest
    record of a window key, in offset order within its partition, is its final count)."""
    latest: dict[tuple[str, int], int] = {}
    for record in records:
        value = record.json()
        if value is None:
            continue
        start = parse_recorded_time(value["window_start"])
        if start is None:
            raise ValueError(f"{record.topic}/{record.partition}/{record.offset}: window_start {value['window_start']!r}")
        latest[(value[key_field], epoch_ms(start))] = int(value["count"])
    return Counter(latest)


def wrong_windows(expected: Counter, got: Counter) -> tuple[int, int, list[str]]:
    """(windows compared, windows that differ or exist on one side only, a few examples)."""
    keys = set(expected) | set(got)
    wrong = sorted(k for k in keys if expected.get(k, 0) != got.get(k, 0))
    return len(keys), len(wrong), [f"{k[0]} @ {k[1]}: expected {expected.get(k, 0)}, got {got.get(k, 0)}" for k in wrong[:3]]


def commit_times(query: Path, inputs: list[Record]) -> list[tuple[float, float]]:
    """(written, committed) in ms for each input record: its broker timestamp, and the commit of
    the batch that read it (the batch's offsets file says which; its commit file's time says
    when). Records no committed batch covers are left out."""
    ends: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
    for batch in committed_batches(query):
        offsets = batch_offsets(query, batch)
        if offsets is None:
            continue
        committed_ms = (query / "commits" / str(batch)).stat().st_mtime * 1000
        for topic, parts in offsets.items():
            for part, end in parts.items():
                marks = ends.setdefault((topic, int(part)), ([], []))
                marks[0].append(int(end))
                marks[1].append(committed_ms)
    times: list[tuple[float, float]] = []
    for record in inputs:
        batch_ends, committed = ends.get((record.topic, record.partition), ([], []))
        at = bisect_right(batch_ends, record.offset)  # the first batch whose end is past this offset
        if at < len(batch_ends):
            times.append((float(record.timestamp_ms), committed[at]))
    return times


def lag_growth(times: list[tuple[float, float]], step_ms: float = 100) -> tuple[int, int]:
    """The largest lag (records written, not yet committed) in the first and in the second half of
    the span the records were written in. An app that keeps pace has no larger a lag in the second
    half than in the first (its batches come round alike); one that falls behind grows it."""
    if not times:
        return 0, 0
    written = sorted(w for w, _ in times)
    committed = sorted(c for _, c in times)
    first, last = written[0], written[-1]
    middle = (first + last) / 2

    def largest(start: float, end: float) -> int:
        found, moment = 0, start
        while moment <= end:
            found = max(found, bisect_right(written, moment) - bisect_right(committed, moment))
            moment += step_ms
        return found

    return largest(first, middle), largest(middle, last)


def sample_state(runtime: AppRuntime, largest: dict[str, tuple[int, int, int]]) -> None:
    """Keep each stateful query's largest state figures seen so far (a batch with no data after
    the load reports RocksDB's files as 0 until its next flush)."""
    for query, progress in runtime.progress().items():
        if progress.stateful:
            seen = largest.get(query, (0, 0, 0))
            largest[query] = (max(seen[0], progress.state_rows), max(seen[1], progress.state_memory_bytes),
                              max(seen[2], progress.state_files_bytes))


# A running app's first batches with data run cold (Spark's code generation, the JIT): at 10,000
# events/s browser-activity's first batch took 25-30 s for its first 120,000 records (4,700 records/s),
# then ran at 14,000-25,000, so whether a rate counted as sustained hung on how cold that batch was.
# The app is primed first: this many seconds of load at the rate, every record committed, then the
# load that is measured. Start-up has its own figure (the drain's launch to first output).
PRIME_S = 10.0


def stateful_run(catalog: Catalog, kafka: KafkaClientConfig, workdir: Path, bench: StatefulApp, rate: int,
                 seconds: float = 30, warmup_s: float = STEADY_WARMUP_S, catch_up_limit_s: float = 180,
                 prime_s: float = PRIME_S) -> StatefulFigure:
    app = catalog.app(bench.name)
    trigger = app.trigger or "2 seconds"

    def load(count: int, seed: int) -> list[tuple[str, str, str]]:
        # Made just before it is sent: event times start now (the priming's are earlier, not later).
        return [(topic, key, value) for topic, key, value, _, _ in load_events(
            app, LoadSpec(count=count, keys=1000, rate=rate, malformed=0.01, seed=seed))]

    checkpoint = launch_live(catalog, kafka, workdir, app_name=bench.name)
    largest: dict[str, tuple[int, int, int]] = {}  # query -> its largest state rows, memory and SST bytes seen
    runtime = AppRuntime(checkpoint)

    def caught_up() -> bool:
        sample_state(runtime, largest)
        return committed_everything(checkpoint, kafka)

    try:
        wait_until_started(checkpoint)
        done = True
        if prime_s > 0:
            paced_produce(load(int(rate * prime_s), seed=rate + 1), rate, kafka)
            try:
                poll_until(caught_up, timeout=catch_up_limit_s, what=f"{bench.name} to commit its priming load",
                           interval=1, max_interval=3)
            except DeadlineExceeded:
                done = False
        started = time.time()
        cpu_s = batches = None
        if done:
            made = load(int(rate * (warmup_s + seconds)), seed=rate)
            log_at, log_from = runtime.driver_log(), len(driver_log_text(runtime))
            cpu_before = cpu_seconds()
            started = time.time()
            paced_produce(made, rate, kafka)
            cpu_s = cpu_used(cpu_before, cpu_seconds())
            # Batches logged while the load ran (a restarted driver's log is read whole).
            logged = driver_log_text(runtime)
            batches = batches_by_query(logged[log_from:] if runtime.driver_log() == log_at else logged)
            try:
                poll_until(caught_up, timeout=catch_up_limit_s, what=f"{bench.name} to commit every record", interval=1,
                           max_interval=3)
            except DeadlineExceeded:
                done = False
        sample_state(runtime, largest)
    finally:
        stop_live(checkpoint)
    measured_from_ms = (started + warmup_s) * 1000
    inputs = [r for topic in app.inputs.values() for r in read_all(kafka, topic) if r.timestamp_ms >= measured_from_ms]
    times = commit_times(query_dir(checkpoint, bench.record_query), inputs)
    latencies = sorted(committed - written for written, committed in times)
    last_commit = max((committed for _, committed in times), default=None)
    lag_first, lag_second = lag_growth(times)
    last_written = max((r.timestamp_ms for r in inputs), default=None)
    caught_up_s = (None if not done or last_commit is None or last_written is None
                   else round((last_commit - last_written) / 1000, 1))
    windows, wrong = 0, None
    if done:
        expected = _expected_counts(app, bench, kafka)
        got = emitted_counts(read_all(kafka, app.outputs[bench.counts_output]), bench.key_field)
        windows, wrong, examples = wrong_windows(expected, got)
        for example in examples:
            print(f"    window differs: {example}", flush=True)
    span_s = (last_written - min(r.timestamp_ms for r in inputs)) / 1000 if inputs and last_written else 0
    return StatefulFigure(
        app=bench.name, target_rate=rate, produced_rate=round(len(inputs) / span_s) if span_s else 0, records=len(inputs),
        p50_ms=percentile(latencies, 0.5) if latencies else 0, p99_ms=percentile(latencies, 0.99) if latencies else 0,
        max_ms=latencies[-1] if latencies else 0, caught_up_s=caught_up_s,
        # Kept pace: every record committed in the end, and the lag no larger in the measured
        # window's second half than in its first (give or take one trigger's input).
        sustained=caught_up_s is not None and lag_second <= lag_first + rate * duration_ms(trigger) / 1000,
        lag_first_half=lag_first, lag_second_half=lag_second,
        windows=windows, windows_wrong=wrong,
        dropped_by_watermark=sum(line.dropped_by_watermark for line in runtime.rates()),
        state_rows=sum(rows for rows, _, _ in largest.values()),
        state_memory_bytes=sum(memory for _, memory, _ in largest.values()),
        state_files_bytes=sum(files for _, _, files in largest.values()),
        dead_letters=sum(high - low for _, (low, high) in end_offsets(kafka, app.dead_letter_topic).items()),
        trigger=trigger, cpu_s=cpu_s, batches=batches,
    )


def _expected_counts(app: AppSpec, bench: StatefulApp, kafka: KafkaClientConfig) -> Counter:
    """The window counts recomputed from what the app's window query reads: browser-activity's
    action records (its input, less the records its dead-letter topic names: the input contract
    is tested elsewhere, the windows here), the notifier's notifications."""
    settings = settings_dict(app)  # an artifact app's defaults come from the version it runs
    window_ms = duration_ms(settings[bench.window_setting])
    slide_ms = duration_ms(settings[bench.slide_setting])
    events: list[tuple[str, int]] = []
    if bench.name == "browser-activity":
        dead = dead_lettered(kafka, app.dead_letter_topic)
        for record in read_all(kafka, app.inputs["logs"]):
            if (record.topic, record.partition, record.offset) in dead:
                continue
            event = record.json()
            if event["logger_name"] != settings["captcha_logger"]:
                events.append((event["browserHash"], _ms(event["@timestamp"])))
    else:  # the notifier counts the notifications it wrote
        for record in read_all(kafka, app.outputs["notifications"]):
            event = record.json()
            events.append((event["user_id"], _ms(event["event_time"])))
    return window_counts_of(events, window_ms, slide_ms)


def _ms(moment: str) -> int:
    parsed = parse_recorded_time(moment)
    if parsed is None:
        raise ValueError(f"not an ISO-8601 time: {moment!r}")
    return epoch_ms(parsed)


def stateful_figures(kafka: KafkaClientConfig, workdir: Path, run_id: str, rates: tuple[int, ...] = STATEFUL_RATES,
                     seconds: float = 30, apps: tuple[str, ...] | None = None) -> list[dict]:
    """Each stateful app (of `apps`; default all) at rising rates (topics of their own per run) until
    one is not sustained."""
    rows: list[dict] = []
    for bench in STATEFUL_APPS:
        if apps is not None and bench.name not in apps:
            continue
        for rate in rates:
            catalog = bench_catalog(kafka, f"{run_id}.st{uuid.uuid4().hex[:4]}", apps=(bench.name,))
            print(f"stateful: {bench.name} at {rate:,} events/s ...", flush=True)
            figure = stateful_run(catalog, kafka, workdir, bench, rate, seconds)
            print(f"  {figure}", flush=True)
            rows.append(asdict(figure))
            if not figure.sustained:
                break
    return rows

