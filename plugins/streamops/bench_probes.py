"""What a bench run measures beside its figures: where the machine's CPU went (per process role,
from psutil), and what the driver's batches say (its per-batch log lines: Spark's durationMs)."""

from __future__ import annotations

import os
import re
from typing import TypedDict

from streamops.app_runtime import AppRuntime

# The driver's line per batch (streamops.driver.progress): "query <app>.<query> batch <n>: <rows> rows in,
# ... <ms> ms (addBatch <ms>, queryPlanning <ms>, ...)": Spark's durationMs of the batch.
BATCH_LINE = re.compile(r"query (?P<query>\S+) batch (?P<batch>\d+): (?P<rows>\d+) rows in, [\d.]+ rows/s processed, "
                        r"(?P<ms>\d+) ms \((?P<phases>[^)]*)\)")
ADD_BATCH = re.compile(r"\baddBatch (\d+)")


def logged_batches(log_text: str, after_batch: int = -1) -> list[tuple[int, int, int, int]]:
    """(batch id, rows in, milliseconds, of which writing: Spark's addBatch) of every batch after
    `after_batch` that had input, once each (a restarted query could log one again: the last line wins)."""
    seen: dict[tuple[str, int], tuple[int, int, int, int]] = {}
    for match in BATCH_LINE.finditer(log_text):
        batch, rows = int(match["batch"]), int(match["rows"])
        if batch > after_batch and rows:
            add_batch = ADD_BATCH.search(match["phases"])
            seen[(match["query"], batch)] = (batch, rows, int(match["ms"]), int(add_batch[1]) if add_batch else 0)
    return [seen[key] for key in sorted(seen, key=lambda k: (k[1], k[0]))]


class BatchCosts(TypedDict):
    batches: int
    inside_batches_rate: float | None
    fixed_cost_s: float | None
    writing_rate: float | None
    mean_batch: float | None


def batch_costs(batches: list[tuple[int, int, int, int]]) -> BatchCosts:
    """What a run's batches say about the model in docs/performance.md (a batch of B records takes
    F + B / R), from Spark's own durations: the records/s inside batches; F, the mean time of a batch
    outside its writing (planning, offsets, the offset and commit logs); R, the records/s of the
    writing itself (addBatch: reading, parsing, routing, producing). addBatch also holds the job's
    scheduling and the sink's planning, so F here is a lower bound of the fixed cost."""
    if not batches:
        return {"batches": 0, "inside_batches_rate": None, "fixed_cost_s": None, "writing_rate": None, "mean_batch": None}
    rows = sum(b[1] for b in batches)
    total_s, writing_s = sum(b[2] for b in batches) / 1000, sum(b[3] for b in batches) / 1000
    return {"batches": len(batches), "inside_batches_rate": rows / total_s if total_s else None,
            "fixed_cost_s": (total_s - writing_s) / len(batches), "writing_rate": rows / writing_s if writing_s else None,
            "mean_batch": rows / len(batches)}


# Who the machine's CPU went to during a measured window, by a process's command line (the first match wins).
CPU_ROLES = (
    ("Spark executors", "CoarseGrainedExecutorBackend"),
    ("Spark driver (JVM)", "org.apache.spark.deploy.SparkSubmit"),
    ("Spark driver (Python)", "entrypoints/driver.py"),
    ("Python workers (pyspark)", "pyspark.daemon"),
    ("Spark master and workers", "org.apache.spark.deploy."),
    ("Kafka broker", "kafka.Kafka"),
)


def cpu_role(cmdline: list[str], own_pid: int, pid: int) -> str:
    if pid == own_pid:
        return "bench (producer)"
    line = " ".join(cmdline)
    return next((role for role, marker in CPU_ROLES if marker in line), "other")


def cpu_seconds() -> dict[int, tuple[str, float]]:
    """Per process on the machine now: (role, user + system CPU seconds so far). Every process counts,
    the bench's or not (a running cluster profile's executors among the bench's roles, a test suite
    in "other"): run a bench on an otherwise idle machine."""
    import psutil

    taken = {}
    for process in psutil.process_iter(["cmdline"]):
        try:
            times = process.cpu_times()
            taken[process.pid] = (cpu_role(process.info["cmdline"] or [], os.getpid(), process.pid),
                                  times.user + times.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return taken


def cpu_used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per role between two cpu_seconds() snapshots (a process started between them counts from 0;
    one that ended between them is not counted), largest first."""
    used: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        used[role] = used.get(role, 0.0) + seconds - (before[pid][1] if pid in before and before[pid][0] == role else 0.0)
    return {role: round(seconds, 1) for role, seconds in sorted(used.items(), key=lambda item: -item[1]) if seconds >= 0.05}


def predicted_rate(batch: float, fixed_cost_s: float, rate: float) -> float:
    """The model's records/s for batches of `batch` records: B / (F + B / R)."""
    return batch / (fixed_cost_s + batch / rate)


def batches_by_query(log_text: str) -> dict[str, dict[str, float]]:
    """Per query of a driver's log (a stretch of it): batches with input, their mean rows, mean
    milliseconds, and mean milliseconds outside the writing (Spark's addBatch): where a stateful
    app's time goes, query by query."""
    by_query: dict[str, list[tuple[int, int, int]]] = {}
    for match in BATCH_LINE.finditer(log_text):
        if int(match["rows"]):
            add_batch = ADD_BATCH.search(match["phases"])
            by_query.setdefault(match["query"], []).append(
                (int(match["rows"]), int(match["ms"]), int(add_batch[1]) if add_batch else 0))
    return {query: {"batches": len(rows), "mean_rows": round(sum(r for r, _, _ in rows) / len(rows)),
                    "mean_ms": round(sum(ms for _, ms, _ in rows) / len(rows)),
                    "mean_outside_writing_ms": round(sum(ms - add for _, ms, add in rows) / len(rows))}
            for query, rows in sorted(by_query.items())}


def driver_log_text(runtime: AppRuntime) -> str:
    """The running (or last) driver's log so far; empty before it has one."""
    log_path = runtime.driver_log()
    return log_path.read_text(errors="replace") if log_path and log_path.exists() else ""
