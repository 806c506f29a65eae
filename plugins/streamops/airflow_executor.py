"""Airflow's LocalExecutor, with a guard against a scheduler race of Airflow 3.3 that fails an
approval the moment it is approved (apache/airflow#72716, fix not released as of 3.3.2).

The race: a plan's approve task parks in "awaiting input" and its task process exits. The
executor will report that exit as a SUCCESS of the task's try. If the operator approves before
the scheduler has read that report, Airflow resumes the same try in a second task process. Once
that resumed attempt has been handed to a worker (queued or running), the late SUCCESS looks to the
scheduler like a task whose process is gone while its state says otherwise ("state mismatch"), and
it marks the approve task failed: the run fails, and what was approved is never applied. The window
is the parked process's last moments: usually milliseconds, up to `[workers] min_heartbeat_interval`
(5 s) when Airflow's task supervisor misses the exit, longer while a child of the task keeps its
output open (up to `[workers] socket_cleanup_timeout`). An operator who approves at once, or a
script, lands in it.

The scheduler ignores such a report when `executor.has_task(ti)` holds, but Airflow's LocalExecutor
answers True only while a task waits in its queue, never once it runs. This executor counts the task
processes (workloads) it has started per task try. When one of them reports its end while another
of the same try still runs, the report is an earlier process's, and `has_task` says True until that
other process reports too. A task with one process at a time, nearly every task, is handled exactly
as before: a process that dies while its task says running still fails the task.

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
    """The task processes of each try that have started and not yet reported their end, and the
    tries whose earlier process has reported while a later one still runs (a resumed approval)."""

    def __init__(self) -> None:
        self._count: Counter[TaskInstanceKey] = Counter()
        self._outlived: set[TaskInstanceKey] = set()

    def started(self, keys: Iterable[TaskInstanceKey]) -> None:
        self._count.update(keys)

    def ended(self, key: TaskInstanceKey) -> None:
        if self._count[key] > 1:
            self._count[key] -= 1
            self._outlived.add(key)
        else:
            # The last process of the try, or a report of one never counted here: the scheduler's
            # heartbeat purge reports FAILED for a task whose process stopped heartbeating.
            self._count.pop(key, None)
            self._outlived.discard(key)

    def outlived(self, key: TaskInstanceKey) -> bool:
        """An earlier process of this try has reported its end and a later one still runs."""
        return key in self._outlived


class LocalExecutor(AirflowLocalExecutor):
    """Airflow's LocalExecutor; an earlier process's late report of a try whose later process
    still runs leaves that try known to the scheduler (see the module's doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_flight = ProcessesInFlight()

    def _process_workloads(self, workload_list: Sequence[Any]) -> None:
        super()._process_workloads(workload_list)
        # Counted once Airflow has queued them; reports are read later, on this same thread (sync).
        self.in_flight.started(w.key for w in workload_list if isinstance(w.key, TaskInstanceKey))

    def change_state(self, key: Any, state: Any, info: Any = None, remove_running: bool = True) -> None:
        if isinstance(key, TaskInstanceKey) and state in _FINISHED:
            self.in_flight.ended(key)
        super().change_state(key, state, info, remove_running=remove_running)

    def has_task(self, task_instance: Any) -> bool:
        return super().has_task(task_instance) or self.in_flight.outlived(task_instance.key)
