"""streamops' LocalExecutor: the late exit report of a parked approval, read while its resumed
attempt runs, leaves the try known to the scheduler, which then ignores the report. (The race
itself, and the counting of the processes Airflow hands the executor, on a real scheduler:
tests/test_approval_race.py.)"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from streamops.airflow_executor import LocalExecutor, ProcessesInFlight

APPROVE = TaskInstanceKey("reprocess", "approve", "manual__1", 1, -1)


def task_instance(key: TaskInstanceKey) -> SimpleNamespace:
    """What the scheduler hands has_task: a task instance (its id and key)."""
    return SimpleNamespace(id=uuid.uuid4(), key=key)


def test_the_parked_process_reporting_late_leaves_the_resumed_attempt_known():
    executor = LocalExecutor(parallelism=2)
    executor.in_flight.started([APPROVE])  # the approve task runs, then parks awaiting input
    executor.in_flight.started([APPROVE])  # approved: the same try resumes in a second process

    executor.change_state(APPROVE, TaskInstanceState.SUCCESS)  # the parked process's late report
    assert executor.event_buffer[APPROVE] == (TaskInstanceState.SUCCESS, None)  # still reported, as before
    assert executor.has_task(task_instance(APPROVE))  # so the scheduler leaves the running attempt alone

    executor.change_state(APPROVE, TaskInstanceState.SUCCESS)  # the resumed attempt ends
    assert not executor.has_task(task_instance(APPROVE))


def test_a_try_with_one_process_at_a_time_is_handled_as_airflow_does():
    """A process that dies while its task still says running must still fail the task: the
    scheduler does that only for a try its executor does not have, and Airflow's LocalExecutor
    has a try only while it waits in the queue."""
    executor = LocalExecutor(parallelism=2)
    executor.in_flight.started([APPROVE])
    assert not executor.has_task(task_instance(APPROVE))
    executor.change_state(APPROVE, TaskInstanceState.FAILED)
    assert not executor.has_task(task_instance(APPROVE))
    executor.in_flight.started([APPROVE])  # a reschedule or a slow approval: the same try, one process at a time
    executor.change_state(APPROVE, TaskInstanceState.SUCCESS)
    assert not executor.has_task(task_instance(APPROVE))


def test_a_running_report_is_not_an_end():
    executor = LocalExecutor(parallelism=2)
    executor.in_flight.started([APPROVE, APPROVE])
    executor.running_state(APPROVE)
    assert not executor.has_task(task_instance(APPROVE))
    executor.change_state(APPROVE, TaskInstanceState.SUCCESS)
    assert executor.has_task(task_instance(APPROVE))


def test_tries_and_tasks_are_counted_apart():
    in_flight = ProcessesInFlight()
    retry = TaskInstanceKey("reprocess", "approve", "manual__1", 2, -1)
    other = TaskInstanceKey("reprocess", "plan", "manual__1", 1, -1)
    in_flight.started([APPROVE, APPROVE, retry, retry, other])
    in_flight.ended(APPROVE)
    assert (in_flight.outlived(APPROVE), in_flight.outlived(retry), in_flight.outlived(other)) == (True, False, False)
    in_flight.ended(APPROVE)
    assert not in_flight.outlived(APPROVE)
    # A report of a process never counted (the scheduler's heartbeat purge reports FAILED for a
    # task that stopped heartbeating): nothing goes negative, and the next process counts afresh.
    in_flight.ended(APPROVE)
    in_flight.started([APPROVE])
    in_flight.ended(APPROVE)
    assert not in_flight.outlived(APPROVE)
