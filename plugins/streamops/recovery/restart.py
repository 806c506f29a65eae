"""Restart a crashed app: check it is down, end what its dead driver left, restart it from its
checkpoint with the version and Spark conf it last ran with, and wait for progress."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.app_status import app_status
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import backup_checkpoint, batch_marks, query_dirs
from streamops.driver_processes import end_leftovers, leftovers
from streamops.failures import describe_failed_batches, describe_ranges
from streamops.kafka_client import KafkaClientConfig
from streamops.kafka_offsets import OffsetSpan
from streamops.kafka_records import read_spans
from streamops.plans import JsonPlan
from streamops.recovery.common import RecoveryRefused, resolve_app
from streamops.runtime_records import FailedBatch


@dataclass
class RestartPlan(JsonPlan):
    app: str
    state: str  # crashed | failed | stopped
    last_driver: dict  # pid, host, version, started/stopped at, reason
    leftovers: list[dict]
    lag: int
    batches: dict[str, int | None]  # query -> last committed batch
    version: str  # what will be started
    spark_conf: dict
    notes: list[str] = field(default_factory=list)
    failed_batches: list[FailedBatch] = field(default_factory=list)  # what the last driver failed on (driver.json)
    failed_again: bool = False  # on the same batch as the driver before it: a restart fails the same way
    largest_records: list[dict] = field(default_factory=list)  # of the failed batch: record, bytes

    def table(self) -> str:
        d = self.last_driver
        lines = [
            *([self.failure()] if self.failed_batches else []),
            f"{self.app} is {self.state.upper()}: last driver pid {d.get('pid')} on {d.get('host')}, version {d.get('version')}, "
            f"started {d.get('started_at')}, ended {d.get('stopped_at') or 'unrecorded (it died)'}"
            + (f": {d.get('reason')}" if d.get("reason") else ""),
            "checkpoint: " + (", ".join(f"{q} at batch {b}" for q, b in self.batches.items()) or "no committed batch"),
            f"lag: {self.lag} record(s) waiting",
            "left behind by the dead driver: "
            + ("; ".join(f"pid {p['pid']} {p['name']}: {p['command'][:120]}" for p in self.leftovers) or "nothing"),
            f"will: {'end those processes, ' if self.leftovers else ''}back up the checkpoint, start version {self.version}"
            f"{' with conf ' + str(self.spark_conf) if self.spark_conf else ''} from the checkpoint, and wait for progress",
        ]
        return "\n".join(lines + [f"NOTE: {n}" for n in self.notes])

    def failure(self) -> str:
        """The failed batch in words: which records, which error, and the way past it."""
        parts = []
        for f in self.failed_batches:
            if f.get("batch") is None:
                parts.append(f"query {f['query']} failed outside a micro-batch. The error: {f.get('error')}")
                continue
            ranges = f.get("ranges") or []
            head = (f"{self.app} failed on batch {f['batch']} again (the same batch as the previous failure): restarting "
                    "will fail the same way." if self.failed_again else
                    f"{self.app} failed on batch {f['batch']} (query {f['query']}); a restart runs that batch again.")
            example = (
                ", ".join(f'"{r["topic"]}:{r["partition"]}:<offset>"' for r in ranges[:3])
                or '"<topic>:<partition>:<offset>"'
            )
            largest = ("Its largest records: " + ", ".join(f"{r['record']} ({r['bytes']} bytes)" for r in self.largest_records)
                       + ". ") if self.largest_records else ""
            advice = (f"Find the record in the driver log and skip it with recover_skip_records (records: [{example}]). "
                      f"{largest}A dry run of recover_skip_records shows each named record (size, key, start of the value) "
                      "and the batch it is in."
                      if self.failed_again else
                      "If it fails on this batch again, a record in it fails the query: skip that record with "
                      "recover_skip_records.")
            parts.append(f"{head} Batch {f['batch']} covers {describe_ranges(ranges)}. "
                         f"The error: {str(f.get('error')).rstrip('.')}. {advice}")
        return "\n".join(parts)

    def summary(self) -> str:
        failed = describe_failed_batches(self.failed_batches) if self.failed_batches else ""
        again = " AGAIN, on the same batch as before: a restart fails the same way; skip the record with recover_skip_records"
        return (f"{self.app} is {self.state}" + (f" ({failed}{again if self.failed_again else ''})" if failed else "")
                + f"; lag {self.lag}; {len(self.leftovers)} leftover process(es)")


def plan_restart(catalog: Catalog, app_name: str, kafka: KafkaClientConfig) -> RestartPlan:
    problems: list[str] = []
    app = resolve_app(catalog, app_name, problems)
    if app is None:
        raise RecoveryRefused(problems)
    runtime = AppRuntime(app.checkpoint_location())
    state = runtime.state()
    driver = runtime.driver() or DriverRecord()
    if state == "running":
        status = app_status(app, kafka)
        age = f"{status.progress_age_s:.0f} s ago" if status.progress_age_s is not None else "never"
        raise RecoveryRefused([
            f"{app.name} is running (driver pid {driver.pid} on {driver.host}, last progress {age}, "
            f"lag {status.total_lag}): there is nothing to restart. If it is stuck, stop it with stop_apps "
            "(it escalates to SIGTERM and SIGKILL), then run this DAG"
        ])
    if state == "never started":
        raise RecoveryRefused([f"{app.name} has never been started here: start it with deploy_apps"])
    notes = []
    if state == "stopped":
        notes.append(f"{app.name} was stopped on purpose ({driver.reason or 'a stop request'}), not crashed")
    if driver.host and driver.host != socket.gethostname():
        notes.append(f"the last driver ran on {driver.host}, not here: its processes there (process group "
                     f"{driver.process_group}: spark-submit, its JVM) cannot be checked or ended from here; its lease "
                     "ran out (no heartbeat), so its Python driver is gone or paused, and it can no longer write a batch "
                     f"(a paused one stops when it wakes). Check that host with `ps -g {driver.process_group}`")
    if not query_dirs(app.checkpoint_location()):
        notes.append("the checkpoint holds no query yet: the app starts from the catalog's starting position")
    failed = driver.failed_batches if state == "failed" else []
    return RestartPlan(
        app=app.name, state=state,
        last_driver={"pid": driver.pid, "host": driver.host, "version": driver.version, "started_at": driver.started_at,
                     "stopped_at": driver.stopped_at, "outcome": driver.outcome, "reason": driver.reason},
        leftovers=[asdict(p) for p in leftovers(driver)],
        lag=app_status(app, kafka).total_lag,
        batches=batch_marks(app.checkpoint_location()),
        version=driver.launched_version or app.version,
        spark_conf=driver.launched_spark_conf,
        notes=notes,
        failed_batches=failed,
        failed_again=bool(failed) and _same_as_previous_failure(runtime, failed),
        largest_records=_largest_records(kafka, failed),
    )


def _largest_records(kafka: KafkaClientConfig, failed: list[FailedBatch], count: int = 3, at_most: int = 20_000) -> list[dict]:
    """The biggest records of the failed batches (the usual suspects when a record is too large
    for a sink), as recover_skip_records items; nothing for a batch of more than `at_most` records."""
    ranges = [r for f in failed for r in f.get("ranges") or []]
    if not ranges or sum(r["last"] - r["first"] + 1 for r in ranges) > at_most:
        return []
    found = []
    try:
        for topic in sorted({r["topic"] for r in ranges}):
            spans = {r["partition"]: OffsetSpan(r["first"], r["last"] + 1) for r in ranges if r["topic"] == topic}
            found += read_spans(kafka, topic, spans, timeout=30)
    except Exception:  # noqa: BLE001 - a hint only: the plan stands without it
        return []
    found.sort(key=lambda r: len(r.key or b"") + len(r.value or b""), reverse=True)
    return [{"record": f"{r.topic}:{r.partition}:{r.offset}", "bytes": len(r.key or b"") + len(r.value or b"")}
            for r in found[:count]]


def _same_as_previous_failure(runtime: AppRuntime, failed: list[FailedBatch]) -> bool:
    """Did the driver before the last one fail on the same batch (query, id and offsets)?"""
    ends = [e for e in runtime.history() if e.get("event") == "stopped"]
    if len(ends) < 2 or ends[-2].get("outcome") != "failed":
        return False

    def batches(entries: list[FailedBatch]) -> list[tuple]:
        # By value: driver.json keeps a range's keys as written, the history's record in declared order.
        return sorted((f["query"], f.get("batch"), tuple(sorted((r["topic"], r["partition"], r["first"], r["last"])
                                                                  for r in f.get("ranges") or [])))
                      for f in entries if f.get("batch") is not None)

    return bool(batches(failed)) and batches(failed) == batches(ends[-2].get("failed_batches") or [])


def apply_restart(app: AppSpec, plan: RestartPlan, start) -> dict:
    """End leftovers, back up the checkpoint, start the app via `start(version, spark_conf)`."""
    return restart_from_checkpoint(app, plan.version, plan.spark_conf, start)


def restart_from_checkpoint(app: AppSpec, version: str, spark_conf: dict, start, label: str = "before-restart",
                            before_start: Callable[[], None] | None = None) -> dict:
    """The restart itself (also recover_skip_records'): end leftovers, back up the checkpoint
    (`<time>-<label>`), run `before_start`, start via `start(version, spark_conf)`."""
    checkpoint = app.checkpoint_location()
    runtime = AppRuntime(checkpoint)
    if runtime.is_running():
        raise RecoveryRefused([f"{app.name} was started by someone else since the plan ({runtime.refusal(app.name)})"])
    # Re-scan: the plan may be minutes old.
    ended = end_leftovers(leftovers(runtime.driver() or DriverRecord()))
    backup = str(backup_checkpoint(checkpoint, label)) if query_dirs(checkpoint) else None
    if before_start is not None:
        before_start()
    started = start(version, spark_conf)
    return {"ended_processes": ended, "backup": backup, "pid": started.pid, "version": version,
            "driver_log": started.driver_log, "summary": f"restarted {app.name} as pid {started.pid} (version {version})"
            + (f"; ended {len(ended)} leftover process(es)" if ended else "") + (f"; backup {backup}" if backup else "")}

