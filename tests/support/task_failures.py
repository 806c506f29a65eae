"""Why a task of an in-process DAG run failed, kept for the test's assertion message.

A test asserts `run.state == "success", run.task_states`. When that fails on CI, the summary line
is often all there is to read; the task's log (and the error in it) is far above. So the error each
failed task raised is recorded by an Airflow listener (the task runner calls
`on_task_instance_failed` with it) and the task states print it next to the state."""

from __future__ import annotations

import threading

from airflow.listeners import hookimpl

ERROR_CHARS = 1500  # enough for a driver's last lines; a summary line stays readable


class TaskFailureRecorder:
    """An Airflow listener: the error of every failed (or retried) task, by (dag_id, run_id, task_id)."""

    def __init__(self) -> None:
        self._errors: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()

    @hookimpl
    def on_task_instance_failed(self, previous_state, task_instance, error) -> None:
        text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        if len(text) > ERROR_CHARS:
            text = text[: ERROR_CHARS // 3] + " ... " + text[-2 * ERROR_CHARS // 3:]
        key = (task_instance.dag_id, task_instance.run_id, task_instance.task_id)
        with self._lock:
            self._errors[key] = text

    def errors_of(self, dag_id: str, run_id: str) -> dict[str, str]:
        with self._lock:
            return {task: text for (dag, run, task), text in self._errors.items() if (dag, run) == (dag_id, run_id)}


_RECORDER = TaskFailureRecorder()


def install() -> None:
    """Register the recorder with the task runner's listener manager (a second call is a no-op)."""
    from airflow.sdk.listener import get_listener_manager

    get_listener_manager().add_listener(_RECORDER)


def errors_of(dag_id: str, run_id: str) -> dict[str, str]:
    """{task_id: error} of the failed tasks of one run (empty unless `install` ran before it)."""
    return _RECORDER.errors_of(dag_id, run_id)


class TaskStates(dict):
    """{task_id: state}, compared as a plain dict; its repr adds each failed task's error."""

    def __init__(self, states: dict[str, str], errors: dict[str, str]):
        super().__init__(states)
        self.errors = errors

    def __repr__(self) -> str:
        shown = super().__repr__()
        if not self.errors:
            return shown
        return shown + "".join(f"\n  {task} failed: {text}" for task, text in sorted(self.errors.items()))
