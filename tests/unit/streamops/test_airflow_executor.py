"""streamops' LocalExecutor: a task try stays known to the scheduler while any of its worker
processes runs, so the late exit report of a parked approval does not fail its resumed attempt.
(The race itself, on a real scheduler: tests/test_approval_race.py.)"""

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


def test_a_single_process_that_ends_is_forgotten_as_before():
    """A process that dies while its task still says running must still fail the task: the
    scheduler does that only for a try its executor no longer has."""
    executor = LocalExecutor(parallelism=2)
    executor.in_flight.started([APPROVE])
    assert executor.has_task(task_instance(APPROVE))
    executor.change_state(APPROVE, TaskInstanceState.FAILED)
    assert not executor.has_task(task_instance(APPROVE))


def test_a_running_report_is_not_an_end():
    executor = LocalExecutor(parallelism=2)
    executor.in_flight.started([APPROVE])
    executor.running_state(APPROVE)
    assert executor.has_task(task_instance(APPROVE))


def test_tries_and_tasks_are_counted_apart():
    in_flight = ProcessesInFlight()
    retry = TaskInstanceKey("reprocess", "approve", "manual__1", 2, -1)
    other = TaskInstanceKey("reprocess", "plan", "manual__1", 1, -1)
    in_flight.started([APPROVE, retry, other])
    in_flight.ended(APPROVE)
    assert (in_flight.running(APPROVE), in_flight.running(retry), in_flight.running(other)) == (False, True, True)
    in_flight.ended(APPROVE)  # a report for a try it never started (an adopted task): nothing goes negative
    in_flight.started([APPROVE])
    assert in_flight.running(APPROVE)
