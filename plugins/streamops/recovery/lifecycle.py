"""The wait for a restarted app to make progress again (a dead driver's leftover processes:
streamops.driver_processes)."""

from __future__ import annotations

import time

from streamops.app_ops import driver_log_tail
from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.app_status import app_status
from streamops.catalog import AppSpec
from streamops.kafka_client import KafkaClientConfig
from streamops.waiting import DeadlineExceeded, poll_until


class NotResumed(RuntimeError):
    pass


def await_resumed(
    app: AppSpec, kafka: KafkaClientConfig, lag_before: int | None, deadline_s: float, caught_up: bool = False
) -> dict:
    """Wait until the new driver completes micro-batches (or reports idle with nothing to read)
    and its lag is below `lag_before` (None: any lag; with `caught_up`: zero). Raise NotResumed
    naming why."""
    runtime = AppRuntime(app.checkpoint_location())
    started = time.monotonic()
    seen: dict = {}

    def resumed() -> bool:
        if not runtime.is_running():
            record = runtime.driver() or DriverRecord()
            raise NotResumed(
                f"{app.name} is {runtime.state()} again: {record.reason or 'the driver died'}; last lines of its log:\n"
                f"{driver_log_tail(app.checkpoint_location())}"
            )
        record = runtime.driver() or DriverRecord()
        status = app_status(app, kafka)
        seen.update(batches=status.batches, lag=status.total_lag, idle=bool(record.last_idle_at))
        progressed = set(status.batches) >= set(record.queries_started or ["?"])
        if not (progressed or (seen["idle"] and status.lags and status.total_lag == 0)):
            return False
        if caught_up:
            return status.total_lag == 0
        return lag_before is None or status.total_lag == 0 or status.total_lag < lag_before

    try:
        poll_until(resumed, timeout=deadline_s, what=f"{app.name} to make progress", max_interval=2)
    except DeadlineExceeded:
        raise NotResumed(
            f"{app.name} did not {'catch up' if caught_up else 'make progress'} within {deadline_s:g}s: batches "
            f"{seen.get('batches')}, lag {lag_before} -> {seen.get('lag')}; it is still running, see app_status"
        ) from None
    return {"seconds": round(time.monotonic() - started, 1), "batches": seen["batches"], "lag_before": lag_before,
            "lag_after": seen["lag"]}
