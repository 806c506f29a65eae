"""Airflow's LocalExecutor, with a guard against a scheduler race of Airflow 3.3 that fails an
approval the moment it is approved (apache/airflow#72716, fix not released as of 3.3.2).

The race: a plan's approve task parks in "awaiting input" and its worker process exits. The
executor will report that exit as a SUCCESS of the task's try. If the operator approves before
the scheduler has read that report, Airflow resumes the same try in a second worker process. Once
that resumed attempt is running, the late SUCCESS looks to the scheduler like a task whose process
is gone while its state still says running ("state mismatch"), and it marks the approve task failed:
the run fails, and what was approved is never applied. The window is the parked process's last
seconds, up to `[workers] min_heartbeat_interval` (5 s) when Airflow's task supervisor misses the
exit; an operator who approves quickly, or a script, lands in it.

The scheduler already ignores such a report while `executor.has_task(ti)` holds, but the
LocalExecutor of 3.3 forgets a task once any of its processes reports. This executor counts the
processes it started per task try and keeps the try known until the last of them has reported, so
the late report of the parked process is ignored and the resumed attempt finishes. A report of the
last process is handled exactly as before (a process that dies while its task says running still
fails the task).

Configured as `AIRFLOW__CORE__EXECUTOR=streamops.airflow_executor.LocalExecutor` by the local
stack and docker/compose.yaml. The Celery executor needs no such guard: it follows only the newest
Celery task of a try, so the parked process's result is never read once the resumed one is sent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from airflow.executors.local_executor import LocalExecutor as AirflowLocalExecutor
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

_FINISHED = (TaskInstanceState.SUCCESS, TaskInstanceState.FAILED)


class ProcessesInFlight:
    """How many worker processes of each task try have started and not yet reported an end."""

    def __init__(self) -> None:
        self._count: Counter[TaskInstanceKey] = Counter()

    def started(self, keys: Iterable[TaskInstanceKey]) -> None:
        self._count.update(keys)

    def ended(self, key: TaskInstanceKey) -> None:
        if self._count[key] <= 1:
            self._count.pop(key, None)
        else:
            self._count[key] -= 1

    def running(self, key: TaskInstanceKey) -> bool:
        return self._count.get(key, 0) > 0


class LocalExecutor(AirflowLocalExecutor):
    """Airflow's LocalExecutor; a task try stays known to the scheduler while any of its worker
    processes runs (see the module's doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_flight = ProcessesInFlight()

    def _process_workloads(self, workload_list: Sequence[Any]) -> None:
        super()._process_workloads(workload_list)
        # Counted after Airflow queued them: results are read on this same thread (sync), later.
        self.in_flight.started(w.key for w in workload_list if isinstance(w.key, TaskInstanceKey))

    def change_state(self, key: Any, state: Any, info: Any = None, remove_running: bool = True) -> None:
        if isinstance(key, TaskInstanceKey) and state in _FINISHED:
            self.in_flight.ended(key)
        super().change_state(key, state, info, remove_running=remove_running)

    def has_task(self, task_instance: Any) -> bool:
        return super().has_task(task_instance) or self.in_flight.running(task_instance.key)
